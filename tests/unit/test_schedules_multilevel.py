"""Multilevel: equal to the H-Revolve optimum, optimal by brute force for K = 3, fast at n = 10^4."""

import heapq
import itertools
import random
import time

import pytest

from hpcadj.checkpoint.schedules import Multilevel, OpCosts, simulate
from hpcadj.checkpoint.schedules.multilevel import MultilevelPlanner


def brute_force(n, caps, uf, w, r):
    """Least forward + I/O cost over *all* plans (single-step advances, stores, restores, moves, frees)."""
    K = len(caps)
    start = (frozenset([0]), frozenset(), n - 1, False)
    dist, queue, tie = {start: 0.0}, [(0.0, 0, start)], itertools.count(1)
    while queue:
        d, _, state = heapq.heappop(queue)
        if d > dist[state]:
            continue
        held, stored, nxt, done = state
        if nxt == -1 and not stored:
            return d

        def push(new, cost):
            if d + cost < dist.get(new, float("inf")):
                dist[new] = d + cost
                heapq.heappush(queue, (d + cost, next(tie), new))

        used = [sum(1 for _, lv in stored if lv == k) for k in range(K)]
        for a in held:
            if a < n and (not done or a <= nxt):
                beyond = [b for b in held if b > a + 1]
                new_held = frozenset([max(beyond) if beyond else a, a + 1])
                push((new_held, stored, nxt, done or a + 1 == n), uf)
            for k in range(K):
                if a <= nxt and (a, k) not in stored and used[k] < caps[k]:
                    push((held, stored | {(a, k)}, nxt, done), w[k])
        for a, k in stored:
            beyond = [b for b in held if b > a]
            push((frozenset([a, *([max(beyond)] if beyond else [])]), stored, nxt, done), r[k])
            push((held, stored - {(a, k)}, nxt, done), 0.0)
            for dst in range(K):
                if dst != k and (a, dst) not in stored and used[dst] < caps[dst]:
                    push((held, (stored - {(a, k)}) | {(a, dst)}, nxt, done), r[k] + w[dst])
        if done and nxt >= 0 and {nxt, nxt + 1} <= held:
            push((frozenset([nxt]), stored, nxt - 1, done), 0.0)
    raise AssertionError("no plan found")


def random_costs(rng, K, zero_level0=False):
    w = [rng.choice([0.0, rng.uniform(0, 4), rng.uniform(0, 20)]) for _ in range(K)]
    r = [rng.choice([0.0, rng.uniform(0, 4), rng.uniform(0, 20)]) for _ in range(K)]
    if zero_level0:
        w[0] = r[0] = 0.0
    return rng.choice([0.1, 0.5, 1.0, 2.0]), w, r


def test_three_levels_small_n_optimal_by_brute_force():
    rng = random.Random(11)
    for _ in range(40):
        n = rng.randint(1, 6)
        caps = [rng.randint(0, 2) for _ in range(3)]
        caps[rng.randrange(3)] = max(1, caps[0])
        uf, w, r = random_costs(rng, 3)
        plan = Multilevel(n, caps, OpCosts(uf, 0.0, w, r))
        found = simulate(plan.actions(), n, caps, OpCosts(uf, 0.0, w, r)).predicted
        assert found == pytest.approx(brute_force(n, caps, uf, w, r), abs=1e-9), (n, caps, uf, w, r)


@pytest.mark.parametrize("K", [2, 3])
def test_equal_to_the_hrevolve_optimum(K):
    from checkpoint_schedules.hrevolve_sequences.hrevolve import get_hopt_table
    rng = random.Random(K)
    for _ in range(60):
        n = rng.randint(2, 40)
        caps = [rng.randint(1, 5) for _ in range(K)]
        uf, w, r = random_costs(rng, K, zero_level0=True)
        ub = rng.uniform(0, 3)
        _, opt = get_hopt_table(n - 1, caps, w, r, ub=ub, uf=uf)
        theirs = opt[K - 1][n - 1][caps[-1]] + uf  # their chain of n-1 steps; our last step once more
        plan = Multilevel(n, caps, OpCosts(uf, ub, w, r))
        ours = simulate(plan.actions(), n, caps, OpCosts(uf, ub, w, r)).predicted
        assert ours == pytest.approx(theirs, rel=1e-9), (n, caps, uf, ub, w, r)


