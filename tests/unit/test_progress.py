"""Progress lines on rank 0 when stderr is not a terminal (batch jobs, mpirun): their format, interval
and mode, from a fake clock and stream (a real run's lines: tests/cli/test_cli_progress.py)."""

import io
import re
from types import SimpleNamespace

from hpcadj.checkpoint.schedules import OpCosts
from hpcadj.checkpoint.schedules.actions import Adjoint, Advance, EndForward, EndReverse, Move, Restore, Store
from hpcadj.telemetry.progress import (SweepProgress, format_bytes, format_duration, format_line, plan_work,
                                       progress_interval, progress_mode)

LINE = re.compile(r"^hpcadj: progress \(rank 0\): forward (\d+)/(\d+), recomputed (\d+), adjoint (\d+)/(\d+); "
                  r"elapsed ([^;]+); remaining (~[^;]+ \(plan cost model\)|n/a \([^)]+\))"
                  r"(; written/read on rank 0's levels: .+)?$")


class Tty(io.StringIO):
    def isatty(self):
        return True


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_format_line():
    text = format_line(nsteps=100, forward=40, recomputed=12, adjoint=3, elapsed=62.4, remaining=190.0,
                       levels=[("ram", 12 * 2**20, 3 * 2**20), ("disk", 0, 512)])
    assert text == ("hpcadj: progress (rank 0): forward 40/100, recomputed 12, adjoint 3/100; elapsed 1 min 02 s; "
                    "remaining ~3 min 10 s (plan cost model); "
                    "written/read on rank 0's levels: ram 12.0 MiB/3.0 MiB, disk 0 B/512 B")
    assert LINE.match(text)
    bare = format_line(nsteps=5, forward=0, recomputed=0, adjoint=0, elapsed=0.25, remaining=None)
    assert bare == ("hpcadj: progress (rank 0): forward 0/5, recomputed 0, adjoint 0/5; elapsed 0.2 s; "
                    "remaining n/a (no plan cost model)")
    assert format_duration(7300) == "2 h 02 min" and format_duration(None) == "n/a"
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(5 * 2**40) == "5.0 TiB"


def test_mode_and_interval():
    assert progress_mode(0, False, Tty(), ranks=1) == "bars"
    assert progress_mode(0, False, Tty(), ranks=2) == "lines"       # mpirun: lines even on a pty
    assert progress_mode(0, False, io.StringIO(), ranks=1) == "lines"
    assert progress_mode(1, False, io.StringIO(), ranks=2) is None
    assert progress_mode(0, True, io.StringIO(), ranks=2) is None
    assert progress_interval({}) == (10.0, None)
    assert progress_interval({"HPCADJ_PROGRESS_INTERVAL": "0.1"}) == (0.1, None)
    value, warning = progress_interval({"HPCADJ_PROGRESS_INTERVAL": "-3"})
    assert value == 10.0 and "not a positive number" in warning


def test_plan_work_counts_actions():
    plan = [Advance(0, 4), Store(0, 0), Store(2, 1), EndForward(), Adjoint(4, 3), Restore(2, 1),
            Move(0, 0, 1), Advance(2, 3), Adjoint(3, 2), EndReverse()]
    work = plan_work(plan)
    assert work == {"forward": 5, "adjoint": 2, "writes": {0: 1, 1: 2}, "reads": {1: 1, 0: 1}}


def level(name, **stats):
    base = dict(bytes_written=0, bytes_read=0, writes=0, reads=0)
    return SimpleNamespace(name=name, stats=SimpleNamespace(**{**base, **stats}))


def test_lines_at_the_interval_with_predicted_remaining():
    """Forward step 1, adjoint step 2, one RAM write 0 (free): a plan of 10 + 10 steps costs 30 units."""
    clock = Clock()
    stream = io.StringIO()
    ram = level("ram")
    schedule = SimpleNamespace(actions=lambda: [Advance(0, 10), EndForward()]
                               + [Adjoint(i + 1, i) for i in reversed(range(10))] + [EndReverse()])
    progress = SweepProgress(10, stream=stream, ranks=2, levels=[ram], plan=schedule,
                             costs=OpCosts(1.0, 2.0, (0.0,), (0.0,)), interval=5.0, clock=clock)
    assert progress.mode == "lines"
    for _ in range(5):
        clock.now += 0.5
        progress.forward(1)
    assert stream.getvalue() == ""                              # 2.5 s < 5 s: nothing yet
    ram.stats.bytes_written = 3 * 2**20
    for _ in range(5):
        clock.now += 0.5
        progress.forward(1)
    lines = stream.getvalue().splitlines()
    # 10 units done in 5 s, 20 units left: 10 s remaining
    assert lines == ["hpcadj: progress (rank 0): forward 10/10, recomputed 0, adjoint 0/10; elapsed 5.0 s; "
                     "remaining ~10.0 s (plan cost model); written/read on rank 0's levels: ram 3.0 MiB/0 B"]
    for _ in range(5):
        clock.now += 1.0
        progress.adjoint(1)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "adjoint 5/10; elapsed 10.0 s; remaining ~5.0 s" in lines[1]
    progress.close()
    progress.close()
    assert len(stream.getvalue().splitlines()) == 3             # one last line at the end, once


def test_quiet_other_ranks_and_bars_print_no_lines():
    for kw in ({"quiet": True}, {"rank": 1}):
        stream = io.StringIO()
        clock = Clock()
        progress = SweepProgress(4, stream=stream, ranks=2, interval=0.01, clock=clock, **kw)
        for _ in range(4):
            clock.now += 1
            progress.forward(1)
            progress.adjoint(1)
        progress.close()
        assert stream.getvalue() == "", kw
    stream = Tty()
    bars = SweepProgress(4, stream=stream, ranks=1, interval=0.01)
    bars.forward(4)
    bars.close()
    assert "hpcadj: progress" not in stream.getvalue() and "4/4" in stream.getvalue()


def test_bad_interval_warns_once(monkeypatch):
    monkeypatch.setenv("HPCADJ_PROGRESS_INTERVAL", "soon")
    stream = io.StringIO()
    progress = SweepProgress(4, stream=stream, ranks=2)
    assert progress.interval == 10.0
    assert stream.getvalue().splitlines() == [
        "hpcadj: warning: HPCADJ_PROGRESS_INTERVAL='soon' is not a positive number of seconds; progress every 10 s"]
