"""The memory wall (issue 16): a gradient whose store-all needs several times this machine's RAM,
computed inside a whole-process budget per rank, and the time-vs-memory curve of the same problem.

1. Headline: wave 3-D 128^3 (32 MiB a snapshot), n steps with n x snapshot >= 3 x the node's memory,
   2 ranks, ``--memory 3GiB`` per rank plus a node-local and an HDF5 budget that fit the free disk
   (files <= 30 GB, removed at the end). Reported: each rank's peak RSS against the budget, bytes per
   level, recomputation factor, wall time against the predicted makespan and against the ideal
   (forward evaluations x step time + adjoint steps x adjoint-step time, both from ``hpcadj
   calibrate`` on the same ranks).
2. Curve: the same problem under ``--memory`` budgets from 1 to 8 GiB per rank, RAM only (what the
   budget leaves for slots), plus one store-all point at the number of steps that 8 GiB can hold.

Every run is one ``mpirun -n 2 hpcadj run --json``; each rank's peak RSS comes from its log file.

    .venv/bin/python experiments/memory_wall/run.py [--quick]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import _harness as H  # noqa: E402

GiB = 2 ** 30


def node_memory() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def rank_rss(log_dir: str) -> list[int]:
    """Each rank's peak RSS from the ``end`` line of its log file."""
    out = []
    for name in sorted(os.listdir(log_dir)):
        if name.startswith("rank") and name.endswith(".jsonl"):
            with open(os.path.join(log_dir, name)) as f:
                ends = [json.loads(line) for line in f if '"type": "end"' in line or '"type":"end"' in line]
            out.append(ends[-1]["max_rss_bytes"])
    return out


def one_run(ranks: int, args: list, work: str, label: str, costs: dict) -> dict:
    """Run once; the row of the CSV."""
    logs = os.path.join(work, "logs")
    shutil.rmtree(logs, ignore_errors=True)
    H.log(f"  {label}: hpcadj run {' '.join(map(str, args))}")
    info = H.hpcadj_run(ranks, [*args, "--log-dir", logs], timeout=3600)
    rss = rank_rss(logs)
    levels = {lv["name"]: lv for lv in info["levels"]}
    ideal = info["forward_steps"] * costs["forward_s"] + info["adjoint_steps"] * costs["adjoint_s"]
    memory = info.get("memory") or {}
    row = {"label": label, "steps": info["steps"], "budget_gib_per_rank": memory.get("budget", 0) / GiB,
           "peak_rss_gib_max_rank": max(rss) / GiB, "peak_rss_gib_per_rank": " ".join(f"{r / GiB:.3f}" for r in rss),
           "within_budget": all(r <= memory["budget"] for r in rss) if memory else "",
           "predicted_peak_gib": memory.get("peak", 0) / GiB, "ram_slots": levels.get("ram", {}).get("slots", 0),
           "forward_steps": info["forward_steps"], "recompute_factor": info["forward_steps"] / info["steps"],
           "wall_s": info["wall_s"], "predicted_s": info["predicted_s"], "ideal_s": ideal,
           "wall_vs_predicted": info["wall_s"] / info["predicted_s"], "wall_vs_ideal": info["wall_s"] / ideal,
           "schedule": info["schedule"]}
    for name in ("ram", "disk", "pfs"):
        lv = levels.get(name, {})
        row[f"{name}_gib_written"] = lv.get("bytes_written", 0) / GiB
        row[f"{name}_writes"] = lv.get("writes", 0)
    H.log(f"    wall {row['wall_s']:.1f} s (predicted {row['predicted_s']:.1f}, ideal {ideal:.1f}), factor "
          f"{row['recompute_factor']:.2f}, peak RSS {row['peak_rss_gib_per_rank']} GiB vs budget "
          f"{row['budget_gib_per_rank']:.2f}")
    return row


