"""Simulator, store-all, periodic, revolve, costs and the registry."""

import json
import math
import random

import pytest
from hypothesis import given, settings, strategies as st

from hpcadj.checkpoint.schedules import (Adjoint, Advance, CostProfile, EndForward, EndReverse, Free, LevelCost,
                                         Move, OpCosts, PlanError, Restore, ScheduleError, Store, make_schedule,
                                         simulate)
from hpcadj.checkpoint.schedules.revolve import Revolve, min_forward_steps


def binomial_minimum(n, s):
    """1 + t n - beta(s+1, t-1), written out independently of the code under test."""
    t = 0
    while math.comb(s + t, s) < n:
        t += 1
    return 1 + t * n - (math.comb(s + t, s + 1) if t >= 1 else 0)


def classical_dp(n_max, s_max):
    """p[L][s]: least forward steps reversing L steps from a checkpoint (classical recursion)."""
    p = [[0] * (s_max + 1) for _ in range(n_max + 1)]
    for L in range(2, n_max + 1):
        p[L][1] = L * (L - 1) // 2
        for s in range(2, s_max + 1):
            p[L][s] = min(k + p[L - k][s - 1] + p[k][s] for k in range(1, L))
    return p


# ---- simulator: it must reject every kind of wrong plan -------------------------------------------

GOOD = [Store(0, 0), Advance(0, 2), EndForward(), Adjoint(2, 1), Restore(0, 0), Adjoint(1, 0), Free(0, 0),
        EndReverse()]


def test_simulator_accepts_and_counts_a_right_plan():
    result = simulate(GOOD, 2, [1], OpCosts(1.0, 2.0, (0.5,), (0.25,)))
    assert (result.forward_steps, result.writes, result.reads, result.peak) == (2, [1], [1], [1])
    assert result.predicted == 2 * 1.0 + 2 * 2.0 + 0.5 + 0.25


@pytest.mark.parametrize("plan, message", [
    ([Advance(0, 2), EndForward(), Adjoint(2, 1), Restore(0, 0)], "not stored"),
    ([Store(0, 0), Store(1, 0)], "not held"),
    ([Store(0, 0), Advance(0, 1), Store(1, 0)], "full"),
    ([Store(0, 0), Store(0, 0)], "already stored"),
    ([Store(0, 0), Advance(0, 2), Adjoint(2, 1)], "before EndForward"),
    ([Store(0, 0), Advance(0, 2), EndForward(), Adjoint(1, 0)], "out of order"),
    ([Store(0, 0), Advance(0, 2), EndForward(), Adjoint(2, 1), Adjoint(1, 0)], "not held"),
    ([Store(0, 0), Advance(0, 1), EndForward()], "not held"),
    ([Store(0, 0), Advance(0, 3)], "beyond"),
    ([Store(0, 0), Advance(0, 2), EndForward(), Adjoint(2, 1), Restore(0, 0), Adjoint(1, 0), EndReverse()],
     "still stored"),
    ([Store(0, 0), Advance(0, 2), EndForward(), Adjoint(2, 1), EndReverse()], "before adjoint step 0"),
    (GOOD + [Free(0, 0)], "after EndReverse"),
    ([Store(0, 5)], "does not exist"),
    ([Store(0, 0), Move(0, 0, 1), Move(0, 0, 1)], "not stored"),
    ([Free(0, 0)], "not stored"),
    (GOOD[:-1], "without EndReverse"),
])
def test_simulator_rejects_wrong_plans(plan, message):
    with pytest.raises(PlanError, match=message):
        simulate(plan, 2, [1, 1])


def test_move_counts_a_read_and_a_write():
    plan = [Store(0, 0), Move(0, 0, 1), Advance(0, 2), EndForward(), Adjoint(2, 1), Restore(0, 1), Adjoint(1, 0),
            Free(0, 1), EndReverse()]
    result = simulate(plan, 2, [1, 1])
    assert result.writes == [1, 1] and result.reads == [1, 1] and result.peak == [1, 1]


# ---- store-all and periodic ------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 17])
def test_store_all_recomputes_nothing(n):
    result = simulate(make_schedule("store-all", n, [0, max(1, n - 1)]).actions(), n, [0, max(1, n - 1)])
    assert result.forward_steps == n and result.writes == [0, max(1, n - 1)]


