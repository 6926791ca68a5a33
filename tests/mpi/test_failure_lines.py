"""Failures that reach the command line by unusual ways still end every rank with one line and
exit 2, promptly, under real mpirun at 1, 2 and 3 ranks, the failure injected in the launched
ranks (real faults need privileges): a calibration's stale scratch file rank 0 cannot remove; a
storage failure inside a petsc4py callback, handed back wrapped in a PETSc.Error; a model raising
in the data check (``hpcadj check`` reports it FAILED, a mixed run refuses the model)."""

from __future__ import annotations

import json
import re
import textwrap
import time

import pytest

from ..helpers import PYTHON, hpcadj, hpcadj_each, mpirun

#: the end of each script below: hpcadj's arguments from argv[2] on, each rank printing its exit status
MAIN = """
from hpcadj.cli import main

try:
    status = main(sys.argv[2:])
except SystemExit as exc:
    status = exc.code
print(f"rank-exit {os.environ.get('OMPI_COMM_WORLD_RANK')} {status}", flush=True)
sys.exit(status)
"""

#: argv[1]: the path whose os.remove fails on rank 0; then hpcadj's arguments.
REMOVE_FAILS = """
import errno, os, sys

real_remove = os.remove


def remove(path, *args, **kwargs):
    if os.environ.get("OMPI_COMM_WORLD_RANK") == "0" and str(path) == sys.argv[1]:
        raise OSError(errno.EIO, os.strerror(errno.EIO) + " (injected)")
    return real_remove(path, *args, **kwargs)


os.remove = remove
""" + MAIN

#: argv[1]: "cause" or "context"; the rest: hpcadj's arguments. Every gradient TAO asks for fails
#: with a storage error inside TAO's callback, which comes back out of ``tao.solve()`` as a
#: PETSc.Error holding it, as newer petsc4py returns a callback's exception (3.18 re-raises it
#: as it is).
WRAPPED = """
import os, sys

from hpcadj.checkpoint.storage.base import LevelFault
from hpcadj.imports import petsc
from hpcadj.inversion.problem import TaoProblem


def failing(self, x, g):
    try:
        raise LevelFault("pfs", 2, "cannot write step 2 to ck.h5: Input/output error (injected)", writing=True)
    except LevelFault as exc:
        if sys.argv[1] == "cause":
            raise petsc().Error(101) from exc
        raise petsc().Error(101)


TaoProblem._gradient_into = failing
""" + MAIN

#: longer than any of these commands takes: a failure that only the agreement's timeout ends shows
AGREE_TIMEOUT_S = "120"


def one_error_line(proc, nranks: int, *expected: str) -> str:
    """The run's one ``hpcadj: error:`` line; every rank exited 2, with no traceback."""
    text = proc.stdout + proc.stderr
    errors = [line for line in text.splitlines() if line.startswith("hpcadj: error:")]
    # ranks' lines may interleave with no newline between them ("rank-exit 0 2rank-exit 1 2")
    exits = sorted(re.findall(r"rank-exit (\d+) (-?\d+|None)", proc.stdout))
    assert proc.returncode == 2 and len(errors) == 1, (proc.returncode, text[-4000:])
    assert exits == [(str(r), "2") for r in range(nranks)], exits
    assert "Traceback" not in text, text[-4000:]
    assert all(e in errors[0] for e in expected), errors
    return errors[0]


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_calibrate_scratch_file_rank_0_cannot_remove_is_one_agreed_line(tmp_path, nranks):
    """A killed calibration left ``<pfs-file>.calibrate``; its removal fails (EIO on rank 0, which
    alone removes the shared file): every rank exits 2 at once with the one line naming the file."""
    pfs = tmp_path / "cal.h5"
    scratch = tmp_path / "cal.h5.calibrate"
    scratch.write_bytes(b"left by a killed calibration")
    script = tmp_path / "remove_fails.py"
    script.write_text(REMOVE_FAILS)
    t0 = time.monotonic()
    proc = mpirun(nranks, [PYTHON, str(script), str(scratch), "calibrate", "--model", "heat", "--grid", "8x8",
                           "--steps", "2", "--repeats", "1", "--pfs-file", str(pfs), "--local-dir",
                           str(tmp_path / "local")],
                  timeout=90, env={"HPCADJ_AGREE_TIMEOUT": AGREE_TIMEOUT_S})
    line = one_error_line(proc, nranks, str(scratch), "(injected)")
    assert time.monotonic() - t0 < 60, line
    assert "profile" not in proc.stdout


