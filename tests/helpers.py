"""Launch hpcadj and pytest under real mpirun, with a timeout that kills the whole process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
HPCADJ = str(Path(PYTHON).with_name("hpcadj"))


def mpi_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", PYTHONUNBUFFERED="1")
    # Two cores, several ranks: let OpenMPI yield instead of spinning in busy-wait.
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    # No binding: OpenMPI binds the ranks of an `mpirun -n 1` or `-n 2` to cores 0 (and 1), so the
    # jobs of two pytest workers piled up on core 0 while core 1 idled.
    env.setdefault("OMPI_MCA_hwloc_base_binding_policy", "none")
    if extra:
        env.update(extra)
    return env


def mpirun(nranks: int, argv: list[str], *, timeout: float = 300, env: dict | None = None,
           cwd=None) -> subprocess.CompletedProcess:
    """Run ``argv`` on ``nranks`` ranks; a run past ``timeout`` is killed and reported as rc 124."""
    cmd = ["mpirun", "--oversubscribe", "-n", str(nranks), *argv]
    return run(cmd, timeout=timeout, env=mpi_env(env), cwd=cwd)


def run(cmd: list[str], *, timeout: float = 300, env: dict | None = None, cwd=None,
        input: str | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env if env is not None else mpi_env(), cwd=cwd or ROOT,
                            start_new_session=True, stdin=subprocess.PIPE if input else subprocess.DEVNULL)
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return subprocess.CompletedProcess(cmd, 124, out, err + f"\n[timed out after {timeout} s]")


def hpcadj(args: list[str], nranks: int = 1, *, timeout: float = 300, env: dict | None = None,
           cwd=None) -> subprocess.CompletedProcess:
    """Run the ``hpcadj`` command, under mpirun when ``nranks`` > 1."""
    if nranks == 1:
        return run([HPCADJ, *args], timeout=timeout, env=mpi_env(env), cwd=cwd)
    return mpirun(nranks, [HPCADJ, *args], timeout=timeout, env=env, cwd=cwd)


def hpcadj_in_process(args: list[str], *, env: dict | None = None) -> subprocess.CompletedProcess:
    """``hpcadj args`` through :func:`hpcadj.cli.main` in this process, with ``env`` set meanwhile:
    its exit status, stdout and stderr as :func:`hpcadj` returns them, without a process's ~1 s of
    start-up (PETSc stays initialised between calls). For what a process of its own need not show."""
    import contextlib
    import io

    from hpcadj.cli import main

    saved = {name: os.environ.get(name) for name in env or {}}
    out, err = io.StringIO(), io.StringIO()
    try:
        os.environ.update(env or {})
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(list(args))
            except SystemExit as exc:  # argparse's usage errors and --help
                status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return subprocess.CompletedProcess(["hpcadj", *args], status, out.getvalue(), err.getvalue())


#: under mpirun: each command of argv[1] (a JSON list of argument lists) through hpcadj_in_process, the
#: collector off as in the ``hpcadj`` executable and the heap frozen before each (tests/conftest.py)
_EACH = """import gc, json, sys
from hpcadj.imports import mpi
from tests.helpers import hpcadj_in_process
gc.disable()
for args in json.loads(sys.argv[1]):
    gc.collect()
    gc.freeze()
    proc = hpcadj_in_process(args)
    if mpi().COMM_WORLD.rank == 0:
        print("hpcadj-each " + json.dumps([proc.returncode, proc.stdout, proc.stderr]), flush=True)
