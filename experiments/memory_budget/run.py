"""Every model's working set in state-equivalents, measured and predicted (issue 16).

For each model at a realistic size, on 1 and 2 ranks: a 10-step gradient with a 3-slot RAM revolve
plan (``probe.py`` under mpirun, one run at a time), the peak RSS of each rank minus the process
baseline, divided by one state's bytes on that rank; next to it the prediction of
:func:`hpcadj.checkpoint.memory.plan_memory` (model + working states + staging + RAM slots) in the
same unit. The "before" figures are of main at 92b7e3b (before the lean heat and grayscott models),
measured with the same probe from an export of that tree and kept in ``before.jsonl``; the "start"
figures of main at 300918a (before the matrix-free heat operator and the leaner driver), kept in
``start.jsonl``.

    .venv/bin/python experiments/memory_budget/run.py            # measure "after", write results.csv
    .venv/bin/python experiments/memory_budget/run.py --from after.jsonl   # table from recorded lines
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CONFIGS = [("heat", "128x128x128", []), ("heat", "1024x1024", []), ("grayscott", "512x512", []),
           ("burgers", "1024x1024", []), ("wave", "128x128x128", []),
           ("heat", "1024x1024", ["--disk", "3"])]


def measure(ranks=(1, 2), steps=10, ram=3, timeout=900):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=str(ROOT))
    lines = []
    for model, grid, extra in CONFIGS:
        for n in ranks:
            cmd = ["mpirun", "--oversubscribe", "-n", str(n), "-x", "PYTHONPATH", sys.executable,
                   str(HERE / "probe.py"), "--model", model, "--grid", grid, "--steps", str(steps),
                   "--ram", str(ram), *extra]
            print("#", " ".join(cmd[5:]), file=sys.stderr, flush=True)
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
            if proc.returncode != 0:
                raise SystemExit(proc.stdout + proc.stderr)
            lines += [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return lines


def key(d):
    return (d["model"], d["grid"], d["ranks"], d.get("disk", 0))


def table(before, after, start=()):
    """One row per (model, grid, ranks, disk): the largest rank's figures."""
    def worst(lines):
        out = {}
        for d in lines:
            k = key(d)
            if k not in out or d["states_measured"] > out[k]["states_measured"]:
                out[k] = d
        return out

    b, a, m = worst(before), worst(after), worst(start)
    rows = []
    for k, d in a.items():
        pred = d["predicted"]
        s = d["state_bytes"]
        old, mid = b.get(k), m.get(k)
        rows.append({
            "model": k[0], "grid": k[1], "ranks": k[2], "ram_slots": d["ram"], "disk_slots": k[3],
            "state_mib_per_rank": round(s / 2**20, 2), "baseline_mib": round(d["baseline_bytes"] / 2**20, 1),
            "peak_mib_before": round(old["peak_bytes"] / 2**20, 1) if old else "",
            "peak_mib_after": round(d["peak_bytes"] / 2**20, 1),
            "states_before": round(old["states_measured"], 1) if old else "",
            "states_start": round(mid["states_measured"], 1) if mid else "",
            "states_after": round(d["states_measured"], 1),
            "states_predicted": round(d["states_predicted"], 1),
            "pred_model": round(pred["model"] / s, 1), "pred_working": round(pred["working states"] / s, 1),
            "pred_staging": round(pred["staging"] / s, 1), "pred_ram_slots": round(pred["ram slots"] / s, 1),
            "construct_states": round((d["construct_peak_bytes"] - d["baseline_bytes"]) / s, 1),
            "controls_states": round((d["controls_peak_bytes"] - d["baseline_bytes"]) / s, 1),
        })
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="source", default=None, help="JSON lines of probe.py runs (skip measuring)")
    p.add_argument("--out", default=str(HERE / "results.csv"))
    args = p.parse_args()
    after = ([json.loads(line) for line in open(args.source) if line.startswith("{")] if args.source
             else measure())
    if not args.source:
        with open(HERE / "after.jsonl", "w") as f:
            f.writelines(json.dumps(d) + "\n" for d in after)
    before = [json.loads(line) for line in open(HERE / "before.jsonl")]
    start = [json.loads(line) for line in open(HERE / "start.jsonl")] if (HERE / "start.jsonl").exists() else []
    rows = table(before, after, start)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        print(f"{r['model']:9s} {r['grid']:12s} {r['ranks']} ranks disk {r['disk_slots']}: "
              f"before {r['states_before']!s:>6} start {r['states_start']!s:>6} after {r['states_after']:6.1f} "
              f"predicted {r['states_predicted']:6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
