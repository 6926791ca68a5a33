"""The priced greedy online multi-level planner (online_greedy.py): every plan passes the simulator,
costs what the planner predicts, stays within the proven bound, and within 1.05x of the offline
multi-level optimum on the study's three-level cases (experiments/online)."""

import math

import pytest

from hpcadj.checkpoint.schedules import (Move, Multilevel, ScheduleError, default_costs, make_schedule, simulate,
                                         simulate_online)
from hpcadj.checkpoint.schedules.online_greedy import OnlineGreedyMultilevel
from hpcadj.checkpoint.schedules.online_multilevel import online_multilevel_bound
from hpcadj.checkpoint.schedules.online_plans import make_online_plan


def one_level_minimum(n, s):
    t = 0
    while math.comb(s + t, s) < n:
        t += 1
    return 1 + t * n - (math.comb(s + t, s + 1) if t >= 1 else 0)


@pytest.mark.parametrize("caps", [[1, 0, 0], [0, 0, 2], [0, 2, 0], [1, 1, 1], [2, 3, 5], [3, 0, 4], [1, 3, 6]])
def test_plans_pass_the_simulator_cost_what_they_predict_and_keep_the_bound(caps):
    costs = default_costs(3)
    for n in list(range(1, 70)) + [200, 611]:
        planner = OnlineGreedyMultilevel(caps, costs)
        for _ in range(n):
            planner.step()
            assert all(a >= b for a, b in zip(planner.levels, planner.levels[1:])), "older on slower levels"
            assert all(planner.levels.count(k) <= c for k, c in enumerate(caps))
        promised = planner.predicted()
        result = simulate_online(OnlineGreedyMultilevel(caps, costs), n, costs)
        assert all(p <= c for p, c in zip(result.peak, caps)), (n, result.peak)
        assert result.predicted <= promised + 1e-9, (n, result.predicted, promised)
        offline = Multilevel(n, caps, costs).predicted
        assert result.predicted >= offline - 1e-9
        bound = online_multilevel_bound(result.forward_steps, one_level_minimum(n, sum(caps)), costs)
        assert result.predicted <= bound * offline + 1e-9


@pytest.mark.parametrize("n, caps", [(30, [1, 3, 6]), (100, [1, 3, 6]), (100, [2, 6, 12]), (300, [2, 6, 12]),
                                     (300, [5, 15, 30]), (1000, [5, 15, 30])])
def test_within_1_05_of_the_offline_multilevel_optimum(n, caps):
    costs = default_costs(3)
    online = simulate_online(OnlineGreedyMultilevel(caps, costs), n, costs)
    offline = Multilevel(n, caps, costs).predicted
    assert online.predicted <= 1.05 * offline, online.predicted / offline


def test_short_runs_skip_slow_writes_and_long_runs_push_checkpoints_down():
    costs = default_costs(3)
    short = simulate_online(OnlineGreedyMultilevel([5, 15, 30], costs), 30, costs)
    assert short.writes[2] == 0  # an HDF5 write + read (2 steps' worth) does not pay at n = 30
    planner = OnlineGreedyMultilevel([5, 15, 30], costs)
    moves = [a for _ in range(1000) for a in planner.step() if isinstance(a, Move)]
    assert moves and all(m.dst == m.src + 1 for m in moves)
    assert planner.levels.count(2) >= 20


def test_planning_is_pure_and_the_driver_path_uses_it():
    costs = default_costs(3)
    a = list(make_online_plan([2, 6, 12], costs, n_steps=257).actions())
    b = list(make_online_plan([2, 6, 12], costs, n_steps=257).actions())
    assert a == b
    assert isinstance(make_online_plan([2, 6, 12], costs, n_steps=5).planner, OnlineGreedyMultilevel)
    assert simulate(a, 257, [2, 6, 12], costs).adjoint_steps == 257


@pytest.mark.parametrize("caps, kind", [([5], "OnlineBinomial"), ([0, 5], "OnlineBinomial"),
                                        ([2, 6, 12], "OnlineGreedyMultilevel")])
