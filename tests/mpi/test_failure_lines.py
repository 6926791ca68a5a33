"""Failures that reach the command line by unusual ways still end every rank with one line and
exit 2, promptly, under real mpirun at 1, 2 and 3 ranks, the failure injected in the launched
ranks (real faults need privileges): a calibration's stale scratch file rank 0 cannot remove; a
storage failure inside a petsc4py callback, handed back wrapped in a PETSc.Error."""

from __future__ import annotations

import re
import time

import pytest

from ..helpers import PYTHON, mpirun

#: argv[1]: the path whose os.remove fails on rank 0; the rest: hpcadj's arguments. Each rank
#: prints its exit status.
REMOVE_FAILS = """
import errno, os, sys

real_remove = os.remove


def remove(path, *args, **kwargs):
    if os.environ.get("OMPI_COMM_WORLD_RANK") == "0" and str(path) == sys.argv[1]:
        raise OSError(errno.EIO, os.strerror(errno.EIO) + " (injected)")
    return real_remove(path, *args, **kwargs)


os.remove = remove
from hpcadj.cli import main

try:
    status = main(sys.argv[2:])
except SystemExit as exc:
    status = exc.code
print(f"rank-exit {os.environ.get('OMPI_COMM_WORLD_RANK')} {status}", flush=True)
sys.exit(status)
"""

#: argv[1]: "cause" or "context"; the rest: hpcadj's arguments. Every gradient TAO asks for fails
#: with a storage error inside TAO's callback, which comes back out of ``tao.solve()`` as a
#: PETSc.Error holding it, as newer petsc4py returns a callback's exception (3.18 re-raises it
#: as it is). Each rank prints its exit status.
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
from hpcadj.cli import main

try:
    status = main(sys.argv[2:])
except SystemExit as exc:
    status = exc.code
print(f"rank-exit {os.environ.get('OMPI_COMM_WORLD_RANK')} {status}", flush=True)
sys.exit(status)
"""

#: longer than any of these commands takes: a failure that only the agreement's timeout ends shows
AGREE_TIMEOUT_S = "120"


def one_error_line(proc, nranks: int, *expected: str) -> str:
    """The run's one ``hpcadj: error:`` line; every rank exited 2, with no traceback."""
    text = proc.stdout + proc.stderr
    errors = [line for line in text.splitlines() if line.startswith("hpcadj: error:")]
    exits = sorted(re.findall(r"rank-exit (\d+) (\w+)", proc.stdout))  # ranks' lines may interleave
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
