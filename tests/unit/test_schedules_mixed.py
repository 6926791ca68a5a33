"""Mixed plans: the adjoint-data actions, the simulator's checks of them, and the optimal mixed plan."""

import heapq
from collections import deque

import pytest

from hpcadj.checkpoint.schedules import (Adjoint, AdjointData, Advance, EndForward, EndReverse, Free, PlanError,
                                         Restore, ScheduleError, Store, StoreData, simulate)
from hpcadj.checkpoint.schedules.actions import WorkingStates
from hpcadj.checkpoint.schedules.mixed import Mixed, least_budget
from hpcadj.checkpoint.schedules.revolve import min_forward_steps

# Forward evaluations of checkpoint_schedules' MixedCheckpointSchedule(n, s), n steps and s units, as
# {n: [s = 1, 2, ...]}: the sum of n1 - n0 over its Forward actions (the first sweep included, as
# ours). Obtained with checkpoint_schedules 1.0.4 in a venv of its own (never a dependency of
# hpcadj); to regenerate: python3 -m venv cs && cs/bin/pip install checkpoint_schedules, then
#   sum(a.n1 - a.n0 for a in MixedCheckpointSchedule(n, s) if isinstance(a, Forward))
# for n = 2..20, s = 1..min(n - 1, 8). Its model is ours with states_suffice=False and d = r: a step
# is reversed from its data only (stored, or made by evaluating the step again), one unit each.
CS_MIXED = {
    2: [2],
    3: [5, 3],
    4: [9, 6, 4],
    5: [14, 8, 7, 5],
    6: [20, 11, 9, 8, 6],
    7: [27, 15, 11, 10, 9, 7],
    8: [35, 18, 14, 12, 11, 10, 8],
    9: [44, 22, 16, 14, 13, 12, 11, 9],
    10: [54, 26, 19, 17, 15, 14, 13, 12],
    11: [65, 31, 23, 19, 17, 16, 15, 14],
    12: [77, 35, 26, 21, 20, 18, 17, 16],
    13: [90, 40, 29, 24, 22, 20, 19, 18],
    14: [104, 45, 33, 26, 24, 23, 21, 20],
    15: [119, 50, 36, 29, 26, 25, 23, 22],
    16: [135, 56, 40, 33, 29, 27, 26, 24],
    17: [152, 61, 43, 36, 31, 29, 28, 26],
    18: [170, 67, 47, 39, 33, 31, 30, 29],
    19: [189, 73, 51, 42, 36, 34, 32, 31],
    20: [209, 79, 55, 46, 38, 36, 34, 33],
}


