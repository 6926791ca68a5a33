"""Advances priced: the cost model, which runs a plan hands to a model's advance, the multi-level DP
choosing recomputation over a slow level when advances are cheap, and calibration's fitted line."""

import pytest

from hpcadj.checkpoint.calibrate import _fit_line
from hpcadj.checkpoint.schedules import (Advance, Adjoint, CostProfile, EndForward, EndReverse, Free, Multilevel,
                                         OpCosts, Restore, Store, make_schedule, simulate)
from hpcadj.checkpoint.schedules import multilevel
from hpcadj.checkpoint.schedules.actions import advance_runs
from hpcadj.checkpoint.schedules.costs import AdvanceCost, price_actions

PLAIN = OpCosts(1.0, 1.0, (0.0, 3.0), (0.0, 3.0))
FAST = OpCosts(1.0, 1.0, (0.0, 3.0), (0.0, 3.0), advance=(0.5, 0.2), advance_first=True)


def test_run_prices_long_runs_by_the_line_and_short_ones_as_steps():
    assert FAST.run(1) == 1.0
    assert FAST.run(2) == pytest.approx(0.9)
    assert FAST.run(10) == pytest.approx(2.5)
    assert PLAIN.run(10) == 10.0
    assert FAST.for_levels(1).advance == (0.5, 0.2) and FAST.for_levels(1).advance_first
    with pytest.raises(ValueError):
        OpCosts(1.0, 1.0, (0.0,), (0.0,), advance=(-1.0, 0.2))


def test_advance_runs_follow_the_drivers_rule():
    # first sweep: the last step stays single (u_{n1-1} is kept for the adjoint)
    assert advance_runs(0, 5, 0, keeps_beyond=False) == [(4, True)]
    # a recomputation with u_hi held beyond: the whole range goes to the advance
    assert advance_runs(0, 5, 10, keeps_beyond=True) == [(5, False)]
    # too short to hand over
    assert advance_runs(3, 5, 3, keeps_beyond=False) == []
    assert advance_runs(3, 4, 10, keeps_beyond=True) == []
    # split at the frontier: recomputed up to it, first sweep after it
    assert advance_runs(0, 10, 4, keeps_beyond=False) == [(4, False), (5, True)]


def test_simulator_counts_and_prices_the_runs():
    plan = [Store(0, 0), Advance(0, 5), EndForward(), Adjoint(5, 4), Restore(0, 0), Advance(0, 3),
            Adjoint(4, 3), Restore(0, 0), Advance(0, 2), Adjoint(3, 2), Restore(0, 0), Advance(0, 1),
            Adjoint(2, 1), Restore(0, 0), Adjoint(1, 0), Free(0, 0), EndReverse()]
    summary = simulate(plan, 5, [1], FAST.for_levels(1))
    assert summary.advances == {(4, True): 1, (3, False): 1, (2, False): 1}
    assert summary.forward_steps == 11
    # the runs at fixed + m * step, the rest (the first sweep's last step, Advance(0, 1)) single steps
    stepping = 2 * 1.0 + FAST.run(4) + FAST.run(3) + FAST.run(2)
    assert summary.predicted == pytest.approx(stepping + 5 * 1.0)
    # without advance_first, the first sweep's run is single steps
    later = OpCosts(1.0, 1.0, (0.0,), (0.0,), advance=(0.5, 0.2))
    assert simulate(plan, 5, [1], later).predicted == pytest.approx(summary.predicted + 4 * 1.0 - FAST.run(4))


