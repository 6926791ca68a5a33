"""Three-level online plans: does another cheap-level threshold or join point reach 1.05x offline?

For each (cheap_fraction, join_repetitions) of OnlineMultilevel, the worst predicted-makespan ratio
to the offline multi-level DP over the three-level cases of results.csv with s >= 10 (offline
values read from results.csv, written by run.py with the same default costs), and how many cases
exceed 1.05. Pure simulation: the figures do not depend on the machine.

    .venv/bin/python experiments/online/variants.py [--max-n 3000]
"""

from __future__ import annotations

import argparse
import csv
import itertools
from pathlib import Path

from hpcadj.checkpoint.schedules import default_costs, simulate_online
from hpcadj.checkpoint.schedules.online_multilevel import OnlineMultilevel

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-n", type=int, default=3000, help="largest n taken from results.csv")
    args = ap.parse_args(argv)
    rows = [r for r in csv.DictReader(open(HERE / "results.csv"))
            if r["levels"] == "3" and int(r["s"]) >= 10 and int(r["n"]) <= args.max_n]
    costs = default_costs(3)
    print("cheap_fraction,join_repetitions,worst_ratio,worst_n,worst_s,cases_above_1.05,cases")
    for fraction, t in itertools.product([1.0, 0.5, 0.1], [2, 3, 4, 6]):
        worst, where, above = 0.0, None, 0
        for r in rows:
            caps = [int(x) for x in r["capacities"].split("/")]
            n = int(r["n"])
            on = simulate_online(OnlineMultilevel(caps, costs, cheap_fraction=fraction, join_repetitions=t), n, costs)
            ratio = on.predicted / float(r["offline_predicted"])
            above += ratio > 1.05
            if ratio > worst:
                worst, where = ratio, (n, r["s"])
        print(f"{fraction},{t},{worst:.4f},{where[0]},{where[1]},{above},{len(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
