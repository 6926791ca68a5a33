"""``hpcadj analyze``'s analysis (telemetry.analyze) of the fake-clock logs of tests/analyze_logs.py:
per-run numbers, optima and Pareto marks, damaged and incomplete logs. The command:
tests/cli/test_cli_analyze.py."""

import json
import shutil

import pytest

from hpcadj.telemetry import jsonlog
from hpcadj.telemetry.analyze import AnalyzeError, analyze, compare, find_run_dirs, load_run

from ..analyze_logs import FakeTime, MODEL, RUNS, SNAP, by_label, partial_run
from ..analyze_logs import mixed_fixture, one_run_fixture, sweep_fixture  # noqa: F401 (fixtures)


def test_per_run_numbers(sweep):
    results = by_label(analyze([sweep], model=MODEL))
    assert sorted(results) == sorted(RUNS)
    ram = results["ram-all"]
    assert ram["wall_seconds"] == pytest.approx(6.91)
    assert ram["energy"] == {"source": "model", "joules": pytest.approx(69.1 + 0.041)}
    assert results["pfs-all"]["energy"]["joules"] == pytest.approx(66.22 + 4.1)
    assert ram["recompute_factor"] == pytest.approx(1.0)
    assert results["revolve-4"]["recompute_factor"] == pytest.approx(2.5)
    assert results["revolve-4"]["checkpoint_peak_bytes"] == 4 * SNAP
    rows = {(p["phase"], p["level"]): p for p in results["revolve-4"]["phases"]}
    assert rows[("recompute", None)]["seconds_sum"] == pytest.approx(3.0)
    assert rows[("restore", "ram")]["bytes"] == 12 * SNAP
    assert rows[("adjoint", None)]["joules_model"] == pytest.approx(40.0)
    assert [p["phase"] for p in results["revolve-4"]["phases"]] == [
        "forward", "recompute", "adjoint", "store", "restore"]
    assert all(not r["problems"] for r in results.values())


def test_comparison_marks_optima_and_pareto(sweep):
    rows = {c["run"]: c for c in compare(analyze([sweep], model=MODEL))}
    assert [k for k, c in rows.items() if c["time_optimal"]] == ["pfs-all"]
    assert [k for k, c in rows.items() if c["energy_optimal"]] == ["ram-all"]
    assert sorted(k for k, c in rows.items() if c["pareto"]) == ["pfs-all", "ram-all", "revolve-4"]
    assert rows["revolve-4"]["memory_metric"] == "checkpoint peak, all levels"
    assert rows["revolve-4"]["memory_MiB"] == pytest.approx(4 * SNAP / 2**20)
    ram_rows = {c["run"]: c for c in compare(analyze([sweep], model=MODEL), memory="ram")}
    assert ram_rows["pfs-all"]["memory_MiB"] == 0.0
    assert ram_rows["ram-all"]["memory_MiB"] == pytest.approx(21 * SNAP / 2**20)
    assert sorted(k for k, c in ram_rows.items() if c["pareto"]) == ["pfs-all", "ram-all"]


def test_truncated_line_and_missing_end_are_reported(one_run):
    path = one_run / "rank00000.jsonl"
    text = path.read_text()
    path.write_text(text[:-40])                      # the end record is cut mid-line
    result = analyze([one_run], model=MODEL)[0]
    problems = "\n".join(result["problems"])
    nlines = text.count("\n")
    assert f"line {nlines} is truncated" in problems
    assert "no end record" in problems
    assert result["forward_steps"] == 20


def test_corrupt_line_is_skipped_and_named(one_run):
    path = one_run / "rank00000.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[4] = '{"type": "event", "phase": "forw\n'
    path.write_text("".join(lines))
    result = analyze([one_run], model=MODEL)[0]
    assert "rank00000.jsonl: line 5 is not valid JSON; skipped" in result["problems"]
    assert "rank00000.jsonl: end record counts 81 events, 80 read" in result["problems"]
    assert result["forward_steps"] == 19


def test_missing_rank_and_summary(one_run):
    run_json = json.loads((one_run / "run.json").read_text())
    run_json["ranks"] = 3
    (one_run / "run.json").write_text(json.dumps(run_json))
    shutil.copy(one_run / "rank00000.jsonl", one_run / "rank00002.jsonl")
    (one_run / "summary.json").unlink()
    result = analyze([one_run], model=MODEL)[0]
    problems = "\n".join(result["problems"])
    assert "1 of 3 rank logs missing (rank 1)" in problems
    assert "summary.json missing" in problems
    assert result["wall_seconds"] == pytest.approx(6.91)
    assert result["wall_from"] == "end records"
    assert result["status_flags"] == ["unfinished", "missing-rank-logs"] and not result["complete"]


