"""A checkpoint level failing in a command other than ``hpcadj run`` (the HDF5 file of ``hpcadj
invert``'s gradients that cannot be removed, EROFS on rank 0, which alone removes it; the RAM level
of ``gradcheck`` and ``hesscheck`` failing to close on every rank): one line, exit status 2, no
traceback and no result, under 1, 2 and 3 ranks with a timeout."""

import pytest

from ..helpers import PYTHON, mpirun, mpi_env, run
from .test_close_faults_cli import PROBE

#: a level's close failing alike on every rank (a RAM level never fails on its own)
CLOSE_FAILS = """
from hpcadj.checkpoint.storage.base import LevelError
from hpcadj.checkpoint.storage.ram import RamLevel


def close(self):
    raise LevelError(f"{self.name}: closing failed (injected)")


RamLevel.close = close
"""

COMMANDS = {
    "invert": ["invert", "--grid", "8x8", "--steps", "6", "--invert", "kappa", "--max-it", "2", "--pfs", "3",
               "--pfs-file", "{ck}", "--controls-out", "{out}"],
    "gradcheck": ["gradcheck", "--grid", "8x8", "--steps", "4", "--halvings", "1"],
    "hesscheck": ["hesscheck", "--grid", "8x8", "--steps", "4", "--halvings", "1"],
}


@pytest.mark.timeout(400)
@pytest.mark.parametrize("nranks", [1, 2, 3])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_failing_level_ends_the_command_in_one_line(tmp_path, command, nranks):
    script = tmp_path / "probe.py"
    script.write_text((CLOSE_FAILS if command != "invert" else "") + PROBE)
    ck, out = tmp_path / "ck.h5", tmp_path / "out.h5"
    argv = [PYTHON, str(script), str(ck), *(a.format(ck=ck, out=out) for a in COMMANDS[command])]
    proc = run(argv, timeout=300, env=mpi_env()) if nranks == 1 else mpirun(nranks, argv, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("hpcadj")]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("hpcadj: error: ") and "(injected)" in lines[0], \
        proc.stderr[-3000:]
    assert not proc.stdout.strip(), proc.stdout[-2000:]  # no result printed
    assert not out.exists() and not (tmp_path / "out.h5.partial").exists()