def test_hrevolve_class_counts_n_minus_one_more_forward_steps():
    from checkpoint_schedules import Forward, HRevolve
    for n, ram, disk in [(20, 2, 3), (30, 3, 5), (12, 1, 4)]:
        theirs = sum(a.n1 - a.n0 for a in HRevolve(n, ram, disk, uf=1, ub=1, wd=2, rd=2) if isinstance(a, Forward))
        costs = OpCosts(1.0, 1.0, (0.0, 2.0), (0.0, 2.0))
        plan = Multilevel(n, [ram, disk], costs)
        result = simulate(plan.actions(), n, [ram, disk], costs)
        # same optimum; their forward count includes re-running every adjoint step's forward (n - 1 more)
        forward_ours = result.predicted - n * 1.0 - 2.0 * (result.writes[1] + result.reads[1])
        assert theirs >= forward_ours + n - 1 - 1e-9


def test_candidate_dp_agrees_with_the_exact_dp():
    rng = random.Random(3)
    mismatches = 0
    for _ in range(40):
        K = rng.randint(1, 3)
        n = rng.randint(2, 150)
        caps = [rng.randint(1, 8) for _ in range(K)]
        uf, w, r = random_costs(rng, K)
        costs = OpCosts(uf, 1.0, w, r)
        exact = MultilevelPlanner(n, caps, costs, exact=True).predicted
        fast = MultilevelPlanner(n, caps, costs, exact=False)
        assert fast.predicted >= exact - 1e-9
        assert fast.predicted <= exact * 1.005
        mismatches += fast.predicted > exact + 1e-9
        assert simulate(fast.actions(), n, caps, costs).predicted == pytest.approx(fast.predicted)
    assert mismatches <= 2


def test_ten_thousand_steps_three_levels_plan_in_under_ten_seconds():
    costs = OpCosts(1.0, 2.0, (0.01, 0.2, 1.0), (0.01, 0.2, 1.0))
    start = time.perf_counter()
    plan = Multilevel(10**4, [4, 16, 64], costs)
    assert time.perf_counter() - start < 10
    forward = sum(a.n1 - a.n0 for a in plan.actions() if type(a).__name__ == "Advance")
    assert 10**4 < forward < 3 * 10**4


def test_cheap_disk_is_used_and_expensive_disk_avoided():
    n, caps = 200, [4, 50]
    cheap = simulate(Multilevel(n, caps, OpCosts(1, 1, (0, 0.01), (0, 0.01))).actions(), n, caps)
    dear = simulate(Multilevel(n, caps, OpCosts(1, 1, (0, 1e6), (0, 1e6))).actions(), n, caps)
    assert cheap.writes[1] > 0 and dear.writes[1] == 0
    assert cheap.forward_steps < dear.forward_steps


def _tables(planner):
    return ([bytes(a) for layers in planner.layers for a in layers],
            [bytes(a) for choices in planner.choices for a in choices],
            [bytes(a) for a in planner.drop + planner.drop_level if a is not None],
            repr(planner.predicted), planner.top_level)


def test_compiled_dp_gives_the_python_dps_tables_bitwise(monkeypatch):
    from hpcadj.checkpoint.schedules import multilevel

    rng = random.Random(5)
    ties = OpCosts(1, 1, (0, 0, 0), (0, 0, 0))  # every split costs the same: the first one must win
    for case in range(24):
        K = rng.randint(1, 3)
        exact = case % 2 == 0
        n = rng.randint(2, 300 if exact else 2000)
        caps = [rng.choice([0, 1, 2, 5, 12, 40]) for _ in range(K)]
        caps[-1] = max(caps[-1], 1)
        uf, w, r = random_costs(rng, K)
        costs = ties.for_levels(K) if case % 5 == 0 else OpCosts(uf, 1.0, w, r)
        tables = []
        for compiled in (False, True):
            monkeypatch.setattr(multilevel, "COMPILED", compiled)
            planner = MultilevelPlanner(n, caps, costs, exact=exact)
            assert planner.compiled is compiled
            tables.append(_tables(planner))
        assert tables[0] == tables[1], (n, caps, costs, exact)
