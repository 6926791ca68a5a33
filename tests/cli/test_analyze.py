"""``hpcadj analyze`` on logs written by the real Telemetry + RunLog, with a fake clock.

The clock makes every phase take the seconds given, so wall times and modeled energies below are
computed by hand. Four runs of n = 20 steps (forward step 0.1 s, adjoint step 0.2 s, 0.5 s set-up),
snapshots of 1 MB, one rank, model: 10 W per core, RAM 1e-9 J/B, PFS 1e-7 J/B:

- ``ram-all``:  21 RAM stores (0.01 s), 20 restores (0.01 s): wall 6.91 s, 69.1 J + 41e6 B x 1e-9 J/B
- ``pfs-all``:  21 PFS stores (0.002 s, async), 20 restores (0.004 s): wall 6.622 s, 66.22 J + 4.1 J
- ``revolve-4``: 4 RAM slots, 30 recomputed steps, 8 stores, 12 restores: wall 9.7 s, 97 J + 0.02 J
- ``revolve-4-slow``: as revolve-4 with 40 recomputed steps: wall 10.7 s — dominated by revolve-4.

So pfs-all is time-optimal, ram-all energy-optimal, and all but revolve-4-slow Pareto-optimal.
"""

import csv
import io
import json
import os
import shutil
import struct
import time as real_time

import pytest

from hpcadj.telemetry import Telemetry, jsonlog, open_run_log
from hpcadj.telemetry.analyze import AnalyzeError, analyze, compare, find_run_dirs, load_run
from hpcadj.telemetry.energy_model import EnergyModel

from ..helpers import HPCADJ, PYTHON, hpcadj_in_process, run

SNAP = 1_000_000
MODEL = EnergyModel(watts_per_core=10.0, joules_per_byte_write={"ram": 1e-9, "pfs": 1e-7},
                    joules_per_byte_read={"ram": 1e-9, "pfs": 1e-7})
MODEL_TOML = ("watts_per_core = 10.0\n[joules_per_byte_write]\nram = 1e-9\npfs = 1e-7\n"
              "[joules_per_byte_read]\nram = 1e-9\npfs = 1e-7\n")


