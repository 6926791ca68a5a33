"""jobs/*.sbatch on a real SLURM: a private single-node cluster (tests/slurm_cluster.py) runs the three
job scripts with small sizes through sbatch, and a running gradient job is stopped with SIGUSR1,
requeued and resumed.

Skipped only where SLURM cannot be installed (not root, no apt-get, apt-get failing); a cluster that
is installed but does not start is a failure.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ..helpers import HPCADJ, ROOT, assert_jobs_completed, batch_output, mpi_env, slurm_cluster, slurm_job_env

pytestmark = pytest.mark.timeout(400)

JOBS = ROOT / "jobs"
SCRIPTS = [JOBS / "gradient.sbatch", JOBS / "sweep.sbatch", JOBS / "scaling.sbatch"]
WAIT = 120  # seconds for one job on a busy 2-core machine; a healthy one takes well under 30


@pytest.fixture(scope="module")
def cluster():
    yield from slurm_cluster()


@pytest.fixture
def submit_dir(tmp_path):
    """The submit directory: batch output files land here, job folders under hpcadj-jobs/."""
    return tmp_path


def job_env(submit_dir: Path, **extra) -> dict:
    """What the scripts see: this checkout's hpcadj, OpenMPI allowed as root, tiny sizes set per test."""
    return slurm_job_env(submit_dir, **extra)


