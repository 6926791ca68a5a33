"""An RK TS's stages as its adjoint data (hpcadj.ts.stages), in process on one rank.

A plan that keeps them (``--schedule mixed``) reverses every step from them: no step re-run inside the
reverse sweep, the gradient bitwise ``TSAdjointSolve``'s at controls other than an earlier evaluation's,
with stage data alone (store-all) and mixed with restart states under a budget. Stages left out are
caught by the check and refused; θ methods declare none.
"""

import numpy as np
import pytest

from hpcadj.adjoint.contract import check_contract
from hpcadj.adjoint.data_check import refuse_untrusted_data
from hpcadj.adjoint.session import Checkpointing, GradientSession
from hpcadj.adjoint.verify import compute_gradient
from hpcadj.checkpoint.options import ConfigError
from hpcadj.imports import mpi, petsc
from hpcadj.ts import TSStepper
from hpcadj.ts.check import tsadjoint_gradient
from hpcadj.ts.examples import VanDerPol

HALF_NORM2 = (lambda u: 0.5 * u.dot(u), lambda u: u.copy())
N = 25
#: stages TSAdjointStep_RK reads: all of them, but an FSAL tableau's last (3bs, 5dp)
READ = {"4": 4, "3bs": 3, "2a": 2, "5dp": 6}


@pytest.fixture(scope="module")
def comm():
    petsc()
    return mpi().COMM_WORLD


def _vdp(comm, ts_type="rk", rk="4", mu=10.0):
    ode = VanDerPol(comm, mu=mu, implicit=ts_type != "rk")
    ode.ts.setType(ts_type)
    if rk is not None:
        ode.ts.setRKType(rk)
    return ode


def _stepper(comm, rk, mu=10.0):
    """RK4 with the μ control; tableaus with a zero weight (3bs, 5dp) without it (PETSc 3.18 refuses)."""
    ode = _vdp(comm, rk=rk, mu=mu)
    return ode.stepper(N) if rk == "4" else TSStepper(ode.ts, ode.u0, N, final=HALF_NORM2)


def _moved(stepper):
    controls = {k: v.copy() for k, v in stepper.default_controls().items()}
    controls["u0"].scale(1.01)
    if "mu" in controls:
        controls["mu"].set(10.5)
    return controls


def _counting(stepper):
    taken = []
    take = stepper._take_step
    stepper._take_step = lambda *a, **k: taken.append(a[0]) or take(*a, **k)
    return taken


def _reference(comm, stepper, controls, rk):
    ref = _vdp(comm, rk=rk, mu=10.5 if "mu" in controls else 10.0)
    return tsadjoint_gradient(ref.ts, controls["u0"], N, stepper._final, parameters=controls.get("mu"))


def _same(mine, theirs):
    assert mine.J == theirs.J
    assert np.array_equal(mine.gradient["u0"].getArray(), theirs.lam0.getArray())
    if theirs.mu is not None:
        assert np.array_equal(mine.gradient["mu"].getArray(), theirs.mu.getArray())
        assert theirs.mu.norm() > 0


def _session(stepper, controls, ram=None):
    """A mixed session's result and the TS steps its driver took (the data check's own left out: it
    runs once per model object, here or in an earlier call, and the session does not repeat it)."""
    taken = _counting(stepper)
    refuse_untrusted_data(stepper, controls)
    checking = len(taken)
    try:
        outcome = GradientSession(stepper, Checkpointing(schedule="mixed", ram=ram), controls=controls).solve()
    finally:
        del stepper._take_step
    assert outcome.status == "complete", outcome.message
    return outcome, len(taken) - checking


@pytest.mark.parametrize("rk", sorted(READ))
def test_store_all_keeps_the_stages_and_reverses_from_them(comm, rk):
    stepper = _stepper(comm, rk)
    assert stepper.recomputes_in_adjoint
    layout = stepper.adjoint_data_layout()
    assert sorted(layout) == [f"stage{k}" for k in range(READ[rk])]
    assert all(f == stepper.snapshot_layout()["u"] for f in layout.values())
    compute_gradient(stepper, stepper.default_controls())                       # an earlier evaluation
    controls = _moved(stepper)
    outcome, driven = _session(stepper, controls)
    assert outcome.result.forward_steps == N and driven == N                   # no step re-run in reverse
    assert outcome.info["mixed"]["data_writes"] == N - 1 and outcome.info["mixed"]["restart_writes"] == 0
    recomputed = compute_gradient(stepper, controls)                           # states: each step re-run
    for name in controls:
        assert np.array_equal(outcome.result.gradient[name].getArray(), recomputed.gradient[name].getArray())
    if rk != "5dp":  # TSSolve reuses 5dp's last stage derivative (FSAL) across steps: J differs in its last bit
        _same(outcome.result, _reference(comm, stepper, controls, rk))


