"""Adaptive time steps (n unknown until the run ends), under mpirun -n 1, 2, 3.

- each adaptive model's first sweep decides a varying dt sequence that lands on t_final, the same on
  every rank; with that sequence frozen its gradient passes Taylor (rate >= 1.95) and dot-product
  (<= 1e-10) tests;
- online plans that learn n only when the model says the run is over (RAM, node-local, HDF5 and three
  levels) give gradients bitwise equal to store-all of the same adaptive run, with the simulator's
  counts; a session reports the predicted makespan of the plan it ran without planning it again;
- a run stopped at random points of either sweep and resumed gives the same gradient bitwise.
"""

import os

import numpy as np
import pytest

from hpcadj.adjoint import compute_gradient
from hpcadj.checkpoint.manager import CheckpointConfig, build_levels, level_slots, profile_for
from hpcadj.adjoint.session import Checkpointing, GradientSession, Restart
from hpcadj.adjoint.verify import dot_product_test, taylor_test
from hpcadj.checkpoint.schedules import simulate
from hpcadj.checkpoint.schedules.online_plans import make_online_plan
from hpcadj.checkpoint.storage import RamLevel
from hpcadj.models.burgers import BurgersModel
from hpcadj.models.heat import HeatModel
from hpcadj.models.wave import WaveModel

MODELS = ("heat", "burgers", "wave")
MIXES = [{"ram": "3"}, {"disk": "3"}, {"pfs": "3"}, {"ram": "1", "disk": "1", "pfs": "2"}]


def adaptive_model(name, comm):
    if name == "heat":
        return HeatModel(comm, (10, 9), dt=1e-3, adaptive=True, t_final=0.02, tolerance=1e-3)
    if name == "burgers":
        return BurgersModel(comm, (12, 12), adaptive=True, t_final=0.3)
    return WaveModel(comm, (14, 12), adaptive=True, t_final=0.3)


def online_gradient(model, controls, slots=3):
    """The first sweep under a one-level online plan: the model decides n as it goes."""
    assert model.n_steps is None
    plan = make_online_plan([slots], done=model.done)
    return compute_gradient(model, controls, plan, [RamLevel(slots, model.snapshot_layout())])


def arrays(result):
    return {k: v.getArray().copy() for k, v in result.gradient.items()}


@pytest.fixture(scope="module", params=MODELS)
def frozen(request, comm):
    """(name, model after its first sweep, controls, store-all J and gradient of the frozen sequence)."""
    model = adaptive_model(request.param, comm)
    controls = model.default_controls()
    online_gradient(model, controls)
    reference = compute_gradient(model, controls)  # n known now: an ordinary store-all plan
    return request.param, model, controls, reference.J, arrays(reference)


def test_sequence_varies_lands_on_t_final_and_agrees_across_ranks(frozen, comm):
    name, model, _controls, _J, _grad = frozen
    steps = model.steps
    assert model.n_steps == len(steps.dts) == steps.n >= 3
    assert steps.times[-1] == steps.t_final
    assert len(set(steps.dts)) > 1, steps.dts  # wave: its last step; heat, burgers: throughout
    if name != "wave":
        assert len(set(steps.dts[:-1])) > 1, steps.dts
    everyone = comm.allgather(steps.dts)
    assert all(d == everyone[0] for d in everyone)
    assert model.describe()["steps"] == model.n_steps


def test_taylor_and_dot_product_with_the_sequence_frozen(frozen):
    _name, model, controls, _J, _grad = frozen
    gradient = compute_gradient(model, controls)
    for control in sorted(controls):
        result = taylor_test(model, controls, control, gradient=gradient)
        assert result.min_rate >= 1.95, (control, result.rates)
    dot = dot_product_test(model, controls, gradient=gradient)
    assert dot.relative_mismatch <= dot.limit <= 1e-8, dot


@pytest.mark.parametrize("budgets", MIXES, ids=["+".join(m) for m in MIXES])
def test_online_plan_bitwise_equal_to_store_all_of_the_same_adaptive_run(frozen, budgets, comm, shared_tmp):
    name, frozen_model, _controls, J_ref, grad_ref = frozen
    model = adaptive_model(name, comm)  # a fresh run: decides its steps again, as the first did
    controls = model.default_controls()
    config = CheckpointConfig(budgets=budgets, local_dir=shared_tmp, pfs_file=f"{shared_tmp}/ad.h5")
    plans = level_slots(config, model.snapshot_layout(), comm, 10 ** 6)
    caps = [p.slots for p in plans]
    costs = profile_for(plans, None).vector("time")
    levels = build_levels(plans, model.snapshot_layout(), comm, config)
    result = compute_gradient(model, controls, make_online_plan(caps, costs, done=model.done), levels)
    assert model.steps.dts == frozen_model.steps.dts
    assert result.J == J_ref
    for control, ref in grad_ref.items():
        assert np.array_equal(result.gradient[control].getArray(), ref), control
    n = model.n_steps
    expected = simulate(make_online_plan(caps, costs, n_steps=n).actions(), n, caps)
    assert result.forward_steps == expected.forward_steps
    assert [level.stats.writes for level in levels] == expected.writes