def exhaustive_min_forward(n, budget, r, d, states_suffice, write_cost=0):
    """Least forward evaluations over every plan of the vocabulary with single-step advances.

    A 0-1 breadth-first search over (forward done, next adjoint step k, held states, held data,
    stored states, stored data), following the rules of actions.py written out again here: an
    advance keeps the held state furthest beyond its end (else its last input) and holds the step's
    data; a restore keeps the state furthest beyond and drops the data; an adjoint step from states
    keeps u_k; one from data drops the states beyond k. Items no later step can use are dropped.
    With ``write_cost`` a write costs that much and an evaluation more than any least-write plan
    writes (4 (n + 1) writes): the search (then by a heap) returns (evaluations, writes) of the least
    evaluations, then writes.
    """
    start = (False, n - 1, (0,), -1, 0, 0)
    best = {start: 0}
    queue = [(0, start)] if write_cost else deque([(0, start)])
    step = 1 + 4 * (n + 1) * write_cost if write_cost else 1
    pop = (lambda: heapq.heappop(queue)) if write_cost else queue.popleft
    while queue:
        cost, state = pop()
        if best[state] != cost:
            continue
        done, k, held, data, st, dt = state
        if done and k < 0:
            return divmod(cost, step) if write_cost else cost
        used = r * st.bit_count() + d * dt.bit_count()
        top = k + 1 if done else n
        moves = []
        for x in held:
            if x < top:
                beyond = [y for y in held if y > x + 1]
                moves.append((step, (done, k, (x + 1, beyond[0]) if beyond else (x, x + 1), x, st, dt)))
            if x <= min(k + 1, n - 1) and not st >> x & 1 and used + r <= budget:
                moves.append((write_cost, (done, k, held, data, st | 1 << x, dt)))
        if 0 <= data <= k and not dt >> data & 1 and used + d <= budget:
            moves.append((write_cost, (done, k, held, data, st, dt | 1 << data)))
        for x in (x for x in range(n + 1) if st >> x & 1):
            if x <= top:
                beyond = [y for y in held if y > x]
                moves.append((0, (done, k, (x, max(beyond)) if beyond else (x,), -1, st, dt)))
            moves.append((0, (done, k, held, data, st & ~(1 << x), dt)))
        if not done and n in held:
            moves.append((0, (True, k, held, data, st, dt)))
        if done:
            mask, keep = (1 << k) - 1, (1 << k + 1) - 1  # step k's data are spent; u_k may serve step k-1
            if states_suffice and k in held and k + 1 in held:
                moves.append((0, (True, k - 1, (k,), -1, st & keep, dt & mask)))
            if data == k or dt >> k & 1:
                moves.append((0, (True, k - 1, tuple(y for y in held if y <= k), -1, st & keep, dt & mask)))
        for c, nxt in moves:
            if cost + c < best.get(nxt, 1 << 60):
                best[nxt] = cost + c
                if write_cost:
                    heapq.heappush(queue, (cost + c, nxt))
                else:
                    (queue.append if c else queue.appendleft)((cost + c, nxt))
    return None


def checked(n, budget, r, d, states_suffice=True):
    """The plan's own count, after the simulator accepted the plan within the byte budget."""
    plan = Mixed(n, [budget], state_size=r, data_size=d, states_suffice=states_suffice)
    summary = simulate(plan.actions(), n, [budget], sizes=(r, d))
    assert summary.forward_steps == plan.forward_steps()
    assert summary.writes[0] + summary.data_writes[0] == plan.writes()
    assert summary.adjoint_steps == n and summary.peak[0] <= budget
    if not states_suffice:
        assert summary.data_adjoints == n
    return summary


# ---- the vocabulary and the simulator -------------------------------------------------------------

DATA_PLAN = [Advance(0, 1), StoreData(0, 0), Advance(1, 2), EndForward(), AdjointData(2, 1),
             AdjointData(1, 0, 0), EndReverse()]


def test_simulator_accepts_a_data_plan_and_counts_bytes():
    summary = simulate(DATA_PLAN, 2, [3], sizes=(4, 3))
    assert (summary.forward_steps, summary.data_writes, summary.writes, summary.peak) == (2, [1], [0], [3])
    assert summary.data_adjoints == 2


@pytest.mark.parametrize("plan, message", [
    ([Advance(0, 1), StoreData(1, 0)], "data of step 1 are not held"),
    ([Store(0, 0), Advance(0, 1), Restore(0, 0), StoreData(0, 0)], "not held"),
    ([Advance(0, 1), StoreData(0, 0), StoreData(0, 0)], "already stored"),
    ([Advance(0, 1), StoreData(0, 0), Advance(1, 2), StoreData(1, 0)], "full"),
    ([Store(0, 0), Advance(0, 1), StoreData(0, 0)], "full"),
    ([Advance(0, 2), EndForward(), AdjointData(2, 1), AdjointData(1, 0)], "data of step 0 are not held"),
    ([Advance(0, 2), EndForward(), AdjointData(2, 1), AdjointData(1, 0, 0)], "not stored"),
    ([Advance(0, 1), StoreData(0, 0), Advance(1, 2), AdjointData(2, 1)], "before EndForward"),
    ([Advance(0, 1), StoreData(0, 0), Advance(1, 2), EndForward(), AdjointData(1, 0, 0)], "out of order"),
    ([Advance(0, 1), StoreData(0, 0), Advance(1, 2), EndForward(), EndReverse()], "before adjoint step 1"),
    ([Advance(0, 1), StoreData(0, 0), Advance(1, 2), EndForward(), AdjointData(2, 1), Adjoint(1, 0)],
     "not held"),
    ([Advance(0, 1), StoreData(0, 7)], "does not exist"),
])
def test_simulator_rejects_wrong_data_plans(plan, message):
    with pytest.raises(PlanError, match=message):
        simulate(plan, 2, [4], sizes=(4, 3))


