"""Wall time of online vs offline plans on real runs: the same model, n, budgets and cost profile.

For each level set (one RAM level; RAM + node-local + HDF5) three configurations run side by side,
rotated each repeat (experiments/_harness.run_configs), on burgers 64x64 by default:

- ``online-adaptive``: ``--adaptive --t-final T --schedule online``: n unknown until the run ends;
- ``online-fixed`` (one level only: a fixed-n ``--schedule online`` plan is one-level): ``--steps n
  --schedule online`` with the n the adaptive run reached;
- ``offline``: ``--steps n`` with the offline plan (revolve on one level, multilevel on three).

The explicit RK3 step costs the same for any dt, so the fixed-step runs do the adaptive run's work
with the plan the only difference. Every run gets the same ``hpcadj calibrate`` profile (--costs),
kept as walltime-costs.json. Beside the measured times, ``predicted_s`` is each plan's makespan
predicted under that profile (the online and offline planners' plans for the run's n, simulated;
``plan_forward`` their forward steps, equal to the run's when the run executed that plan).
Prints the median wall times and the ratios to ``offline`` and writes walltime.csv here.

    .venv/bin/python experiments/online/walltime.py [--quick] [--ranks 2] [--repeats 3]
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import _harness as H  # noqa: E402

from hpcadj.checkpoint.schedules import Multilevel, Revolve, simulate  # noqa: E402
from hpcadj.checkpoint.schedules.costs import CostProfile  # noqa: E402
from hpcadj.checkpoint.schedules.online_plans import make_online_plan  # noqa: E402

CAPACITIES = {"one": [10], "three": [2, 6, 12]}


def predicted(level_set: str, n: int, profile: str) -> dict[str, tuple[float, int]]:
    """{"online": (makespan, forward steps), "offline": ...} of the planners' plans under ``profile``."""
    caps = CAPACITIES[level_set]
    costs = CostProfile.load(profile).vector("time").for_levels(len(caps))
    offline = Revolve(n, caps) if len(caps) == 1 else Multilevel(n, caps, costs)
    out = {}
    for name, actions in (("online", make_online_plan(caps, costs, n_steps=n).actions()),
                          ("offline", offline.actions())):
        summary = simulate(actions, n, caps, costs)
        out[name] = (summary.predicted, summary.forward_steps)
    return out


def main(argv=None) -> int:
    ap = H.study_parser(__doc__, HERE, model="burgers")
    ap.add_argument("--t-final", type=float, default=None, help="adaptive end time (default 1.0, quick 0.3)")
    args = ap.parse_args(argv)
    grid = args.grid or ("32x32" if args.quick else "64x64")
    t_final = args.t_final or (0.3 if args.quick else 1.0)
    model = ["--model", args.model, "--grid", grid]
    tmp = H.scratch("online-wall")
    try:
        profile = os.path.join(tmp, "costs.json")
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        H.hpcadj_cmd(args.ranks, "calibrate", [*model, "--steps", "10", "--local-dir", tmp, "--pfs-file",
                                               os.path.join(tmp, "cal.h5"), "--out", profile])
        first = H.hpcadj_run(args.ranks, [*model, "--adaptive", "--t-final", t_final, "--ram", "8",
                                          "--schedule", "online", "--costs", profile])
        n = first["steps"]
        H.log(f"adaptive {args.model} {grid} to t = {t_final}: n = {n}")
        level_sets = {"one": ["--ram", "10"],
                      "three": ["--ram", "2", "--disk", "6", "--pfs", "12", "--local-dir", "@LOCALDIR",
                                "--pfs-file", "@PFSFILE"]}
        rows = []
        for name, levels in level_sets.items():
            common = [*model, *levels, "--costs", profile]
            configs = [(f"{name}/online-adaptive", [*common, "--adaptive", "--t-final", t_final, "--schedule", "online"]),
                       (f"{name}/offline", [*common, "--steps", n])]
            if name == "one":  # with a fixed n, --schedule online is one level only
                configs.insert(1, (f"{name}/online-fixed", [*common, "--steps", n, "--schedule", "online"]))
            _raw, summary = H.run_configs(configs, args.ranks, args.repeats)
            offline = next(r for r in summary if r["label"].endswith("/offline"))
            plans = predicted(name, n, profile)
            for row in summary:
                row.update(levels=name, n=n, t_final=t_final, grid=grid, model=args.model,
                           wall_ratio=row["wall_s"] / offline["wall_s"],
                           forward_ratio=row["forward_steps"] / offline["forward_steps"])
                plan = plans["offline" if row["label"].endswith("/offline") else "online"]
                row.update(predicted_s=plan[0], plan_forward=plan[1],
                           predicted_ratio=plan[0] / plans["offline"][0])
            rows += summary
        shutil.copy(profile, out / ("walltime-costs-quick.json" if args.quick else "walltime-costs.json"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    keys = ["label", "schedule", "n", "forward_steps", "plan_forward", "forward_ratio", "predicted_ratio", "wall_s",
            "wall_min_s", "wall_max_s", "wall_ratio"]
    print(f"machine: {H.machine()}; ranks {args.ranks}, repeats {args.repeats}")
    print(H.markdown_table(rows, keys))
    H.write_csv(out / ("walltime-quick.csv" if args.quick else "walltime.csv"), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
