"""Plan choice with fast steps (issue 15): predicted makespan against measured wall, and ``auto``
against the best single-level plan for the same RAM budget, from one calibration, in one run.

    python experiments/kernels/plan_choice.py [--grid 128x128x128] [--steps 300] [--ranks 2]

Calibrates once (``hpcadj calibrate --out``), then runs ``hpcadj run --json --costs`` with that
profile for: ``auto`` with ``--ram 512MiB --disk 2GiB --pfs 4GiB``, ``auto`` with the RAM budget
alone (single level: revolve), and revolve on the same RAM. Prints each run's plan, predicted and
measured seconds and their ratio, the ideal (forward evaluations x step + adjoint steps x adjoint
step, from the profile) and wall / ideal, and auto's wall over the best single-level wall. Writes
plan_choice.csv beside this file (or --out). Bad arguments: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
HPCADJ = str(ROOT / ".venv" / "bin" / "hpcadj")


def _mpirun(ranks: int, args: list[str], timeout: int = 1800) -> str:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env = {k: v for k, v in env.items() if not k.startswith(("PMIX_", "OMPI_COMM", "OMPI_MCA_ess"))}
    proc = subprocess.run(["mpirun", "--oversubscribe", "-n", str(ranks), HPCADJ, *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"hpcadj {' '.join(args)}: rc {proc.returncode}\n{proc.stderr[-3000:]}")
    return proc.stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="128x128x128")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "plan_choice.csv"))
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    if args.steps < 1 or args.ranks < 1:
        print("plan_choice.py: --steps and --ranks must be >= 1", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="plan_choice_"))
    model = ["--model", "wave", "--grid", args.grid, "--steps", str(args.steps)]
    local = ["--local-dir", str(work / "local")]
    (work / "local").mkdir()
    profile = work / "profile.json"
    _mpirun(args.ranks, ["calibrate", *model, *local, "--pfs-file", str(work / "cal.h5"),
                         "--out", str(profile)])
    costs = json.loads(profile.read_text())
    step_s, adjoint_s = costs["forward_s"], costs["adjoint_s"]
    cases = [
        ("auto, RAM + disk + PFS", ["--ram", "512MiB", "--disk", "2GiB", "--pfs", "4GiB", *local,
                                    "--pfs-file", str(work / "ck.h5")]),
        ("auto, RAM only", ["--ram", "512MiB"]),
        ("revolve, RAM only", ["--schedule", "revolve", "--ram", "512MiB"]),
    ]
    rows = []
    for label, extra in cases:
        out = json.loads(_mpirun(args.ranks, ["run", *model, *extra, "--costs", str(profile), "--json"]))
        ideal = out["forward_steps"] * step_s + out["adjoint_steps"] * adjoint_s
        rows.append({"case": label, "schedule": out["schedule"], "forward_steps": out["forward_steps"],
                     "adjoint_steps": out["adjoint_steps"], "predicted_s": out["predicted_s"],
                     "wall_s": round(out["wall_s"], 2),
                     "predicted_over_wall": round(out["predicted_s"] / out["wall_s"], 3),
                     "ideal_s": round(ideal, 2), "wall_over_ideal": round(out["wall_s"] / ideal, 3),
                     "phase_s": json.dumps({k: round(v, 2) for k, v in out.get("phase_s", {}).items()})})
    single = min(r["wall_s"] for r in rows[1:])
    rows[0]["auto_over_best_single"] = round(rows[0]["wall_s"] / single, 3)
    print(f"wave {args.grid} x {args.steps} steps, {args.ranks} ranks; calibrated step {step_s * 1e3:.2f} ms, "
          f"adjoint step {adjoint_s * 1e3:.2f} ms")
    for r in rows:
        print(f"{r['case']:24s} {r['schedule']:10s} evals {r['forward_steps']:4d}  predicted {r['predicted_s']:7.2f} s"
              f"  wall {r['wall_s']:7.2f} s  predicted/wall {r['predicted_over_wall']:.3f}"
              f"  ideal {r['ideal_s']:6.2f} s  wall/ideal {r['wall_over_ideal']:.3f}  {r['phase_s']}")
    print(f"auto (3 levels) wall / best single-level wall: {rows[0]['auto_over_best_single']:.3f}")
    with open(args.out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
