"""A negative budget is one line naming the option ("must be positive"), however it is written; and
``predicted_s`` in ``run --json`` / ``plan --json`` is seconds or null: a prediction from the default
(relative) costs is ``predicted_relative``, in units of a default forward step."""

import json

import pytest

from ..helpers import hpcadj_in_process

RUN = ["run", "--model", "heat", "--grid", "8x8", "--steps", "4", "--quiet"]


@pytest.mark.parametrize("args,flag", [(["--memory", "-1GiB"], "--memory"), (["--memory=-1GiB"], "--memory"),
                                       (["--memory", "-3"], "--memory"), (["--ram", "-3"], "--ram"),
                                       (["--ram=-2GiB"], "--ram"), (["--disk", "-1.5GiB"], "--disk")])
def test_a_negative_budget_is_one_line_naming_the_option(args, flag):
    proc = hpcadj_in_process([*RUN, *args])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and proc.stdout == "", (proc.returncode, proc.stderr)
    assert lines[0].startswith(f"hpcadj: error: {flag}") and "must be positive" in lines[0], lines[0]
    assert "expected one argument" not in lines[0] and "is not slots" not in lines[0], lines[0]


def test_a_negative_plan_budget_is_one_line_too():
    proc = hpcadj_in_process(["plan", "--steps", "10", "--ram", "-4"])
    assert proc.returncode == 2 and "--ram" in proc.stderr and "must be positive" in proc.stderr, proc.stderr


def test_predicted_s_is_seconds_or_null(tmp_path):
    default = json.loads(hpcadj_in_process(["plan", "--steps", "100", "--ram", "5", "--json"]).stdout)
    assert default["predicted_s"] is None and default["predicted_relative"] > 100, default
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"forward_s": 0.5, "adjoint_s": 1.0,
                                 "levels": [{"name": "ram", "write_s": 0.005, "read_s": 0.005}]}))
    measured = json.loads(hpcadj_in_process(["plan", "--steps", "100", "--ram", "5", "--json",
                                             "--costs", str(costs)]).stdout)
    assert measured["predicted_relative"] is None
    assert measured["predicted_s"] == pytest.approx(0.5 * default["predicted_relative"]), (measured, default)
    run = json.loads(hpcadj_in_process([*RUN, "--ram", "2", "--json"]).stdout)
    assert run["costs_source"] == "model" and run["predicted_s"] is None and run["predicted_relative"] > 4, run
    timed = json.loads(hpcadj_in_process([*RUN, "--ram", "2", "--json", "--costs", str(costs)]).stdout)
    assert timed["predicted_relative"] is None and timed["predicted_s"] > 0, timed