@pytest.mark.parametrize("nranks, link", [(1, "cause"), (2, "context"), (3, "cause")])
def test_storage_failure_wrapped_in_a_petsc_error_is_one_line(tmp_path, nranks, link):
    """A level's failure raised inside TAO's gradient callback reaches ``hpcadj invert`` as the
    ``__cause__`` (or ``__context__``) of a PETSc.Error: one line with the level's own message,
    exit 2 on every rank, no traceback."""
    script = tmp_path / "wrapped.py"
    script.write_text(WRAPPED)
    proc = mpirun(nranks, [PYTHON, str(script), link, "invert", "--model", "heat", "--grid", "8x8", "--steps", "2",
                           "--invert", "kappa", "--max-it", "1"],
                  timeout=90, env={"HPCADJ_AGREE_TIMEOUT": AGREE_TIMEOUT_S})
    one_error_line(proc, nranks, "cannot write step 2 to ck.h5: Input/output error (injected)")


READS_PREVIOUS = textwrap.dedent("""
    from hpcadj.models.wave import WaveModel


    class ReadsPrevious(WaveModel):
        \"\"\"Declares u^i as its data, but its adjoint step reads u^{i-1} too.\"\"\"

        def adjoint_step(self, i, u, u_next, lam_next, grad):
            self._fields(u)  # a ValueError on the one-field stand-in of its data
            return super().adjoint_step(i, u, u_next, lam_next, grad)


    def make(comm, args):
        return ReadsPrevious(comm, (14, 12), n_steps=6)
""")


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_a_model_raising_in_the_data_check_is_failed_and_refused_in_one_line(tmp_path, nranks):
    """``hpcadj check`` reports adjoint_data FAILED with the model's exception in one line (exit 1);
    ``hpcadj run --schedule mixed`` refuses the model in one line, exit 2, no traceback."""
    model = tmp_path / "reads_previous.py"
    model.write_text(READS_PREVIOUS)
    spec = f"{model}:make"
    check, run = hpcadj_each([["check", "--model", spec, "--check-steps", "2", "--json"],
                              ["run", "--model", spec, "--schedule", "mixed", "--quiet"]], nranks, timeout=120)
    verdict = json.loads(check.stdout)["properties"]["adjoint_data"]
    assert check.returncode == 1 and verdict["status"] == "FAILED", (check.returncode, verdict)
    assert "step 0: ValueError: cannot reshape" in verdict["reason"], verdict
    errors = [line for line in run.stderr.splitlines() if line.startswith("hpcadj: error:")]
    assert run.returncode == 2 and len(errors) == 1 and "Traceback" not in run.stderr, (run.returncode, run.stderr)
    assert "cannot trust 'wave''s adjoint data" in errors[0] and "step 0: ValueError" in errors[0], errors
    assert run.stdout == "", run.stdout


#: raises on the last rank only, in its adjoint step from the data's stand-in (from any state with
#: $RAISE_ALWAYS=1): the other ranks are then inside the adjoint step's halo exchange, which the
#: failing rank never joins
LAST_RANK_RAISES = textwrap.dedent("""
    import os

    from hpcadj.models.wave import WaveModel

    ALWAYS = os.environ.get("RAISE_ALWAYS") == "1"


    class LastRankRaises(WaveModel):
        def adjoint_step(self, i, u, u_next, lam_next, grad):
            if (self._is_field(u) or ALWAYS) and self.comm.rank == self.comm.size - 1:
                raise RuntimeError("this rank's adjoint step cannot read its data")
            return super().adjoint_step(i, u, u_next, lam_next, grad)


    def make(comm, args):
        return LastRankRaises(comm, (14, 12), n_steps=6)
""")


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_model_raising_on_one_rank_in_the_data_check_ends_the_job_in_one_line(tmp_path, nranks):
    """The failing rank waits for the others only the agreement's time, then prints its one line
    naming itself and ends the job: the others, blocked in the model's halo exchange, never hang it."""
    model = tmp_path / "last_rank_raises.py"
    model.write_text(LAST_RANK_RAISES)
    t0 = time.monotonic()
    proc = hpcadj(["run", "--model", f"{model}:make", "--schedule", "mixed", "--quiet"], nranks, timeout=120,
                  env={"HPCADJ_AGREE_TIMEOUT": "3"})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hpcadj: error:")]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)
    assert len(errors) == 1 and f"rank {nranks - 1}: step 0: RuntimeError: this rank's" in errors[0], proc.stderr
    assert proc.stdout == "" and time.monotonic() - t0 < 90


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_model_raising_on_one_rank_in_check_ends_the_job_in_one_line(tmp_path, nranks):
    """``hpcadj check`` of a model whose adjoint step raises on one rank only: that rank's one line
    after the agreement's timeout and the job ended, not a hang in the contract's agreement."""
    model = tmp_path / "last_rank_raises.py"
    model.write_text(LAST_RANK_RAISES)
    t0 = time.monotonic()
    proc = hpcadj(["check", "--model", f"{model}:make", "--check-steps", "2"], nranks, timeout=120,
                  env={"HPCADJ_AGREE_TIMEOUT": "3", "RAISE_ALWAYS": "1"})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hpcadj: error:")]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)
    assert len(errors) == 1 and f"rank {nranks - 1}: RuntimeError: this rank's" in errors[0], proc.stderr
    assert time.monotonic() - t0 < 90
