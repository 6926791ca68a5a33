"""PETSc's ex5adj (Gray–Scott on a periodic 2-D DMDA, dof 2) as a user's TS under hpcadj, on any rank count.

Against TSAdjointSolve on a second instance of the same set-up (its own DM): bitwise for CN (stages
filled) and RK4 (step recomputed before each adjoint step); then the same gradient bitwise through
three checkpoint levels with lossless compression, and through a stopped and resumed session. Beside
it, PETSc's ex23fwdadj and van der Pol (one and two unknowns, all on rank 0: the other ranks own
nothing) on the same rank counts, van der Pol also with θ-midpoint (its stage reconstructed, no
step recomputed).
"""

import json
import os

import math

import numpy as np
import pytest

from hpcadj.adjoint.session import Checkpointing, GradientSession, Restart
from hpcadj.adjoint.verify import compute_gradient, taylor_test
from hpcadj.checkpoint.schedules import make_schedule
from hpcadj.checkpoint.storage import RamLevel
from hpcadj.ts.check import tsadjoint_gradient
from hpcadj.ts.examples import GrayScott, MassODE, VanDerPol

N, M = 10, 12
TYPES = ["cn", "rk"]


def _moved(controls):
    out = {k: v.copy() for k, v in controls.items()}
    out["u0"].scale(0.98)
    out["u0"].shift(0.01)
    out["gamma"].set(0.026)
    return out


def _gathered(comm, vec):
    return np.concatenate(comm.allgather(vec.getArray(readonly=True).copy()))


@pytest.fixture(scope="module", params=TYPES)
def case(request, comm):
    """The stepper, controls away from the defaults (after an evaluation at the defaults) and its gradient."""
    gs = GrayScott(comm, m=M, ts_type=request.param)
    stepper = gs.stepper(N)
    compute_gradient(stepper, stepper.default_controls())
    controls = _moved(stepper.default_controls())
    return request.param, stepper, controls, compute_gradient(stepper, controls)


def test_bitwise_tsadjointsolve(comm, case):
    ts_type, stepper, controls, mine = case
    ref = GrayScott(comm, m=M, ts_type=ts_type, gamma=0.026)
    theirs = tsadjoint_gradient(ref.ts, controls["u0"], N, stepper._final, parameters=controls["gamma"])
    assert theirs.steps == N
    assert mine.J == theirs.J
    assert np.array_equal(_gathered(comm, mine.gradient["u0"]), _gathered(comm, theirs.lam0))
    assert np.array_equal(_gathered(comm, mine.gradient["gamma"]), _gathered(comm, theirs.mu))
    assert theirs.mu.norm() > 0 and theirs.lam0.norm() > 0


@pytest.mark.parametrize("control", ["u0", "gamma"])
def test_taylor(comm, case, control):
    _, stepper, controls, mine = case
    result = taylor_test(stepper, controls, control, eps0=1e-2, halvings=3, gradient=mine)
    assert all(r > 0 for r in result.remainders)
    assert result.min_rate >= 1.95, result.rates


def _prepare(comm, work):
    if comm.rank == 0:
        os.makedirs(os.path.join(work, "local"))
        with open(os.path.join(work, "costs.json"), "w") as f:
            json.dump(PROFILE, f)
    comm.Barrier()


def _work(comm, tmp_path_factory, tag):
    path = str(tmp_path_factory.mktemp(tag)) if comm.rank == 0 else None
    return comm.bcast(path)


#: fixed costs (I/O cheap against a step), so the plan is the same on every run and uses all three levels
PROFILE = {"forward_s": 1.0, "adjoint_s": 2.0, "source": "test",
           "levels": [{"name": "ram", "write_s": 0.01, "read_s": 0.01},
                      {"name": "disk", "write_s": 0.05, "read_s": 0.05},
                      {"name": "pfs", "write_s": 0.1, "read_s": 0.1}]}


def _options(work):
    costs = os.path.join(work, "costs.json")
    return Checkpointing(ram=1, disk=1, pfs=2, local_dir=os.path.join(work, "local"), costs=costs,
                         pfs_file=os.path.join(work, "ck.h5"), compress="lossless", schedule="multilevel")


def test_three_levels_compressed_bitwise(comm, case, tmp_path_factory):
    ts_type, stepper, controls, mine = case
    work = _work(comm, tmp_path_factory, f"levels-{ts_type}")
    _prepare(comm, work)
    outcome = GradientSession(stepper, _options(work), controls=controls).solve()
    assert outcome.status == "complete", outcome.message
    result = outcome.result
    assert result.recomputed_steps > 0
    assert sorted(lv["name"] for lv in outcome.info["levels"]) == ["disk", "pfs", "ram"]
    assert all(lv["writes"] > 0 for lv in outcome.info["levels"]), outcome.info["levels"]
    assert result.J == mine.J
    for name in controls:
        assert np.array_equal(_gathered(comm, result.gradient[name]), _gathered(comm, mine.gradient[name])), name


def test_stopped_and_resumed_bitwise(comm, case, tmp_path_factory):
    ts_type, stepper, controls, mine = case
    work = _work(comm, tmp_path_factory, f"resume-{ts_type}")
    _prepare(comm, work)
    polls = []
    first = GradientSession(stepper, _options(work), controls=controls,
                            restart=Restart(os.path.join(work, "run"), durable_every=1),
                            should_stop=lambda: polls.append(1) or len(polls) > N + 3)   # in the reverse sweep
    assert first.solve().status == "stopped"
    second = GradientSession(stepper, _options(work), controls=controls,
                             restart=Restart(os.path.join(work, "run"), resume=True, durable_every=1))
    outcome = second.solve()
    assert outcome.status == "complete" and outcome.info["resumed"], outcome.message
    assert outcome.result.adjoint_steps < N
    for name in controls:
        assert np.array_equal(_gathered(comm, outcome.result.gradient[name]),
                              _gathered(comm, mine.gradient[name])), name