def test_data_left_stored_is_an_error():
    plan = [Store(0, 0), Advance(0, 2), StoreData(1, 0), EndForward(), Adjoint(2, 1), Restore(0, 0), Adjoint(1, 0),
            Free(0, 0), EndReverse()]
    with pytest.raises(PlanError, match=r"still stored: \[\(0, 'data', \[1\]\)\]"):
        simulate(plan, 2, [7], sizes=(4, 3))
    with pytest.raises(PlanError, match="full"):
        simulate(plan, 2, [6], sizes=(4, 3))


def test_working_states_hold_the_last_steps_data_until_the_next_change():
    work = WorkingStates(0, "u0")
    work.advanced(0, 3, "u2", "u3", data="D2")
    assert (work.steps(), work.data_step(), work.get_data(2)) == ([2, 3], 2, "D2")
    work.restored(1, "u1")
    assert work.data_step() is None and work.steps() == [1, 3]
    work.advanced(1, 2, "u1", "u2", data="D1")
    assert work.steps() == [2, 3]
    work.data_adjoint_done(1)
    assert work.steps() == [] and work.data_step() is None
    with pytest.raises(PlanError, match="not held"):
        work.get_data(1)


def test_data_adjoint_keeps_the_states_it_does_not_pass():
    work = WorkingStates(0, "u0")
    work.advanced(0, 1, "u0", "u1", data="D0")
    work.data_adjoint_done(0)
    assert work.steps() == [0]


# ---- the optimal mixed plan -----------------------------------------------------------------------

def test_equal_sizes_match_checkpoint_schedules_mixed():
    for n, row in CS_MIXED.items():
        for s, theirs in enumerate(row, start=1):
            assert checked(n, s, 1, 1, states_suffice=False).forward_steps == theirs, (n, s)


def test_equal_sizes_with_state_reversal_are_revolve():
    """Where states suffice and d = r, data buy nothing: the binomial minimum (u_0's slot counted)."""
    for n in range(2, 40):
        for s in (1, 2, 3, 5, 9):
            assert checked(n, s, 1, 1).forward_steps == min_forward_steps(n, s), (n, s)


SIZES = [(2, 1), (2, 3), (3, 2), (4, 3), (1, 2)]


@pytest.mark.parametrize("r, d", SIZES)
@pytest.mark.parametrize("states_suffice", [True, False])
def test_unequal_sizes_match_an_exhaustive_search(r, d, states_suffice):
    """Every budget from the least to where storing every step fits (beyond it n is the plain minimum);
    n <= 6, or 5 where that budget is largest (large data that states cannot replace)."""
    for n in range(1, 6 if d > r and not states_suffice else 7):
        full = (n - 1) * (min(r, d) if states_suffice else d)
        for budget in range(least_budget(n, r, d), full + 1):
            ours = checked(n, budget, r, d, states_suffice).forward_steps
            assert ours == exhaustive_min_forward(n, budget, r, d, states_suffice), (n, budget)
        assert checked(n, full + max(r, d), r, d, states_suffice).forward_steps == n


@pytest.mark.parametrize("n, budget, r, d, states_suffice", [
    (12, 3, 2, 1, True), (9, 5, 2, 1, True), (12, 5, 3, 2, False), (10, 4, 2, 3, True), (12, 3, 2, 1, False),
])
def test_longer_chains_match_an_exhaustive_search(n, budget, r, d, states_suffice):
    assert checked(n, budget, r, d, states_suffice).forward_steps == \
        exhaustive_min_forward(n, budget, r, d, states_suffice)


