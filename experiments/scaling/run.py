"""Scaling (issue 7, study 3): strong and weak scaling of one gradient over 1, 2 and 3 MPI ranks.

This VM has 2 cores: 1 and 2 ranks get a core each (shared with whatever else runs), **3 ranks are
oversubscribed** (3 processes on 2 cores) and are labelled so — they show the cost of
oversubscription, not scaling. Strong: a fixed grid. Weak: the grid grows with the ranks along x
(same points per rank). The plan is revolve with a fixed RAM budget, so each run recomputes the
same number of steps. ``mpirun -n R hpcadj run --json``, 3 repeats (order rotated), medians.

    .venv/bin/python experiments/scaling/run.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import _harness as H  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--model", default="heat")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--ram", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--out", default=str(HERE))
    args = p.parse_args()
    n = args.steps or (30 if args.quick else 60)
    side = 160 if args.quick else 256   # strong: side x side
    weak = 128 if args.quick else 192   # weak: (weak * R) x weak
    info = H.machine()
    cores = info["nproc"]
    raw_all, rows = [], []
    for rep in range(args.repeats):
        order = args.ranks[rep % len(args.ranks):] + args.ranks[:rep % len(args.ranks)]
        for ranks in order:
            for kind, grid in (("strong", f"{side}x{side}"), ("weak", f"{weak * ranks}x{weak}")):
                info_run = H.hpcadj_run(ranks, ["--model", args.model, "--grid", grid, "--steps", n,
                                                "--schedule", "revolve", "--ram", args.ram])
                raw_all.append({"kind": kind, "ranks": ranks, "grid": grid, "repeat": rep,
                                "wall_s": info_run["wall_s"], "forward_steps": info_run["forward_steps"],
                                **{f"{k}_s": v for k, v in info_run["phase_s"].items()},
                                "peak_rss_mib": info_run["peak_rss_bytes"] / 2**20, "J": info_run["J"]})
                H.log(f"  [{rep}] {kind:6s} {ranks} rank(s) {grid:>9s}: wall {info_run['wall_s']:.3f} s")
    for kind in ("strong", "weak"):
        base = None
        for ranks in args.ranks:
            rs = [r for r in raw_all if r["kind"] == kind and r["ranks"] == ranks]
            row = {"kind": kind, "ranks": ranks, "oversubscribed": ranks > cores, "grid": rs[0]["grid"],
                   "forward_steps": rs[0]["forward_steps"], "wall_s": H.median([r["wall_s"] for r in rs]),
                   "wall_min_s": min(r["wall_s"] for r in rs), "wall_max_s": max(r["wall_s"] for r in rs),
                   "forward_s": H.median([r["forward_s"] for r in rs]),
                   "recompute_s": H.median([r["recompute_s"] for r in rs]),
                   "adjoint_s": H.median([r["adjoint_s"] for r in rs]),
                   "peak_rss_mib": H.median([r["peak_rss_mib"] for r in rs]), "J": rs[0]["J"], "repeats": len(rs)}
            base = base or row
            if kind == "strong":
                row["speedup"] = base["wall_s"] / row["wall_s"]
                row["efficiency"] = row["speedup"] / ranks
                row["J_rel_diff_vs_1"] = abs(row["J"] - base["J"]) / abs(base["J"])
            else:
                row["efficiency"] = base["wall_s"] / row["wall_s"]
            rows.append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    H.write_csv(out / "results.csv", rows)
    plot(rows, out / "scaling.png", args, n, info)
    print(H.markdown_table(rows, ["kind", "ranks", "oversubscribed", "grid", "forward_steps", "wall_s", "wall_min_s",
                                  "wall_max_s", "speedup", "efficiency", "J_rel_diff_vs_1"]))
    print(f"\nmachine: {info}; load at the end {H.machine()['loadavg_1m']}; medians of {args.repeats}")
    return 0


def plot(rows, path, args, n, info) -> None:
    plt = H.pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2))
    cores = info["nproc"]
    for ax, kind in ((a1, "strong"), (a2, "weak")):
        rs = [r for r in rows if r["kind"] == kind]
        ranks = [r["ranks"] for r in rs]
        ax.errorbar(ranks, [r["wall_s"] for r in rs],
                    yerr=[[r["wall_s"] - r["wall_min_s"] for r in rs], [r["wall_max_s"] - r["wall_s"] for r in rs]],
                    fmt="o-", capsize=3, label="measured (median, min-max)")
        t1 = rs[0]["wall_s"]
        ideal = [t1 / p for p in ranks] if kind == "strong" else [t1 for _ in ranks]
        ax.plot(ranks, ideal, "k--", lw=1, label="ideal")
        ax.axvspan(cores + 0.5, max(ranks) + 0.5, color="red", alpha=0.1,
                   label=f"oversubscribed (> {cores} cores)")
        for r in rs:
            ax.annotate(r["grid"], (r["ranks"], r["wall_s"]), textcoords="offset points", xytext=(5, 5), fontsize=7)
        ax.set_xticks(ranks)
        ax.set_xlabel("MPI ranks")
        ax.set_ylabel("wall time of the gradient (s)")
        ax.set_title(f"{kind} scaling, {args.model}, {n} steps, revolve {args.ram} RAM slots")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{info['nproc']}-core VM shared with other jobs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