def test_nothing_to_analyse(tmp_path):
    with pytest.raises(AnalyzeError, match="no such directory"):
        find_run_dirs([tmp_path / "absent"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(AnalyzeError, match="no hpcadj log"):
        find_run_dirs([tmp_path / "empty"])
    with pytest.raises(AnalyzeError, match="no hpcadj log"):
        load_run(tmp_path / "empty")


PARTIAL = {"fragment": ["resumed-fragment"], "half-ranks": ["missing-rank-logs"], "failed": ["failed"],
           "stopped": ["stopped"], "killed": ["unfinished"]}


def test_incomplete_runs_are_flagged(mixed):
    root, first_id = mixed
    results = by_label(analyze([root], model=MODEL))
    for label in RUNS:
        assert results[label]["status"] == "complete" and results[label]["complete"], label
    for label, flags in PARTIAL.items():
        assert results[label]["status_flags"] == flags, (label, results[label]["status_detail"])
        assert not results[label]["complete"]
    detail = " ".join(results["fragment"]["status_detail"])
    assert "8 of 20 adjoint steps" in detail and "0 of 20 first-sweep forward steps" in detail
    assert first_id in detail                     # the stopped part before the resume was overwritten
    run_json = json.loads((root / "fragment" / "run.json").read_text())
    assert run_json["overwrote"]["run_id"] == first_id and run_json["overwrote"]["status"] == "stopped"
    # the part before the resume is kept, whole, where run.json says, and analyze reads it there
    kept = root / "fragment" / run_json["overwrote"]["kept_in"]
    assert kept == root / "fragment" / "attempts" / f"00-{first_id}" and f"is in attempts/00-{first_id}" in detail
    header = json.loads((kept / "rank00000.jsonl").read_text().splitlines()[0])
    assert header["run_id"] == first_id
    (earlier,) = analyze([root / "fragment" / "attempts"], model=MODEL)
    assert earlier["status_flags"] == ["stopped"]
    assert "rank 0 aborted: LevelError" in " ".join(results["failed"]["status_detail"])
    assert "no end record on rank 0" in " ".join(results["killed"]["status_detail"])
    # each partial run is cheaper than every complete one: the old ranking marked them optimal
    for label in PARTIAL:
        assert results[label]["wall_seconds"] < results["pfs-all"]["wall_seconds"], label
        assert results[label]["energy"]["joules"] < results["ram-all"]["energy"]["joules"], label


def test_no_incomplete_run_is_ranked(mixed):
    root, _ = mixed
    results = analyze([root], model=MODEL)
    rows = {c["run"]: c for c in compare(results)}
    assert [k for k, c in rows.items() if c["time_optimal"]] == ["pfs-all"]
    assert [k for k, c in rows.items() if c["energy_optimal"]] == ["ram-all"]
    assert sorted(k for k, c in rows.items() if c["pareto"]) == ["pfs-all", "ram-all", "revolve-4"]
    for label in PARTIAL:
        assert not rows[label]["ranked"] and rows[label]["status"] != "complete"
        assert not (rows[label]["time_optimal"] or rows[label]["energy_optimal"] or rows[label]["pareto"])
    # the memory column keeps its meaning: runs without level statistics get n/a, not peak RSS
    assert {c["memory_metric"] for c in rows.values()} == {"checkpoint peak, all levels"}
    assert rows["revolve-4"]["memory_MiB"] == pytest.approx(4 * SNAP / 2**20)
    assert rows["failed"]["memory_MiB"] is None and rows["stopped"]["memory_MiB"] is None
    assert rows["failed"]["peak_rss_MiB"] > 0
    from hpcadj.telemetry.analyze import markdown_report

    text = markdown_report(results)
    assert "| fragment | resumed-fragment | 1 |" in text
    assert text.count("not ranked |") == len(PARTIAL)
    assert "memory MiB (checkpoint peak, all levels)" in text
    assert "Memory n/a (checkpoint peak, all levels not logged) for failed, killed, stopped" in text
    assert "- status: **resumed-fragment** (not compared with complete runs:" in text


def test_resumed_run_covering_every_step_is_complete(tmp_path):
    """--resume that found nothing durable restarts from step 0: its log is a whole run."""
    clock = FakeTime()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jsonlog, "time", clock)
        partial_run(tmp_path / "r", clock, "r", resumed=True)
    result = analyze([tmp_path / "r"], model=MODEL)[0]
    assert result["status"] == "complete"
