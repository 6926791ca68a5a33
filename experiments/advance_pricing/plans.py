"""Plans for wave 128^3 x 300 on 2 ranks with a calibrated profile, with and without its advance model.

    .venv/bin/python experiments/advance_pricing/plans.py [profile.json]

For each budget, the plan made from the profile without ``advance`` (advances priced as single steps,
what the planner did before) and with it, both priced with the advance model as the simulator runs them:
forward evaluations, writes and reads per level, the runs handed to the advance and the predicted
makespan. No MPI, no model: the snapshot size is the wave model's (two fields of 128^3 doubles).
"""

from __future__ import annotations

import sys
from pathlib import Path

from hpcadj.checkpoint.schedules import CostProfile, make_schedule, simulate

STEPS = 300
SNAPSHOT = 2 * 8 * 128 ** 3 // 2  # bytes a rank, 2 ranks
BUDGETS = {"--ram 512MiB": [512 * 2 ** 20 // SNAPSHOT], "--ram 4 --disk 64": [4, 64],
           "--ram 8 --disk 40": [8, 40], "--ram 2 --disk 100": [2, 100]}


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else Path(__file__).with_name("profile.json")
    profile = CostProfile.load(path)
    flat = CostProfile.from_dict({**profile.to_dict(), "advance": None})
    priced = profile.vector("time")
    print("| budget | advances priced in the plan | forward evaluations | writes | reads | runs advanced "
          "(steps) | predicted s |")
    print("|---|---|---|---|---|---|---|")
    for name, caps in BUDGETS.items():
        for label, costs in (("no", flat), ("yes", profile)):
            levels = CostProfile(levels=profile.levels[:len(caps)])
            plan = make_schedule("auto", STEPS, caps, costs.vector("time") if len(caps) > 1 or label == "yes"
                                 else None)
            summary = simulate(plan.actions(), STEPS, caps, priced)
            runs = profile.advance_seconds(summary)
            predicted = summary.predicted + levels.fill_seconds(summary.peak)
            print(f"| {name} | {label} ({plan.name}) | {summary.forward_steps} | {summary.writes} | "
                  f"{summary.reads} | {runs['runs']} ({runs['steps']}) | {predicted:.1f} |")


if __name__ == "__main__":
    main()
