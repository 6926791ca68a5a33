"""Online checkpointing: the step/finish protocol, the documented bound, and its misuse."""

import math

import pytest

from hpcadj.checkpoint.schedules import (Advance, OnlineSchedule, ScheduleError, make_schedule, online_bound,
                                         simulate, simulate_online)


def offline_minimum(n, s):
    t = 0
    while math.comb(s + t, s) < n:
        t += 1
    return 1 + t * n - (math.comb(s + t, s + 1) if t >= 1 else 0)


def test_bound_holds_and_store_all_regime_is_optimal():
    for s in range(1, 13):
        for n in range(1, 260):
            result = simulate_online(OnlineSchedule([s]), n)
            assert result.peak[0] <= s
            assert offline_minimum(n, s) <= result.forward_steps <= online_bound(n, s), (n, s)
            if n <= s + 1 or s == 1:
                assert result.forward_steps == offline_minimum(n, s), (n, s)


@pytest.mark.parametrize("n, s, ratio", [(1000, 20, 1.05), (10**4, 50, 1.03)])
def test_close_to_offline_at_realistic_sizes(n, s, ratio):
    result = simulate(make_schedule("online", n, [s]).actions(), n, [s])
    assert result.forward_steps <= ratio * offline_minimum(n, s)


def test_step_returns_one_advance_and_the_schedule_learns_n_at_finish():
    plan = make_schedule("online", None, [3])
    batches = [plan.step() for _ in range(5)]
    assert [b[-1] for b in batches] == [Advance(i, i + 1) for i in range(5)]
    rest = list(plan.finish())
    assert type(rest[0]).__name__ == "EndForward" and type(rest[-1]).__name__ == "EndReverse"
    with pytest.raises(ScheduleError, match="after finish"):
        plan.step()
    with pytest.raises(ScheduleError, match="twice"):
        plan.finish()


def test_finish_before_any_step_and_no_slot_are_errors():
    with pytest.raises(ScheduleError, match="before any step"):
        OnlineSchedule([2]).finish()
    with pytest.raises(ScheduleError, match="at least one slot"):
        OnlineSchedule([0])


# --- OnlineBinomial: the greedy one-level planner (online_binomial.py) ---

from hpcadj.checkpoint.schedules.online_binomial import OnlineBinomial, reverse_cost  # noqa: E402


@pytest.mark.parametrize("s", range(1, 15))
def test_binomial_online_is_optimal_up_to_beta_s_2(s):
    for n in range(1, math.comb(s + 2, 2) + 2):
        result = simulate_online(OnlineBinomial([s]), n)
        assert result.peak[0] <= s
        assert result.forward_steps == offline_minimum(n, s), (n, s)


@pytest.mark.parametrize("s", [2, 3, 5, 8, 12])
def test_binomial_online_beyond_the_optimal_range_is_valid_and_close(s):
    worst = 1.0
    for n in range(math.comb(s + 2, 2) + 2, math.comb(s + 3, 3) + 2):
        plan = OnlineBinomial([s])
        result = simulate_online(plan, n)
        assert result.forward_steps == reverse_cost(plan.stored, n, s)
        assert offline_minimum(n, s) <= result.forward_steps <= n + (n - 1) * (n - 2) // 2 + 1
        worst = max(worst, result.forward_steps / offline_minimum(n, s))
    assert worst <= 1.07, worst


@pytest.mark.parametrize("n, s, ratio", [(1000, 20, 1.0), (10**4, 50, 1.0), (10**4, 10, 1.003)])
def test_binomial_online_at_realistic_sizes(n, s, ratio):
    result = simulate_online(OnlineBinomial([s]), n)
    assert result.forward_steps <= ratio * offline_minimum(n, s)
    assert result.forward_steps < simulate_online(OnlineSchedule([s]), n).forward_steps or n <= s + 1


def test_binomial_online_protocol_errors():
    plan = OnlineBinomial([2])
    with pytest.raises(ScheduleError, match="before any step"):
        plan.finish()
    plan.step()
    list(plan.finish())
    with pytest.raises(ScheduleError, match="after finish"):
        plan.step()
    with pytest.raises(ScheduleError, match="at least one slot"):
        OnlineBinomial([0])


# --- OnlineMultilevel (online_multilevel.py) ---

from hpcadj.checkpoint.schedules import Multilevel, default_costs  # noqa: E402
from hpcadj.checkpoint.schedules.online_multilevel import OnlineMultilevel, online_multilevel_bound  # noqa: E402


@pytest.mark.parametrize("caps", [[1, 0, 0], [0, 0, 2], [1, 1, 1], [2, 3, 5], [3, 0, 4]])
@pytest.mark.parametrize("priced", [False, True])
def test_online_multilevel_plans_are_valid_and_within_the_proven_bound(caps, priced):
    costs = default_costs(3)
    for n in list(range(1, 60)) + [200, 611]:
        result = simulate_online(OnlineMultilevel(caps, costs if priced else None), n, costs)
        assert all(p <= c for p, c in zip(result.peak, caps)), (n, result.peak)
        one = offline_minimum(n, sum(caps))
        offline = Multilevel(n, caps, costs).predicted
        assert result.predicted <= online_multilevel_bound(result.forward_steps, one, costs) * offline + 1e-9
        assert result.predicted >= offline - 1e-9
        if not priced and n <= math.comb(sum(caps) + 2, 2) + 1:
            assert result.forward_steps == one


def test_online_multilevel_errors():
    with pytest.raises(ScheduleError, match="at least one slot"):
        OnlineMultilevel([0, 0])
    plan = OnlineMultilevel([1, 1])
    with pytest.raises(ScheduleError, match="before any step"):
        plan.finish()


def test_online_plan_streams_once_and_asks_done_before_each_step():
    from hpcadj.checkpoint.schedules.online_plans import OnlinePlan

    asked = []
    plan = OnlinePlan(OnlineBinomial([3]), 7, done=lambda i: asked.append(i) or i >= 5)
    result = simulate(plan.actions(), 5, [3])
    assert asked == [1, 2, 3, 4, 5] and result.forward_steps == offline_minimum(5, 3)
    with pytest.raises(ScheduleError, match="streams once"):
        list(plan.actions())


@pytest.mark.parametrize("n, caps, ratio", [(300, [1, 3, 6], 1.04), (1000, [2, 6, 12], 1.05), (3000, [5, 15, 30], 1.05)])
def test_online_multilevel_close_to_the_offline_optimum(n, caps, ratio):
    costs = default_costs(3)
    online = simulate_online(OnlineMultilevel(caps, costs), n, costs).predicted
    assert online <= ratio * Multilevel(n, caps, costs).predicted
