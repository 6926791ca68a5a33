"""Planning time of hpcadj's schedules side by side with checkpoint_schedules, same inputs.

Run: .venv/bin/python experiments/planning_speed/bench.py [--full] > experiments/planning_speed/results.csv
Without --full the slow checkpoint_schedules DP cases are skipped (marked "skipped").
Time = building the schedule and streaming every action once (no simulation).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time

from checkpoint_schedules import HRevolve, MultistageCheckpointSchedule, Revolve as CsRevolve

from hpcadj.checkpoint.schedules import Multilevel, OpCosts, Revolve


def timed(build):
    start = time.perf_counter()
    count = sum(1 for _ in build())
    return time.perf_counter() - start, count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--full", action="store_true", help="also run checkpoint_schedules' slow DP cases")
    args = parser.parse_args()
    out = csv.writer(sys.stdout)
    out.writerow(["case", "n", "levels", "hpcadj_schedule", "hpcadj_s", "hpcadj_actions",
                  "cs_schedule", "cs_s", "cs_actions"])

    def row(case, n, levels, ours, ours_build, theirs, theirs_build, slow=False):
        o_s, o_n = timed(ours_build)
        if theirs_build is None or (slow and not args.full):
            t_s, t_n = "skipped", ""
        else:
            t_s, t_n = timed(theirs_build)
            t_s = f"{t_s:.3f}"
        out.writerow([case, n, levels, ours, f"{o_s:.3f}", o_n, theirs, t_s, t_n])
        sys.stdout.flush()

    for n in (10**5, 10**6):
        row("binomial, 50 slots", n, "50", "Revolve", lambda n=n: Revolve(n, [50]).actions(),
            "MultistageCheckpointSchedule(n,50,0)", lambda n=n: iter(MultistageCheckpointSchedule(n, 50, 0)),
            slow=n > 10**5)
    row("revolve optimal", 2000, "20", "Revolve", lambda: Revolve(2000, [20]).actions(),
        "Revolve(2000,20)", lambda: iter(CsRevolve(2000, 20)), slow=True)
    row("revolve optimal", 500, "10", "Revolve", lambda: Revolve(500, [10]).actions(),
        "Revolve(500,10)", lambda: iter(CsRevolve(500, 10)))
    two = OpCosts(1.0, 1.0, (0.0, 2.0), (0.0, 2.0))
    row("two levels", 2000, "10+100", "Multilevel", lambda: Multilevel(2000, [10, 100], two).actions(),
        "HRevolve(2000,10,100)", lambda: iter(HRevolve(2000, 10, 100, uf=1, ub=1, wd=2, rd=2)), slow=True)
    row("two levels", 300, "5+20", "Multilevel", lambda: Multilevel(300, [5, 20], two).actions(),
        "HRevolve(300,5,20)", lambda: iter(HRevolve(300, 5, 20, uf=1, ub=1, wd=2, rd=2)))
    three = OpCosts(1.0, 2.0, (0.01, 0.2, 1.0), (0.01, 0.2, 1.0))
    for caps in ([8, 32, 128], [4, 16, 64]):
        row("three levels", 10**4, "+".join(map(str, caps)), "Multilevel",
            lambda caps=caps: Multilevel(10**4, caps, three).actions(), "(no K=3 class)", None)


if __name__ == "__main__":
    main()
