"""Peak RSS against a whole-process budget at a realistic size, for the commands that hold one
baseline for all their work: ``hpcadj hesscheck --memory`` (Hessian products, then gradient
differences) and ``hpcadj run --memory`` under a revolve plan, wave 384x384 x 40 steps on 2 ranks.

Each row is one real command (``mpirun -n RANKS hpcadj ... --json``); its ``peak_rss_bytes`` is the
largest rank's peak resident set over the whole command. Appends rows to budget_held.csv beside this
script and exits 1 when a peak exceeds its budget (tests/cli/test_memory_baseline.py checks the cause
in-process at a small size; this is the size where the budget was broken).

    flock /work/wt/measure.lock .venv/bin/python experiments/hessian/budget_held.py
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _harness import HPCADJ, mpirun

HERE = Path(__file__).resolve().parent
MiB = 2 ** 20
SIZE = ["--model", "wave", "--grid", "384x384", "--steps", "40"]
ROWS = {
    "hesscheck": (["hesscheck", *SIZE], "262MiB"),
    "run-revolve": (["run", *SIZE, "--schedule", "revolve"], "245MiB"),
}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rows", default=",".join(ROWS))
    args = p.parse_args()
    out, failed = [], False
    for name in args.rows.split(","):
        argv, budget = ROWS[name]
        t0 = time.time()
        text = mpirun(args.ranks, [HPCADJ, *argv, "--memory", budget, "--json"], timeout=1800)
        wall = time.time() - t0
        info = json.loads(text.strip().splitlines()[-1])
        memory = info["memory"]
        peak = memory["peak_rss_bytes"] if "peak_rss_bytes" in memory else info["peak_rss_bytes"]
        predicted = memory.get("predicted_peak_bytes", memory.get("peak"))
        row = {"date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "row": name, "ranks": args.ranks,
               "budget_MiB": float(budget[:-3]), "peak_MiB": round(peak / MiB, 1),
               "predicted_MiB": round(predicted / MiB, 1) if predicted else "", "wall_s": round(wall, 1),
               "load": round(os.getloadavg()[0], 1)}
        failed |= peak > float(budget[:-3]) * MiB
        out.append(row)
        print(row, flush=True)
    path = HERE / "budget_held.csv"
    new = not path.exists()
    with open(path, "a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(out[0]))
        if new:
            writer.writeheader()
        writer.writerows(out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