@pytest.mark.parametrize("r, d", [(2, 1), (2, 3), (1, 1)])
@pytest.mark.parametrize("states_suffice", [True, False])
def test_fewest_writes_among_the_fewest_evaluations(r, d, states_suffice):
    for n in range(2, 6):
        for budget in range(least_budget(n, r, d), (n - 1) * max(r, d) + 1):
            summary = checked(n, budget, r, d, states_suffice)
            ours = (summary.forward_steps, summary.writes[0] + summary.data_writes[0])
            assert ours == exhaustive_min_forward(n, budget, r, d, states_suffice, write_cost=1), (n, budget)


@pytest.mark.parametrize("states_suffice", [True, False])
def test_store_all_with_data_is_the_cheapest_complete_plan(states_suffice):
    """Wave-like sizes (d = r/2): the data of every step but the last fit, every step runs once."""
    n, r, d = 40, 2, 1
    summary = checked(n, (n - 1) * d, r, d, states_suffice)
    assert (summary.forward_steps, summary.data_writes, summary.writes) == (n, [n - 1], [0])
    # one unit less: some step must be evaluated again, and restart states of twice the size
    # buy back less than the data they displace
    tighter = checked(n, (n - 1) * d - 1, r, d, states_suffice)
    assert tighter.forward_steps > n
    revolve = min_forward_steps(n, (n - 1) * d // r)
    assert checked(n, (n - 1) * d, r, d).forward_steps < revolve


def test_data_beat_revolve_between_one_and_two_fields_a_step():
    """Leapfrog sizes (restart = 2 fields, data = 1): fewer evaluations than revolve on the same RAM."""
    n = 60
    for fields in (10, 20, 30, 45):
        ours = checked(n, fields, 2, 1).forward_steps
        assert ours < min_forward_steps(n, fields // 2), fields


def test_a_budget_below_the_least_names_it():
    n, r, d = 10, 8, 3
    least = least_budget(n, r, d)
    assert least == min(r, (n - 1) * d) == 8
    with pytest.raises(ScheduleError, match="the least that would do is 8"):
        Mixed(n, [least - 1], r, d)
    checked(n, least, r, d)
    assert least_budget(3, 8, 3) == 6
    checked(3, 6, 8, 3)
    with pytest.raises(ScheduleError, match="least that would do is 6"):
        Mixed(3, [5], 8, 3)


def test_one_step_needs_no_budget():
    assert checked(1, 0, 4, 3).forward_steps == 1


def test_the_plan_is_the_same_stream_every_time():
    plan = Mixed(30, [17], 3, 2)
    assert list(plan.actions()) == list(plan.actions())


def test_make_schedule_builds_the_mixed_plan_and_run_offers_it():
    from hpcadj.checkpoint.schedules import SCHEDULES, make_schedule
    plan = make_schedule("mixed", 20, [9], state_size=2, data_size=1)
    assert list(plan.actions()) == list(Mixed(20, [9], 2, 1).actions())
    assert "mixed" in SCHEDULES
    with pytest.raises(ScheduleError, match="least that would do is 2"):
        make_schedule("mixed", 20, [1], state_size=2, data_size=1)


def test_random_cases_pass_the_simulator_on_any_level():
    import random
    rng = random.Random(41)
    for _ in range(25):
        n, r, d = rng.randint(2, 60), rng.randint(1, 6), rng.randint(1, 6)
        states_suffice = rng.random() < 0.5
        budget = rng.randint(least_budget(n, r, d), (n - 1) * max(r, d))
        plan = Mixed(n, [0, budget], r, d, states_suffice, level=1)
        summary = simulate(plan.actions(), n, [0, budget], sizes=(r, d))
        assert summary.forward_steps == plan.forward_steps() and summary.peak[1] <= budget
        smaller = budget - min(r, d)
        if smaller >= least_budget(n, r, d):  # less room never needs fewer evaluations
            assert Mixed(n, [smaller], r, d, states_suffice).forward_steps() >= summary.forward_steps
