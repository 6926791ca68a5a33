"""Every model, schedule and level mix gives a gradient bitwise identical to store-all in RAM."""

import numpy as np
import pytest

from model_checks import owned, small_model, store_all_reference

from hpcadj.adjoint import Driver
from hpcadj.checkpoint.manager import CheckpointConfig, build_levels, level_slots, make_plan, profile_for
from hpcadj.models import MODELS

N_STEPS = 9

#: (schedule, budgets per level), budgets in slots
PLANS = [
    ("store-all", {"disk": "8"}),
    ("store-all", {"pfs": "8"}),
    ("periodic", {"ram": "3"}),
    ("revolve", {"ram": "2"}),
    ("revolve", {"disk": "3"}),
    ("revolve", {"pfs": "3"}),
    ("online", {"ram": "3"}),
    ("multilevel", {"ram": "1", "disk": "2"}),
    ("multilevel", {"ram": "1", "disk": "1", "pfs": "2"}),
    ("auto", {"ram": "2", "disk": "2", "pfs": "2"}),
]


@pytest.fixture(scope="module", params=sorted(MODELS))
def reference(request, comm):
    return store_all_reference(small_model(request.param, comm, N_STEPS))


@pytest.mark.parametrize("async_io", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("schedule,budgets", PLANS, ids=[f"{s}-{'+'.join(b)}" for s, b in PLANS])
def test_bitwise_identical_to_store_all(reference, schedule, budgets, async_io, comm, shared_tmp):
    model, controls, J_ref, grad_ref = reference
    config = CheckpointConfig(budgets=budgets, local_dir=shared_tmp, pfs_file=f"{shared_tmp}/ck.h5",
                              async_io=async_io)
    plans = level_slots(config, model.snapshot_layout(), comm, model.n_steps)
    plan = make_plan(schedule, model.n_steps, plans, profile_for(plans, None))
    levels = build_levels(plans, model.snapshot_layout(), comm, config)
    try:
        result = Driver(model, levels).run(plan, controls)
    finally:
        for level in levels:
            level.close()
    assert result.J == J_ref
    for name, ref in grad_ref.items():
        assert np.array_equal(result.gradient[name].getArray(), ref), name
    assert result.adjoint_steps == model.n_steps
    if schedule != "store-all":
        assert sum(level.stats.writes for level in levels) >= 1


def test_a_model_whose_adjoint_reads_no_next_state_gets_none_and_the_same_gradient(comm):
    """adjoint_reads_next = False: the driver passes None for u_{i+1} (freed before the step), and
    the gradient of a recomputing plan is bitwise the one the model gets with u_{i+1} passed."""
    from hpcadj.checkpoint.schedules import make_schedule
    from hpcadj.checkpoint.storage.factory import make_level
    from hpcadj.models.burgers import BurgersModel

    class Lean(BurgersModel):
        adjoint_reads_next = False
        seen = []

        def adjoint_step(self, i, u, u_next, lam_next, grad):
            self.seen.append(u_next)
            return super().adjoint_step(i, u, u_next, lam_next, grad)

    grads = []
    for cls in (BurgersModel, Lean):
        model = cls(comm, (12, 12), n_steps=9)
        levels = [make_level("ram", 3, model.snapshot_layout(), comm)]
        result = Driver(model, levels).run(make_schedule("revolve", 9, [3]), model.default_controls())
        assert result.recomputed_steps > 0
        grads.append(owned(result))
    assert Lean.seen and all(u_next is None for u_next in Lean.seen)
    for name in grads[0]:
        assert np.array_equal(grads[0][name], grads[1][name]), name


def test_garbage_cleanups_are_batched_for_small_states_alike_on_every_rank(comm, monkeypatch):
    """The collective garbage cleanup (two allreduces) runs once every ``GARBAGE_BYTES`` of states'
    global bytes of the driver's calls, at the same calls on every rank, and always at the run's end:
    small states are not synchronised after every step. States at least that large: every call. The
    gradient is the same bits whatever the cadence."""
    from hpcadj.adjoint import garbage as garbage_module
    from hpcadj.checkpoint.schedules import make_schedule
    from hpcadj.checkpoint.storage.factory import make_level
    from hpcadj.imports import petsc
    from hpcadj.models.burgers import BurgersModel

    cleanups = []

    class Counting:
        def __getattr__(self, name):
            return getattr(petsc(), name)

        @staticmethod
        def garbage_cleanup(c):
            cleanups.append(1)
            petsc().garbage_cleanup(c)

    monkeypatch.setattr(garbage_module, "petsc", Counting)
    model = BurgersModel(comm, (12, 12), n_steps=9)
    state = sum(f.global_nbytes for f in model.snapshot_layout().values())
    runs = []
    for budget, every in ((Driver.GARBAGE_BYTES, None), (3 * state, 3), (state, 1)):
        monkeypatch.setattr(Driver, "GARBAGE_BYTES", budget)
        cleanups.clear()
        levels = [make_level("ram", 3, model.snapshot_layout(), comm)]
        driver = Driver(model, levels)
        result = driver.run(make_schedule("revolve", 9, [3]), model.default_controls())
        calls = driver._gc_calls
        assert calls > 20  # a cleanup point after every forward and several per adjoint step
        if every is None:  # 2 MiB of 12x12 states: the run's end only
            assert len(cleanups) == 1, (len(cleanups), calls)
        else:
            assert len(cleanups) == (calls - 1) // every + 1, (len(cleanups), calls, every)
        assert len(set(comm.allgather((len(cleanups), calls)))) == 1
        runs.append(owned(result))
    for other in runs[1:]:
        for name in runs[0]:
            assert np.array_equal(runs[0][name], other[name]), name
