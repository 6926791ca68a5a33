"""A resumed mixed run's plan: the rest cut at the snapshots that survived, each segment a fresh mixed
plan in the bytes left; data slots never survive, so they are rebuilt by recomputation."""

import random

import pytest

from hpcadj.checkpoint.schedules import Mixed, ScheduleError, Simulator
from hpcadj.checkpoint.schedules.actions import AdjointData, EndForward, StoreData
from hpcadj.checkpoint.schedules.resume import shift


def _run(plan, resumed, retained, lam_step):
    """Execute ``resumed`` in the state a resumed driver starts from; its summary."""
    sim = Simulator.resumed(plan.n_steps, resumed.capacities, retained, lam_step, sizes=plan.sizes)
    for action in resumed.actions():
        sim.execute(action)
    return sim.result()


def test_shift_moves_data_actions():
    assert shift(StoreData(2, 0), 5) == StoreData(7, 0)
    assert shift(AdjointData(3, 2, 0), 5) == AdjointData(8, 7, 0)
    assert shift(AdjointData(3, 2), 5) == AdjointData(8, 7, None)


@pytest.mark.parametrize("states_suffice", [True, False])
def test_reverse_resume_without_snapshots_is_the_mixed_plan_of_the_steps_left(states_suffice):
    plan = Mixed(20, [17], state_size=2, data_size=1, states_suffice=states_suffice)
    for m in (1, 7, 19):
        resumed = plan.resumed([8], {}, lam_step=m)
        assert resumed.stores_data
        summary = _run(plan, resumed, {}, m)
        fresh = Mixed(m, [17], state_size=2, data_size=1, states_suffice=states_suffice)
        assert summary.adjoint_steps == m
        assert summary.forward_steps == fresh.forward_steps()
        assert sum(summary.data_writes) > 0 or m == 1
        assert EndForward() not in list(resumed.actions())


def test_forward_resume_from_a_durable_state_keeps_u0_and_finishes_both_sweeps():
    plan = Mixed(20, [17], state_size=2, data_size=1)
    resumed = plan.resumed([8], {9: 0}, lam_step=None)  # the forward file's state placed in RAM
    summary = _run(plan, resumed, {9: 0}, None)
    assert summary.adjoint_steps == 20
    assert EndForward() in list(resumed.actions())
    assert summary.peak[0] <= 17


def test_a_disk_snapshot_takes_a_slot_not_ram_bytes():
    plan = Mixed(16, [6, 3], state_size=2, data_size=1)
    resumed = plan.resumed([3, 3], {0: 1, 8: 1}, lam_step=12)
    assert resumed.capacities == (6, 3)
    summary = _run(plan, resumed, {0: 1, 8: 1}, 12)
    assert summary.adjoint_steps == 12


def test_random_resumed_states_give_valid_plans():
    rng = random.Random(7)
    for _ in range(150):
        n = rng.randint(2, 24)
        r, d = rng.choice([(2, 1), (1, 1), (1, 4), (3, 2)])
        states_suffice = rng.random() < 0.6
        budget = rng.randint(min(r, (n - 1) * d), 3 * n)
        plan = Mixed(n, [budget], state_size=r, data_size=d, states_suffice=states_suffice)
        lam_step = rng.choice([None, rng.randint(1, n)])
        top = n if lam_step is None else lam_step
        retained = {s: 0 for s in rng.sample(range(top), min(top, rng.randint(0, 2)))
                    if budget >= r * 2}
        try:
            resumed = plan.resumed([budget // r], retained, lam_step=lam_step)
        except ScheduleError:
            continue
        summary = _run(plan, resumed, retained, lam_step)
        assert summary.adjoint_steps == top, (n, r, d, budget, retained, lam_step)
        assert summary.peak[0] <= budget