def main() -> int:
    p = H.study_parser(__doc__, HERE, model="wave")
    args = p.parse_args()
    grid = args.grid or ("64x64x64" if args.quick else "128x128x128")
    nx = [int(x) for x in grid.split("x")]
    snapshot = 2 * 8 * nx[0] * nx[1] * nx[2]                    # wave: u and u_prev
    node = node_memory()
    n = args.steps or (200 if args.quick else -(-3 * max(node, 24 * GiB) // snapshot) + 10)  # > 72 GiB
    headline_memory = "0.4GiB" if args.quick else "3GiB"
    curve = ["0.3GiB", "0.4GiB", "0.6GiB"] if args.quick else ["1GiB", "2GiB", "3GiB", "5GiB", "8GiB"]
    disk_per_rank = (n * snapshot // 8 // args.ranks) if args.quick else 6 * GiB
    pfs = (n * snapshot // 8) if args.quick else 12 * GiB
    info = H.machine()
    H.log(f"memory_wall: wave {grid}, {n} steps: store-all would hold {n * snapshot / GiB:.1f} GiB "
          f"(node {node / GiB:.1f} GiB, {n * snapshot / node:.2f}x); {args.ranks} ranks")
    # the curve's largest budget on every rank, touched once: first-touch faults of memory the VM's
    # host has not backed are the machine's history, not the plan's cost (reported in machine.json)
    warm_gib = args.ranks * float(curve[-1].removesuffix("GiB")) + 1.0
    first_touch = H.warm_memory(warm_gib)
    H.log(f"  first touch of {warm_gib:g} GiB: {first_touch:.2f} s/GiB")
    work = H.scratch("memwall")
    local = os.path.join(work, "local")
    rows = []
    try:
        profile = os.path.join(work, "profile.json")
        H.hpcadj_cmd(args.ranks, "calibrate", ["--model", "wave", "--grid", grid, "--steps", n, "--local-dir",
                                              work, "--pfs-file", os.path.join(work, "cal.h5"), "--out", profile,
                                              "--repeats", 5], timeout=1800)
        costs = json.loads(Path(profile).read_text())
        base = ["--model", "wave", "--grid", grid, "--steps", n, "--costs", profile]
        rows.append(one_run(args.ranks, [*base, "--memory", headline_memory, "--disk", f"{disk_per_rank}B",
                                         "--pfs", f"{pfs}B", "--local-dir", local, "--pfs-file",
                                         os.path.join(work, "ckpt.h5")],
                            work, f"three levels, --memory {headline_memory}", costs))
        for budget in curve:
            rows.append(one_run(args.ranks, [*base, "--memory", budget], work, f"RAM only, --memory {budget}",
                                costs))
        largest = rows[-1]
        fits = max(2, largest["ram_slots"] + 1)
        rows.append(one_run(args.ranks, [*base[:5], fits, *base[6:], "--memory", curve[-1]], work,
                            f"store-all at {fits} steps, --memory {curve[-1]}", costs))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    H.write_csv(out / "results.csv", rows)
    (out / "machine.json").write_text(json.dumps({**info, "node_memory_bytes": node, "snapshot_bytes": snapshot,
                                                  "steps": n, "costs": costs, "warmed_gib": warm_gib,
                                                  "first_touch_s_per_gib": first_touch}, indent=1))
    plot(rows, out / "memory_wall.png", grid, n, snapshot, node)
    return 0


def plot(rows, path, grid, n, snapshot, node) -> None:
    plt = H.pyplot()
    curve = [r for r in rows if r["label"].startswith("RAM only")]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot([r["budget_gib_per_rank"] for r in curve], [r["wall_s"] for r in curve], "o-",
            label="RAM only: wall time")
    ax.plot([r["budget_gib_per_rank"] for r in curve], [r["ideal_s"] for r in curve], "x--",
            label="ideal (evaluations x step + adjoints x adjoint step)")
    three = rows[0]
    ax.plot([three["budget_gib_per_rank"]], [three["wall_s"]], "s", ms=9, label=three["label"])
    for r in curve:
        ax.annotate(f"{r['recompute_factor']:.2f}x\n{r['peak_rss_gib_max_rank']:.2f} GiB", (r["budget_gib_per_rank"],
                    r["wall_s"]), textcoords="offset points", xytext=(4, 6), fontsize=7)
    ax.set_xlabel("--memory per rank (GiB)")
    ax.set_ylabel("gradient wall time (s)")
    ax.set_title(f"wave {grid}, {n} steps, 2 ranks: store-all would need {n * snapshot / 2**30:.0f} GiB "
                 f"({n * snapshot / node:.1f}x the node)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
