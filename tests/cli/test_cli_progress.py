"""Progress lines of a real 2-rank run (stderr not a terminal, as under mpirun); silenced by --quiet and
--json. The lines' format alone: tests/unit/test_progress.py."""

import pytest

from ..helpers import hpcadj
from ..unit.test_progress import LINE

RUN = ["run", "--grid", "16x16", "--steps", "24", "--ram", "4", "--schedule", "revolve"]

ENV = {"HPCADJ_PROGRESS_INTERVAL": "0.1", "HPCADJ_TEST_STEP_DELAY": "0.02"}


def test_progress_lines_under_mpirun():
    proc = hpcadj(RUN, nranks=2, timeout=240, env=ENV)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("hpcadj: progress")]
    assert len(lines) >= 3, proc.stderr
    matches = [LINE.match(line) for line in lines]
    assert all(matches), lines
    assert {m.group(2) for m in matches} == {"24"}
    assert any(m.group(8) and "ram " in m.group(8) for m in matches), lines
    assert all("(plan cost model)" in line for line in lines), lines
    assert int(matches[-1].group(4)) == 24 and int(matches[-1].group(1)) == 24   # the last line: all done
    assert int(matches[-1].group(3)) > 0                                       # revolve recomputes
    assert "hpcadj: progress (rank 1)" not in proc.stderr
    assert proc.stdout.count("hpcadj run: heat 16x16") == 1                    # stdout untouched


@pytest.mark.parametrize("flag", ["--quiet", "--json"])
def test_quiet_and_json_silence_progress(flag):
    proc = hpcadj([*RUN, flag], nranks=2, timeout=240, env=ENV)
    assert proc.returncode == 0, proc.stderr
    assert "hpcadj: progress" not in proc.stderr, proc.stderr
    if flag == "--json":
        assert len(proc.stdout.strip().splitlines()) == 1
