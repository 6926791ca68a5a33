"""Mixed plans run by the driver: steps' adjoint data (wave: u^i) beside restart states in one RAM
budget give the store-all gradient bitwise, with the plan's forward steps, at every budget."""

import numpy as np
import pytest

from model_checks import owned

from hpcadj.adjoint import Driver
from hpcadj.checkpoint.schedules import Mixed, make_schedule, simulate
from hpcadj.checkpoint.storage.ram import RamLevel
from hpcadj.models.wave import WaveModel

N = 24
#: budgets in fields (a restart state is 2, a step's data 1): store-all with data, one field a step,
#: one and a half, a middle one that mixes both kinds, the least that would do (one restart state)
BUDGETS = {"store-all-data": N - 1, "1-field": N, "1.5-fields": 3 * N // 2, "mixed": 9, "tight": 2}


def _controls(model):
    """Controls away from the defaults: a scaled velocity, a nonzero initial pair."""
    controls = model.default_controls()
    controls["c"].scale(1.03)
    u0 = controls["u0"].getArray()
    u0[...] = np.sin(np.arange(u0.size) + controls["u0"].getOwnershipRange()[0])
    return controls


def _run(model, plan, slots, controls):
    level = RamLevel(slots, model.snapshot_layout())
    driver = Driver(model, [level])
    result = driver.run(plan, controls)
    return result, driver


@pytest.fixture(scope="module")
def reference(comm):
    model = WaveModel(comm, (14, 12), n_steps=N)
    controls = _controls(model)
    result, _ = _run(model, make_schedule("store-all", N, [N]), N, controls)
    return model, controls, result.J, owned(result)


@pytest.mark.parametrize("budget", BUDGETS, ids=list(BUDGETS))
def test_mixed_plan_gives_the_store_all_gradient_bitwise(reference, budget):
    model, controls, J, grad = reference
    fields = BUDGETS[budget]
    plan = Mixed(N, [fields], state_size=2, data_size=1)
    result, driver = _run(model, plan, fields // 2, controls)
    assert result.J == J
    got = owned(result)
    for name in grad:
        assert np.array_equal(got[name], grad[name]), name
    summary = simulate(plan.actions(), N, [fields], sizes=(2, 1))
    assert result.forward_steps == summary.forward_steps == plan.forward_steps()
    assert driver.data_stats()["writes"] == summary.data_writes[0]
    if budget != "tight":
        assert summary.data_writes[0] > 0
    if fields >= N - 1:
        assert result.forward_steps == N


#: a 3-D grid whose fields exceed MAPPED_MIN_BYTES on every rank up to 3: pooled buffers in mappings
LARGE = (44, 36, 40)


def test_steps_data_reuse_idle_buffers_and_the_adjoint_step_reads_them_in_place(comm):
    """A step's data are made in a recycled field buffer (no fresh pages per capture), never in one
    whose data are still held, and the stand-in state the adjoint step reads is a Vec over that very
    buffer (no copy per step)."""
    from hpcadj.imports import petsc

    model = WaveModel(comm, LARGE, n_steps=4)
    model.set_controls(_controls(model))
    u = model.step(0, model.initial_state())
    data = model.adjoint_data(1, u, None)
    held = {"u": data["u"].view()}  # as a RAM level holds donated data
    kept = held["u"].copy()
    state = model.adjoint_data_state(1, data)
    assert np.shares_memory(state.getArray(readonly=True), data["u"])
    address = data["u"].__array_interface__["data"][0]
    state.destroy()
    del state, data
    other = model.adjoint_data(2, model.step(1, u), None)
    assert other["u"].__array_interface__["data"][0] != address
    assert np.array_equal(held["u"], kept)
    del held, other
    petsc().garbage_cleanup(comm)
    assert model.adjoint_data(1, u, None)["u"].__array_interface__["data"][0] == address


def test_a_3d_mixed_plan_over_large_fields_gives_the_store_all_gradient_bitwise(comm):
    n = 8
    model = WaveModel(comm, LARGE, n_steps=n)
    controls = _controls(model)
    ref, _ = _run(model, make_schedule("store-all", n, [n]), n, controls)
    want = owned(ref)
    plan = Mixed(n, [5], state_size=2, data_size=1)
    got, driver = _run(model, plan, 2, controls)
    assert driver.data_stats()["writes"] > 1
    assert got.J == ref.J
    for name, value in owned(got).items():
        assert np.array_equal(value, want[name]), name


def test_a_plan_storing_data_for_a_model_without_any_is_refused(comm):
    from hpcadj.checkpoint.schedules.actions import PlanError

    model = WaveModel(comm, (14, 12), n_steps=6)
    model.adjoint_data_layout = lambda: None
    with pytest.raises(PlanError, match="declares no adjoint data"):
        _run(model, Mixed(6, [5], state_size=2, data_size=1), 2, model.default_controls())


class WrongData(WaveModel):
    """Declares u^{i-1} as its data, where its adjoint step reads u^i."""

    def adjoint_data(self, i, u, u_next):
        return {"u": np.array(self._fields(u)[0])}


def test_check_catches_data_that_are_not_what_the_adjoint_step_reads(comm):
    from hpcadj.adjoint.contract import check_contract

    good = check_contract(WaveModel(comm, (14, 12), n_steps=6), steps=2)
    assert good["adjoint_data"].status == "PASSED", good["adjoint_data"].reason
    wrong = check_contract(WrongData(comm, (14, 12), n_steps=6), steps=2)
    assert wrong["adjoint_data"].status == "FAILED"
    assert "from its declared data gives another lambda, dJ/dc" in wrong["adjoint_data"].reason


class ReadsPrevious(WaveModel):
    """Declares u^i as its data, but its adjoint step reads u^{i-1} too: from the one-field stand-in
    of its data it raises (a ValueError of numpy's reshape)."""

    def adjoint_step(self, i, u, u_next, lam_next, grad):
        self._fields(u)
        return super().adjoint_step(i, u, u_next, lam_next, grad)


def test_a_model_raising_in_the_data_check_fails_it_with_its_one_line(comm):
    """The model's exception is the check's FAILED verdict, and a mixed run's one refusal, naming
    the step and the exception, the same on every rank."""
    from hpcadj.adjoint.contract import check_contract
    from hpcadj.adjoint.session import GradientSession
    from hpcadj.checkpoint.options import Checkpointing, ConfigError

    with pytest.raises(ConfigError, match="cannot trust 'wave''s adjoint data: (rank 0: )?step 0: ValueError") as caught:
        GradientSession(ReadsPrevious(comm, (14, 12), n_steps=6), Checkpointing(schedule="mixed")).solve()
    assert len(set(comm.allgather(str(caught.value)))) == 1 and "\n" not in str(caught.value)
    result = check_contract(ReadsPrevious(comm, (14, 12), n_steps=6), steps=2)["adjoint_data"]
    assert result.status == "FAILED" and "step 0: ValueError: cannot reshape" in result.reason, result
    assert len(set(comm.allgather(result.reason))) == 1


def test_a_mixed_run_refuses_a_model_whose_data_are_wrong_before_any_gradient(comm):
    from hpcadj.adjoint.session import GradientSession
    from hpcadj.checkpoint.options import Checkpointing, ConfigError

    model = WrongData(comm, (14, 12), n_steps=6)
    with pytest.raises(ConfigError, match="cannot trust 'wave''s adjoint data: .*from its declared data"):
        GradientSession(model, Checkpointing(schedule="mixed")).solve()


def test_a_model_object_s_data_are_checked_once_and_a_new_wrong_one_still_refused(comm, monkeypatch):
    """An inversion's or hesscheck's sessions on one model object check its data in the first only."""
    from hpcadj.adjoint import data_check
    from hpcadj.adjoint.session import GradientSession
    from hpcadj.checkpoint.options import Checkpointing, ConfigError

    checked = []
    problem = data_check.adjoint_data_problem
    monkeypatch.setattr(data_check, "adjoint_data_problem", lambda *a, **k: checked.append(1) or problem(*a, **k))
    model = WaveModel(comm, (14, 12), n_steps=6)
    controls = model.default_controls()
    for _ in range(3):
        controls["c"].scale(1.01)
        GradientSession(model, Checkpointing(schedule="mixed"), controls=controls).solve()
    assert len(checked) == 1
    with pytest.raises(ConfigError, match="cannot trust 'wave''s adjoint data"):
        GradientSession(WrongData(comm, (14, 12), n_steps=6), Checkpointing(schedule="mixed")).solve()
    assert len(checked) == 2


#: (RAM budget in fields, node-local slots, HDF5 slots): restart pairs on the file levels, a mixed plan
#: inside every RAM chain between them
LEVELS = {"ram3+disk2": (6, 2, 0), "ram3+disk1+pfs2": (7, 1, 2), "ram8+disk2": (17, 2, 0)}


@pytest.mark.parametrize("async_io", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("case", LEVELS, ids=list(LEVELS))
def test_mixed_plan_over_several_levels_gives_the_store_all_gradient_bitwise(reference, case, async_io,
                                                                           comm, shared_tmp):
    from hpcadj.checkpoint.manager import CheckpointConfig, build_levels, level_slots
    from hpcadj.checkpoint.schedules.costs import OpCosts
    from hpcadj.checkpoint.schedules.mixed_levels import MixedLevels

    model, controls, J, grad = reference
    fields, disk, pfs = LEVELS[case]
    budgets = {"ram": str(fields // 2), "disk": str(disk), **({"pfs": str(pfs)} if pfs else {})}
    config = CheckpointConfig(budgets=budgets, local_dir=shared_tmp, pfs_file=f"{shared_tmp}/mixed.h5",
                              async_io=async_io)
    plans = level_slots(config, model.snapshot_layout(), comm, N)
    costs = OpCosts(forward=1.0, adjoint=2.0, write=(0.01, 0.3, 0.6)[:len(plans)],
                    read=(0.01, 0.3, 0.6)[:len(plans)])
    plan = MixedLevels(N, [fields, *(p.slots for p in plans[1:])], 2, 1, costs=costs)
    levels = build_levels(plans, model.snapshot_layout(), comm, config)
    try:
        driver = Driver(model, levels)
        result = driver.run(plan, controls)
    finally:
        for level in levels:
            level.close()
    assert result.J == J
    got = owned(result)
    for name in grad:
        assert np.array_equal(got[name], grad[name]), name
    summary = simulate(plan.actions(), N, plan.units(), sizes=(2, 1))
    today = simulate(plan.today.actions(), N, plan.slots())
    assert result.forward_steps == summary.forward_steps <= today.forward_steps
    assert driver.data_stats()["writes"] == summary.data_writes[0] > 0
    assert levels[1].stats.writes > 0, [lv.stats.writes for lv in levels]  # restart states on file levels


def test_a_storage_fault_in_a_mixed_plan_is_planned_around_bitwise(reference, comm, shared_tmp):
    """A node-local restart state corrupted on every rank mid-run (asynchronous writes): the driver
    re-plans the rest from what survived; same gradient bitwise. (A RAM chain's data are all used
    before the plan next touches a file level, so no data slot is held when a file level fails.)"""
    import os

    from hpcadj.checkpoint.manager import CheckpointConfig, build_levels, level_slots
    from hpcadj.checkpoint.schedules.costs import OpCosts
    from hpcadj.checkpoint.schedules.mixed_levels import MixedLevels

    model, controls, J, grad = reference
    config = CheckpointConfig(budgets={"ram": "4", "disk": "2"}, local_dir=shared_tmp, async_io=True)
    plans = level_slots(config, model.snapshot_layout(), comm, N)
    plan = MixedLevels(N, [8, plans[1].slots], 2, 1, costs=OpCosts(1.0, 2.0, (0.01, 0.3), (0.01, 0.3)))
    levels = build_levels(plans, model.snapshot_layout(), comm, config)
    disk, real = levels[1], levels[1].write
    plain, damaged = Driver(model, levels), []

    def write(step, snapshot, time=None, **kw):
        real(step, snapshot, time=time, **kw)
        if not damaged and step > 0:
            disk.flush()
            comm.Barrier()
            with open(disk.path(step), "r+b") as f:
                f.seek(-5, os.SEEK_END)
                b = f.read(1)
                f.seek(-5, os.SEEK_END)
                f.write(bytes([b[0] ^ 0x10]))
            damaged.append(step)
            comm.Barrier()
    disk.write = write
    try:
        result = plain.run(plan, controls)
    finally:
        for level in levels:
            level.close()
    assert damaged and plain.faults, "no fault was seen"
    assert result.J == J
    got = owned(result)
    for name in grad:
        assert np.array_equal(got[name], grad[name]), name
