"""A user's petsc4py TS as a Stepper: gradients against PETSc's own TSAdjointSolve on the same set-up.

van der Pol (petsc4py's demo, PETSc ex20adj) with RK4, Crank–Nicolson and backward Euler, and ex23fwdadj
(a parameter in the mass matrix) against its analytic solution. Every gradient is taken at controls
other than the ones an earlier evaluation of the same stepper used.
"""

import math

import numpy as np
import pytest

from hpcadj.adjoint.verify import compute_gradient, taylor_test
from hpcadj.checkpoint.schedules import make_schedule
from hpcadj.checkpoint.storage import RamLevel
from hpcadj.imports import mpi, petsc
from hpcadj.ts import TSStepper
from hpcadj.ts.check import tsadjoint_gradient
from hpcadj.ts.examples import MassODE, VanDerPol

HALF_NORM2 = (lambda u: 0.5 * u.dot(u), lambda u: u.copy())
VDP_TYPES = {"rk4": ("rk", "4"), "cn": ("cn", None), "beuler": ("beuler", None)}


@pytest.fixture(scope="module")
def comm():
    petsc()
    return mpi().COMM_WORLD


def _vdp(comm, kind, mu=10.0):
    ts_type, rk = VDP_TYPES[kind]
    ode = VanDerPol(comm, mu=mu, implicit=ts_type != "rk")
    ode.ts.setType(ts_type)
    if rk:
        ode.ts.setRKType(rk)
    return ode


def _moved(controls, u0_scale=1.01, p_value=None):
    """Controls away from the defaults: u0 scaled, the parameter set to ``p_value``."""
    out = {k: v.copy() for k, v in controls.items()}
    out["u0"].scale(u0_scale)
    for name in out:
        if name != "u0" and p_value is not None:
            out[name].set(p_value)
    return out


def _array(vec):
    return vec.getArray(readonly=True).copy()


@pytest.mark.parametrize("kind", sorted(VDP_TYPES))
def test_vanderpol_bitwise_tsadjoint(comm, kind):
    """λ_0 and the μ gradient bitwise TSAdjointSolve's; θ-endpoint fills stages, RK recomputes."""
    n = 25
    ode = _vdp(comm, kind)
    stepper = ode.stepper(n)
    assert stepper.recomputes_in_adjoint == (kind == "rk4")
    compute_gradient(stepper, stepper.default_controls())          # an earlier evaluation
    controls = _moved(stepper.default_controls(), 1.01, 10.5)
    mine = compute_gradient(stepper, controls)

    ref = _vdp(comm, kind, mu=10.5)
    theirs = tsadjoint_gradient(ref.ts, controls["u0"], n, stepper._final, parameters=controls["mu"])
    assert theirs.steps == n
    assert mine.J == theirs.J
    assert np.array_equal(_array(mine.gradient["u0"]), _array(theirs.lam0))
    assert np.array_equal(_array(mine.gradient["mu"]), _array(theirs.mu))
    assert np.abs(_array(theirs.mu)).max() > 0


@pytest.mark.parametrize("kind", sorted(VDP_TYPES))
@pytest.mark.parametrize("control", ["u0", "mu"])
def test_vanderpol_taylor(comm, kind, control):
    stepper = _vdp(comm, kind).stepper(25)
    controls = _moved(stepper.default_controls(), 0.99, 9.5)
    result = taylor_test(stepper, controls, control, eps0=1e-3)
    assert result.min_rate >= 1.95, result.rates


def test_checkpointed_rk_bitwise_store_all(comm):
    """FSAL RK (Bogacki–Shampine) under revolve with 3 slots: recomputed steps bitwise the first ones."""
    ode = _vdp(comm, "rk4")
    ode.ts.setRKType("3bs")
    stepper = TSStepper(ode.ts, ode.u0, 30, final=HALF_NORM2)
    controls = _moved(stepper.default_controls(), 1.02)
    store_all = compute_gradient(stepper, controls)
    schedule = make_schedule("revolve", 30, [3])
    result = compute_gradient(stepper, controls, schedule, [RamLevel(3, stepper.snapshot_layout())])
    assert result.forward_steps > 30
    assert np.array_equal(_array(result.gradient["u0"]), _array(store_all.gradient["u0"]))
    ref = _vdp(comm, "rk4")
    ref.ts.setRKType("3bs")
    theirs = tsadjoint_gradient(ref.ts, controls["u0"], 30, stepper._final)
    assert np.array_equal(_array(result.gradient["u0"]), _array(theirs.lam0))


def test_ex23_mass_matrix_parameter(comm):
    """c x' = b x: bitwise TSAdjointSolve's, and within O(dt) of the analytic dx(T)/da, dx(T)/dc."""
    ode = MassODE(comm, dt=1e-3)
    stepper = ode.stepper()
    assert stepper.n_steps == 1000
    compute_gradient(stepper, stepper.default_controls())
    controls = _moved(stepper.default_controls(), 1.1, 2.5)          # a = 2.2, c = 2.5
    mine = compute_gradient(stepper, controls)
    ref = MassODE(comm, a=2.2, c=2.5, dt=1e-3)
    ref.ts.setMaxTime(2.0)   # n steps of dt exactly: TSSolve's MATCHSTEP would trim the last one to land on 1.0
    theirs = tsadjoint_gradient(ref.ts, controls["u0"], None, stepper._final, parameters=controls["c"])
    assert theirs.steps == 1000
    assert mine.J == theirs.J
    assert np.array_equal(_array(mine.gradient["u0"]), _array(theirs.lam0))
    assert np.array_equal(_array(mine.gradient["c"]), _array(theirs.mu))
    a, b, c, T = 2.2, 4.0, 2.5, 1.0
    x_T = a * math.exp(b * T / c)
    assert abs(mine.J - x_T) < 0.01 * x_T
    assert abs(_array(mine.gradient["u0"])[0] - math.exp(b * T / c)) < 0.01 * math.exp(b * T / c)
    dxdc = -a * b * T / c ** 2 * math.exp(b * T / c)
    assert abs(_array(mine.gradient["c"])[0] - dxdc) < 0.01 * abs(dxdc)
    assert taylor_test(stepper, controls, "c", eps0=1e-2).min_rate >= 1.95
    # x(T) is linear in a: the Taylor remainder is round-off at every eps, no rate to measure
    assert max(taylor_test(stepper, controls, "u0", eps0=1e-2).remainders) < 1e-12 * abs(mine.J)


@pytest.mark.parametrize("kind", ["rk4", "cn"])
def test_per_step_terms_taylor(comm, kind):
    """every_step terms (a misfit at every state) beside the final term: Taylor rate >= 1.95 for u0 and μ."""
    ode = _vdp(comm, kind)
    target = ode.u0.copy()

    def value(i, t, u):
        d = u - target
        return 0.5 * t * d.dot(d)

    def gradient(i, t, u):
        return (u - target) * t

    stepper = TSStepper(ode.ts, ode.u0, 20, parameters={"mu": ode.p}, apply_parameters=ode.set_mu,
                        final=HALF_NORM2, every_step=(value, gradient))
    controls = _moved(stepper.default_controls(), 0.98, 10.3)
    for control in ("u0", "mu"):
        assert taylor_test(stepper, controls, control, eps0=1e-3).min_rate >= 1.95
