"""The ``hpcadj analyze`` command on the fake-clock logs of tests/analyze_logs.py (markdown, CSV, plot,
bad input, no MPI needed) and on a real killed-and-resumed run. The analysis alone:
tests/unit/test_analyze.py."""

import csv
import io
import json
import os
import struct

import pytest

from hpcadj.telemetry.analyze import analyze, compare

from ..analyze_logs import MODEL_TOML, by_label
from ..analyze_logs import mixed_fixture, one_run_fixture, sweep_fixture  # noqa: F401 (fixtures)
from ..helpers import HPCADJ, PYTHON, hpcadj_in_process, run


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