class FakeTime:
    """Stands in for the ``time`` module inside jsonlog: a clock the simulation advances."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        return self.now

    def time(self):
        return 1.7e9 + self.now

    strftime = staticmethod(real_time.strftime)


def simulate(path, clock, label, *, level, store_s, restore_s, slots, recompute, stores, restores):
    """One run: set-up, forward sweep storing ``stores`` snapshots, reverse sweep with recomputation."""
    record = {"label": label, "model": "heat", "grid": "64x64", "steps": 20, "schedule": label,
              "levels": [{"name": level, "kind": level, "capacity": slots}], "snapshot_bytes": SNAP}
    log = open_run_log(path, None, record, meter=None, energy_model=MODEL)
    tel = Telemetry(sinks=[log], petsc_events=False)

    def phase(name, seconds, **kw):
        tel.record(name, t0=clock.time(), seconds=seconds, **kw)
        clock.now += seconds

    clock.now += 0.5
    for i in range(20):
        phase("forward", 0.1, step=i, steps=1)
    for i in range(stores):
        phase("store", store_s, step=i, nbytes=SNAP, level=level)
    for i in range(recompute):
        phase("recompute", 0.1, step=i, steps=1)
    for i in range(restores):
        phase("restore", restore_s, step=i, nbytes=SNAP, level=level)
    for i in reversed(range(20)):
        phase("adjoint", 0.2, step=i, steps=1)
    log.close({"levels": {level: {"kind": level, "peak_slots": slots}}})


RUNS = {
    "ram-all": dict(level="ram", store_s=0.01, restore_s=0.01, slots=21, recompute=0, stores=21, restores=20),
    "pfs-all": dict(level="pfs", store_s=0.002, restore_s=0.004, slots=21, recompute=0, stores=21, restores=20),
    "revolve-4": dict(level="ram", store_s=0.01, restore_s=0.01, slots=4, recompute=30, stores=8, restores=12),
    "revolve-4-slow": dict(level="ram", store_s=0.01, restore_s=0.01, slots=4, recompute=40, stores=8,
                           restores=12),
}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    clock = FakeTime()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jsonlog, "time", clock)
        for label, kw in RUNS.items():
            clock.now = 0.0
            simulate(root / label, clock, label, **kw)
    return root


@pytest.fixture
def one_run(sweep, tmp_path):
    target = tmp_path / "ram-all"
    shutil.copytree(sweep / "ram-all", target)
    return target


def by_label(results):
    return {r["label"]: r for r in results}


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


def hpcadj(*args, env=None):
    return run([HPCADJ, *args], timeout=120, env={**os.environ, **(env or {})})


def analyze_cli(*args, env=None):
    """``hpcadj analyze`` in this process: the command's own exit status and lines are checked once
    through :func:`hpcadj` above (a process costs a second of start-up)."""
    return hpcadj_in_process(list(args), env=env)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "model.toml"
    path.write_text(MODEL_TOML)
    return path


def test_cli_markdown_csv_and_plot(sweep, model_file, tmp_path):
    png = tmp_path / "pareto.png"
    proc = hpcadj("analyze", str(sweep), "--energy-model", str(model_file), "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "## Run `revolve-4`" in proc.stdout and "## Comparison" in proc.stdout
    assert "| pfs-all | complete | 1 | pfs-all | 6.622 | 70.32 | model |" in proc.stdout
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 1000 and height >= 500
    proc = analyze_cli("analyze", str(sweep / "ram-all"), str(sweep / "revolve-4"), "--csv",
                       env={"HPCADJ_ENERGY_MODEL": str(model_file)})
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert [r["run"] for r in rows] == ["ram-all", "revolve-4"]
    assert float(rows[1]["recompute_factor"]) == pytest.approx(2.5)
    assert float(rows[0]["energy_J"]) == pytest.approx(69.141)
    proc = analyze_cli("analyze", str(sweep / "revolve-4"), "--csv", "--by-phase")
    phases = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert [(r["phase"], r["level"]) for r in phases] == [
        ("forward", ""), ("recompute", ""), ("adjoint", ""), ("store", "ram"), ("restore", "ram")]


def test_cli_needs_no_mpi(sweep):
    code = ("import sys; from hpcadj.cli import main; rc = main(['analyze', sys.argv[1], '--csv']); "
            "print(sorted(m for m in ('mpi4py', 'petsc4py', 'h5py') if m in sys.modules), file=sys.stderr); "
            "sys.exit(rc)")
    proc = run([PYTHON, "-c", code, str(sweep)], timeout=120)
    assert proc.returncode == 0
    assert proc.stderr.strip() == "[]"


def test_cli_broken_log_warns_and_still_reports(one_run):
    path = one_run / "rank00000.jsonl"
    path.write_text(path.read_text()[:-40])
    proc = analyze_cli("analyze", str(one_run))
    assert proc.returncode == 0
    assert "warning" in proc.stderr and "is truncated" in proc.stderr
    assert "**Problems in this log:**" in proc.stdout


@pytest.mark.parametrize("case", ["absent", "empty", "plot-dir", "model"])
def test_cli_bad_input_exits_2_with_one_line(sweep, tmp_path, case):
    (tmp_path / "empty").mkdir()
    bad_model = tmp_path / "bad.toml"
    bad_model.write_text("watts = 1\n")
    args = {"absent": [str(tmp_path / "absent")],
            "empty": [str(tmp_path / "empty")],
            "plot-dir": [str(sweep), "--plot", str(tmp_path / "no" / "such" / "p.png")],
            "model": [str(sweep), "--energy-model", str(bad_model)]}[case]
    proc = hpcadj("analyze", *args) if case == "absent" else analyze_cli("analyze", *args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("hpcadj: error:")
    assert not (tmp_path / "no").exists()


# --- incomplete and partial runs: shown, flagged, never ranked -------------------------------------

def partial_run(path, clock, label, *, forward=20, recompute=0, adjoint=20, end="close", resumed=False,
                overwrite=False, levels=True):
    """A RAM run cheaper than every complete one in the sweep (0.5 s set-up, few steps)."""
    record = {"label": label, "model": "heat", "grid": "64x64", "steps": 20, "schedule": "revolve",
              "levels": [{"name": "ram", "kind": "ram", "capacity": 4}], "snapshot_bytes": SNAP,
              "resumed": resumed}
    log = open_run_log(path, None, record, meter=None, energy_model=MODEL, overwrite=overwrite)
    tel = Telemetry(sinks=[log], petsc_events=False)
    clock.now += 0.5
    for kind, count, seconds in (("forward", forward, 0.01), ("recompute", recompute, 0.01),
                                 ("adjoint", adjoint, 0.02)):
        for i in range(count):
            tel.record(kind, t0=clock.time(), seconds=seconds, step=i, steps=1)
            clock.now += seconds
    result = {"levels": {"ram": {"kind": "ram", "peak_slots": 1}}} if levels else {}
    if end == "close":
        log.close(result)
    elif end in ("stopped", "failed"):
        log.close({"status": end})
    elif end == "abort":
        log.abort("LevelError: ram: all 4 slots are full")
    return log


@pytest.fixture(scope="module")
def mixed(sweep, tmp_path_factory):
    """The complete sweep plus a resumed fragment (over the stopped part before it), a run missing a
    rank's log, a failed (aborted) run, a stopped run and a killed one (no end record)."""
    root = tmp_path_factory.mktemp("mixed")
    for label in RUNS:
        shutil.copytree(sweep / label, root / label)
    clock = FakeTime()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jsonlog, "time", clock)
        first = partial_run(root / "fragment", clock, "fragment", adjoint=12, end="stopped")
        clock.now = 0.0
        partial_run(root / "fragment", clock, "fragment", forward=0, recompute=3, adjoint=8,
                    resumed=True, overwrite=True)
        clock.now = 0.0
        partial_run(root / "half-ranks", clock, "half-ranks")
        clock.now = 0.0
        partial_run(root / "failed", clock, "failed", adjoint=5, end="abort")
        clock.now = 0.0
        partial_run(root / "stopped", clock, "stopped", adjoint=5, end="stopped")
        clock.now = 0.0
        partial_run(root / "killed", clock, "killed")
    # half-ranks: a 2-rank run whose rank 1 log was lost (its totals hold half the phases)
    for name in ("run.json", "summary.json"):
        data = json.loads((root / "half-ranks" / name).read_text())
        data["ranks"] = 2
        (root / "half-ranks" / name).write_text(json.dumps(data))
    # killed: the end record and the summary never written
    rank0 = root / "killed" / "rank00000.jsonl"
    rank0.write_text("".join(rank0.read_text().splitlines(keepends=True)[:-1]))
    (root / "killed" / "summary.json").unlink()
    return root, first.run_id


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