class StopAfter:
    """should_stop: True once, after ``k`` polls (every rank counts the same polls)."""

    def __init__(self, k):
        self.k, self.polls = k, 0

    def __call__(self):
        self.polls += 1
        return self.polls == self.k


def _session(model, tmp, **kwargs):
    checkpointing = Checkpointing(ram=1, disk=2, pfs=2, schedule="online", local_dir=f"{tmp}/local",
                                  pfs_file=f"{tmp}/ck.h5")
    return GradientSession(model, checkpointing, restart=Restart(f"{tmp}/run", durable_every=1, **kwargs))


def test_stop_at_random_points_then_resume_is_bitwise_identical(frozen, comm, shared_tmp):
    name, frozen_model, _controls, J_ref, grad_ref = frozen
    # should_stop is polled after every Advance and Adjoint: at least 2n polls, n in the first sweep
    rng = np.random.default_rng(17)
    points = sorted({int(k) for k in rng.integers(1, 2 * frozen_model.n_steps, size=3)})
    sweeps = set()
    for k in points:
        tmp = f"{shared_tmp}/stop{k}"
        if comm.rank == 0:
            os.makedirs(f"{tmp}/local", exist_ok=True)
        comm.Barrier()
        model = adaptive_model(name, comm)
        session = _session(model, tmp)
        session.should_stop = StopAfter(k)
        first = session.solve()
        assert first.status == "stopped", (k, first.status, first.message)
        sweeps.add("forward" if "forward sweep" in first.message else "reverse")
        model = adaptive_model(name, comm)
        resumed = _session(model, tmp, resume=True).solve()
        assert resumed.status == "complete", (k, resumed.message)
        assert model.steps.dts == frozen_model.steps.dts, k
        assert resumed.result.J == J_ref, k
        for control, ref in grad_ref.items():
            assert np.array_equal(resumed.result.gradient[control].getArray(), ref), (k, control)
    assert sweeps == {"forward", "reverse"}, (points, sweeps)


def test_write_failure_in_the_first_sweep_replans_online_bitwise(frozen, comm, shared_tmp):
    """A node-local level that stops taking writes while n is still unknown: the driver continues
    the first sweep online from what survived (OnlineResidual); the gradient stays bitwise."""
    import errno

    from hpcadj.adjoint import Driver

    name, frozen_model, _controls, J_ref, grad_ref = frozen
    model = adaptive_model(name, comm)
    controls = model.default_controls()
    config = CheckpointConfig(budgets={"ram": "2", "disk": "3"}, local_dir=shared_tmp, async_io=False)
    plans = level_slots(config, model.snapshot_layout(), comm, 10 ** 6)
    caps = [p.slots for p in plans]
    costs = profile_for(plans, None).vector("time")
    levels = build_levels(plans, model.snapshot_layout(), comm, config)
    disk = levels[1]
    real, count, seen = disk.transport.store, [0], []

    def store(step, snapshot, t, token=None):
        count[0] += 1
        if count[0] > 1:
            seen.append(model.n_steps)  # None: the first sweep had not ended
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real(step, snapshot, t, token)
    disk.transport.store = store
    driver = Driver(model, levels, costs=costs)
    try:
        result = driver.run(make_online_plan(caps, costs, done=model.done), controls)
    finally:
        for level in levels:
            level.close()
    assert driver.faults and seen and seen[0] is None, (driver.faults, seen)
    assert model.steps.dts == frozen_model.steps.dts
    assert result.J == J_ref
    for control, ref in grad_ref.items():
        assert np.array_equal(result.gradient[control].getArray(), ref), control


def test_session_without_budgets_runs_online_store_all(frozen, comm):
    name, frozen_model, _controls, J_ref, grad_ref = frozen
    model = adaptive_model(name, comm)
    session = GradientSession(model)
    outcome = session.solve()
    assert session.planned.schedule.name == "online-store-all"
    assert outcome.result.forward_steps == model.n_steps == frozen_model.n_steps
    assert outcome.result.J == J_ref
    for control, ref in grad_ref.items():
        assert np.array_equal(outcome.result.gradient[control].getArray(), ref), control


def test_session_reports_the_online_plan_it_ran_without_planning_it_again(frozen, comm, monkeypatch):
    """The predicted makespan of an online run prices what ran: the same as its plan for the n reached."""
    from hpcadj.checkpoint.schedules import online_plans

    name, frozen_model, _controls, _J, _grad = frozen
    model = adaptive_model(name, comm)
    session = GradientSession(model, Checkpointing(ram=2, schedule="online"))
    planned = session.set_up()

    def planned_again(*args, **kwargs):
        raise AssertionError("an online plan was planned again to report the run")

    monkeypatch.setattr(online_plans, "make_online_plan", planned_again)
    outcome = session.solve()
    monkeypatch.undo()
    n, caps, profile = model.n_steps, [p.slots for p in planned.plans], planned.profile
    assert n == frozen_model.n_steps
    expected = simulate(make_online_plan(caps, profile.vector("time"), n_steps=n).actions(), n, caps)
    key = "predicted_relative" if profile.relative else "predicted_s"
    assert outcome.info[key] == profile.predicted_seconds(expected)
