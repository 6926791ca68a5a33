"""Store-all and auto choose mixed plans for the wave model (its data: u^i, one field of the pair):
the gradient bitwise the restart-state plan's, half its checkpoint bytes, fewer forward steps in the
same RAM; a model whose declared data are wrong is refused when a mixed plan is chosen implicitly."""

import numpy as np
import pytest

from model_checks import owned

from hpcadj.adjoint.session import GradientSession
from hpcadj.checkpoint.options import Checkpointing, ConfigError
from hpcadj.models.wave import WaveModel

N = 16
GRID = (14, 12)


def _controls(model):
    """Controls away from the defaults: a scaled velocity, a nonzero initial pair."""
    controls = model.default_controls()
    controls["c"].scale(0.97)
    u0 = controls["u0"].getArray()
    u0[...] = np.cos(np.arange(u0.size) + controls["u0"].getOwnershipRange()[0])
    return controls


def _solve(comm, checkpointing, model=None):
    model = model or WaveModel(comm, GRID, n_steps=N)
    outcome = GradientSession(model, checkpointing, controls=_controls(model)).solve()
    assert outcome.status == "complete", outcome.message
    return outcome.info, owned(outcome.result)


@pytest.fixture(scope="module")
def restart_states(comm):
    """Restart states alone with room for every state: today's store-all."""
    info, grad = _solve(comm, Checkpointing(ram=str(N), schedule="revolve"))
    assert info["schedule"] == "revolve" and info["forward_steps"] == N and "mixed" not in info
    return info, grad


def _same(grad, want):
    for name in want:
        assert np.array_equal(grad[name], want[name]), name


def test_store_all_keeps_one_field_a_step_with_the_restart_plan_s_gradient(comm, restart_states):
    want_info, want = restart_states
    info, grad = _solve(comm, Checkpointing())
    assert info["schedule"] == "mixed" and info["J"] == want_info["J"]
    _same(grad, want)
    facts = info["mixed"]
    assert facts["restart_bytes"] == 2 * facts["data_bytes"]
    assert facts["data_slots"] == facts["data_writes"] == N - 1 and facts["restart_slots"] == 0
    assert facts["peak_bytes"] == (N - 1) * facts["data_bytes"]  # half of N - 1 restart states
    assert info["forward_steps"] == N
    assert any(note.startswith("store-all keeps every step's adjoint data") for note in info["notes"])


def test_auto_with_ram_for_one_field_a_step_takes_every_step_once(comm, restart_states):
    _, want = restart_states
    revolve, _ = _solve(comm, Checkpointing(ram=str(N // 2), schedule="revolve"))
    info, grad = _solve(comm, Checkpointing(ram=str(N // 2)))
    _same(grad, want)
    assert info["schedule"] == "mixed" and info["forward_steps"] == N < revolve["forward_steps"]
    assert info["mixed"]["forward_steps_states_only"] == revolve["forward_steps"]
    assert info["mixed"]["forward_steps_saved"] == revolve["forward_steps"] - N


class WrongData(WaveModel):
    """Declares u^{i-1} as its data, where its adjoint step reads u^i."""

    def adjoint_data(self, i, u, u_next):
        return {"u": np.array(self._fields(u)[0])}


def test_an_implicit_mixed_plan_refuses_wrong_data_before_any_gradient(comm):
    with pytest.raises(ConfigError, match="the mixed plan chosen cannot trust 'wave''s adjoint data"):
        _solve(comm, Checkpointing(), WrongData(comm, GRID, n_steps=6))
    info, _ = _solve(comm, Checkpointing(ram="3", schedule="revolve"), WrongData(comm, GRID, n_steps=6))
    assert info["schedule"] == "revolve"  # restart states alone never read the data


def test_an_rk_ts_store_all_keeps_its_stages_bitwise_tsadjointsolve_s(comm):
    """A user's RK4 TS (Gray–Scott, ex5adj) without a budget: every step's stages, no step re-run."""
    from hpcadj.ts.check import tsadjoint_gradient
    from hpcadj.ts.examples import GrayScott

    stepper = GrayScott(comm, m=12, ts_type="rk").stepper(N)
    controls = {k: v.copy() for k, v in stepper.default_controls().items()}
    controls["u0"].scale(0.98)
    controls["gamma"].set(0.026)
    theirs = tsadjoint_gradient(GrayScott(comm, m=12, ts_type="rk", gamma=0.026).ts, controls["u0"], N,
                                stepper._final, parameters=controls["gamma"])
    outcome = GradientSession(stepper, Checkpointing(), controls=controls).solve()
    info = outcome.info
    assert info["schedule"] == "mixed" and info["forward_steps"] == N
    assert info["mixed"]["data_slots"] == N - 1 and info["mixed"]["forward_steps_states_only"] == 2 * N
    assert any("stages" in note for note in info["notes"])
    assert outcome.result.J == theirs.J
    for mine, want in ((outcome.result.gradient["u0"], theirs.lam0), (outcome.result.gradient["gamma"], theirs.mu)):
        assert np.array_equal(np.concatenate(comm.allgather(mine.getArray(readonly=True).copy())),
                              np.concatenate(comm.allgather(want.getArray(readonly=True).copy())))
