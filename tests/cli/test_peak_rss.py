"""Peak RSS reported by runs is the process's own: Linux carries ``ru_maxrss`` over exec from the
process that forked, so a run started from a large Python process (a pytest worker, a notebook)
reported that process's peak as its own (1151 MiB for a 64^3 run peaking near 300 MiB)."""

import subprocess
import sys

from ..helpers import ROOT

CHILD = "from hpcadj.telemetry.jsonlog import peak_rss_bytes; print(peak_rss_bytes())"


def test_a_child_reports_its_own_peak_not_its_parent_s():
    ballast = bytearray(400 * 2 ** 20)
    ballast[::4096] = b"\1" * len(ballast[::4096])  # touched: resident in this process
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) < 200 * 2 ** 20, int(out.stdout) >> 20
    del ballast