"""


def hpcadj_each(commands: list[list[str]], nranks: int, *, timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """Several ``hpcadj`` commands one after another in one ``mpirun`` (its ranks' start-up paid once),
    each through :func:`hpcadj.cli.main` on every rank: rank 0's exit status, stdout and stderr of
    each. For checks that need ranks but not a process each (no kill, signal or PETSc option)."""
    proc = mpirun(nranks, [PYTHON, "-c", _EACH, json.dumps([list(map(str, c)) for c in commands])],
                  timeout=timeout)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    results = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
               if line.startswith("hpcadj-each ")]
    assert len(results) == len(commands), proc.stdout[-4000:]
    return [subprocess.CompletedProcess(["hpcadj", *c], rc, out, err) for c, (rc, out, err) in zip(commands, results)]


def hpcadj_json(args: list[str], nranks: int = 1, *, in_process: bool = False, **kw) -> dict:
    """Run ``hpcadj ... --json`` (in this process with ``in_process``) and return its one JSON object
    (fails the test on error)."""
    if in_process:
        assert nranks == 1, "a run in this process has this process's one rank"
        proc = hpcadj_in_process([*args, "--json"], env=kw.get("env"))
    else:
        proc = hpcadj([*args, "--json"], nranks, **kw)
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one JSON line, got:\n{proc.stdout}"
    return json.loads(lines[0])


# -- the run that tests/mpi/test_restart.py and tests/mpi/test_compression_restart.py kill and resume ---------
#: a small heat gradient with durable points every 2 stores (its reference: conftest's restart_reference)
RESTART_BASE = ["run", "--model", "heat", "--grid", "20x16", "--steps", "30", "--dt", "1e-3", "--durable-every", "2",
                "--quiet"]
RESTART_LEVELS = ["--ram", "2", "--disk", "3", "--pfs", "4"]
#: I/O cheap against a step, so the multilevel plan uses all three levels (and no run calibrates)
RESTART_PROFILE = {"forward_s": 1.0, "adjoint_s": 2.0, "source": "test",
                   "levels": [{"name": "ram", "write_s": 0.01, "read_s": 0.01},
                              {"name": "disk", "write_s": 0.05, "read_s": 0.05},
                              {"name": "pfs", "write_s": 0.1, "read_s": 0.1}]}


def restart_args(base: list[str], tmp: Path, levels=RESTART_LEVELS, extra=(), tag: str = "") -> list[str]:
    """``base`` (RESTART_BASE and a cost profile, say) with ``levels`` and ``extra``, its files under
    ``tmp``: the HDF5 level's ``ck{tag}.h5``, the node-local ``local{tag}/`` (made here), ``run{tag}/``."""
    (tmp / f"local{tag}").mkdir(exist_ok=True)
    return [*base, *levels, *extra, "--pfs-file", str(tmp / f"ck{tag}.h5"), "--local-dir", str(tmp / f"local{tag}"),
            "--run-dir", str(tmp / f"run{tag}")]


def kill_env(at: str) -> dict:
    """The environment of a run whose rank ``at`` (``RANK:ACTION`` or ``RANK:frontier=STEP``) SIGKILLs
    itself there (``HPCADJ_INJECT_KILL``), with mpirun killing the survivors at once: its default
    grace of 1 s between SIGTERM and SIGKILL, spent twice, is idle time to a rank blocked in a
    collective with the dead one (4 s a killed run, not 2)."""
    return {"HPCADJ_INJECT_KILL": at, "OMPI_MCA_odls_base_sigkill_timeout": "0"}


def killed_run(args: list[str], nranks: int, at: str, *, timeout: float = 240,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """``hpcadj args`` on ``nranks`` ranks with ``HPCADJ_INJECT_KILL=at`` (``RANK:ACTION`` or
    ``RANK:frontier=STEP``): that rank SIGKILLs itself there, and mpirun takes the job down, as on a
    node failure (:func:`kill_env`). Fails the test unless the run died (not by its timeout) without
    printing a result."""
    proc = hpcadj(args, nranks, timeout=timeout, env={**(env or {}), **kill_env(at)})
    assert proc.returncode not in (0, 124), f"no injected kill at {at}: rc={proc.returncode}\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip() == "", f"a killed run must not print a result:\n{proc.stdout}"
    return proc


def assert_bitwise(got: dict, want: dict, label=None) -> None:
    """Every field of ``want`` (name -> array) is in ``got`` with the same bits."""
    for name, field in want.items():
        assert np.array_equal(got[name], field), (label, name)


def read_gradients(path) -> dict:
    """Every dataset of a ``--gradient-out`` file, by name."""
    from hpcadj.imports import h5py

    with h5py().File(path, "r") as f:
        return {name: f[name][...] for name in f}


# -- jobs/*.sbatch on a private SLURM (tests/cluster/test_slurm_jobs.py, tests/cluster/test_slurm_multinode.py) --------
def slurm_cluster(**options):
    """A started :class:`tests.slurm_cluster.SlurmCluster` (``options`` as it takes them), yielded
    for a module-scoped fixture and stopped after it, even on failure. The test is skipped where
    SLURM cannot be installed, and where a multi-node cluster's per-node namespaces are not
    permitted; a cluster that is installed but does not start otherwise is a failure."""
    import pytest

    from .slurm_cluster import SlurmCluster, SlurmUnavailable, ensure_installed

    try:
        ensure_installed()
    except SlurmUnavailable as exc:
        pytest.skip(f"SLURM cannot be installed here: {exc}")
    cluster = SlurmCluster(**options)
    try:
        try:
            cluster.start()
        except RuntimeError as exc:
            if options.get("nodes", 1) > 1 and ("unshare" in str(exc) or "Operation not permitted" in str(exc)):
                pytest.skip(f"per-node namespaces not permitted here: {exc}")
            raise
        yield cluster
    finally:
        cluster.stop()  # cancels this cluster's jobs, then stops its daemons by pid


def slurm_job_env(submit_dir: Path, base: dict | None = None, keep: tuple = (), **extra) -> dict:
    """What a job script sees: this checkout's hpcadj, OpenMPI allowed as root, job folders under
    ``submit_dir``, ``base`` and ``extra`` (the per-test sizes); none of pytest's MPI-worker flag, and
    no SLURM_* variable of the calling shell but those in ``keep`` and ``extra``."""
    env = mpi_env({"HPCADJ": HPCADJ, "HPCADJ_OUTPUT": str(submit_dir / "hpcadj-jobs"),
                   "TMPDIR": str(submit_dir / "tmp"), **(base or {})})  # TMPDIR: the node-local fallback
    env.pop("HPCADJ_MPI_WORKER", None)
    env.update({k: str(v) for k, v in extra.items()})
    return {k: v for k, v in env.items() if not k.startswith("SLURM_") or k in extra or k in keep}


def rank_hosts(run_dir: Path) -> dict[int, str]:
    """rank -> host name, from each rank's JSON-lines header."""
    hosts = {}
    for path in sorted(run_dir.glob("rank*.jsonl")):
        header = json.loads(path.read_text().splitlines()[0])
        hosts[header["rank"]] = header["host"]
    return hosts


def batch_output(submit_dir: Path) -> str:
    """Every batch output file (``*.out``) in ``submit_dir``, each under its name."""
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in sorted(submit_dir.glob("*.out")))


def assert_jobs_completed(cluster, job: str, submit_dir: Path, timeout: float, log_lines: int = 40) -> list[dict]:
    """Wait for ``job`` (every task of an array); each must be COMPLETED, or the test fails with the
    batch output and the daemons' log tails. Returns the job's records."""
    records = cluster.wait(job, timeout)
    bad = [r for r in records if r.get("JobState") != "COMPLETED"]
    assert not bad, (f"job {job}: " + ", ".join(f"{r['JobId']} {r.get('JobState')} exit {r.get('ExitCode')}"
                                                 for r in bad) + "\n" + batch_output(submit_dir)
                     + "\n" + cluster.log_tails(log_lines))
    return records