def test_cli_csv_and_plot_with_incomplete_runs(mixed, model_file, tmp_path):
    root, _ = mixed
    proc = analyze_cli("analyze", str(root), "--csv", "--energy-model", str(model_file))
    assert proc.returncode == 0, proc.stderr
    rows = {r["run"]: r for r in csv.DictReader(io.StringIO(proc.stdout))}
    assert rows["half-ranks"]["status"] == "missing-rank-logs" and rows["half-ranks"]["ranked"] == "False"
    assert [k for k, r in rows.items() if r["time_optimal"] == "True"] == ["pfs-all"]
    assert {r["memory_metric"] for r in rows.values()} == {"checkpoint peak, all levels"}
    png = tmp_path / "p.png"
    proc = analyze_cli("analyze", str(root), "--plot", str(png), "--json", "--energy-model", str(model_file))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert {c["run"]: c["status"] for c in data["comparison"]}["killed"] == "unfinished"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resumed_run_covering_every_step_is_complete(tmp_path):
    """--resume that found nothing durable restarts from step 0: its log is a whole run."""
    clock = FakeTime()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jsonlog, "time", clock)
        partial_run(tmp_path / "r", clock, "r", resumed=True)
    result = analyze([tmp_path / "r"], model=MODEL)[0]
    assert result["status"] == "complete"


def test_real_resumed_run_is_a_fragment(tmp_path):
    """A real run killed in its reverse sweep and resumed into the same --log-dir: analyze flags it."""
    from ..helpers import hpcadj as run_hpcadj

    args = ["run", "--grid", "12x12", "--steps", "30", "--ram", "5", "--schedule", "revolve", "--run-dir",
            str(tmp_path / "rd"), "--log-dir", str(tmp_path / "logs"), "--durable-every", "2", "--quiet"]
    killed = run_hpcadj(args, timeout=120, env={"HPCADJ_INJECT_KILL": "0:50"})
    assert killed.returncode == -9, killed.stderr
    first_id = json.loads((tmp_path / "logs" / "run.json").read_text())["run_id"]
    resumed = hpcadj_in_process([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    full = hpcadj_in_process(args[:9] + ["--log-dir", str(tmp_path / "full"), "--quiet"])
    assert full.returncode == 0, full.stderr
    results = by_label(analyze([tmp_path / "logs", tmp_path / "full"]))
    fragment = results["logs"]
    assert fragment["status"] == "resumed-fragment", fragment["status_detail"]
    assert 0 < fragment["adjoint_steps"] < 30
    assert first_id in " ".join(fragment["status_detail"])
    assert results["full"]["status"] == "complete"
    rows = {c["run"]: c for c in compare(list(results.values()))}
    assert not rows["logs"]["ranked"] and rows["full"]["time_optimal"]
