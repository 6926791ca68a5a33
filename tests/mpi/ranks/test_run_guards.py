"""The driver's guards in real runs on every rank: a step that changes its input, and a non-finite
state, lambda or gradient, end the run alike on every rank with one line naming the step; heat at an
absurd --dt exits 2 with no gradient file instead of reporting a zero gradient."""

import contextlib
import io
import os

import numpy as np
import pytest
from mpi4py import MPI  # noqa: F401  (MPI before the comm fixture starts PETSc)

from contract_models import Blows, NanAdjoint, Reaction, ScalesInput
from hpcadj.adjoint.driver import Driver
from hpcadj.adjoint.guards import InputModified, NonFinite
from hpcadj.adjoint.session import Checkpointing, GradientSession
from hpcadj.models.base import SolverError

pytestmark = pytest.mark.timeout(300)


def agreed(comm, text):
    assert len(set(comm.allgather(text))) == 1, "ranks raised different errors"


def test_a_step_that_scales_its_input_stops_the_run(comm):
    with pytest.raises(InputModified) as caught:
        GradientSession(ScalesInput(comm)).solve()
    message = str(caught.value)
    agreed(comm, message)
    assert "step 0" in message and "input" in message
    assert isinstance(caught.value, SolverError)  # the command line's one line, exit 2


@pytest.mark.parametrize("options", [None, Checkpointing(ram=2, schedule="revolve")])
def test_a_kept_contract_still_completes(comm, options):
    model = Reaction(comm, n_steps=8)
    controls = model.default_controls()
    outcome = GradientSession(model, options, controls=controls).solve()
    assert outcome.status == "complete"
    assert np.isfinite(outcome.result.J)


@pytest.fixture
def every_step(monkeypatch):
    """States and lambdas checked at every step, so the step a value turned non-finite is named."""
    monkeypatch.setattr(Driver, "FINITE_EVERY", 1)


def test_an_infinite_state_names_its_step(comm, every_step):
    model = Blows(comm, n_steps=12)
    model.bad = 6
    with pytest.raises(NonFinite) as caught:
        GradientSession(model).solve()
    message = str(caught.value)
    agreed(comm, message)
    assert "u_6" in message and "step 5" in message and "forward" in message


def test_an_infinite_state_between_checks_is_caught_with_its_range(comm):
    model = Blows(comm, n_steps=20)
    model.bad = 5  # past the checksummed first steps, before the check of u_8
    with pytest.raises(NonFinite) as caught:
        GradientSession(model, Checkpointing(ram=3, schedule="revolve")).solve()
    message = str(caught.value)
    agreed(comm, message)
    assert "u_8" in message and "u_3 was the last checked finite" in message


def test_a_nan_lambda_names_its_adjoint_step(comm, every_step):
    with pytest.raises(NonFinite) as caught:
        GradientSession(NanAdjoint(comm, n_steps=6), Checkpointing(ram=2, schedule="revolve")).solve()
    message = str(caught.value)
    agreed(comm, message)
    assert "lambda_2" in message and "adjoint step 2" in message


def test_a_nan_lambda_between_checks_is_caught_at_lambda_0(comm):
    with pytest.raises(NonFinite) as caught:
        GradientSession(NanAdjoint(comm, n_steps=6), Checkpointing(ram=2, schedule="revolve")).solve()
    message = str(caught.value)
    agreed(comm, message)
    assert "lambda_0" in message and "lambda_6 was the last checked finite" in message


@pytest.mark.parametrize("dt", ["1e160", "1e200", "1e300"])
def test_heat_at_an_absurd_dt_exits_2_without_a_gradient(comm, shared_tmp, capfd, dt):
    from hpcadj.cli import main

    out = os.path.join(shared_tmp, f"grad-{dt}.h5")
    with contextlib.redirect_stdout(io.StringIO()) as stdout:
        rc = main(["run", "--model", "heat", "--grid", "12x10", "--steps", "4", "--dt", dt, "--quiet",
                   "--gradient-out", out])
    err = capfd.readouterr().err
    assert rc == 2
    assert stdout.getvalue() == ""
    assert not os.path.exists(out)
    if comm.rank == 0:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("hpcadj: error:"), err
        assert "step" in lines[0]


def test_a_non_finite_initial_state_is_named(comm):
    model = Reaction(comm, n_steps=4)
    controls = model.default_controls()
    block = controls["u0"].getArray()  # written through on every rank (no stale cached norm)
    if comm.rank == comm.size - 1:
        block[0] = np.nan
    with pytest.raises(NonFinite) as caught:
        GradientSession(model, controls=controls).solve()
    agreed(comm, str(caught.value))
    assert "u_0" in str(caught.value)
