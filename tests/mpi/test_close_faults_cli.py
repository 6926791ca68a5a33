"""A checkpoint file that cannot be removed at the end of a real ``hpcadj run`` (EROFS on rank 0,
which alone removes it): every rank ends with one line and exit status 2, under 1, 2 and 3 ranks,
never a hang or a traceback."""

import pytest

from ..helpers import PYTHON, mpirun, mpi_env, run

PROBE = """
import errno
import os
import sys

from hpcadj.cli import console

target = os.path.abspath(sys.argv[1])
real = os.remove


def remove(path, *args, **kwargs):
    if os.path.abspath(path) == target:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS) + " (injected)")
    return real(path, *args, **kwargs)


os.remove = remove
sys.argv = ["hpcadj", *sys.argv[2:]]
sys.exit(console())
"""


@pytest.mark.timeout(400)
@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_a_checkpoint_file_that_cannot_be_removed_ends_the_run_in_one_line(tmp_path, nranks):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    pfs = tmp_path / "ck.h5"
    argv = [PYTHON, str(script), str(pfs), "run", "--grid", "8x8", "--steps", "6", "--pfs", "3",
            "--pfs-file", str(pfs), "--quiet"]
    proc = run(argv, timeout=300, env=mpi_env()) if nranks == 1 else mpirun(nranks, argv, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("hpcadj")]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1 and "cannot remove" in lines[0] and "(injected)" in lines[0], proc.stderr[-3000:]