def marker(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def assert_completed(cluster, job: str, submit_dir: Path, timeout: float = WAIT) -> list[dict]:
    return assert_jobs_completed(cluster, job, submit_dir, timeout)


def assert_complete_run(run_dir: Path, ranks: int, steps: int) -> dict:
    """A run folder that is complete: markers, hpcadj's logs and its JSON result agree."""
    names = sorted(p.name for p in run_dir.iterdir())
    assert (run_dir / "COMPLETE").is_file(), f"{run_dir}: no COMPLETE ({names})"
    assert not (run_dir / "STOPPED").exists() and not (run_dir / "FAILED").exists(), names
    assert marker(run_dir / "COMPLETE")["rc"] == "0"
    for name in ("run.json", "summary.json", "result.json", *(f"rank{r:05d}.jsonl" for r in range(ranks))):
        assert (run_dir / name).is_file(), f"{run_dir}: {name} missing ({names})"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary, "empty summary.json"
    result = json.loads((run_dir / "result.json").read_text())
    assert result["ranks"] == ranks and result["steps"] == steps, result
    if not result.get("resumed"):  # a resumed run counts the steps of its own attempt
        assert result["adjoint_steps"] == steps
    return result


def test_job_scripts_are_shellcheck_clean():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    proc = subprocess.run(["shellcheck", "-x", *map(str, SCRIPTS), str(JOBS / "common.sh")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_gradient_script_runs_without_slurm(tmp_path):
    """`bash jobs/gradient.sbatch` outside a job: one local run, same folder layout, no requeue."""
    env = job_env(tmp_path, HPCADJ_GRID="16x16", HPCADJ_STEPS=8, HPCADJ_NTASKS=2)
    proc = subprocess.run(["bash", str(JOBS / "gradient.sbatch")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (job_dir,) = (tmp_path / "hpcadj-jobs").glob("gradient-local-*")
    assert_complete_run(job_dir, ranks=2, steps=8)


def _model_file(submit_dir: Path) -> None:
    """docs/example.md's model as ``models/reaction.py`` in the submit directory, with a factory."""
    from ..cli.test_model_spec import EXTRA, readme_model

    (submit_dir / "models").mkdir()
    (submit_dir / "models" / "reaction.py").write_text(readme_model() + EXTRA)


def test_gradient_script_passes_a_model_file_through(tmp_path):
    """HPCADJ_MODEL=models/reaction.py:make (relative to the submit directory, made absolute for
    the ranks); HPCADJ_GRID empty: the factory's own grid, no --grid."""
    _model_file(tmp_path)
    env = job_env(tmp_path, HPCADJ_MODEL="models/reaction.py:make", HPCADJ_GRID="", HPCADJ_STEPS=6,
                  HPCADJ_NTASKS=2, HPCADJ_RAM=2, HPCADJ_DISK="", HPCADJ_PFS="")
    proc = subprocess.run(["bash", str(JOBS / "gradient.sbatch")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (job_dir,) = (tmp_path / "hpcadj-jobs").glob("gradient-local-*")
    result = assert_complete_run(job_dir, ranks=2, steps=6)
    assert result["model"] == "reaction" and result["snapshot_bytes"] == 10 * 10 * 8, result
    assert f"--model {tmp_path}/models/reaction.py:make --steps 6" in (job_dir / "history.log").read_text()
    env["HPCADJ_MODEL"] = "models/absent.py:make"
    proc = subprocess.run(["bash", str(JOBS / "gradient.sbatch")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "no such file" in proc.stderr, proc.stderr


def test_bad_launcher_is_refused(tmp_path):
    env = job_env(tmp_path, HPCADJ_LAUNCHER="mpiexec-typo")
    proc = subprocess.run(["bash", str(JOBS / "gradient.sbatch")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "HPCADJ_LAUNCHER must be mpirun, srun or none" in proc.stderr
    assert not (tmp_path / "hpcadj-jobs").exists()


def test_gradient_job(cluster, submit_dir):
    """2 ranks through mpirun; node-local files under SLURM_TMPDIR, the HDF5 file in the job folder."""
    scratch = submit_dir / "node-local"
    # Three levels; --keep-checkpoints leaves their files where the script put them, to inspect.
    env = job_env(submit_dir, HPCADJ_GRID="32x32", HPCADJ_STEPS=24, HPCADJ_RAM=2, HPCADJ_DISK=2, HPCADJ_PFS=16,
                  HPCADJ_EXTRA_ARGS="--keep-checkpoints", SLURM_TMPDIR=scratch)
    job = cluster.sbatch(["--ntasks=2", str(JOBS / "gradient.sbatch")], env=env, cwd=submit_dir)
    assert_completed(cluster, job, submit_dir)

    job_dir = submit_dir / "hpcadj-jobs" / f"gradient-{job}"
    result = assert_complete_run(job_dir, ranks=2, steps=24)
    assert (submit_dir / f"hpcadj-gradient-{job}.out").is_file()
    assert [level["kind"] for level in result["levels"]] == ["ram", "local", "pfs"], result["levels"]
    assert (job_dir / "checkpoints.h5").is_file(), "the HDF5 level's file is not in the job folder"
    local = scratch / f"hpcadj-{job}" / f"gradient-{job}"
    assert local.is_dir() and any(local.iterdir()), f"the node-local level is not under SLURM_TMPDIR ({scratch})"
    history = (job_dir / "history.log").read_text()
    assert "launcher=mpirun" in history and "job complete" in history


def test_gradient_job_with_a_model_file(cluster, submit_dir):
    """A user's Stepper class named by file through sbatch, on 2 ranks."""
    _model_file(submit_dir)
    env = job_env(submit_dir, HPCADJ_MODEL="models/reaction.py:ReactionDiffusion", HPCADJ_GRID="12x12",
                  HPCADJ_STEPS=6, HPCADJ_RAM=2, HPCADJ_DISK="", HPCADJ_PFS="")
    job = cluster.sbatch(["--ntasks=2", str(JOBS / "gradient.sbatch")], env=env, cwd=submit_dir)
    assert_completed(cluster, job, submit_dir)
    result = assert_complete_run(submit_dir / "hpcadj-jobs" / f"gradient-{job}", ranks=2, steps=6)
    assert result["model"] == "reaction" and result["snapshot_bytes"] == 12 * 12 * 8, result


def test_gradient_job_with_srun(cluster, submit_dir):
    """HPCADJ_LAUNCHER=srun: direct launch through SLURM's PMIx plugin, where SLURM has one."""
    plugins = cluster.run(["srun", "--mpi=list"], check=False)
    if "pmix" not in plugins.stdout + plugins.stderr:
        pytest.skip("this SLURM has no pmix MPI plugin (srun --mpi=list); the mpirun launcher is the default")
    env = job_env(submit_dir, HPCADJ_LAUNCHER="srun", HPCADJ_GRID="16x16", HPCADJ_STEPS=10, HPCADJ_RAM="",
                  HPCADJ_DISK="", HPCADJ_PFS="")
    job = cluster.sbatch(["--ntasks=2", str(JOBS / "gradient.sbatch")], env=env, cwd=submit_dir)
    assert_completed(cluster, job, submit_dir)
    job_dir = submit_dir / "hpcadj-jobs" / f"gradient-{job}"
    assert_complete_run(job_dir, ranks=2, steps=10)
    assert "srun --ntasks=2 --mpi=pmix" in (job_dir / "history.log").read_text()


def test_sweep_job_array_and_dependent_analysis(cluster, submit_dir):
    schedules, budgets = ["revolve", "periodic"], ["3", "6"]
    env = job_env(submit_dir, HPCADJ_GRID="16x16", HPCADJ_STEPS=16, HPCADJ_SCHEDULES=" ".join(schedules),
                  HPCADJ_BUDGETS=" ".join(budgets))
    array = cluster.sbatch(["--ntasks=1", "--array=0-3", str(JOBS / "sweep.sbatch")], env=env, cwd=submit_dir)
    records = assert_completed(cluster, array, submit_dir)
    assert len(records) == 4, records

    sweep = submit_dir / "hpcadj-jobs" / f"sweep-{array}"
    labels = [f"{s}-ram{b}" for s in schedules for b in budgets]
    for label in labels:
        result = assert_complete_run(sweep / label, ranks=1, steps=16)
        assert result["schedule"] == label.split("-ram")[0]
    analyze_job = (sweep / "analyze.jobid").read_text().strip()
    (record,) = assert_completed(cluster, analyze_job, submit_dir)
    assert f"afterok:{array}" in record.get("Dependency", "") or record.get("Dependency") == "(null)"

    with open(sweep / "analyze.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(r["run"] for r in rows) == sorted(labels), rows
    table = (sweep / "analyze.md").read_text()
    assert all(label in table for label in labels), table
    assert (sweep / "pareto.png").stat().st_size > 0
    assert (sweep / "ANALYZED").is_file()


def test_scaling_job_strong_and_weak(cluster, submit_dir):
    env = job_env(submit_dir, HPCADJ_GRID="24x24", HPCADJ_WEAK_GRID="16x16", HPCADJ_STEPS=10)
    job = cluster.sbatch(["--ntasks=2", str(JOBS / "scaling.sbatch")], env=env, cwd=submit_dir)
    assert_completed(cluster, job, submit_dir)

    job_dir = submit_dir / "hpcadj-jobs" / f"scaling-{job}"
    assert (job_dir / "COMPLETE").is_file()
    grids = {}
    for series in ("strong", "weak"):
        for p in (1, 2):
            grids[series, p] = assert_complete_run(job_dir / f"{series}-p{p}", ranks=p, steps=10)["grid"]
        with open(job_dir / f"{series}.csv", newline="") as fh:
            assert sorted(int(r["ranks"]) for r in csv.DictReader(fh)) == [1, 2]
    assert grids == {("strong", 1): "24x24", ("strong", 2): "24x24", ("weak", 1): "16x16", ("weak", 2): "32x16"}
    with open(job_dir / "scaling.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["series"], r["ranks"]) for r in rows] == [("strong", "1"), ("strong", "2"), ("weak", "1"),
                                                         ("weak", "2")]
    assert all(float(r["wall_s"]) > 0 and float(r["efficiency"]) > 0 for r in rows)


def wait_for_time_loop(cluster, job: str, job_dir: Path, submit_dir: Path) -> None:
    """Until the run's time loop runs (its first forward-phase events are logged), not in start-up."""
    rank_log = job_dir / "rank00000.jsonl"
    deadline = time.monotonic() + WAIT
    while not (rank_log.is_file() and '"forward"' in rank_log.read_text(errors="replace")):
        assert time.monotonic() < deadline, f"the run never started\n{batch_output(submit_dir)}"
        assert cluster.state(job) in ("PENDING", "RUNNING", "CONFIGURING"), batch_output(submit_dir)
        time.sleep(0.2)


def test_cancelled_job_is_not_requeued(cluster, submit_dir):
    """A plain scancel (SIGTERM to the batch shell and every process) ends the job for good."""
    env = job_env(submit_dir, HPCADJ_GRID="32x32", HPCADJ_STEPS=3000, HPCADJ_RAM=8)
    job = cluster.sbatch(["--ntasks=2", str(JOBS / "gradient.sbatch")], env=env, cwd=submit_dir)
    job_dir = submit_dir / "hpcadj-jobs" / f"gradient-{job}"
    wait_for_time_loop(cluster, job, job_dir, submit_dir)
    cluster.run(["scancel", job])
    (record,) = cluster.wait(job, WAIT)
    assert record["JobState"] == "CANCELLED" and record["Restarts"] == "0", record
    time.sleep(1)  # the batch shell writes its marker within SLURM's KillWait
    assert not (job_dir / "COMPLETE").exists() and not (job_dir / "result.json").exists()
    stopped = marker(job_dir / "STOPPED")
    assert stopped["reason"] == "SIGTERM received" and stopped["requeue"] == "no", stopped
    assert "requeue\n" not in (job_dir / "history.log").read_text()


@pytest.mark.slow
def test_gradient_job_stopped_requeued_and_resumed(cluster, submit_dir):
    """SIGUSR1 to the batch shell (what --signal=B:USR1@120 sends): the run stops with status 75, the
    job writes STOPPED and requeues itself; its next start resumes and ends with the same gradient as
    an uninterrupted run."""
    # Long enough to be caught mid-run (a few seconds on a loaded 2-core VM), short enough to run twice;
    # all three levels, so the resumed run reattaches node-local files and the HDF5 file.
    args = dict(HPCADJ_GRID="32x32", HPCADJ_STEPS=800, HPCADJ_RAM=4, HPCADJ_DISK=32, HPCADJ_PFS=8)
    env = job_env(submit_dir, **args)
    job = cluster.sbatch(["--ntasks=2", str(JOBS / "gradient.sbatch")], env=env, cwd=submit_dir)
    job_dir = submit_dir / "hpcadj-jobs" / f"gradient-{job}"
    wait_for_time_loop(cluster, job, job_dir, submit_dir)
    cluster.run(["scancel", "--signal=USR1", "--batch", job])

    # Requeued: pending again (held for the cluster's credential lifetime) with one restart counted.
    # (PENDING, not merely "not RUNNING": while the requeue completes, a begin time set now is overwritten.)
    cluster.wait_until(job, lambda r: int(r[0].get("Restarts", "0")) >= 1 and r[0]["JobState"] == "PENDING",
                       WAIT, "requeue")
    out = batch_output(submit_dir)
    stopped = marker(job_dir / "STOPPED")
    assert stopped["reason"] == "SIGUSR1 received", (stopped, out)
    assert stopped["rc"] == "75", f"hpcadj did not exit 75 on SIGUSR1: {stopped}\n{out}"
    assert stopped["resumable"] == "yes" and stopped["requeue"] == "yes", stopped
    assert not (job_dir / "COMPLETE").exists() and not (job_dir / "result.json").exists()
    assert "requeue" in (job_dir / "history.log").read_text()

    # The uninterrupted reference runs meanwhile: the requeued job is held before its second attempt.
    reference = subprocess.Popen(["mpirun", "--oversubscribe", "-n", "2", HPCADJ, "run", "--grid", "32x32",
                                  "--steps", "800", "--ram", "4", "--disk", "32", "--local-dir",
                                  str(submit_dir / "ref-local"), "--json", "--quiet"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=mpi_env(), cwd=ROOT,
                                 start_new_session=True)
    try:
        ref_out, ref_err = reference.communicate(timeout=WAIT)
    finally:
        if reference.poll() is None:
            os.killpg(reference.pid, signal.SIGKILL)
            reference.wait()
    assert reference.returncode == 0, ref_err
    ref = json.loads(ref_out.strip().splitlines()[-1])

    # After the hold (cred_expire, 10 s here) the second attempt starts by itself, passes --resume, completes.
    assert_completed(cluster, job, submit_dir)
    result = assert_complete_run(job_dir, ranks=2, steps=800)
    assert marker(job_dir / "COMPLETE")["resumed"] == "1"
    (first,) = (job_dir / "attempts").iterdir()  # the stopped attempt's telemetry is kept, whole
    assert all((first / f"rank{r:05d}.jsonl").is_file() for r in range(2)), sorted(first.iterdir())
    history = (job_dir / "history.log").read_text()
    assert "attempt=1 run" in history and "--resume" in history.split("attempt=1 run", 1)[1], history
    assert (result["J"], result["grad_norm"]) == (ref["J"], ref["grad_norm"]), (result, ref)
