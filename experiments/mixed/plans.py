"""Forward evaluations of mixed plans (restart states or adjoint data) against today's revolve plans.

Plans only: each plan is executed by the plan simulator (hpcadj/checkpoint/schedules/simulate.py),
which checks it against the byte budget and counts its forward evaluations. Sizes are in fields (one
field = one grid function on the whole domain: 128^3 doubles = 16 MiB for the wave case).

- wave (leapfrog), 300 steps: a restart state is (u^{i-1}, u^i), 2 fields; the adjoint step reads
  u^i, 1 field, and also runs from the two working states (states_suffice).
- RK4, 200 steps: a restart state is 1 field; the adjoint step reads the 4 stages (assumed 4 fields)
  and has them only by running the step (not states_suffice). Today's adapter re-runs each step
  before its adjoint step, so today's count is revolve's plus n.

Writes results.csv (beside this file, or in --out DIR) and prints the table of README.md; --quick
plans the two smallest budgets of each case.
"""

import argparse
import csv
import time
from pathlib import Path

from hpcadj.checkpoint.schedules import Mixed, Revolve, simulate

HERE = Path(__file__).parent


def revolve_count(n, slots):
    """Forward evaluations of today's one-level plan with ``slots`` restart states (store-all if all fit)."""
    slots = min(slots, n - 1)
    return simulate(Revolve(n, [slots]).actions(), n, [slots]).forward_steps


def mixed_count(n, budget, r, d, states_suffice):
    plan = Mixed(n, [budget], state_size=r, data_size=d, states_suffice=states_suffice)
    summary = simulate(plan.actions(), n, [budget], sizes=(r, d))
    return summary


CASES = (
    # (case, n, restart fields, data fields, states_suffice, budgets in fields, label of the budget)
    ("wave 128^3", 300, 2, 1, True, [(f, round(f * 300)) for f in (0.25, 0.5, 0.75, 1.0, 1.5)], "fields/step"),
    ("RK4 128^2", 200, 1, 4, False, [(f, round(f * 199 * 4)) for f in (0.1, 0.25, 0.5, 1.0)], "of store-all"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="directory for results.csv")
    parser.add_argument("--quick", action="store_true", help="the two smallest budgets of each case")
    args = parser.parse_args()
    quick = args.quick
    rows = []
    for case, n, r, d, states, budgets, label in CASES:
        for frac, budget in budgets[: 2 if quick else None]:
            t0 = time.process_time()
            summary = mixed_count(n, budget, r, d, states)
            seconds = time.process_time() - t0
            today = revolve_count(n, budget // r) + (0 if states else n)
            rows.append({"case": case, "n": n, "restart_fields": r, "data_fields": d, "budget": f"{frac} {label}",
                         "budget_fields": budget, "today_forward": today, "mixed_forward": summary.forward_steps,
                         "fewer_percent": round(100 * (1 - summary.forward_steps / today), 1),
                         "mixed_state_writes": summary.writes[0], "mixed_data_writes": summary.data_writes[0],
                         "peak_fields": summary.peak[0], "plan_cpu_s": round(seconds, 1)})
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print("| case | budget | today | mixed | fewer | restart / data writes | peak (fields) |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['case']}, n = {row['n']} | {row['budget']} ({row['budget_fields']} fields) | "
              f"{row['today_forward']} | {row['mixed_forward']} | {row['fewer_percent']} % | "
              f"{row['mixed_state_writes']} / {row['mixed_data_writes']} | {row['peak_fields']} |")


if __name__ == "__main__":
    main()
