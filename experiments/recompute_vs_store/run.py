"""Recompute vs store (issue 7, study 1): wall time, peak memory and modeled energy of one nonlinear
model (Burgers, SSP-RK3) as the RAM budget shrinks from store-all to 2 slots, revolve vs periodic,
with the binomial minimum (``min_forward_steps``) beside the measured forward-step counts.

Every point is ``mpirun -n 2 hpcadj run --model burgers --ram S --schedule revolve|periodic --json
--log-dir ...`` (the log dir makes the run report its energy: the documented model,
``hpcadj/telemetry/energy_model.py``, as this VM has no RAPL), repeated 3 times with the order
rotated; medians.

    .venv/bin/python experiments/recompute_vs_store/run.py [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import _harness as H  # noqa: E402


def main() -> int:
    p = H.study_parser(__doc__, HERE, model="burgers")
    args = p.parse_args()
    from hpcadj.checkpoint.schedules import min_forward_steps, store_all_slots

    grid = args.grid or ("96x96" if args.quick else "128x128")
    n = args.steps or (40 if args.quick else 60)
    budgets = [8, 4, 2] if args.quick else [20, 8, 4, 2]
    info = H.machine()
    base = ["--model", args.model, "--grid", grid, "--steps", n, "--log-dir", "@LOGDIR"]
    configs = [("store-all", base + ["--schedule", "store-all"])]
    for s in budgets:
        configs.append((f"revolve {s}", base + ["--schedule", "revolve", "--ram", s]))
        configs.append((f"periodic {s}", base + ["--schedule", "periodic", "--ram", s]))
    H.log(f"recompute_vs_store: {args.model} {grid}, {n} steps, {args.ranks} ranks, load {info['loadavg_1m']}")
    raw, rows = H.run_configs(configs, args.ranks, args.repeats)
    for row in rows:
        slots = row.get("ram_slots", store_all_slots(n))
        row["slots"] = slots
        row["theory_min_forward"] = min_forward_steps(n, slots)
        row["recompute_factor"] = row["forward_steps"] / n
    J0 = rows[0]["J"]
    for row in rows:
        row["J_rel_diff"] = abs(row["J"] - J0) / abs(J0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    H.write_csv(out / "results.csv", rows)
    plot(rows, out / "recompute_vs_store.png", args.model, grid, n, args, info)
    print(H.markdown_table(rows, ["label", "slots", "forward_steps", "theory_min_forward", "recompute_factor",
                                  "wall_s", "peak_rss_mib", "energy_j", "energy_source", "J_rel_diff"]))
    print(f"\nmachine: {info}; load at the end {H.machine()['loadavg_1m']}; medians of {args.repeats}")
    return 0


def plot(rows, path, model, grid, n, args, info) -> None:
    from hpcadj.checkpoint.schedules import min_forward_steps

    plt = H.pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    smax = max(r["slots"] for r in rows)
    theory_s = list(range(2, smax + 1))
    series = [("revolve", "o-", "tab:orange"), ("periodic", "s--", "tab:purple")]
    store_all = rows[0]
    panels = [(axes[0][0], "forward_steps", "forward step evaluations"),
              (axes[0][1], "wall_s", f"wall time (s, median of {args.repeats})"),
              (axes[1][0], "peak_rss_mib", "peak RSS, largest rank (MiB)"),
              (axes[1][1], "energy_j", "energy (J, modeled: 12 W per core-second + J/B)")]
    for ax, key, ylabel in panels:
        for name, style, colour in series:
            rs = sorted([r for r in rows if r["label"].startswith(name)], key=lambda r: r["slots"])
            ax.plot([r["slots"] for r in rs], [r.get(key, float("nan")) for r in rs], style, color=colour,
                    label=f"{name} (measured)")
        ax.plot([store_all["slots"]], [store_all.get(key, float("nan"))], "D", color="tab:blue",
                label="store-all (measured)")
        if key == "forward_steps":
            ax.plot(theory_s, [min_forward_steps(n, s) for s in theory_s], "-", color="black", lw=1,
                    label="binomial minimum (theory)")
            ax.set_yscale("log")
        ax.set_xscale("log")
        ax.set_xlabel("RAM slots per rank (snapshot of u_0 included)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Recompute vs store: {model} {grid}, {n} steps, {args.ranks} ranks ({info['nproc']}-core VM)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
