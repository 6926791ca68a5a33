"""The contract checker's working-set property (one process: RSS is per process); the human output
of ``hpcadj check``: tests/cli/test_cli_check.py."""


import pytest

from hpcadj.models.base import Stepper
from tests.mpi.ranks.contract_models import Greedy, Reaction

pytestmark = pytest.mark.timeout(300)

#: 640 x 640 doubles: 3.1 MiB a state, large enough for RSS to resolve a few states
BIG = (640, 640)


@pytest.fixture(scope="module")
def comm():
    from hpcadj.imports import mpi, petsc

    petsc()
    return mpi().COMM_WORLD


class Default(Reaction):
    """Declares nothing: the contract's default of 32 states."""

    working_set_states = Stepper.working_set_states


def test_an_under_declared_working_set_fails(comm):
    from hpcadj.adjoint.contract import check_contract

    report = check_contract(Greedy(comm, grid=BIG, n_steps=2), steps=1, factory=lambda: Greedy(comm, grid=BIG))
    ws = report["working_set"]
    assert ws.status == "FAILED", ws.reason
    assert "under" in ws.reason
    assert ws.details["measured_states"] > 30 and ws.details["declared_states"] == 0.5


def test_an_honest_working_set_passes_and_the_default_is_flagged(comm):
    from hpcadj.adjoint.contract import check_contract

    honest = check_contract(Reaction(comm, grid=BIG, n_steps=2), steps=1,
                            factory=lambda: Reaction(comm, grid=BIG))
    assert honest["working_set"].status == "PASSED", honest["working_set"].reason
    default = check_contract(Default(comm, grid=BIG, n_steps=2), steps=1, factory=lambda: Default(comm, grid=BIG))
    assert default["working_set"].status == "WARNING", default["working_set"].reason
    assert "over" in default["working_set"].reason
    assert default.passed  # over-declaring is safe: it only leaves RAM slots unused


def test_a_tiny_state_is_a_warning_that_says_so(comm):
    from hpcadj.adjoint.contract import check_contract

    report = check_contract(Greedy(comm, grid=(12, 10)), steps=1)
    ws = report["working_set"]
    assert ws.status == "WARNING" and "too small" in ws.reason, ws.reason
