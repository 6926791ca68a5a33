"""Mixed plans for adaptive steps: the online planner's first sweep, then the cheaper of its own reverse
sweep and a mixed one — never more forward steps than today's online plan, every plan valid in bytes."""

import itertools

import pytest

from hpcadj.checkpoint.schedules import Simulator, simulate_online
from hpcadj.checkpoint.schedules.actions import StoreData
from hpcadj.checkpoint.schedules.costs import OpCosts
from hpcadj.checkpoint.schedules.online_mixed import OnlineMixed, online_mixed_factory
from hpcadj.checkpoint.schedules.online_plans import online_factory

COSTS = OpCosts(forward=1.0, adjoint=2.0, write=(0.01, 0.3), read=(0.01, 0.3))


def _run(n, slots, ram_units, sizes=(2, 1), states_suffice=True, costs=None):
    """(the mixed plan's summary, today's online plan's forward steps, the planner)."""
    factory = online_factory(slots, costs)
    plan = online_mixed_factory(factory, ram_units, sizes, states_suffice, costs)(slots)
    sim = Simulator(n, plan.units(), sizes)
    for _ in range(n):
        for action in plan.step():
            sim.execute(action)
    actions = list(plan.finish())
    for action in actions:
        sim.execute(action)
    return sim.result(), simulate_online(factory(slots), n).forward_steps, plan, actions


@pytest.mark.parametrize("n, slots, spare, sizes", list(itertools.product(
    (2, 7, 15, 31, 60), ([2], [4], [7], [2, 2], [3, 4]), (0, 1), ((2, 1), (3, 2), (1, 1)))))
def test_never_more_forward_steps_than_today_s_online_plan(n, slots, spare, sizes):
    costs = COSTS if len(slots) > 1 else None
    summary, today, plan, _ = _run(n, slots, slots[0] * sizes[0] + spare % sizes[0], sizes, costs=costs)
    assert summary.adjoint_steps == n
    assert summary.forward_steps <= today
    assert plan.chosen in ("mixed", "states")


def test_data_in_the_reverse_sweep_save_forward_steps():
    summary, today, plan, actions = _run(80, [4], 9)
    assert plan.chosen == "mixed" and summary.forward_steps < today
    assert any(isinstance(a, StoreData) for a in actions)


def test_steps_that_must_run_again_for_their_data_keep_today_s_reverse_sweep():
    summary, today, plan, actions = _run(40, [4], 9, sizes=(1, 4), states_suffice=False)
    assert plan.chosen == "states" and summary.forward_steps == today
    assert not any(isinstance(a, StoreData) for a in actions)


def test_a_planner_named_for_the_report():
    assert OnlineMixed.name == "online-mixed"
