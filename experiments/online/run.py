"""Online vs offline checkpointing, from simulation (planning is pure): forward evaluations and
predicted makespan of the online plans over their offline optima, same n, slots and costs.

One level: OnlineBinomial (greedy, online_binomial.py) and the thinning OnlineSchedule (online.py)
against the binomial minimum 1 + p(n, s). Three levels (RAM, node-local, HDF5; capacities s/10,
3s/10, the rest; default costs): the priced greedy OnlineGreedyMultilevel (online_greedy.py, what
the driver runs) and the older cascade OnlineMultilevel (online_multilevel.py) against Multilevel's DP.

    .venv/bin/python experiments/online/run.py            # writes results.csv and ratios.png here
    .venv/bin/python experiments/online/run.py --quick --out DIR   # n <= 1000, s <= 20
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from hpcadj.checkpoint.schedules import (Multilevel, OnlineSchedule, default_costs, min_forward_steps, simulate,
                                         simulate_online)
from hpcadj.checkpoint.schedules.online_binomial import OnlineBinomial
from hpcadj.checkpoint.schedules.online_greedy import OnlineGreedyMultilevel
from hpcadj.checkpoint.schedules.online_multilevel import OnlineMultilevel

HERE = Path(__file__).resolve().parent
NS = [10, 30, 100, 300, 1000, 3000, 10**4, 3 * 10**4, 10**5]
SS = [2, 5, 10, 20, 50, 100, 200]
#: three-level rows: the target's range (n <= 10^4, every s of SS from 5); the offline DP switches to
#: candidate splits past 2e7 split evaluations, so n = 10^4 with s = 200 plans in seconds
ML_MAX_N, ML_MAX_S = 10**4, 200


def three_levels(s: int) -> list[int]:
    ram = max(1, s // 10)
    local = max(0, (3 * s) // 10)
    return [ram, local, s - ram - local]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n <= 1000 and s <= 20 only")
    ap.add_argument("--out", default=str(HERE), help="directory for results.csv and ratios.png")
    args = ap.parse_args(argv)
    ns = [n for n in NS if n <= 1000] if args.quick else NS
    ss = [s for s in SS if s <= 20] if args.quick else SS
    rows = []
    for s in ss:
        for n in ns:
            t0 = time.perf_counter()
            offline = min_forward_steps(n, s)
            greedy = simulate_online(OnlineBinomial([s]), n).forward_steps
            thin = simulate_online(OnlineSchedule([s]), n).forward_steps
            rows.append(dict(levels=1, n=n, s=s, capacities=str(s), offline_forward=offline,
                             online_forward=greedy, thinning_forward=thin,
                             ratio_forward=round(greedy / offline, 5), thinning_ratio=round(thin / offline, 5),
                             offline_predicted="", online_predicted="", ratio_predicted="",
                             cascade_predicted="", cascade_ratio=""))
            if n <= ML_MAX_N and s <= ML_MAX_S and s >= 3:
                caps = three_levels(s)
                costs = default_costs(3)
                off = simulate(Multilevel(n, caps, costs).actions(), n, caps, costs)
                on = simulate_online(OnlineGreedyMultilevel(caps, costs), n, costs)
                cascade = simulate_online(OnlineMultilevel(caps, costs), n, costs)
                rows.append(dict(levels=3, n=n, s=s, capacities="/".join(map(str, caps)),
                                 offline_forward=off.forward_steps, online_forward=on.forward_steps,
                                 thinning_forward="", ratio_forward=round(on.forward_steps / off.forward_steps, 5),
                                 thinning_ratio="", offline_predicted=round(off.predicted, 3),
                                 online_predicted=round(on.predicted, 3),
                                 ratio_predicted=round(on.predicted / off.predicted, 5),
                                 cascade_predicted=round(cascade.predicted, 3),
                                 cascade_ratio=round(cascade.predicted / off.predicted, 5)))
            print(f"s={s} n={n}: {rows[-1]['levels']} level(s) done in {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, out / "ratios.png")
    one = [r for r in rows if r["levels"] == 1 and r["n"] <= 10**4 and r["s"] >= 10]
    worst = max(one, key=lambda r: r["ratio_forward"])
    print(f"one level, n <= 1e4, s >= 10: worst online/offline {worst['ratio_forward']} "
          f"at n={worst['n']} s={worst['s']}")
    three = [r for r in rows if r["levels"] == 3 and r["s"] >= 10]
    if three:
        worst = max(three, key=lambda r: r["ratio_predicted"])
        above = sum(r["ratio_predicted"] > 1.05 for r in three)
        print(f"three levels, s >= 10: worst predicted online/offline {worst['ratio_predicted']} "
              f"at n={worst['n']} s={worst['s']}; {above} of {len(three)} cases above 1.05")
    return 0


def plot(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for s in sorted({r["s"] for r in rows}):
        one = [r for r in rows if r["levels"] == 1 and r["s"] == s]
        axes[0].plot([r["n"] for r in one], [r["ratio_forward"] for r in one], marker="o", label=f"s={s}")
        three = [r for r in rows if r["levels"] == 3 and r["s"] == s]
        if three:
            line, = axes[1].plot([r["n"] for r in three], [r["ratio_predicted"] for r in three], marker="o",
                                 label=f"s={s}")
            axes[1].plot([r["n"] for r in three], [r["cascade_ratio"] for r in three], ls=":", lw=0.9,
                         color=line.get_color())
    axes[0].set_title("one level: online / offline forward evaluations")
    axes[1].set_title("three levels: online / offline makespan (dotted: old cascade)")
    for ax in axes:
        ax.set_xscale("log")
        ax.axhline(1.05, color="grey", ls="--", lw=0.8)
        ax.set_xlabel("steps n")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
