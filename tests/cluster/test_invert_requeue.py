"""jobs/invert.sbatch stopped by SIGUSR1 under a real SLURM controller (tests/slurm_cluster.py): the
inversion stops at the end of its evaluation with exit 75, the batch shell requeues the job, and the
requeued attempt resumes from the last accepted iterate K. Its first K iterates are an uninterrupted
inversion's, bit for bit, and its final controls are bitwise those of the inversion started afresh
at iterate K with the iterations left (what docs/inversion.md promises: petsc4py exposes no LMVM
history). Run by `make test-cluster` (HPCADJ_TEST_CLUSTER=1), not by `make test`."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from ..helpers import PYTHON, ROOT, assert_jobs_completed, batch_output, mpirun, slurm_cluster, slurm_job_env

pytestmark = [pytest.mark.timeout(900),
              pytest.mark.skipif(os.environ.get("HPCADJ_TEST_CLUSTER") != "1",
                                 reason="SLURM cluster tests: run with `make test-cluster` (HPCADJ_TEST_CLUSTER=1)")]

WAIT = 300  # seconds for a job attempt on a busy 2-core machine
# about a second an iterate: long enough for the signal to land mid-inversion, short enough to run thrice
GRID, STEPS, SHOTS, MAX_IT = "24x24", 400, 2, 8

#: on the job's 2 ranks: the inversion uninterrupted up to MAX_IT, then afresh at the job's iterate K
#: (argv: its controls file) with MAX_IT - K iterations; every J and the final controls to an .npz
REFERENCE = """
import sys
import h5py
import numpy as np
from hpcadj.adjoint.session import Checkpointing
from hpcadj.imports import mpi
from hpcadj.inversion.shots import ShotInversion, ShotLayout, ShotProblem, shot_positions
from hpcadj.models.wave import WaveModel

iterate, K, max_it, local, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
comm = mpi().COMM_WORLD
positions = shot_positions({shots})


def factory(shot_comm, shot):
    return WaveModel(shot_comm, ({grid}), n_steps={steps}, source_x=positions[shot])


def inversion(max_it, **options):
    inv = ShotInversion(comm, factory, {shots}, ["c"], Checkpointing(ram=8, disk=16, local_dir=local),
                        tao_type="lmvm", max_it=max_it, gatol=0.0, grtol=0.0, gttol=0.0, **options)
    inv.layout = ShotLayout(comm, {shots}, 1)
    inv.problem = ShotProblem(inv.layout, factory)
    return inv


whole = inversion(max_it)
uninterrupted = whole.solve()
start = inversion(max_it - K)
controls = start.problem.default_controls()
with h5py.File(iterate, "r") as f:  # one rank a shot: each group holds the whole field
    controls["c"].getArray()[:] = np.array(f["c"]).ravel()
start.options.update(controls=controls, reference=start.problem.default_controls())
afresh = start.solve()
if comm.rank == 0:
    np.savez(out, uninterrupted=[h["J"] for h in uninterrupted.history],
             afresh=[h["J"] for h in afresh.history], controls=afresh.controls["c"].getArray(readonly=True))
