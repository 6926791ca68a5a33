"""Mixed plans over RAM and node-local disk against today's multi-level plan with the same levels and
bytes: wave, 2 ranks, one calibrated cost profile for both, gradients compared bitwise.

    .venv/bin/python experiments/mixed/levels_runs.py [--grid 128x128x128] [--steps 300] \
        [--levels 60:20 100:30] [--out DIR]

``--levels RAM:DISK`` pairs: RAM and node-local slots in restart states (a wave restart state is two
fields; the mixed plan spends the same RAM bytes on restart states and steps' data u^i). Writes
levels_runs.csv (beside this file or in --out) and prints the rows with the load average before
each run; the profile, checkpoints and gradients go to a scratch directory, removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import _harness as H  # noqa: E402
from runs import gradients  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", default="128x128x128")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--levels", nargs="+", default=["60:20", "100:30"])
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    base = ["--model", "wave", "--grid", args.grid, "--steps", str(args.steps)]
    scratch = Path(H.scratch("mixed-levels"))
    rows = []
    try:
        costs = scratch / "costs.json"
        H.hpcadj_cmd(args.ranks, "calibrate", [*base, "--local-dir", str(scratch), "--out", str(costs)])
        for pair in args.levels:
            ram, disk = pair.split(":")
            levels = ["--ram", ram, "--disk", disk, "--local-dir", str(scratch), "--costs", str(costs)]
            reference = None
            for schedule in ("multilevel", "mixed"):
                out = scratch / f"grad-{schedule}.h5"
                load = os.getloadavg()
                H.log(f"{schedule} --ram {ram} --disk {disk} (load {load[0]:.1f})")
                info = H.hpcadj_run(args.ranks, [*base, "--schedule", schedule, *levels, "--gradient-out", str(out)],
                                    timeout=3600)
                grad = gradients(out)
                out.unlink()
                reference = reference or grad
                mixed = info.get("mixed") or {}
                disk_level = next(lv for lv in info["levels"] if lv["name"] == "disk")
                rows.append({"case": f"wave {args.grid} x {args.steps}, {args.ranks} ranks",
                             "levels": f"ram {ram} + disk {disk} states", "schedule": schedule,
                             "forward_steps": info["forward_steps"], "wall_s": round(info["wall_s"], 2),
                             "peak_rss_mib": round(info["peak_rss_bytes"] / 2 ** 20, 1),
                             "disk_writes": disk_level["writes"], "data_writes": mixed.get("data_writes", 0),
                             "load_before": round(load[0], 1), "load_after": round(os.getloadavg()[0], 1),
                             "gradient_bitwise_multilevel": all(np.array_equal(grad[k], reference[k])
                                                                for k in reference)})
                print(rows[-1], flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    H.write_csv(args.out / "levels_runs.csv", rows)
    print(H.markdown_table(rows, ["levels", "schedule", "forward_steps", "wall_s", "peak_rss_mib", "disk_writes",
                                  "data_writes", "load_before", "load_after", "gradient_bitwise_multilevel"]))
    print(H.machine())


if __name__ == "__main__":
    main()
