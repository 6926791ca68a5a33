"""Run logs written by the real Telemetry through RunLog (one process), and the progress bars."""

import io
import json
import os
import threading

import pytest

from hpcadj.telemetry import Telemetry, open_run_log
from hpcadj.telemetry.energy import EnergyMeter
from hpcadj.telemetry.energy_model import EnergyModel
from hpcadj.telemetry.jsonlog import LogDirError
from hpcadj.telemetry.progress import SweepProgress, progress_enabled

MODEL = EnergyModel(watts_per_core=10.0, joules_per_byte_write={"ram": 1e-6}, joules_per_byte_read={"ram": 1e-6})
RECORD = {"argv": ["hpcadj", "run"], "model": "heat", "steps": 4, "schedule": "revolve",
          "levels": [{"name": "ram", "kind": "ram", "capacity": 2}], "snapshot_bytes": 1000}


def lines(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh]


def test_events_carry_every_field(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    log = open_run_log(tmp_path / "run", None, RECORD, meter=None, energy_model=MODEL)
    tel = Telemetry(sinks=[log], petsc_events=False)
    tel.record("forward", t0=1700000000.25, seconds=0.5, step=0, steps=3)
    tel.record("store", t0=1700000001.0, seconds=0.125, step=3, nbytes=1000, level="ram")
    with tel.phase("adjoint", step=2, steps=1):
        pass
    log.close({"J": 1.5})
    records = lines(tmp_path / "run" / "rank00000.jsonl")
    assert [r["type"] for r in records] == ["header", "event", "event", "event", "end"]
    first = records[1]
    assert first["time"] == "2023-11-14T22:13:20.250000+00:00"
    assert (first["phase"], first["step"], first["steps"], first["seconds"], first["bytes"], first["level"]) \
        == ("forward", 0, 3, 0.5, 0, None)
    assert first["job_id"] == "777" and first["rank"] == 0 and first["host"] == os.uname().nodename
    assert records[2]["level"] == "ram" and records[2]["bytes"] == 1000
    run_ids = {r["run_id"] for r in records}
    assert len(run_ids) == 1
    monos = [r["mono"] for r in records[1:4]]
    assert monos == sorted(monos) and monos[0] >= 0
    assert records[-1]["events"] == 3
    run = json.load(open(tmp_path / "run" / "run.json"))
    assert run["record"] == RECORD and run["run_id"] in run_ids and run["ranks"] == 1
    assert run["job_id"] == "777" and run["versions"]["hpcadj"]


def test_summary_totals_and_modeled_energy(tmp_path):
    log = open_run_log(tmp_path / "run", None, RECORD, meter=None, energy_model=MODEL)
    tel = Telemetry(sinks=[log], petsc_events=False)
    forward = [0.25, 0.5, 0.125]
    for i, s in enumerate(forward):
        tel.record("forward", t0=0.0, seconds=s, step=i, steps=1)
    tel.record("store", t0=0.0, seconds=0.5, step=0, nbytes=1_000_000, level="ram")
    tel.record("store", t0=0.0, seconds=0.25, step=2, nbytes=1_000_000, level="ram")
    summary = log.close({"levels": {"ram": {"kind": "ram", "peak_slots": 2}}})
    on_disk = json.load(open(tmp_path / "run" / "summary.json"))
    assert on_disk == summary
    rows = {(r["phase"], r["level"]): r for r in summary["phases"]}
    assert rows[("forward", None)]["seconds_sum"] == pytest.approx(sum(forward))
    assert rows[("forward", None)]["steps"] == 3 and rows[("forward", None)]["count"] == 3
    assert rows[("store", "ram")]["bytes"] == 2_000_000
    by_phase = {(r["phase"], r["level"]): r["joules"] for r in summary["energy"]["model"]["by_phase"]}
    assert by_phase[("forward", None)] == pytest.approx(8.75)          # 0.875 s x 10 W
    assert by_phase[("store", "ram")] == pytest.approx(7.5 + 2.0)      # 0.75 s x 10 W + 2e6 B x 1e-6 J/B
    assert summary["energy"]["total"]["source"] == "model"
    assert summary["energy"]["total"]["joules"] == pytest.approx(summary["energy"]["model"]["joules"])
    assert summary["result"]["levels"]["ram"]["peak_slots"] == 2
    assert summary["peak_rss_bytes"]["max"] > 1_000_000


def test_measured_energy_from_powercap(tmp_path):
    zone = tmp_path / "powercap" / "intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "name").write_text("package-0\n")
    (zone / "energy_uj").write_text("1000\n")
    (zone / "max_energy_range_uj").write_text("262143328850\n")
    meter = EnergyMeter(None, str(tmp_path / "powercap"), nvml=False, interval_s=None)
    log = open_run_log(tmp_path / "run", None, RECORD, meter=meter, energy_model=MODEL)
    Telemetry(sinks=[log], petsc_events=False).record("forward", t0=0.0, seconds=0.1, steps=1)
    (zone / "energy_uj").write_text("3501000\n")
    summary = log.close()
    assert summary["energy"]["total"] == {"source": "rapl", "joules": pytest.approx(3.5)}
    assert summary["energy"]["measured"]["rapl"]["domains"] == {"package": pytest.approx(3.5)}
    assert summary["energy"]["model"]["source"] == "model"


def test_abort_ends_the_rank_file_with_the_error(tmp_path):
    from hpcadj.telemetry.analyze import load_run

    log = open_run_log(tmp_path / "run", None, RECORD, meter=None)
    Telemetry(sinks=[log], petsc_events=False).record("forward", t0=0.0, seconds=0.1, steps=1)
    log.abort("LevelError: ram: all 2 slots are full")
    log.abort("second call is a no-op")
    with pytest.warns(RuntimeWarning, match="after the run log was closed"):
        log({"phase": "store", "t0": 0.0, "seconds": 0.1, "bytes": 8, "level": "ram"})
    assert log.dropped == 1
    assert lines(tmp_path / "run" / "rank00000.jsonl")[-1]["error"] == "LevelError: ram: all 2 slots are full"
    problems = load_run(tmp_path / "run").problems
    assert "rank00000.jsonl: rank 0 aborted after 1 events: LevelError: ram: all 2 slots are full" in problems
    assert any("summary.json missing" in p for p in problems)


def test_unwritable_log_dir_is_detected_up_front(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(LogDirError, match="not writable|not a directory"):
        open_run_log(blocker / "logs", None, RECORD, meter=None)
    with pytest.raises(LogDirError, match="not a directory"):
        open_run_log(blocker, None, RECORD, meter=None)


def test_existing_run_is_not_mixed_in(tmp_path):
    open_run_log(tmp_path / "run", None, RECORD, meter=None).close()
    with pytest.raises(LogDirError, match="already holds a run"):
        open_run_log(tmp_path / "run", None, RECORD, meter=None)
    log = open_run_log(tmp_path / "run", None, RECORD, meter=None, overwrite=True)
    log.close()
    assert len(lines(tmp_path / "run" / "rank00000.jsonl")) == 2


def test_with_petsc_log_events(tmp_path):
    """The driver's default Telemetry also opens PETSc.Log events; the sink sees the same phases."""
    from hpcadj.imports import petsc

    PETSc = petsc()
    PETSc.Log.begin()
    before = PETSc.Log.Event("hpcadj:forward").getPerfInfo()["count"]
    log = open_run_log(tmp_path / "run", None, RECORD, meter=None)
    tel = Telemetry(sinks=[log])
    with tel.phase("forward", step=0, steps=2):
        pass
    log.close()
    assert PETSc.Log.Event("hpcadj:forward").getPerfInfo()["count"] == before + 1
    assert [r.get("phase") for r in lines(tmp_path / "run" / "rank00000.jsonl")][1] == "forward"


def test_events_from_two_threads_are_whole_lines(tmp_path):
    log = open_run_log(tmp_path / "run", None, RECORD, meter=None)
    tel = Telemetry(sinks=[log], petsc_events=False)

    def io_thread():
        for i in range(300):
            tel.record("store", t0=0.0, seconds=1e-4, step=i, nbytes=64, level="ram")

    thread = threading.Thread(target=io_thread)
    thread.start()
    for i in range(300):
        log({"phase": "forward", "t0": 0.0, "seconds": 1e-4, "step": i, "steps": 1, "bytes": 0, "level": None})
    thread.join()
    summary = log.close()
    records = lines(tmp_path / "run" / "rank00000.jsonl")
    assert sum(r["type"] == "event" for r in records) == 600
    assert {r["phase"]: r["count"] for r in summary["phases"]} == {"forward": 300, "store": 300}


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_bars_only_on_a_terminal():
    assert not progress_enabled(0, False, io.StringIO())
    assert not progress_enabled(1, False, Tty())
    assert not progress_enabled(0, True, Tty())
    plain = io.StringIO()
    silent = SweepProgress(10, stream=plain, interval=3600)   # not a terminal: lines (tests/cli/test_progress.py)
    silent({"phase": "forward", "steps": 10})
    assert silent._forward is None and silent.mode == "lines" and plain.getvalue() == ""
    stream = Tty()
    bar = SweepProgress(10, stream=stream)
    tel = Telemetry(sinks=[bar], petsc_events=False)
    tel.record("forward", t0=0.0, seconds=0.1, step=0, steps=10)
    tel.record("recompute", t0=0.0, seconds=0.1, step=0, steps=4)
    for i in reversed(range(10)):
        tel.record("adjoint", t0=0.0, seconds=0.1, step=i, steps=1)
    bar.close()
    text = stream.getvalue()
    assert "forward" in text and "10/10" in text
    assert "reverse" in text and "recomputed=4" in text