"""


@pytest.fixture(scope="module")
def cluster():
    yield from slurm_cluster()


def marker(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def iterations(log: Path) -> list[dict]:
    if not log.is_file():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def test_invert_job_stopped_by_usr1_is_requeued_and_resumes_from_its_last_iterate(cluster, tmp_path):
    import numpy as np

    from hpcadj.imports import h5py as mpi_h5py

    h5py = mpi_h5py()  # the MPI build: a plain import first would fix the serial one in this process

    env = slurm_job_env(tmp_path, PYTHONPATH=str(ROOT), HPCADJ_GRID=GRID, HPCADJ_STEPS=STEPS,
                        HPCADJ_SHOTS=SHOTS, HPCADJ_RANKS_PER_SHOT=1, HPCADJ_MAX_IT=MAX_IT, HPCADJ_RAM=8,
                        HPCADJ_DISK=16, HPCADJ_EXTRA_ARGS="--gatol 0 --grtol 0 --gttol 0")
    job = cluster.sbatch(["--ntasks=2", str(ROOT / "jobs" / "invert.sbatch")], env=env, cwd=tmp_path)
    job_dir = tmp_path / "hpcadj-jobs" / f"invert-{job}"
    log = job_dir / "inversion.jsonl"

    # SIGUSR1 to the batch shell (what #SBATCH --signal=B:USR1@120 sends) once iterate 1 is durable
    deadline = time.monotonic() + WAIT
    while not any(r["iteration"] >= 1 for r in iterations(log)):
        assert cluster.state(job) in ("PENDING", "RUNNING", "CONFIGURING"), batch_output(tmp_path)
        assert time.monotonic() < deadline, f"no accepted iterate after {WAIT} s\n{batch_output(tmp_path)}"
        time.sleep(0.1)
    cluster.run(["scancel", "--signal=USR1", "--batch", job])

    # stopped with 75 and requeued: pending again (held for the credential lifetime), one restart
    cluster.wait_until(job, lambda r: int(r[0].get("Restarts", "0")) >= 1 and r[0]["JobState"] == "PENDING",
                       WAIT, "requeue")
    out = batch_output(tmp_path)
    stopped = marker(job_dir / "STOPPED")
    assert stopped["reason"] == "SIGUSR1 received" and stopped["rc"] == "75", (stopped, out)
    assert stopped["resumable"] == "yes" and stopped["requeue"] == "yes", (stopped, out)
    assert not (job_dir / "COMPLETE").exists() and not (job_dir / "result.json").exists()
    state = json.loads((job_dir / "state" / "inversion.json").read_text())
    K = state["iteration"]
    assert 1 <= K < MAX_IT, f"the stop came after iterate {K} of {MAX_IT}: nothing left to resume\n{out}"
    iterate = tmp_path / "iterate-K.h5"  # the resumed attempt replaces it with its own iterates
    shutil.copy(job_dir / "state" / state["controls_file"], iterate)
    assert [r["iteration"] for r in iterations(log)] == list(range(K + 1)), out

    assert_jobs_completed(cluster, job, tmp_path, WAIT)
    assert marker(job_dir / "COMPLETE")["resumed"] == "1"
    result = json.loads((job_dir / "result.json").read_text())
    assert result["status"] == "max_it" and result["resumed_from"] == K and result["iterations"] == MAX_IT, result
    history = iterations(log)
    assert [r["iteration"] for r in history] == list(range(MAX_IT + 1)), [r["iteration"] for r in history]
    text = (job_dir / "history.log").read_text()
    assert "requeue" in text and "--resume" in text.split("attempt=1", 1)[1], text
    assert not list((tmp_path / "tmp").glob("hpcadj-*")), "node-local scratch left behind"

    npz = tmp_path / "reference.npz"
    script = REFERENCE.format(grid=GRID.replace("x", ", "), steps=STEPS, shots=SHOTS)
    proc = mpirun(2, [PYTHON, "-c", script, str(iterate), str(K), str(MAX_IT), str(tmp_path / "ref-local"),
                      str(npz)], env={"PYTHONPATH": str(ROOT)}, timeout=WAIT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = np.load(npz)
    job_J = [r["J"] for r in history]
    # the first attempt up to K is the uninterrupted inversion; from K on, the inversion afresh at K
    assert job_J[:K + 1] == list(ref["uninterrupted"][:K + 1]), (job_J, list(ref["uninterrupted"]))
    assert job_J[K:] == list(ref["afresh"]), (job_J, list(ref["afresh"]))
    with h5py.File(job_dir / "controls.h5", "r") as f:
        final = np.array(f["c"]).ravel()
    assert final.tobytes() == ref["controls"].tobytes(), np.abs(final - ref["controls"]).max()
    assert job_J[-1] < job_J[0]


def test_invert_job_requeued_after_a_rank_kill_with_three_levels_resumes_and_leaves_nothing(cluster, tmp_path):
    """A rank SIGKILLed mid-evaluation (RAM, node-local and HDF5 levels in use): the attempt fails, the
    requeued one passes --resume, takes over what the killed evaluation left (removes it) and
    completes; iterates 0..K are the first attempt's, and no node-local snapshot or HDF5 file stays."""
    import signal
    import subprocess

    env = slurm_job_env(tmp_path, PYTHONPATH=str(ROOT), HPCADJ_GRID=GRID, HPCADJ_STEPS=STEPS,
                        HPCADJ_SHOTS=SHOTS, HPCADJ_RANKS_PER_SHOT=1, HPCADJ_MAX_IT=MAX_IT, HPCADJ_RAM=2,
                        HPCADJ_DISK=2, HPCADJ_PFS=4, HPCADJ_EXTRA_ARGS="--gatol 0 --grtol 0 --gttol 0")
    job = cluster.sbatch(["--ntasks=2", str(ROOT / "jobs" / "invert.sbatch")], env=env, cwd=tmp_path)
    job_dir = tmp_path / "hpcadj-jobs" / f"invert-{job}"
    log = job_dir / "inversion.jsonl"
    deadline = time.monotonic() + WAIT
    while not any(r["iteration"] >= 1 for r in iterations(log)) or not list(job_dir.glob("checkpoints-shot*.h5")):
        assert cluster.state(job) in ("PENDING", "RUNNING", "CONFIGURING"), batch_output(tmp_path)
        assert time.monotonic() < deadline, f"no accepted iterate after {WAIT} s\n{batch_output(tmp_path)}"
        time.sleep(0.1)
    ranks = subprocess.run(["pgrep", "-f", f"hpcadj invert .*invert-{job}"], capture_output=True,
                           text=True).stdout.split()
    assert ranks, "no rank process of the job found"
    os.kill(int(ranks[-1]), signal.SIGKILL)
    cluster.wait_until(job, lambda r: r[0]["JobState"] in ("FAILED", "COMPLETED"), WAIT, "the failed attempt")
    assert (job_dir / "FAILED").exists(), batch_output(tmp_path)
    before = iterations(log)
    K = json.loads((job_dir / "state" / "inversion.json").read_text())["iteration"]
    assert 1 <= K < MAX_IT and [r["iteration"] for r in before] == list(range(K + 1)), before
    assert list(job_dir.glob("checkpoints-shot*.h5")), "the killed evaluation left no HDF5 file"

    cluster.run(["scontrol", "requeue", job])  # what a node failure or an operator does
    assert_jobs_completed(cluster, job, tmp_path, WAIT)
    assert marker(job_dir / "COMPLETE")["resumed"] == "1"
    result = json.loads((job_dir / "result.json").read_text())
    assert result["status"] == "max_it" and result["resumed_from"] == K and result["iterations"] == MAX_IT, result
    history = iterations(log)
    assert [r["iteration"] for r in history] == list(range(MAX_IT + 1))
    assert history[:K + 1] == before and history[-1]["J"] < history[0]["J"]
    assert not list(job_dir.glob("checkpoints*.h5")), list(job_dir.iterdir())
    assert not list((tmp_path / "tmp").rglob("*.snap")), "node-local snapshots left behind"
