"""Planning cost per forward step of the priced greedy (OnlineGreedyMultilevel): wall seconds of a
whole plan, sum(1 for _ in OnlinePlan(planner, n_steps=N).actions()), over N, default costs,
capacities s/10, 3s/10, the rest; "tables" is the part spent building the DP tables
(MultilevelPlanner). ``--before FILE``: also time another version of online_greedy.py (e.g.
``git show 1fb74a3:hpcadj/checkpoint/schedules/online_greedy.py > /tmp/before.py``) and check that
both plans are the same action stream; ``--before-multilevel FILE`` gives that version its own
multilevel.py (the DP tables; default: the package's). Time it alone on the cores (flock -x).

    .venv/bin/python experiments/online/planning_cost.py [--steps 10000] [--before FILE]
        [--before-multilevel FILE] 20 50 100 200
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import sys
import time

from hpcadj.checkpoint.schedules import default_costs
from hpcadj.checkpoint.schedules import online_greedy
from hpcadj.checkpoint.schedules.online_plans import OnlinePlan


def load(path: str, name: str = "_online_greedy_before"):
    """A schedules module (online_greedy.py) from ``path``, imported inside the package as ``name``
    so its relative imports resolve."""
    spec = importlib.util.spec_from_file_location(f"hpcadj.checkpoint.schedules.{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(module, caps, costs, steps: int) -> tuple[float, float, str]:
    """(wall s, s in MultilevelPlanner, sha256 of the action stream) of one whole plan."""
    spent = [0.0]
    planner_class = module.MultilevelPlanner

    class Timed(planner_class):
        def __init__(self, *args, **kwargs):
            t = time.perf_counter()
            super().__init__(*args, **kwargs)
            spent[0] += time.perf_counter() - t

    module.MultilevelPlanner = Timed
    try:
        digest = hashlib.sha256()
        t0 = time.perf_counter()
        for action in OnlinePlan(module.OnlineGreedyMultilevel(caps, costs), n_steps=steps).actions():
            digest.update(repr(action).encode())
        return time.perf_counter() - t0, spent[0], digest.hexdigest()
    finally:
        module.MultilevelPlanner = planner_class


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("slots", type=int, nargs="+", help="total slots s (at least 3)")
    ap.add_argument("--steps", type=int, default=10**4)
    ap.add_argument("--before", help="another online_greedy.py to time beside this one")
    ap.add_argument("--before-multilevel", help="the multilevel.py of the --before version")
    args = ap.parse_args(argv)
    if args.steps < 1 or min(args.slots) < 3 or (args.before_multilevel and not args.before):
        print("planning_cost.py: --steps must be >= 1, every s >= 3, --before-multilevel needs --before",
              file=sys.stderr)
        return 2
    versions = [("after", online_greedy)]
    if args.before:
        before = load(args.before)
        if args.before_multilevel:
            before.MultilevelPlanner = load(args.before_multilevel, "_multilevel_before").MultilevelPlanner
        versions.append(("before", before))
    costs = default_costs(3)
    print("version,s,capacities,steps,ms_per_step,tables_ms_per_step,rest_ms_per_step,sha256")
    differ = 0
    for s in args.slots:
        ram = max(1, s // 10)
        caps = [ram, (3 * s) // 10, s - ram - (3 * s) // 10]
        digests = set()
        for name, module in versions:
            wall, tables, digest = timed(module, caps, costs, args.steps)
            digests.add(digest)
            ms = 1e3 / args.steps
            print(f"{name},{s},{'/'.join(map(str, caps))},{args.steps},{wall * ms:.3f},{tables * ms:.3f},"
                  f"{(wall - tables) * ms:.3f},{digest[:16]}", flush=True)
        differ += len(digests) > 1
    if differ:
        print(f"# {differ} case(s) where the versions' plans differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