def test_store_all_refuses_too_small_a_budget():
    with pytest.raises(ScheduleError, match="store-all needs 9 slots"):
        make_schedule("store-all", 10, [5, 3])


@pytest.mark.parametrize("n, caps, period, forward, peaks", [
    # sweep 12; periods [0,3) [3,6) [6,9) recompute 2 + 1 each, the last [9,12) only u_10: 1
    (12, [4], 3, 12 + 3 * 3 + 1, [4]),
    # room for the inner states on level 1: each full period is recomputed once (2), the last 1
    (12, [6, 4], 3, 12 + 3 * 2 + 1, [4, 1]),
    (10, [10], 1, 10, [10]),
])
def test_periodic_counts(n, caps, period, forward, peaks):
    result = simulate(make_schedule("periodic", n, caps, period=period).actions(), n, caps)
    assert result.forward_steps == forward
    assert result.peak == peaks


def test_periodic_without_inner_room_recomputes_quadratically():
    # one period of 10 from u_0, no other room: 10 (sweep) + 8 + 7 + ... + 1 = 10 + 36
    result = simulate(make_schedule("periodic", 10, [1], period=10).actions(), 10, [1])
    assert result.forward_steps == 10 + 36


def test_periodic_refuses_a_period_that_does_not_fit():
    with pytest.raises(ScheduleError, match="needs 5 slots"):
        make_schedule("periodic", 10, [3], period=2)


# ---- revolve: the binomial minimum -------------------------------------------------------------------

def test_known_minima():
    assert min_forward_steps(3, 1) == 4
    assert min_forward_steps(1000, 20) == 2748
    assert [min_forward_steps(n, 2) for n in range(1, 8)] == [1, 2, 3, 5, 7, 9, 12]


def test_count_formula_matches_the_classical_recursion():
    p = classical_dp(120, 8)
    for n in range(1, 121):
        for s in range(1, 9):
            assert min_forward_steps(n, s) == 1 + p[n][s] == binomial_minimum(n, s), (n, s)


def test_formula_every_n_to_2000_every_s_to_50():
    for s in range(1, 51):
        for n in range(1, 2001):
            assert min_forward_steps(n, s) == binomial_minimum(n, s)


def test_revolve_plans_reach_the_minimum_small_grid():
    for n in range(1, 161):
        for s in range(1, 13):
            result = simulate(Revolve(n, [s]).actions(), n, [s])
            assert result.forward_steps == binomial_minimum(n, s), (n, s)
            assert result.peak[0] <= s


def test_revolve_plans_reach_the_minimum_sampled_to_2000_and_50():
    rng = random.Random(4)
    for _ in range(120):
        n, s = rng.randint(1, 2000), rng.randint(1, 50)
        assert simulate(Revolve(n, [s]).actions(), n, [s]).forward_steps == binomial_minimum(n, s), (n, s)


@pytest.mark.parametrize("n, s", [(10**5, 20), (123457, 7), (300000, 50)])
def test_revolve_large_n_counted_from_the_stream(n, s):
    forward = sum(a.n1 - a.n0 for a in Revolve(n, [s]).actions() if type(a) is Advance)
    assert forward == binomial_minimum(n, s)


def test_revolve_matches_checkpoint_schedules_on_small_cases():
    from checkpoint_schedules import Forward, Revolve as CsRevolve
    for n, s in [(3, 1), (10, 2), (25, 3), (60, 5), (100, 4)]:
        theirs = sum(a.n1 - a.n0 for a in CsRevolve(n, s) if isinstance(a, Forward))
        ours = simulate(Revolve(n, [s]).actions(), n, [s]).forward_steps
        assert theirs == ours + n - 1, (n, s, theirs, ours)


def test_revolve_streams_a_million_steps():
    """A million-step plan streamed in bounded CPU time (3 s on the 2-core VM; this process's CPU
    time, not the wall clock, which other work on a shared machine stretches)."""
    import time
    start = time.process_time()
    count = sum(1 for _ in Revolve(10**6, [20]).actions())
    assert count > 3 * 10**6
    assert time.process_time() - start < 20


# ---- costs --------------------------------------------------------------------------------------------