def test_ex23_where_ranks_own_nothing(comm):
    """c x' = b x with c in the mass matrix (IJacobianP), backward Euler, 200 steps under revolve with 3
    RAM slots: bitwise TSAdjointSolve's at controls other than the first evaluation's, and near the
    analytic x(T) = a exp(bT/c) and its derivatives (backward Euler's O(dt): 2 % at dt = 5e-3).
    On more than one rank this needs MassODE's Jacobi preconditioner: with PETSc's block Jacobi the
    dense Jacobian's diagonal block keeps its first factor (the earlier evaluation's c), and the c
    gradient differed from TSAdjointSolve's by up to 1e-12 relative (examples._fresh_preconditioner)."""
    n, a, c, b, T = 200, 2.2, 2.5, 4.0, 1.0
    ode = MassODE(comm, dt=T / n)
    stepper = ode.stepper()
    assert stepper.n_steps == n
    compute_gradient(stepper, stepper.default_controls())
    controls = {k: v.copy() for k, v in stepper.default_controls().items()}
    controls["u0"].set(a)
    controls["c"].set(c)
    mine = compute_gradient(stepper, controls, make_schedule("revolve", n, [3]),
                            [RamLevel(3, stepper.snapshot_layout())])
    assert mine.forward_steps > n
    ref = MassODE(comm, a=a, c=c, dt=T / n)
    ref.ts.setMaxTime(2 * T)   # n steps of dt exactly: TSSolve's MATCHSTEP may trim the last one to land on T
    theirs = tsadjoint_gradient(ref.ts, controls["u0"], n, stepper._final, parameters=controls["c"])
    assert theirs.steps == n and mine.J == theirs.J
    got = {name: _gathered(comm, mine.gradient[name]) for name in ("u0", "c")}
    assert np.array_equal(got["u0"], _gathered(comm, theirs.lam0))
    assert np.array_equal(got["c"], _gathered(comm, theirs.mu))
    growth = math.exp(b * T / c)
    assert abs(mine.J - a * growth) < 0.02 * a * growth
    assert abs(got["u0"][0] - growth) < 0.02 * growth
    assert abs(got["c"][0] + a * b * T / c ** 2 * growth) < 0.02 * a * b * T / c ** 2 * growth


#: van der Pol: TS type, θ-endpoint flag (None: the type's own) and how its adjoint step gets its stages
VDP = {"rk4": ("rk", None, "recomputed"), "cn": ("cn", None, "filled"), "beuler": ("beuler", None, "filled"),
       "midpoint": ("theta", False, "reconstructed")}


def _vdp(comm, kind, mu=10.0):
    ts_type, endpoint, _ = VDP[kind]
    ode = VanDerPol(comm, mu=mu, implicit=ts_type != "rk")
    ode.ts.setType(ts_type)
    if ts_type == "rk":
        ode.ts.setRKType("4")
    if endpoint is not None:
        ode.ts.setTheta(0.5)
        ode.ts.setThetaEndpoint(endpoint)
    return ode


@pytest.mark.parametrize("kind", sorted(VDP))
def test_vanderpol_where_ranks_own_nothing(comm, kind):
    """van der Pol (2 unknowns on rank 0) against TSAdjointSolve at controls other than an earlier
    evaluation's: bitwise where the same operations run; θ-midpoint (stage X reconstructed as
    u_i + θ (u_{i+1} - u_i), equal to TSStep's Newton X up to round-off: 3.5e-13 relative measured in
    the μ gradient at 1 rank) within 1e-12 relative, with no forward step inside the reverse sweep."""
    n = 25
    stepper = _vdp(comm, kind).stepper(n)
    assert stepper.adjoint_stages == VDP[kind][2]
    assert stepper.recomputes_in_adjoint == (kind == "rk4")
    compute_gradient(stepper, stepper.default_controls())               # an earlier evaluation
    controls = {k: v.copy() for k, v in stepper.default_controls().items()}
    controls["u0"].scale(1.01)
    controls["mu"].set(10.5)
    taken = []
    take = stepper._take_step
    stepper._take_step = lambda *a, **k: taken.append(a[0]) or take(*a, **k)
    try:
        mine = compute_gradient(stepper, controls)
    finally:
        del stepper._take_step
    assert mine.forward_steps == n
    assert len(taken) == (2 * n if kind == "rk4" else n), len(taken)    # RK re-runs each step in its adjoint
    theirs = tsadjoint_gradient(_vdp(comm, kind, mu=10.5).ts, controls["u0"], n, stepper._final,
                                parameters=controls["mu"])
    assert theirs.steps == n and mine.J == theirs.J
    for name, ref in (("u0", theirs.lam0), ("mu", theirs.mu)):
        got, want = _gathered(comm, mine.gradient[name]), _gathered(comm, ref)
        assert np.abs(want).max() > 0
        if kind == "midpoint":
            assert np.abs(got - want).max() <= 1e-12 * np.abs(want).max(), (name, got, want)
        else:
            assert np.array_equal(got, want), (name, got, want)
    if kind == "midpoint":
        for control in ("u0", "mu"):
            result = taylor_test(stepper, controls, control, eps0=1e-3, halvings=3, gradient=mine)
            assert result.min_rate >= 1.95, (control, result.rates)
