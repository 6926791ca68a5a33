"""Memory vs time for one model (issue 5): peak RSS and wall time of store-all, revolve at several
RAM budgets, and three-level plans (RAM + node-local + parallel HDF5), 2 ranks.

Every configuration is a separate ``mpirun -n 2 hpcadj run --json`` (so ``peak_rss_bytes``, the
largest rank's ru_maxrss, belongs to that run alone), repeated (default 3 times, order rotated
each repeat); the table holds medians. Multilevel plans use one cost profile measured at the start
with ``hpcadj calibrate`` on the same ranks.

    .venv/bin/python experiments/memory_time/run.py [--quick]
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


def main() -> int:
    p = H.study_parser(__doc__, HERE, model="heat")
    args = p.parse_args()
    grid = args.grid or ("160x160" if args.quick else "256x256")
    n = args.steps or (50 if args.quick else 80)
    ram_budgets = [16, 4] if args.quick else [16, 4, 2]
    three = [(2, 4), (4, 8)] if args.quick else [(2, 4), (4, 16)]

    info = H.machine()
    work = H.scratch("memtime")
    profile = os.path.join(work, "profile.json")
    H.log(f"memory_time: {args.model} {grid}, {n} steps, {args.ranks} ranks; calibrating")
    H.hpcadj_cmd(args.ranks, "calibrate", ["--model", args.model, "--grid", grid, "--steps", n,
                                          "--pfs-file", os.path.join(work, "cal.h5"), "--local-dir", work,
                                          "--out", profile])
    base = ["--model", args.model, "--grid", grid, "--steps", n, "--costs", profile]
    configs = [("store-all (RAM)", base + ["--schedule", "store-all"])]
    configs += [(f"revolve RAM {s}", base + ["--schedule", "revolve", "--ram", s]) for s in ram_budgets]
    for ram, disk in three:
        configs.append((f"3-level RAM {ram} + disk {disk} + HDF5",
                        base + ["--schedule", "multilevel", "--ram", ram, "--disk", disk, "--pfs", n,
                                "--pfs-file", "@PFSFILE", "--local-dir", "@LOCALDIR"]))
    raw, rows = H.run_configs(configs, args.ranks, args.repeats)
    for row in rows:
        row["ram_ckpt_mib_per_rank"] = row.get("ram_peak_slots", 0) * row["snapshot_bytes"] / args.ranks / 2**20
    ref = rows[0]
    for row in rows:
        row["time_vs_store_all"] = row["wall_s"] / ref["wall_s"]
        row["rss_vs_store_all"] = row["peak_rss_mib"] / ref["peak_rss_mib"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    H.write_csv(out / "results.csv", rows)
    (out / "profile.json").write_text(Path(profile).read_text())
    shutil.rmtree(work, ignore_errors=True)
    plot(rows, out / "memory_time.png", args.model, grid, n, args, info)
    keys = ["label", "forward_steps", "ram_peak_slots", "disk_writes", "pfs_writes", "ram_ckpt_mib_per_rank",
            "peak_rss_mib", "wall_s", "wall_min_s", "wall_max_s", "time_vs_store_all", "rss_vs_store_all"]
    print(H.markdown_table(rows, keys))
    print(f"\nmachine: {info}; load at the end {H.machine()['loadavg_1m']}; medians of {args.repeats}")
    print(json.dumps(json.loads(Path(out / "profile.json").read_text())))
    return 0


def plot(rows, path, model, grid, n, args, info) -> None:
    plt = H.pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    groups = [("store-all", "s", "tab:blue"), ("revolve", "o", "tab:orange"), ("3-level", "^", "tab:green")]
    for key, marker, colour in groups:
        rs = [r for r in rows if r["label"].startswith(key)]
        if not rs:
            continue
        ax.errorbar([r["peak_rss_mib"] for r in rs], [r["wall_s"] for r in rs],
                    yerr=[[r["wall_s"] - r["wall_min_s"] for r in rs], [r["wall_max_s"] - r["wall_s"] for r in rs]],
                    fmt=marker, color=colour, capsize=3, label={"store-all": "store-all in RAM",
                                                                "revolve": "revolve, RAM only",
                                                                "3-level": "RAM + node-local + HDF5"}[key])
        for r in rs:
            short = r["label"].replace("revolve RAM ", "s=").replace("3-level RAM ", "R").replace(
                " + disk ", "+D").replace(" + HDF5", "+H").replace("store-all (RAM)", "all")
            ax.annotate(short, (r["peak_rss_mib"], r["wall_s"]), textcoords="offset points", xytext=(4, 4),
                        fontsize=7)
    ax.set_xlabel("peak RSS of the largest rank (MiB)")
    ax.set_ylabel(f"wall time of the gradient (s, median of {args.repeats}; bars: min-max)")
    ax.set_title(f"{model} {grid}, {n} steps, {args.ranks} ranks ({info['nproc']}-core VM)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
