"""Error lines and labels of the command line: no doubled prefix, runs told apart by their paths,
and every malformed --observations file named in one line (exit 2), never a traceback."""

from __future__ import annotations

import json

import numpy as np
import pytest

from .test_model_spec import invoke, one_error



def test_argument_errors_carry_one_prefix():
    line = one_error(["run", "--dt", "x"])
    assert line == "hpcadj: error: run: argument --dt: expected a number, got 'x'", line
    line = one_error(["plan", "--steps", "2.5", "--ram", "2"])
    assert line.startswith("hpcadj: error: plan: argument --steps:") and "hpcadj plan" not in line, line
    assert one_error(["--no-such-flag"]).startswith("hpcadj: error: ")


def test_analyze_labels_runs_by_their_shortest_distinct_path(tmp_path):
    for name in ("a", "b"):
        rc, _, err = invoke(["run", "--grid", "8x8", "--steps", "3", "--quiet", "--log-dir",
                             tmp_path / name / "logs"])
        assert rc == 0, err
    rc, out, err = invoke(["analyze", tmp_path / "a" / "logs", tmp_path / "b" / "logs", "--json"])
    assert rc == 0, err
    assert sorted(r["label"] for r in json.loads(out)["runs"]) == ["a/logs", "b/logs"]
    rc, out, err = invoke(["analyze", tmp_path / "a" / "logs", "--markdown"])
    assert rc == 0 and "Run `logs`" in out, out


def _observations(path, steps, u=None, u_group=False):
    from hpcadj.imports import h5py

    with h5py().File(path, "w") as f:
        f["steps"] = steps
        if u_group:
            f.create_group("u")
        else:
            f["u"] = u


@pytest.mark.parametrize("case,expected", [
    ("scalar u", "'u' must have shape (k, [nz,] ny, nx)"),
    ("group u", "'u' is a group, not a dataset"),
    ("fractional step", "'steps' must hold whole numbers, got 2.7"),
    ("NaN", "'u' holds NaN or infinite values (state 0, step 4)"),
    ("strings", "'u' must hold numbers"),
    ("string steps", "'steps' must hold whole numbers"),
])
def test_a_malformed_observations_file_is_one_line_naming_it(tmp_path, case, expected):
    path = tmp_path / f"{case.replace(' ', '_')}.h5"
    good = np.zeros((1, 8, 8))
    nan = good.copy()
    nan[0, 3, 3] = np.nan
    args = {"scalar u": ([4], 1.5), "group u": ([4], None, True), "fractional step": ([2.7], good),
            "NaN": ([4], nan), "strings": ([4], np.array([[[b"x"] * 8] * 8])),
            "string steps": (np.array([b"4"]), good)}[case]
    _observations(path, *args)
    line = one_error(["run", "--model", "heat", "--grid", "8x8", "--steps", "4", "--observations", path])
    assert str(path) in line and expected in line, line


def test_whole_float_steps_are_accepted(tmp_path):
    path = tmp_path / "obs.h5"
    _observations(path, np.array([2.0, 4.0]), np.ones((2, 8, 8)))
    rc, out, err = invoke(["run", "--model", "heat", "--grid", "8x8", "--steps", "4", "--observations", path,
                           "--json", "--quiet"])
    assert rc == 0 and json.loads(out)["J"] > 0, err


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    """``hpcadj plan --actions | head -1``: no BrokenPipeError traceback, as Unix tools do."""
    import subprocess

    from ..helpers import HPCADJ, mpi_env

    proc = subprocess.Popen([HPCADJ, "plan", "--steps", "20000", "--ram", "5", "--actions"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=mpi_env())
    first = proc.stdout.readline()
    proc.stdout.close()  # the reader leaves, as head -1 does
    err = proc.stderr.read().decode()
    status = proc.wait(timeout=300)
    assert first.startswith(b"Store(") and err == "" and status == 141, (first, status, err)
