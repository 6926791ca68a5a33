"""Plan choice with fast steps (issue 15): predicted makespan against measured wall, wall against the
ideal of the run's own step times, and ``auto`` against the best single-level plan for the same RAM
budget, from one calibration, in one run.

    python experiments/kernels/plan_choice.py [--grid 128x128x128] [--steps 300] [--ranks 2]
                                              [--repeats 3] [--warm-gib G]

First touches ``--warm-gib`` GiB of memory once (default: 1.5 GiB per rank) and reports what that cost:
on a virtual machine, guest memory the host has not backed yet (never touched since boot, or paged
out by the host) costs a host page fault per page on its first touch, which is a property of the
machine's history, not of a plan (3 s/GiB on this project's VMs). Then calibrates once (``hpcadj
calibrate --out``) and runs ``hpcadj run --json --costs --log-dir`` ``--repeats`` times for each of:
``auto`` with ``--ram 512MiB --disk 2GiB --pfs 4GiB``, ``auto`` with the RAM budget alone (single
level: revolve), and revolve on the same RAM. Per case it prints the median run's plan, predicted
and measured seconds and their ratio, and two ideals:

- ``ideal`` = forward evaluations x step + adjoint steps x adjoint step with the run's own step
  times (its telemetry: each phase's seconds over its steps, the slowest rank's): wall / ideal is
  what the driver, the levels and the waits between ranks add to the kernels;
- ``ideal_cal``, the same with the calibrated (steady-state) step times.

It also gives the run's median recomputation step against a STREAM-triad probe run under the same
mpirun (``ratio_to_triad``, for the step's minimal bytes), and auto's wall over the best
single-level wall. Writes plan_choice.csv beside this file (or --out). Bad arguments: one line on
stderr, exit 2.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))
from _harness import warm_memory  # noqa: E402
HPCADJ = str(ROOT / ".venv" / "bin" / "hpcadj")
PYTHON = str(ROOT / ".venv" / "bin" / "python")
COMPUTE_PHASES = ("forward", "recompute", "adjoint")


def _env() -> dict:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return {k: v for k, v in env.items() if not k.startswith(("PMIX_", "OMPI_COMM", "OMPI_MCA_ess"))}


def _mpirun(ranks: int, argv: list[str], timeout: int = 1800) -> str:
    proc = subprocess.run(["mpirun", "--oversubscribe", "-n", str(ranks), *argv], env=_env(),
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: rc {proc.returncode}\n{proc.stderr[-3000:]}")
    return proc.stdout


def probe_worker() -> None:
    """Under mpirun: print the aggregate triad GB/s of all ranks (experiments/kernels/run.py's probe)."""
    sys.path.insert(0, str(HERE))
    from run import triad_probe

    from hpcadj.imports import mpi

    comm = mpi().COMM_WORLD
    bandwidth = triad_probe(comm)
    if comm.rank == 0:
        print(json.dumps({"triad_GBps": bandwidth}))


def run_step_times(log_dir: Path) -> dict:
    """Per compute phase, the slowest rank's seconds and steps, and the median seconds per step of
    the one-step recomputations (the run's steady-state kernel time)."""
    per_rank = []
    single_steps = []
    for path in sorted(log_dir.glob("rank*.jsonl")):
        sums = {p: [0.0, 0] for p in COMPUTE_PHASES}
        for line in path.read_text().splitlines():
            event = json.loads(line)
            phase = event.get("phase")
            if event.get("type") != "event" or phase not in sums:
                continue
            sums[phase][0] += event["seconds"]
            sums[phase][1] += event["steps"] or 0
            if phase == "recompute" and event["steps"] == 1:
                single_steps.append(event["seconds"])
        per_rank.append(sums)
    slowest = {p: max(r[p][0] for r in per_rank) for p in COMPUTE_PHASES}
    steps = {p: per_rank[0][p][1] for p in COMPUTE_PHASES}
    median_step = statistics.median(single_steps) if single_steps else float("nan")
    return {"seconds": slowest, "steps": steps, "median_recompute_step_s": median_step}


def measure_case(args, model, extra, profile, step_s, adjoint_s, work: Path) -> dict:
    """One run of a case: wall, predicted, the run's own step times and the ideals."""
    log_dir = work / "log"
    shutil.rmtree(log_dir, ignore_errors=True)
    out = json.loads(_mpirun(args.ranks, [HPCADJ, "run", *model, *extra, "--costs", str(profile),
                                          "--json", "--quiet", "--log-dir", str(log_dir)]))
    times = run_step_times(log_dir)
    sec, steps = times["seconds"], times["steps"]
    evaluations = steps["forward"] + steps["recompute"]
    run_step = (sec["forward"] + sec["recompute"]) / max(evaluations, 1)
    run_adjoint = sec["adjoint"] / max(steps["adjoint"], 1)
    ideal = out["forward_steps"] * run_step + out["adjoint_steps"] * run_adjoint
    ideal_cal = out["forward_steps"] * step_s + out["adjoint_steps"] * adjoint_s
    return {"schedule": out["schedule"], "forward_steps": out["forward_steps"],
            "adjoint_steps": out["adjoint_steps"], "predicted_s": round(out["predicted_s"], 3),
            "wall_s": round(out["wall_s"], 3),
            "predicted_over_wall": round(out["predicted_s"] / out["wall_s"], 3),
            "run_step_ms": round(run_step * 1e3, 3), "run_adjoint_ms": round(run_adjoint * 1e3, 3),
            "ideal_s": round(ideal, 3), "wall_over_ideal": round(out["wall_s"] / ideal, 3),
            "ideal_cal_s": round(ideal_cal, 3), "wall_over_ideal_cal": round(out["wall_s"] / ideal_cal, 3),
            "median_recompute_step_ms": round(times["median_recompute_step_s"] * 1e3, 3),
            "phase_s": json.dumps({k: round(v, 2) for k, v in out.get("phase_s", {}).items()})}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="128x128x128")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="runs per case; the median-wall run is reported")
    ap.add_argument("--warm-gib", type=float, default=None, help="GiB to touch first (default 1.5 per rank)")
    ap.add_argument("--out", default=str(HERE / "plan_choice.csv"))
    ap.add_argument("--probe-worker", action="store_true", help=argparse.SUPPRESS)
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    if args.probe_worker:
        probe_worker()
        return 0
    if args.steps < 1 or args.ranks < 1 or args.repeats < 1 or (args.warm_gib is not None and args.warm_gib < 0):
        print("plan_choice.py: --steps, --ranks and --repeats must be >= 1, --warm-gib >= 0", file=sys.stderr)
        return 2
    try:
        dims = [int(d) for d in args.grid.lower().split("x")]
    except ValueError:
        print(f"plan_choice.py: --grid must look like 128x128x128, got {args.grid!r}", file=sys.stderr)
        return 2
    warm_gib = 1.5 * args.ranks if args.warm_gib is None else args.warm_gib
    warm_s_per_gib = warm_memory(warm_gib)
    triad = json.loads(_mpirun(args.ranks, [PYTHON, str(Path(__file__).resolve()), "--probe-worker"]))["triad_GBps"]
    sys.path.insert(0, str(HERE))
    from run import MIN_BYTES

    points = 1
    for d in dims:
        points *= d
    work = Path(tempfile.mkdtemp(prefix="plan_choice_"))
    try:
        rows = _study(args, work, triad, points * MIN_BYTES[("wave", "step")])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    single = min(r["wall_s"] for r in rows[1:])
    rows[0]["auto_over_best_single"] = round(rows[0]["wall_s"] / single, 3)
    print(f"wave {args.grid} x {args.steps} steps, {args.ranks} ranks; first touch of {warm_gib:g} GiB: "
          f"{warm_s_per_gib:.2f} s/GiB; triad {triad:.1f} GB/s")
    for r in rows:
        print(f"{r['case']:24s} {r['schedule']:10s} evals {r['forward_steps']:4d}  predicted {r['predicted_s']:6.2f} s"
              f"  wall {r['wall_s']:6.2f} s (of {r['walls']})  predicted/wall {r['predicted_over_wall']:.3f}"
              f"  ideal {r['ideal_s']:5.2f} s  wall/ideal {r['wall_over_ideal']:.3f}"
              f"  (calibrated {r['ideal_cal_s']:5.2f} s, {r['wall_over_ideal_cal']:.3f})"
              f"  run step {r['run_step_ms']:.2f} ms, adjoint {r['run_adjoint_ms']:.2f} ms,"
              f" median recomputation {r['median_recompute_step_ms']:.2f} ms = {r['ratio_to_triad']:.2f} of triad")
    print(f"auto (3 levels) wall / best single-level wall: {rows[0]['auto_over_best_single']:.3f}")
    for r in rows:
        r["warm_s_per_gib"] = round(warm_s_per_gib, 3)
        r["triad_GBps"] = round(triad, 2)
    with open(args.out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return 0


def _study(args, work: Path, triad: float, step_bytes: int) -> list[dict]:
    model = ["--model", "wave", "--grid", args.grid, "--steps", str(args.steps)]
    local = ["--local-dir", str(work / "local")]
    (work / "local").mkdir()
    profile = work / "profile.json"
    _mpirun(args.ranks, [HPCADJ, "calibrate", *model, *local, "--pfs-file", str(work / "cal.h5"),
                         "--out", str(profile)])
    costs = json.loads(profile.read_text())
    step_s, adjoint_s = costs["forward_s"], costs["adjoint_s"]
    cases = [
        ("auto, RAM + disk + PFS", ["--ram", "512MiB", "--disk", "2GiB", "--pfs", "4GiB", *local,
                                    "--pfs-file", str(work / "ck.h5")]),
        ("auto, RAM only", ["--ram", "512MiB"]),
        ("revolve, RAM only", ["--schedule", "revolve", "--ram", "512MiB"]),
    ]
    results = {label: [] for label, _ in cases}
    for _ in range(args.repeats):  # cases interleaved, so a slow spell of the machine hits them alike
        for label, extra in cases:
            results[label].append(measure_case(args, model, extra, profile, step_s, adjoint_s, work))
    rows = []
    for label, _ in cases:
        runs = sorted(results[label], key=lambda r: r["wall_s"])
        row = {"case": label, **runs[len(runs) // 2], "walls": " ".join(f"{r['wall_s']:.2f}" for r in runs),
               "calibrated_step_ms": round(step_s * 1e3, 3), "calibrated_adjoint_ms": round(adjoint_s * 1e3, 3)}
        row["ratio_to_triad"] = round(step_bytes / (row["median_recompute_step_ms"] * 1e-3) / 1e9 / triad, 3)
        rows.append(row)
    return rows


if __name__ == "__main__":
    sys.exit(main())
