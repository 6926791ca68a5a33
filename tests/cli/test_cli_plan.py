"""``hpcadj plan``: the summary, the JSON, the action stream and bad input (one line, exit 2).

The real command runs once for a summary and once for bad input; the rest calls ``hpcadj.cli.main``
in this process (``plan`` starts no solver, and a process would cost a second of start-up each)."""

import json
import re
from pathlib import Path

import pytest

from tests.helpers import hpcadj, hpcadj_in_process


def test_human_summary_for_revolve():
    proc = hpcadj(["plan", "--steps", "1000", "--ram", "20"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "forward evaluations 2748 (2.748 per step)" in proc.stdout
    assert "predicted makespan" in proc.stdout


def test_json_summary_three_levels_from_bytes(tmp_path):
    proc = hpcadj_in_process(["plan", "--steps", "500", "--ram", "8MiB", "--disk", "32", "--pfs", "1GiB",
                              "--snapshot-bytes", str(1024**2), "--json"])
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["schedule"] == "multilevel" and info["steps"] == 500
    assert [lv["name"] for lv in info["levels"]] == ["ram", "disk", "pfs"]
    assert [lv["slots"] for lv in info["levels"]] == [8, 32, 1024]
    assert all(lv["peak"] <= lv["slots"] for lv in info["levels"])
    fwd, writes, reads = info["forward_steps"], [lv["writes"] for lv in info["levels"]], [lv["reads"] for lv in
                                                                                          info["levels"]]
    expected = fwd * 1.0 + 500 * 2.0 + sum(c * x for c, x in zip((0.01, 0.2, 1.0), writes)) + sum(
        c * x for c, x in zip((0.01, 0.2, 1.0), reads))
    assert info["predicted_s"] is None and info["predicted_relative"] == pytest.approx(expected)


def test_first_touch_of_each_filled_slot_is_in_the_predicted_makespan(tmp_path):
    levels = [{"name": "ram", "write_s": 0.01, "read_s": 0.01}, {"name": "disk", "write_s": 0.2, "read_s": 0.2}]
    infos = []
    for fill in (0.0, 0.25):
        path = tmp_path / f"costs{fill}.json"
        levels[0]["fill_s"] = fill
        path.write_text(json.dumps({"forward_s": 1.0, "adjoint_s": 2.0, "levels": levels}))
        proc = hpcadj_in_process(["plan", "--steps", "200", "--ram", "6", "--disk", "10", "--costs", str(path),
                                  "--json"])
        assert proc.returncode == 0, proc.stderr
        infos.append(json.loads(proc.stdout))
    plain, filled = infos
    assert filled["forward_steps"] == plain["forward_steps"]
    peak_ram = filled["levels"][0]["peak"]
    assert peak_ram == 6
    assert filled["predicted_s"] - plain["predicted_s"] == pytest.approx(0.25 * peak_ram)


def test_costs_file_changes_the_plan(tmp_path):
    profile = {"forward_s": 1.0, "adjoint_s": 1.0, "source": "measured",
               "levels": [{"name": "ram", "write_s": 0.0, "read_s": 0.0},
                          {"name": "disk", "write_s": 1e6, "read_s": 1e6}]}
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(profile))
    proc = hpcadj_in_process(["plan", "--steps", "100", "--ram", "3", "--disk", "50", "--costs", str(path),
                              "--json"])
    info = json.loads(proc.stdout)
    assert info["levels"][1]["writes"] == 0 and info["costs_source"] == "measured"


def test_actions_stream():
    proc = hpcadj_in_process(["plan", "--steps", "3", "--ram", "1", "--schedule", "revolve", "--actions"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:4] == ["Store(n=0, level=0)", "Advance(n0=0, n1=3)", "EndForward()", "Adjoint(n1=3, n0=2)"]
    proc = hpcadj_in_process(["plan", "--steps", "3", "--ram", "1", "--actions", "--json"])
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert records[0] == {"action": "Store", "n": 0, "level": 0}
    assert records[-2] == {"action": "EndReverse"} and records[-1]["forward_steps"] == 4


@pytest.mark.parametrize("args, message", [
    (["--steps", "0", "--ram", "4"], "--steps must be >= 1"),
    (["--steps", "10", "--ram", "0", "--disk", "0"], "no level has room for one snapshot"),
    (["--steps", "10", "--ram", "1KiB", "--snapshot-bytes", "4096"], "no level has room for one snapshot"),
    (["--steps", "10", "--ram", "1KiB", "--snapshot-bytes", "4KiB"], "no level has room for one snapshot"),
    (["--steps", "10", "--ram", "1GiB", "--snapshot-bytes", "8XB"], "unknown unit"),
    (["--steps", "10", "--ram", "4", "--schedule", "nope"], "invalid choice"),
    (["--steps", "10", "--ram", "2GiB"], "--snapshot-bytes"),
    (["--steps", "10", "--ram", "lots"], "--ram"),
    (["--steps", "10"], "at least one level"),
    (["--steps", "10", "--ram", "2", "--schedule", "store-all"], "store-all needs 9 slots"),
    (["--steps", "10", "--ram", "2", "--costs", "/nonexistent.json"], "cannot read cost profile"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    real = args == ["--steps", "0", "--ram", "4"]  # the real command for one case, this process for the rest
    proc = hpcadj(["plan", *args], timeout=120) if real else hpcadj_in_process(["plan", *args])
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


# -- plan says what run does: one provisioning for both ---------------------------------------------

PROFILE = str(Path(__file__).resolve().parents[2] / "experiments" / "levels" / "profile.json")


def _plan_and_run(args: list[str], tmp_path, plan_extra=()):
    """``hpcadj plan --json`` and ``hpcadj run --json`` of the same options on 2 ranks."""
    run_args = ["run", *args, "--local-dir", str(tmp_path), "--json", "--quiet"]
    if "--pfs" in args:
        run_args += ["--pfs-file", str(tmp_path / "c.h5")]
    proc = hpcadj(run_args, 2, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ran = json.loads(proc.stdout)
    proc = hpcadj(["plan", *args, *plan_extra(ran), "--json"], 2, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout  # one document under mpirun, not one per rank
    return json.loads(lines[0]), ran


def _assert_same_plan(planned: dict, ran: dict) -> None:
    assert planned["schedule"] == ran["schedule"]
    assert planned["forward_steps"] == ran["forward_steps"]
    assert [(lv["name"], lv["slots"], lv["peak"]) for lv in planned["levels"]] == [
        (lv["name"], lv["slots"], lv["peak_slots"]) for lv in ran["levels"]]
    for key in ("predicted_s", "predicted_relative"):
        assert (planned[key] is None) == (ran[key] is None)
        assert planned[key] is None or planned[key] == pytest.approx(ran[key])


@pytest.mark.parametrize("args", [
    ["--model", "heat", "--grid", "24x20", "--steps", "30", "--ram", "4"],
    ["--model", "burgers", "--grid", "32x24", "--steps", "24", "--ram", "2", "--disk", "3", "--costs", PROFILE],
], ids=["revolve", "multilevel"])
def test_plan_with_a_model_is_the_plan_run_runs(args, tmp_path):
    planned, ran = _plan_and_run(args, tmp_path, lambda ran: ())
    _assert_same_plan(planned, ran)


#: how far (relative) a plan's measured baseline may stand from a run's of the same options
BASELINE_NOISE = 0.1


def test_plan_memory_counts_the_run_s_baseline_and_slots(tmp_path):
    """Under --memory, plan measures the baseline as run does (not zero); given run's, it plans the
    same RAM slots, bytes and actions."""
    from hpcadj.checkpoint.provision import ALLOCATOR_SLACK_BYTES

    base = ["--model", "wave", "--grid", "24x24x24", "--steps", "40"]
    proc = hpcadj(["plan", *base, "--memory", "1MiB"], 2, timeout=240)
    least = float(re.search(r"least budget that would do is ([\d.]+) MiB", proc.stderr).group(1))
    args = [*base, "--memory", f"{least + 1.5:.1f}MiB"]  # room for about 14 of 40 states
    planned, ran = _plan_and_run(args, tmp_path, lambda ran: (
        "--baseline", f"{ran['memory']['baseline'] - ALLOCATOR_SLACK_BYTES}B"))
    _assert_same_plan(planned, ran)
    assert 2 <= planned["levels"][0]["slots"] < 39
    mine = {k: v for k, v in planned["memory"].items() if k != "source"}
    assert mine == {k: v for k, v in ran["memory"].items() if k in mine}
    given = ("--baseline", f"{ran['memory']['baseline'] - ALLOCATOR_SLACK_BYTES}B")
    lines = hpcadj(["plan", *args, *given, "--json", "--actions"], 2, timeout=240).stdout.splitlines()
    assert len(lines) - 1 == ran["actions"]  # the same action list, one per line
    measured = json.loads(hpcadj(["plan", *args, "--json"], 2, timeout=240).stdout)
    m = measured["memory"]
    # measured as run measures it, not zero nor before the warm-up (wave's kernels alone are about
    # 55 MiB): two processes' resident sets differ by a few MiB, more under load
    assert abs(m["baseline"] - ran["memory"]["baseline"]) <= BASELINE_NOISE * ran["memory"]["baseline"]
    # and counted, exactly: the RAM slots are what the budget leaves beside this plan's own baseline
    assert m["peak"] == m["baseline"] + m["total"]
    assert m["ram_slots_fit"] == (m["budget"] - m["baseline"] - m["model"] - m["working states"]
                                  - m["staging"]) // m["snapshot"]
    assert measured["levels"][0]["slots"] == min(m["ram_slots_fit"], 39) == m["ram slots"] // m["snapshot"]
