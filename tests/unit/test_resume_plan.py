"""Re-planning from a resumed state: every residual plan is checked by the simulator."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcadj.checkpoint.schedules import ScheduleError, Simulator
from hpcadj.checkpoint.schedules.actions import Adjoint, Advance, Free, Move, Restore, Store
from hpcadj.checkpoint.schedules.resume import residual_plan, shift


def run_residual(n, caps, retained, lam_step):
    sim = Simulator.resumed(n, caps, retained, lam_step)
    for action in residual_plan(n, caps, retained, lam_step=lam_step):
        sim.execute(action)
    return sim.result()


def test_shift_moves_every_step():
    assert shift(Advance(1, 4), 10) == Advance(11, 14)
    assert shift(Adjoint(4, 3), 10) == Adjoint(14, 13)
    assert shift(Store(2, 1), 5) == Store(7, 1)
    assert shift(Restore(2, 1), 5) == Restore(7, 1)
    assert shift(Free(2, 0), 5) == Free(7, 0)
    assert shift(Move(2, 0, 1), 5) == Move(7, 0, 1)


def test_restart_before_anything_survived_is_a_full_plan():
    summary = run_residual(20, [4], {}, lam_step=None)
    assert summary.adjoint_steps == 20
    assert summary.forward_steps >= 20


def test_reverse_sweep_resumes_from_lambda_and_retained_snapshots():
    summary = run_residual(30, [3, 2], {0: 1, 10: 1, 20: 0}, lam_step=25)
    assert summary.adjoint_steps == 25
    # segment [20, 25] needs at most 5 recomputed steps, [10, 20] and [0, 10] at most one sweep more
    assert summary.forward_steps <= 5 + 10 * 4 + 10 * 4


def test_full_levels_merge_segments():
    # every slot of the only level is taken by retained snapshots: segments must merge downwards
    summary = run_residual(12, [3], {0: 0, 4: 0, 8: 0}, lam_step=10)
    assert summary.adjoint_steps == 10


def test_nothing_fits_is_an_error():
    with pytest.raises(ScheduleError):
        list(residual_plan(10, [0], {}, lam_step=None))


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 40), caps=st.lists(st.integers(0, 4), min_size=1, max_size=3),
       seed=st.integers(0, 10**6), reverse=st.booleans())
def test_random_resumed_states_give_valid_plans(n, caps, seed, reverse):
    if sum(caps) < 1:
        caps = [1] + caps[1:]
    rng = random.Random(seed)
    lam_step = rng.randint(1, n) if reverse else None
    top = n if lam_step is None else lam_step
    retained, used = {}, [0] * len(caps)
    for step in sorted(rng.sample(range(top), min(top, rng.randint(0, 4)))):
        free = [lv for lv, c in enumerate(caps) if used[lv] < c]
        if free:
            level = rng.choice(free)
            retained[step] = level
            used[level] += 1
    if 0 not in retained and sum(used) == sum(caps):
        retained.pop(max(retained))
    summary = run_residual(n, caps, retained, lam_step)
    assert summary.adjoint_steps == top


def test_predicted_durable_seconds_counts_frontier_stores_adjoint_points_and_the_interval():
    from hpcadj.checkpoint.manager import LevelPlan
    from hpcadj.restart import predicted_durable_seconds
    from hpcadj.checkpoint.schedules import CostProfile, LevelCost, make_schedule

    plans = [LevelPlan("ram", "ram", 2), LevelPlan("disk", "local", 4)]
    profile = CostProfile(forward_s=1.0, adjoint_s=2.0, levels=[LevelCost("ram", 0.01, 0.01),
                                                                LevelCost("disk", 0.2, 0.1)])
    schedule = make_schedule("multilevel", 30, [2, 4], costs=profile.vector("time"))
    from hpcadj.checkpoint.schedules.actions import EndForward
    frontier, stores = 0, 0
    for a in schedule.actions():
        if isinstance(a, EndForward):
            break
        if isinstance(a, Advance):
            frontier = max(frontier, a.n1)
        elif isinstance(a, Store) and a.level == 1 and a.n == frontier:
            stores += 1
    assert stores > 0
    none_timed = predicted_durable_seconds(schedule, plans, profile, every=2, interval=1e9, makespan_s=100.0)
    assert none_timed == pytest.approx((stores // 2 + 30 // 2) * 0.3)
    timed = predicted_durable_seconds(schedule, plans, profile, every=2, interval=10.0, makespan_s=100.0)
    assert timed == pytest.approx(none_timed + 10 * 0.3)
    ram_only = predicted_durable_seconds(schedule, [plans[0], LevelPlan("disk2", "ram", 4)], profile,
                                         every=2, interval=10.0, makespan_s=100.0)
    assert ram_only == 0.0
