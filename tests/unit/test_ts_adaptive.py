"""An adaptive TS (the user's TSAdapt): the first sweep records each accepted dt, recomputation replays it.

Oracle: TSSolve + TSAdjointSolve on a second TS with adaptivity off, fed the recorded steps by a
post-step callback: the same step sequence, so the gradient must be bitwise the same. n is unknown
until the run reaches t_final, so the session runs an online plan; under a budget it recomputes.
"""

import numpy as np
import pytest

from hpcadj.adjoint.session import Checkpointing, GradientSession
from hpcadj.imports import mpi, petsc
from hpcadj.ts import TSStepper
from hpcadj.ts.check import tsadjoint_gradient
from hpcadj.ts.examples import VanDerPol

HALF_NORM2 = (lambda u: 0.5 * u.dot(u), lambda u: u.copy())
T_FINAL = 0.3


@pytest.fixture(scope="module")
def comm():
    petsc()
    return mpi().COMM_SELF


def _adaptive(comm, kind, prefix):
    opts = petsc().Options()
    opts[f"{prefix}ts_adapt_type"] = "basic"
    opts[f"{prefix}ts_max_time"] = T_FINAL
    opts[f"{prefix}ts_max_steps"] = 10000
    opts[f"{prefix}ts_rtol"] = 1e-6
    opts[f"{prefix}ts_atol"] = 1e-6
    if kind == "rk":
        opts[f"{prefix}ts_rk_type"] = "3bs"
    if kind == "mid":
        opts[f"{prefix}ts_type"] = "theta"
        opts[f"{prefix}ts_theta_endpoint"] = "false"
    try:
        return VanDerPol(comm, mu=50.0, implicit=kind != "rk", prefix=prefix)
    finally:
        for key in ("ts_adapt_type", "ts_max_time", "ts_max_steps", "ts_rtol", "ts_atol", "ts_rk_type", "ts_type",
                    "ts_theta_endpoint"):
            opts.delValue(f"{prefix}{key}")


def _replayed_reference(comm, kind, dts, controls, with_mu):
    """TSAdjointSolve on the recorded step sequence (adaptivity off, dt set after every step)."""
    ref = VanDerPol(comm, mu=50.0, implicit=kind != "rk")
    if kind == "rk":
        ref.ts.setRKType("3bs")
    if kind == "mid":
        ref.ts.setType("theta")
        ref.ts.setThetaEndpoint(False)
    ref.ts.setMaxTime(T_FINAL)
    ref.ts.setMaxSteps(len(dts))
    ref.ts.setTimeStep(dts[0])
    ref.ts.setPostStep(lambda ts: ts.setTimeStep(dts[min(ts.getStepNumber(), len(dts) - 1)]))
    return tsadjoint_gradient(ref.ts, controls["u0"], len(dts), HALF_NORM2,
                              parameters=controls["mu"] if with_mu else None)


@pytest.mark.parametrize("kind,dt0", [("cn", 1e-3), ("rk", 1e-3), ("cn", 0.05), ("rk", 0.05), ("mid", 1e-3)])
def test_adaptive_records_and_replays(comm, kind, dt0):
    """With dt0 = 0.05 the TSAdapt rejects first tries: the accepted dt is re-taken exactly. θ-midpoint
    (its stage reconstructed from u_i and u_{i+1}) agrees to round-off, 1e-12 relative, not bitwise."""
    ode = _adaptive(comm, kind, f"adapt{kind}{dt0}_".replace(".", ""))
    ode.ts.setTimeStep(dt0)

    with_mu = kind != "rk"     # 3bs has a zero weight: PETSc 3.18 refuses its parameter gradient
    stepper = TSStepper(ode.ts, ode.u0, parameters={"mu": ode.p} if with_mu else None,
                        apply_parameters=ode.set_mu, final=HALF_NORM2)
    assert stepper.n_steps is None and stepper.steps.t_final == T_FINAL
    assert stepper.adjoint_stages == {"rk": "recomputed", "cn": "filled", "mid": "reconstructed"}[kind]
    controls = stepper.default_controls()
    store_all = GradientSession(stepper, controls=controls).solve()
    assert store_all.status == "complete", store_all.message
    dts = list(stepper.steps.dts)
    n = stepper.n_steps
    assert n == len(dts) > 5 and len(set(dts)) > 3          # the TSAdapt chose the steps
    assert abs(sum(dts) - T_FINAL) < 1e-12
    assert (ode.ts.getStepRejections() > 0) == (dt0 > 1e-3)

    budget = GradientSession(stepper, Checkpointing(ram=3), controls=controls).solve()
    assert budget.status == "complete", budget.message
    assert budget.result.recomputed_steps > 0 and stepper.steps.dts == dts
    theirs = _replayed_reference(comm, kind, dts, controls, with_mu)
    assert theirs.steps == n
    def same(mine, ref):
        if kind == "mid":
            return np.abs(mine - ref).max() <= 1e-12 * np.abs(ref).max()
        return np.array_equal(mine, ref)

    for result in (store_all.result, budget.result):
        assert result.J == theirs.J
        assert same(result.gradient["u0"].getArray(), theirs.lam0.getArray())
        if with_mu:
            assert same(result.gradient["mu"].getArray(), theirs.mu.getArray())


def test_adaptive_run_stopped_and_resumed_replays_the_record(comm, tmp_path):
    """A fresh TS resumes a stopped adaptive run: it replays the manifest's steps, the gradient is bitwise."""
    from hpcadj.adjoint.session import Restart

    def build(tag):
        ode = _adaptive(comm, "cn", f"resume{tag}_")
        return TSStepper(ode.ts, ode.u0, parameters={"mu": ode.p}, apply_parameters=ode.set_mu, final=HALF_NORM2)

    reference = build("a")
    controls = reference.default_controls()
    expected = GradientSession(reference, Checkpointing(ram=4), controls=controls).solve().result
    polls = []
    first = build("b")
    stopped = GradientSession(first, Checkpointing(ram=4), controls=controls,
                              restart=Restart(str(tmp_path / "run"), durable_every=1),
                              should_stop=lambda: polls.append(1) or len(polls) > reference.n_steps + 10)
    assert stopped.solve().status == "stopped"
    second = build("c")
    assert second.n_steps is None
    outcome = GradientSession(second, Checkpointing(ram=4), controls=controls,
                              restart=Restart(str(tmp_path / "run"), resume=True, durable_every=1)).solve()
    assert outcome.status == "complete" and outcome.info["resumed"], outcome.message
    assert second.steps.dts == reference.steps.dts and second.n_steps == reference.n_steps
    for name in controls:
        assert np.array_equal(outcome.result.gradient[name].getArray(), expected.gradient[name].getArray()), name
