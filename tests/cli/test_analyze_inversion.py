"""``hpcadj analyze`` on an inversion's log (``hpcadj invert --log-dir``): the convergence table's
numbers are the JSON lines' (joules modeled at 10 W per core: 10 x seconds x ranks), the CSV holds
them at full precision, the plot is a PNG; a broken log is analysed as far as it goes with warnings,
and bad input is one line with exit status 2 and no file left behind."""

import csv
import io
import json
import math
import os
import shutil
import signal

import pytest

from ..helpers import hpcadj_in_process

WATTS = 10.0


@pytest.fixture(scope="module")
def inversion_log(tmp_path_factory):
    """One real inversion (heat 12x10, 8 steps, revolve on 3 RAM slots, Armijo, 4 iterates) logged,
    and an energy model file of 10 W per core."""
    root = tmp_path_factory.mktemp("inv")
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        result = hpcadj_in_process(["invert", "--grid", "12x10", "--steps", "8", "--dt", "2e-3", "--invert",
                                    "kappa", "--bounds", "kappa:0.5:3", "--max-it", "4", "--ram", "3",
                                    "--schedule", "revolve", "--log-dir", str(root / "log"),
                                    "-tao_ls_type", "armijo"])
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert result.returncode == 0, result.stderr
    model = root / "model.toml"
    model.write_text(f"watts_per_core = {WATTS}\n")
    with open(root / "log" / "inversion.jsonl") as fh:
        records = [json.loads(line) for line in fh]
    assert [r["iteration"] for r in records] == [0, 1, 2, 3, 4]
    return root, records


def analyze(*args):
    return hpcadj_in_process(["analyze", *map(str, args)])


def table(markdown: str) -> list[dict]:
    """The convergence table's rows as {header: cell}."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def close(cell: str, value: float, rel: float) -> bool:
    return math.isclose(float(cell), value, rel_tol=rel, abs_tol=1e-300)


def test_table_numbers_are_the_logged_ones(inversion_log):
    root, records = inversion_log
    result = analyze(root / "log", "--energy-model", root / "model.toml")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    rows = table(result.stdout)
    assert [int(r["iterate"]) for r in rows] == [0, 1, 2, 3, 4]
    wall = energy = 0.0
    for row, rec in zip(rows, records):
        for key, column in (("J", "J"), ("misfit", "misfit"), ("grad_norm", "‖g‖")):
            assert close(row[column], rec[key], 1e-6), (column, row[column], rec[key])
        assert float(row["regularisation"]) == rec["regularization"] == 0.0
        assert close(row["step"], rec["step"], 1e-3)
        assert int(row["forward steps"]) == rec["forward_steps"]
        assert int(row["adjoint steps"]) == rec["adjoint_steps"]
        assert int(row["naive-loop forward steps"]) == rec["naive_forward_steps"]
        wall += rec["seconds"]
        energy += WATTS * rec["seconds"] * rec["ranks"]
        assert close(row["seconds"], rec["seconds"], 1e-3)
        assert close(row["cumulative s"], wall, 1e-3)
        assert close(row["joules (model)"], WATTS * rec["seconds"], 1e-3)
        assert close(row["cumulative J"], energy, 1e-3)
        assert close(row["peak RSS MiB"], rec["max_rss_bytes"] / 2**20, 1e-3)
    misfits = [r["misfit"] for r in records]
    assert misfits[-1] < misfits[0]
    later = [r["forward_steps"] for r in records[1:]]
    assert f"reduced {misfits[0] / misfits[-1]:.4g}×" in result.stdout
    assert f"{sum(later) / len(later):.4g} per iteration after the start" in result.stdout


def test_csv_holds_every_number_exactly(inversion_log):
    root, records = inversion_log
    result = analyze(root / "log", "--csv")
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == len(records)
    for row, rec in zip(rows, records):
        for key in ("J", "misfit", "grad_norm", "step", "seconds"):
            assert float(row[key]) == rec[key]
        assert int(row["forward_steps"]) == rec["forward_steps"] and row["energy_source"] == "model"


def test_json_totals(inversion_log):
    root, records = inversion_log
    result = analyze(root / "log", "--json")
    assert result.returncode == 0, result.stderr
    (inv,) = json.loads(result.stdout)["inversions"]
    assert inv["forward_steps"] == sum(r["forward_steps"] for r in records)
    assert inv["naive_forward_steps"] == sum(r["naive_forward_steps"] for r in records)
    assert inv["wall_seconds"] == pytest.approx(sum(r["seconds"] for r in records), rel=1e-12)
    assert inv["misfit_monotone"] is all(b <= a for a, b in zip([r["misfit"] for r in records],
                                                                 [r["misfit"] for r in records[1:]]))


def test_plot_is_a_png(inversion_log, tmp_path):
    root, _ = inversion_log
    out = tmp_path / "misfit.png"
    result = analyze(root / "log", "--plot", out)
    assert result.returncode == 0, result.stderr
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(data) < 200_000
    assert os.listdir(tmp_path) == ["misfit.png"]


def test_a_directory_of_inversions_and_a_broken_log(inversion_log, tmp_path):
    """Two inversions under one directory: a section each; the second's log is truncated mid-line and
    repeats an iterate: warnings on stderr, the rest analysed, the later record kept."""
    root, records = inversion_log
    shutil.copytree(root / "log", tmp_path / "a")
    (tmp_path / "b").mkdir()
    lines = [json.dumps(r) for r in records[:3]]
    again = dict(records[2], J=records[2]["J"] / 2, misfit=records[2]["misfit"] / 2)
    (tmp_path / "b" / "inversion.jsonl").write_text("\n".join(lines + [json.dumps(again)]) + "\n" + lines[0][:20])
    result = analyze(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "## Inversion `a`" in result.stdout and "## Inversion `b`" in result.stdout
    warnings = result.stderr.strip().splitlines()
    assert len(warnings) == 2 and all(w.startswith("hpcadj analyze: warning: ") for w in warnings)
    assert "line 5 is truncated" in result.stderr and "iterate 2 logged again at line 4" in result.stderr
    section_b = result.stdout.split("## Inversion `b`")[1]
    rows = table(section_b)
    assert [int(r["iterate"]) for r in rows] == [0, 1, 2]
    assert close(rows[2]["J"], again["J"], 1e-6)


def test_bad_input_is_one_line_and_exit_2(inversion_log, tmp_path):
    root, _ = inversion_log
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "inversion.jsonl").write_text("")
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "inversion.jsonl").write_text('{"iteration": "x"}\nnot json\n')
    runlog = tmp_path / "runlog"
    runlog.mkdir()
    (runlog / "run.json").write_text("{}")
    cases = [
        ([empty], "no accepted iterate logged"),
        ([garbage], "no accepted iterate logged"),
        ([root / "log", runlog], "analyze inversion logs and run logs separately"),
        ([root / "log", "--csv", "--by-phase"], "--by-phase: not for an inversion's log"),
        ([root / "log", "--sacct"], "--sacct: not for an inversion's log"),
        ([root / "log", "--plot", tmp_path / "nowhere" / "p.png"], "does not exist"),
    ]
    before = sorted(os.listdir(tmp_path))
    for args, message in cases:
        result = analyze(*args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert result.stdout == ""
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr, (args, result.stderr)
    assert sorted(os.listdir(tmp_path)) == before
    assert (empty / "inversion.jsonl").read_text() == ""