def test_cost_profile_round_trips_and_switches_units(tmp_path):
    profile = CostProfile(forward_s=2.0, adjoint_s=3.0, forward_j=50.0, adjoint_j=None, source="rapl",
                          levels=[LevelCost("ram", 0.1, 0.2, write_j=1.0, read_j=2.0),
                                  LevelCost("disk", 1.0, 0.5, overlap=0.75)])
    path = tmp_path / "costs.json"
    profile.save(path)
    again = CostProfile.load(path)
    assert again == profile and json.loads(path.read_text())["source"] == "rapl"
    assert again.vector("time") == OpCosts(2.0, 3.0, (0.1, 0.25), (0.2, 0.5))
    assert again.vector("energy") == OpCosts(50.0, 300.0, (1.0, 100.0), (2.0, 50.0))
    with pytest.raises(ValueError, match="minimize"):
        again.vector("money")


@pytest.mark.parametrize("text", ["[1]", "{\"forward_s\": -1}", "{\"nope\": 1}", "not json"])
def test_bad_cost_profiles_are_value_errors(tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError):
        CostProfile.load(path)


def test_fill_seconds_are_per_filled_slot_and_round_trip(tmp_path):
    profile = CostProfile(levels=[LevelCost("ram", 0.1, 0.1, fill_s=0.004), LevelCost("disk", 1.0, 1.0)])
    assert profile.fill_seconds([7, 3]) == pytest.approx(0.028)
    path = tmp_path / "costs.json"
    profile.save(path)
    assert CostProfile.load(path).levels[0].fill_s == 0.004
    assert CostProfile.from_dict({"levels": [{"name": "ram", "write_s": 0, "read_s": 0}]}).fill_seconds([5]) == 0
    with pytest.raises(ValueError, match="fill_s"):
        LevelCost("ram", 0.1, 0.1, fill_s=-1.0)


def test_overlap_must_be_a_fraction():
    with pytest.raises(ValueError, match="overlap"):
        LevelCost("disk", 1.0, 1.0, overlap=1.5)


# ---- registry and property tests ------------------------------------------------------------------------

def test_registry_refuses_unknown_names_and_missing_steps():
    with pytest.raises(ScheduleError, match="unknown schedule"):
        make_schedule("greedy", 10, [3])
    with pytest.raises(ScheduleError, match="needs the number of steps"):
        make_schedule("revolve", None, [3])
    with pytest.raises(ScheduleError, match="no slot"):
        make_schedule("revolve", 10, [0, 0])


def test_auto_is_revolve_on_one_level_and_multilevel_on_more():
    assert make_schedule("auto", 10, [3]).name == "revolve"
    assert make_schedule("auto", 10, [3, 4]).name == "multilevel"


costs_strategy = st.builds(
    lambda uf, ub, w, r: (uf, ub, w, r),
    st.floats(0.01, 5), st.floats(0, 5), st.lists(st.floats(0, 5), min_size=3, max_size=3),
    st.lists(st.floats(0, 5), min_size=3, max_size=3))


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["store-all", "periodic", "revolve", "multilevel", "online", "auto"]),
       n=st.integers(1, 150), caps=st.lists(st.integers(0, 12), min_size=1, max_size=3), c=costs_strategy)
def test_every_schedule_passes_the_simulator(name, n, caps, c):
    k = len(caps)
    costs = OpCosts(c[0], c[1], tuple(c[2][:k]), tuple(c[3][:k]))
    try:
        plan = make_schedule(name, n, caps, costs=costs)
    except ScheduleError:
        assert sum(caps) == 0 or name in ("store-all", "periodic")
        return
    result = simulate(plan.actions(), n, caps, costs)
    assert result.adjoint_steps == n and result.forward_steps >= n
    assert all(p <= c for p, c in zip(result.peak, caps))
    if name == "revolve":
        level = next(i for i, c in enumerate(caps) if c > 0)
        assert result.forward_steps == binomial_minimum(n, max(1, min(caps[level], n - 1)))
    if name in ("multilevel",) or (name == "auto" and sum(1 for c in caps if c) > 1):
        assert result.predicted == pytest.approx(plan.predicted, rel=1e-9, abs=1e-9)