def test_cheap_advances_make_the_dp_recompute_instead_of_reading_disk():
    n, caps = 60, (2, 40)
    plain, fast = Multilevel(n, caps, PLAIN), Multilevel(n, caps, FAST)
    as_planned = simulate(plain.actions(), n, caps, FAST)
    found = simulate(fast.actions(), n, caps, FAST)
    # the advance-priced plan reads the slow level far less and recomputes more
    assert found.reads[1] < as_planned.reads[1] / 2
    assert found.forward_steps > as_planned.forward_steps
    assert found.predicted < 0.9 * as_planned.predicted
    # the DP's own prediction: the simulator's but for the last single step of each first-sweep
    # advance that ends at a store (the DP prices those as recomputations, the whole run advanced)
    first_runs = sum(c for (m, first), c in found.advances.items() if first)
    assert fast.predicted == pytest.approx(found.predicted - (first_runs - 1) * (1.0 - 0.2))
    # priced as m single steps, the plan is the one made without an advance model
    assert list(Multilevel(n, caps, OpCosts(1.0, 1.0, (0.0, 3.0), (0.0, 3.0), advance=None)).actions()) == \
        list(plain.actions())


def test_compiled_dp_gives_the_python_dp_plan_with_advances(monkeypatch):
    n, caps = 90, (2, 5, 30)
    costs = OpCosts(1.0, 2.0, (0.01, 0.4, 2.0), (0.01, 0.5, 2.5), advance=(0.3, 0.35), advance_first=True)
    plans = []
    for compiled in (False, True):
        monkeypatch.setattr(multilevel, "COMPILED", compiled)
        for exact in (True, False):
            plans.append((list(Multilevel(n, caps, costs, exact=exact).actions()),
                          Multilevel(n, caps, costs, exact=exact).predicted))
    assert plans[0] == plans[2] and plans[1] == plans[3]


def test_online_reverse_prices_advances():
    actions = [Advance(0, 6), Store(6, 1), Restore(0, 0), Advance(0, 2)]
    assert price_actions(actions, FAST) == pytest.approx(FAST.run(6) + 3.0 + 0.0 + FAST.run(2))
    schedule = make_schedule("online", None, [3, 10], FAST)
    for _ in range(30):
        schedule.step()
    simulate_ok = list(schedule.finish())
    assert simulate_ok[-1] == EndReverse()


def test_profiles_without_an_advance_stay_readable_and_price_steps():
    old = {"forward_s": 2.0, "adjoint_s": 3.0, "levels": [{"name": "ram", "write_s": 0.1, "read_s": 0.2}]}
    profile = CostProfile.from_dict(old)
    assert profile.advance is None and profile.vector().advance is None
    summary = simulate(Multilevel(20, [4], profile.vector()).actions(), 20, [4], profile.vector())
    assert summary.cost(profile.vector()) == summary.forward_steps * 2.0 + 20 * 3.0 + sum(
        w * 0.1 for w in summary.writes) + sum(r * 0.2 for r in summary.reads)
    assert profile.advance_seconds(summary) is None


def test_profile_with_an_advance_round_trips_and_prices_energy(tmp_path):
    adv = AdvanceCost(fixed_s=0.01, step_s=0.02, first=True, depth=8, runs=[[2, 0.05], [8, 0.17]])
    profile = CostProfile(forward_s=0.03, adjoint_s=0.05, forward_j=3.0, levels=[], advance=adv)
    profile.save(tmp_path / "p.json")
    again = CostProfile.load(tmp_path / "p.json")
    assert again.advance == adv
    assert again.vector("time").advance == (0.01, 0.02)
    assert again.vector("energy").advance == pytest.approx((1.0, 2.0))  # 100 W, the forward step's power
    for bad in ({"fixed_s": -1, "step_s": 0.1}, 3):
        with pytest.raises(ValueError, match="bad cost profile"):
            CostProfile.from_dict({"forward_s": 1.0, "adjoint_s": 1.0, "advance": bad})


def test_fit_line_recovers_fixed_and_per_step_cost():
    fixed, step = _fit_line([[2, 0.5 + 2 * 0.1], [4, 0.5 + 4 * 0.1], [16, 0.5 + 16 * 0.1]])
    assert fixed == pytest.approx(0.5) and step == pytest.approx(0.1)
    # a negative intercept is not a cost: the line goes through the origin instead
    fixed, step = _fit_line([[2, 0.1], [8, 1.0]])
    assert fixed == 0.0 and step == pytest.approx((2 * 0.1 + 8 * 1.0) / (4 + 64))
