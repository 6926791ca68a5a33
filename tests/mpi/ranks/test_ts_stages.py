"""An RK TS's stages kept as its adjoint data, on any rank count: ``--schedule mixed`` reverses each step
from them (no step re-run in the reverse sweep) and the gradient is bitwise ``TSAdjointSolve``'s, at
controls other than an earlier evaluation's, with every step's stages (store-all) and under a budget
that mixes stage data and restart states. Gray–Scott (ex5adj, dof 2, RK4 with the γ control) and van
der Pol, whose two unknowns leave every rank but rank 0 with empty stages (RK4, 2a and the FSAL 3bs).
"""

import numpy as np
import pytest

from hpcadj.adjoint.data_check import check_adjoint_data, refuse_untrusted_data
from hpcadj.adjoint.session import Checkpointing, GradientSession
from hpcadj.adjoint.verify import compute_gradient
from hpcadj.ts import TSStepper
from hpcadj.ts.check import tsadjoint_gradient
from hpcadj.ts.examples import GrayScott, VanDerPol

N, M = 10, 12
HALF_NORM2 = (lambda u: 0.5 * u.dot(u), lambda u: u.copy())


def _gathered(comm, vec):
    return np.concatenate(comm.allgather(vec.getArray(readonly=True).copy()))


def _mixed(stepper, controls, ram=None):
    """The session's outcome and the TS steps its driver took (the data check's left out: it runs once
    per model object, here or in an earlier call, and the session does not repeat it)."""
    taken = []
    take = stepper._take_step
    stepper._take_step = lambda *a, **k: taken.append(a[0]) or take(*a, **k)
    try:
        refuse_untrusted_data(stepper, controls)
        checking = len(taken)
        outcome = GradientSession(stepper, Checkpointing(schedule="mixed", ram=ram), controls=controls).solve()
    finally:
        del stepper._take_step
    assert outcome.status == "complete", outcome.message
    return outcome, len(taken) - checking


def _bitwise(comm, mine, theirs, controls, parameter=None):
    assert mine.J == theirs.J
    assert np.array_equal(_gathered(comm, mine.gradient["u0"]), _gathered(comm, theirs.lam0))
    if parameter is not None:
        assert np.array_equal(_gathered(comm, mine.gradient[parameter]), _gathered(comm, theirs.mu))
        assert theirs.mu.norm() > 0


@pytest.fixture(scope="module")
def grayscott(comm):
    """RK4 Gray–Scott after an evaluation at the defaults, and controls away from them."""
    stepper = GrayScott(comm, m=M, ts_type="rk").stepper(N)
    compute_gradient(stepper, stepper.default_controls())
    controls = {k: v.copy() for k, v in stepper.default_controls().items()}
    controls["u0"].scale(0.98)
    controls["u0"].shift(0.01)
    controls["gamma"].set(0.026)
    theirs = tsadjoint_gradient(GrayScott(comm, m=M, ts_type="rk", gamma=0.026).ts, controls["u0"], N,
                                stepper._final, parameters=controls["gamma"])
    return stepper, controls, theirs


def test_grayscott_data_check(comm, grayscott):
    stepper = grayscott[0]
    assert sorted(stepper.adjoint_data_layout()) == ["stage0", "stage1", "stage2", "stage3"]
    result = check_adjoint_data(stepper, stepper.default_controls())
    assert result.status == "PASSED", result.reason


@pytest.mark.parametrize("ram", [None, 8], ids=["store-all", "8-states"])
def test_grayscott_bitwise_tsadjointsolve(comm, grayscott, ram):
    """Every step's stages (no budget), then RAM for 8 states (two steps' stages): restarts and data."""
    stepper, controls, theirs = grayscott
    outcome, driven = _mixed(stepper, controls, ram)
    mixed = outcome.info["mixed"]
    assert outcome.result.forward_steps == driven
    if ram is None:
        assert driven == N and mixed["data_writes"] == N - 1 and mixed["restart_writes"] == 0
    else:
        assert N < driven < mixed["forward_steps_states_only"]
        assert mixed["data_writes"] > 0 and mixed["restart_writes"] > 0, mixed
        assert mixed["peak_bytes"] <= ram * mixed["restart_bytes"]
    _bitwise(comm, outcome.result, theirs, controls, "gamma")


@pytest.mark.parametrize("rk", ["4", "2a", "3bs"])
def test_vanderpol_where_ranks_hold_empty_stages(comm, rk):
    n = 25

    def ode(mu):
        made = VanDerPol(comm, mu=mu, implicit=False)
        made.ts.setType("rk")
        made.ts.setRKType(rk)
        return made

    first = ode(10.0)
    stepper = first.stepper(n) if rk == "4" else TSStepper(first.ts, first.u0, n, final=HALF_NORM2)
    compute_gradient(stepper, stepper.default_controls())
    controls = {k: v.copy() for k, v in stepper.default_controls().items()}
    controls["u0"].scale(1.01)
    if rk == "4":
        controls["mu"].set(10.5)
    outcome, driven = _mixed(stepper, controls)
    assert outcome.result.forward_steps == driven == n
    theirs = tsadjoint_gradient(ode(10.5 if rk == "4" else 10.0).ts, controls["u0"], n, stepper._final,
                                parameters=controls.get("mu"))
    _bitwise(comm, outcome.result, theirs, controls, "mu" if rk == "4" else None)


def _layout(vec) -> int:
    """The PetscLayout holding a Vec's sizes (VecGetLayout): Vecs that share one were made without a
    collective call."""
    import ctypes

    from hpcadj.ts import _capi

    out = ctypes.c_void_p()
    _capi._call("VecGetLayout", _capi._h(vec), ctypes.byref(out))
    return out.value


def test_vecs_made_per_step_share_one_layout(comm, grayscott):
    """A step's output, a restored state, the stand-in of a step reversed from its data and its λ all
    duplicate one plain Vec: one PetscLayout, made once, no collective call; a copy of a DMDA Vec makes
    a new layout each time (an allreduce and an allgather a step on 2 ranks)."""
    stepper, controls, _ = grayscott
    stepper.set_controls(controls)
    u1 = stepper.step(0, stepper.initial_state())
    u2 = stepper.step(1, u1)
    stand_in = stepper.adjoint_data_state(1, stepper.adjoint_data(1, u1, u2))
    grad = {"gamma": controls["gamma"].duplicate()}
    grad["gamma"].set(0.0)
    lam = stepper.adjoint_step(1, stand_in, None, u2, grad)
    made = [u1, u2, stepper.restore(stepper.snapshot(u2)), stand_in, lam]
    assert [_layout(v) for v in made] == [_layout(stepper._template)] * len(made)
