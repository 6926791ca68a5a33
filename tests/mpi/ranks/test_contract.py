"""The Stepper contract checker on every rank: a model that keeps the contract passes every property,
each broken model fails the property it breaks, and every rank holds the same report."""

import contextlib
import io
import json

import pytest
from mpi4py import MPI  # noqa: F401  (MPI before the comm fixture starts PETSc)

from contract_models import (Blows, CachedGuess, Counter, LosesField, Reaction, SameDescribe, ScalesInput, TwoSpecies,
                             WrongParameterAdjoint)
from hpcadj.adjoint.contract import PROPERTIES, check_contract

pytestmark = pytest.mark.timeout(300)

KEPT = ("step_pure", "inputs_untouched", "snapshot_round_trip", "adjoint_transpose")


def same_everywhere(comm, report):
    text = json.dumps(report.as_dict(), sort_keys=True)
    assert len(set(comm.allgather(text))) == 1, "ranks hold different reports"


@pytest.mark.parametrize("cls", [Reaction, TwoSpecies])
def test_a_model_that_keeps_the_contract_passes(comm, cls):
    report = check_contract(cls(comm), steps=3, variant=lambda: cls(comm, rate=3.0))
    same_everywhere(comm, report)
    assert [p.name for p in report.properties] == list(PROPERTIES)
    for name in KEPT + ("describe",):
        assert report[name].status == "PASSED", (name, report[name].reason)
    # a 12x10 state is far below what RSS can resolve: never a failure, and it says why
    assert report["working_set"].status in ("PASSED", "WARNING"), report["working_set"].reason
    assert report.passed


@pytest.mark.parametrize("cls, broken", [
    (ScalesInput, "inputs_untouched"),
    (Counter, "step_pure"),
    (CachedGuess, "step_pure"),
    (WrongParameterAdjoint, "adjoint_transpose"),
    (LosesField, "snapshot_round_trip"),
])
def test_each_broken_model_fails_what_it_breaks(comm, cls, broken):
    report = check_contract(cls(comm), steps=3)
    same_everywhere(comm, report)
    assert report[broken].status == "FAILED"
    assert report[broken].reason
    assert not report.passed


def test_the_wrong_parameter_adjoint_is_named(comm):
    report = check_contract(WrongParameterAdjoint(comm), steps=2)
    assert "'a'" in report["adjoint_transpose"].reason
    assert report["step_pure"].status == "PASSED"


def test_describe_needs_a_second_configuration(comm):
    unchecked = check_contract(Reaction(comm), steps=2)
    assert unchecked["describe"].status == "NOT CHECKED"
    assert unchecked.passed
    same = check_contract(SameDescribe(comm), steps=2, variant=SameDescribe(comm, rate=3.0))
    assert same["describe"].status == "FAILED"
    assert not same.passed


def cli(argv):
    from hpcadj.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    return rc, out.getvalue()


def test_check_command_json(comm):
    rc, out = cli(["check", "--model", "heat", "--grid", "10x8", "--steps", "4", "--check-steps", "2",
                   "--vary", "--dt 2e-4", "--json"])
    assert rc == 0
    if comm.rank == 0:
        info = json.loads(out)
        assert info["passed"] is True and info["ranks"] == comm.size
        assert {name: p["status"] for name, p in info["properties"].items() if name != "working_set"} == \
            {name: "NOT CHECKED" if name in ("adjoint_difference", "advance", "adjoint_data") else "PASSED"  # heat: no advance
             for name in PROPERTIES if name != "working_set"}
    else:
        assert out == ""


@pytest.mark.parametrize("argv", [["--check-steps", "0"], ["--vary", "--no-such-option 3"],
                                  ["--vary", "--grid"]])
def test_check_command_bad_input_exits_2(comm, argv):
    rc, out = cli(["check", "--model", "heat", "--grid", "10x8", *argv])
    assert rc == 2 and out == ""


def test_a_state_that_overflows_is_named(comm):
    report = check_contract(Blows(comm), steps=4)
    same_everywhere(comm, report)
    assert report["step_pure"].status == "FAILED" and "u_3" in report["step_pure"].reason
    assert report["adjoint_transpose"].status == "NOT CHECKED"
    assert not report.passed
