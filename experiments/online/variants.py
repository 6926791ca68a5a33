"""Three-level online plans: variants of each planner, and where the greedy's remaining cost goes.

Default (``--planner greedy``): the priced greedy OnlineGreedyMultilevel (online_greedy.py) with
other horizons H and with the mean over n = i+1 .. i+H instead of the lexicographic comparison.
``--planner cascade``: the older OnlineMultilevel (online_multilevel.py) for each (cheap_fraction,
join_repetitions): when the slow levels join its first sweep. Each line: the worst predicted-makespan
ratio to the offline multi-level DP over the three-level cases of results.csv with s >= 10 and
n <= --max-n (offline values read from results.csv, written by run.py with the same default
costs), and how many cases exceed 1.05. ``--breakdown K``: for the greedy's K worst cases, the
counts behind the ratio (forward steps, writes and reads per level, moves) online and offline.
``--random T``: robustness beyond the study's costs: T random cost profiles (seed 1; each write and
read log-uniform in [10^-2.5, 10^2.5] forward steps, sorted so slower levels cost more, adjoint 1
or 2), random capacities of the study and n in {30, 100, 300}: the greedy's ratio for each.
Pure simulation: the figures do not depend on the machine.

    .venv/bin/python experiments/online/variants.py [--planner cascade] [--max-n 3000] [--breakdown 4] [--random 60]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import random
import sys
from pathlib import Path

from hpcadj.checkpoint.schedules import Move, Multilevel, OpCosts, default_costs, simulate, simulate_online
from hpcadj.checkpoint.schedules.online_greedy import OnlineGreedyMultilevel
from hpcadj.checkpoint.schedules.online_multilevel import OnlineMultilevel

HERE = Path(__file__).resolve().parent


def cases(max_n: int) -> list[dict]:
    """The three-level rows of results.csv with s >= 10 and n <= max_n."""
    path = HERE / "results.csv"
    if not path.exists():
        print(f"variants.py: {path} missing: run experiments/online/run.py first", file=sys.stderr)
        raise SystemExit(2)
    return [r for r in csv.DictReader(open(path))
            if r["levels"] == "3" and int(r["s"]) >= 10 and int(r["n"]) <= max_n]


def worst(rows, make, costs) -> tuple[float, tuple, int]:
    """(worst ratio, (n, s) where, cases above 1.05) of planner ``make(caps)`` over ``rows``."""
    top, where, above = 0.0, None, 0
    for r in rows:
        caps = [int(x) for x in r["capacities"].split("/")]
        ratio = simulate_online(make(caps), int(r["n"]), costs).predicted / float(r["offline_predicted"])
        above += ratio > 1.05
        if ratio > top:
            top, where = ratio, (int(r["n"]), int(r["s"]))
    return top, where, above


def breakdown(rows, count: int, costs) -> None:
    """The counts behind the greedy's ``count`` worst ratios, online beside offline."""
    print("n,s,capacities,plan,ratio,forward,writes,reads,moves")
    ranked = sorted(rows, key=lambda r: -float(r["ratio_predicted"]))[:count]
    for r in ranked:
        caps, n = [int(x) for x in r["capacities"].split("/")], int(r["n"])
        planner = OnlineGreedyMultilevel(caps, costs)
        moves = sum(isinstance(a, Move) for _ in range(n) for a in planner.step())
        rest = list(planner.finish())
        moves += sum(isinstance(a, Move) for a in rest)
        online = simulate_online(OnlineGreedyMultilevel(caps, costs), n, costs)
        offline = simulate(Multilevel(n, caps, costs).actions(), n, caps, costs)
        for name, res, mv in (("online", online, moves), ("offline", offline, 0)):
            print(f"{n},{r['s']},{r['capacities']},{name},{res.predicted / offline.predicted:.4f},"
                  f"{res.forward_steps},{'/'.join(map(str, res.writes))},{'/'.join(map(str, res.reads))},{mv}")


def random_profiles(trials: int) -> None:
    """The greedy against the offline DP on ``trials`` random ordered cost profiles (module docstring)."""
    rng = random.Random(1)
    print("ratio,n,capacities,write,read,adjoint")
    ratios = []
    for _ in range(trials):
        caps = rng.choice([[1, 3, 6], [2, 6, 12], [5, 15, 30], [2, 3, 5], [1, 1, 3]])
        n = rng.choice([30, 100, 300])
        write = sorted(10 ** rng.uniform(-2.5, 2.5) for _ in range(3))
        read = sorted(10 ** rng.uniform(-2.5, 2.5) for _ in range(3))
        costs = OpCosts(1.0, rng.choice([1.0, 2.0]), tuple(write), tuple(read))
        ratio = (simulate_online(OnlineGreedyMultilevel(caps, costs), n, costs).predicted
                 / Multilevel(n, caps, costs).predicted)
        ratios.append((ratio, sum(caps)))
        print(f"{ratio:.4f},{n},{'/'.join(map(str, caps))},{'/'.join(f'{w:.3g}' for w in write)},"
              f"{'/'.join(f'{r:.3g}' for r in read)},{costs.adjoint}")
    big = [r for r, s in ratios if s >= 10]
    print(f"# worst {max(r for r, _ in ratios):.4f}; above 1.05: {sum(r > 1.05 for r, _ in ratios)} of {trials}; "
          f"s >= 10: worst {max(big, default=0):.4f}, above 1.05: {sum(r > 1.05 for r in big)} of {len(big)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--planner", choices=["greedy", "cascade"], default="greedy")
    ap.add_argument("--max-n", type=int, default=3000, help="largest n taken from results.csv")
    ap.add_argument("--breakdown", type=int, default=0, metavar="K", help="counts of the greedy's K worst cases")
    ap.add_argument("--random", type=int, default=0, metavar="T", help="T random cost profiles")
    args = ap.parse_args(argv)
    if args.max_n < 1 or args.breakdown < 0 or args.random < 0:
        print("variants.py: --max-n must be >= 1, --breakdown and --random >= 0", file=sys.stderr)
        return 2
    if args.random:
        random_profiles(args.random)
        return 0
    rows = cases(args.max_n)
    costs = default_costs(3)
    if args.breakdown:
        breakdown(rows, args.breakdown, costs)
        return 0
    if args.planner == "cascade":
        print("cheap_fraction,join_repetitions,worst_ratio,worst_n,worst_s,cases_above_1.05,cases")
        for fraction, t in itertools.product([1.0, 0.5, 0.1], [2, 3, 4, 6]):
            top, where, above = worst(rows, lambda caps: OnlineMultilevel(
                caps, costs, cheap_fraction=fraction, join_repetitions=t), costs)
            print(f"{fraction},{t},{top:.4f},{where[0]},{where[1]},{above},{len(rows)}")
        return 0
    print("horizon,mean,worst_ratio,worst_n,worst_s,cases_above_1.05,cases")
    for horizon, mean in [(1, False), (3, False), (6, False), (2, True), (3, True), (5, True)]:
        top, where, above = worst(rows, lambda caps: OnlineGreedyMultilevel(caps, costs, horizon, mean), costs)
        print(f"{horizon},{mean},{top:.4f},{where[0]},{where[1]},{above},{len(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
