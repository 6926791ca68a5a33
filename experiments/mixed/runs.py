"""Measured runs of issue 41's wave targets: mixed plans (steps' data u^i beside restart states) against
today's plans (restart states only), the same RAM bytes, 2 ranks, gradients compared bitwise.

Pairs (today / mixed), budgets in fields per step (a restart state is 2 fields, a step's data 1):
- store-all: restart states for every step (``--schedule revolve --ram n``) / ``--schedule mixed``
  without a budget: peak RSS;
- 1 field a step (``--ram n/2`` restart states' bytes): ``revolve`` / ``mixed``: forward steps;
- 1.5 fields a step (``--ram 3n/4``): the same.

    .venv/bin/python experiments/mixed/runs.py [--grid 96x96x96] [--steps 300] [--out DIR]

Writes runs.csv (beside this file or in --out) and prints the rows; gradient files go to a scratch
directory, removed at the end.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import _harness as H  # noqa: E402


def gradients(path: Path) -> dict:
    import h5py

    with h5py.File(path, "r") as f:
        return {name: f[name][...] for name in f}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", default="96x96x96")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    n = args.steps
    base = ["--model", "wave", "--grid", args.grid, "--steps", str(n)]
    # today's store-all is restart states alone: revolve with room for every state (store-all keeps u^i)
    configs = [("store-all", "today", ["--schedule", "revolve", "--ram", str(n)]),
               ("store-all", "mixed", ["--schedule", "mixed"]),
               ("1 field/step", "today", ["--schedule", "revolve", "--ram", str(n // 2)]),
               ("1 field/step", "mixed", ["--schedule", "mixed", "--ram", str(n // 2)]),
               ("1.5 fields/step", "today", ["--schedule", "revolve", "--ram", str(3 * n // 4)]),
               ("1.5 fields/step", "mixed", ["--schedule", "mixed", "--ram", str(3 * n // 4)])]
    scratch = Path(H.scratch("mixed-runs"))
    rows, reference = [], None
    try:
        for k, (budget, plan, extra) in enumerate(configs):
            out = scratch / f"grad{k}.h5"
            H.log(f"{budget} {plan}: {' '.join(extra)}")
            info = H.hpcadj_run(args.ranks, [*base, *extra, "--gradient-out", str(out)], timeout=3600)
            grad = gradients(out)
            out.unlink()
            reference = reference or grad
            bitwise = all(np.array_equal(grad[name], reference[name]) for name in reference)
            mixed = info.get("mixed") or {}
            rows.append({"case": f"wave {args.grid} x {n}, {args.ranks} ranks", "budget": budget, "plan": plan,
                         "schedule": info["schedule"], "forward_steps": info["forward_steps"],
                         "peak_rss_mib": round(info["peak_rss_bytes"] / 2 ** 20, 1),
                         "wall_s": round(info["wall_s"], 2), "data_writes": mixed.get("data_writes", 0),
                         "restart_writes": mixed.get("restart_writes", ""),
                         "J": repr(info["J"]), "gradient_bitwise_store_all": bitwise})
            print(rows[-1], flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    H.write_csv(args.out / "runs.csv", rows)
    print(H.markdown_table(rows, ["budget", "plan", "schedule", "forward_steps", "peak_rss_mib", "wall_s",
                                  "data_writes", "gradient_bitwise_store_all"]))
    print(H.machine())


if __name__ == "__main__":
    main()