def test_make_schedule_online_without_n_is_the_planner_runs_use(caps, kind):
    planner = make_schedule("online", None, caps)
    assert type(planner).__name__ == kind
    mine = [a for _ in range(40) for a in planner.step()] + list(planner.finish())
    assert mine == list(make_online_plan(caps, default_costs(len(caps)), n_steps=40).actions())


def test_protocol_errors():
    costs = default_costs(2)
    with pytest.raises(ScheduleError, match="at least one slot"):
        OnlineGreedyMultilevel([0, 0], costs)
    plan = OnlineGreedyMultilevel([1, 1], costs)
    with pytest.raises(ScheduleError, match="before any step"):
        plan.finish()
    with pytest.raises(ScheduleError, match="before any step"):
        plan.predicted()
    plan.step()
    list(plan.finish())
    with pytest.raises(ScheduleError, match="after finish"):
        plan.step()
    with pytest.raises(ScheduleError, match="twice"):
        plan.finish()


def test_horizon_and_mean_variants_are_valid_and_a_bad_horizon_is_refused():
    costs = default_costs(3)
    for horizon, mean in [(1, False), (5, True)]:
        result = simulate_online(OnlineGreedyMultilevel([1, 3, 6], costs, horizon, mean), 120, costs)
        assert result.adjoint_steps == 120 and all(p <= c for p, c in zip(result.peak, [1, 3, 6]))
    with pytest.raises(ScheduleError, match="horizon"):
        OnlineGreedyMultilevel([1, 3, 6], costs, horizon=0)


def test_expensive_disk_reads_send_checkpoints_from_ram_straight_to_hdf5():
    """A calibrated profile (burgers 64x64, 2 ranks, in step units): a disk read costs 141 steps, so
    the old cascade's RAM -> disk -> HDF5 path does not pay; moving past the empty disk level does."""
    from hpcadj.checkpoint.schedules import OpCosts

    costs = OpCosts(1.0, 2.22, (0.078, 2.17, 118.7), (0.49, 141.1, 5.48))
    caps, n = [2, 6, 12], 263
    planner = OnlineGreedyMultilevel(caps, costs)
    moves = [a for _ in range(n) for a in planner.step() if isinstance(a, Move)]
    assert any(m.src == 0 and m.dst == 2 for m in moves)
    online = simulate_online(OnlineGreedyMultilevel(caps, costs), n, costs).predicted
    assert online <= 1.05 * Multilevel(n, caps, costs).predicted


@pytest.mark.parametrize("caps, costs", [([2, 3, 5], default_costs(3)), ([1, 3, 6], default_costs(3)),
                                         ([3, 0, 4], default_costs(3)), ([2, 2], default_costs(2)),
                                         ([5, 15, 30], default_costs(3))])
def test_batched_candidate_costs_equal_the_interval_sums_and_pick_the_same_plan(caps, costs):
    """step() prices many candidates at once (numpy; [5, 15, 30] past its first steps), few one by
    one: each batched cost must equal _cost of the configuration it stands for bit for bit, and the
    choice must be the reference rule's: least (price + C at i+1, i+2, i+3), then the first."""
    planner = OnlineGreedyMultilevel(caps, costs)
    planner.step()
    for i in range(1, 160):
        planner._ensure_table(i + planner.horizon)
        groups = list(planner._candidates())
        batch = planner._candidate_costs(groups, i - 1, [i + 1, i + 2, i + 3])
        keys = []
        row = 0
        for frees, moves, store, price in groups:
            for free_j in frees:
                _, points, levels = planner._configured(i - 1, free_j, moves, store)
                exact = [planner._cost(points, levels, n) for n in (i + 1, i + 2, i + 3)]
                assert list(batch[row]) == exact, (i, row)
                keys.append((*(price + e for e in exact), row, points, levels))
                row += 1
        planner.step()
        assert (planner.points, planner.levels) == min(keys)[-2:], i