def test_a_budget_mixes_stage_data_and_restart_states(comm):
    """RAM for 12 states (3 steps' stages): a plan with both kinds, every TS step one the plan counts."""
    stepper = _stepper(comm, "4")
    compute_gradient(stepper, stepper.default_controls())
    controls = _moved(stepper)
    outcome, driven = _session(stepper, controls, ram=12)
    mixed = outcome.info["mixed"]
    assert mixed["data_writes"] > 0 and mixed["restart_writes"] > 0, mixed
    assert mixed["peak_bytes"] <= 12 * 2 * 8
    assert N < outcome.result.forward_steps == driven < mixed["forward_steps_states_only"]
    _same(outcome.result, _reference(comm, stepper, controls, "4"))


def test_the_heap_is_trimmed_per_bytes_of_data_freed_not_per_slot(comm, monkeypatch):
    """Freed data slots give the heap back once ``TRIM_BYTES`` of them were freed: never in a run of small
    slots (a trim every few steps cost more, in page faults, than it gave back), and every k slots once
    k slots' bytes reach it."""
    from hpcadj.adjoint import data_actions
    from hpcadj.adjoint.driver import Driver

    trims = []
    monkeypatch.setattr(data_actions, "release_free_memory", lambda: trims.append(1))
    stepper = _stepper(comm, "4")
    slot = 4 * stepper._u0.getLocalSize() * 8                  # 4 stages of this rank's entries
    outcome, _ = _session(stepper, _moved(stepper))
    assert outcome.info["mixed"]["data_writes"] == N - 1 and not trims
    monkeypatch.setattr(Driver, "TRIM_BYTES", 10 * slot)
    _session(stepper, _moved(stepper))
    assert len(trims) == (N - 1) // 10


def test_data_of_a_step_the_ts_did_not_just_take_are_the_same_bits(comm):
    """Captured after another step ran: the step is taken again from u_i, the stages bitwise the first."""
    stepper = _stepper(comm, "4")
    stepper.set_controls(stepper.default_controls())
    u0 = stepper.initial_state()
    u1 = stepper.step(0, u0)
    first = stepper.adjoint_data(0, u0, u1)
    u2 = stepper.step(1, u1)
    again = stepper.adjoint_data(0, u0, u1)
    assert all(np.array_equal(first[k], again[k]) for k in first)
    assert np.array_equal(first["stage0"], u0.getArray())
    assert not np.array_equal(stepper.adjoint_data(1, u1, u2)["stage1"], first["stage1"])


def test_stages_left_out_are_caught_and_refused(comm):
    stepper = _stepper(comm, "4")
    stepper._stages_read = 3                     # RK4's adjoint reads all four
    report = check_contract(stepper, steps=2)
    assert report["adjoint_data"].status == "FAILED"
    assert "leave out something the adjoint step reads" in report["adjoint_data"].reason
    with pytest.raises(ConfigError, match="--schedule mixed cannot trust 'vanderpol'"):
        GradientSession(stepper, Checkpointing(schedule="mixed"), controls=_moved(stepper)).solve()


def test_check_passes_an_rk_ts_data(comm):
    report = check_contract(_stepper(comm, "4"), steps=2)
    assert report["adjoint_data"].status == "PASSED", report["adjoint_data"].reason


@pytest.mark.parametrize("ts_type, endpoint", [("cn", None), ("beuler", None), ("theta", False)])
def test_theta_methods_declare_no_data(comm, ts_type, endpoint):
    """Their stages are the states (endpoint) or rebuilt from them (midpoint): no step is re-run."""
    ode = _vdp(comm, ts_type, rk=None)
    if endpoint is not None:
        ode.ts.setTheta(0.5)
        ode.ts.setThetaEndpoint(endpoint)
    stepper = ode.stepper(N)
    assert stepper.adjoint_data_layout() is None and not stepper.recomputes_in_adjoint
    with pytest.raises(ConfigError, match="declares none"):
        GradientSession(stepper, Checkpointing(schedule="mixed"), controls=stepper.default_controls()).solve()
