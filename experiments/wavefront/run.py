"""Wavefront (time-tiled) advances of the wave model against its single steps and a triad.

For each grid and rank count, one mpirun measures, interleaved round by round in the same
processes: a STREAM-like triad (experiments/kernels/run.py's ``Triad``), m single steps as the
driver takes them (``step``), and ``advance(0, u, m)`` at T = 1, 2, 4, 8, 16 (``--time-tile``) with
the automatic slab width along y, and at T = 8 and 16 with slabs ``--widths`` rows wide (``wW``).
Per variant: seconds per step (slowest rank; minimum and median over the rounds), the speed-up over
the single step, and the effective bandwidth (the 48 bytes a point a single step must move, over
the time per step) against the triad's; also the CPU seconds per step (slowest rank, minimum), less
sensitive to other work on a shared machine. Writes results.csv, wavefront.png and prints a table.

    .venv/bin/python experiments/wavefront/run.py [--grids 96x96x96,128x128x128,192x192x192]
        [--ranks 1,2] [--steps 32] [--rounds 5] [--widths 16,32]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "kernels"))

import _harness as H  # noqa: E402

DEPTHS = (1, 2, 4, 8, 16)
STEP_BYTES = 48  # per point: read u^{i-1}, u^i, sigma, c; write both fields of the pair


def worker(grid: str, steps: int, rounds: int, widths) -> None:
    """Under mpirun: the interleaved measurement; rank 0 prints one JSON row per variant."""
    from run import Triad

    from hpcadj.imports import mpi, petsc
    from hpcadj.models.dmda import parse_grid
    from hpcadj.models.wave import WaveModel

    comm = mpi().COMM_WORLD
    model = WaveModel(comm, parse_grid(grid), n_steps=10 * steps)
    model.set_controls(model.default_controls())
    u = model.initial_state()
    for i in range(4):
        u = model.step(i, u)
    limit = model.time_tile_limit()
    depths = [d for d in DEPTHS if d <= limit]
    triad = Triad(comm, n=1 << 23)

    def single(_):
        return H.single_steps(model, u, steps)

    def tiled(depth, width=None):
        def go(_):
            model.tile_width = width
            model.set_time_tile(depth)
            return model.advance(0, u, steps)
        return go

    variants = [("step", single)] + [(f"T{d}", tiled(d)) for d in depths]
    variants += [(f"T{d}w{w}", tiled(d, w)) for d in (8, 16) if d <= limit for w in widths]
    for _name, fn in variants:  # warm: compile, fault in the pool's buffers
        fn(0).destroy()
        petsc().garbage_cleanup(comm)
    H.measure_variants(comm, grid, variants, steps, rounds, triad, STEP_BYTES)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grids", default="96x96x96,128x128x128,192x192x192")
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--widths", default="16,32", help="slab widths along y measured at T = 8 and 16")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.rounds, [int(w) for w in args.widths.split(",") if w])
        return 0
    rows = []
    for ranks in (int(r) for r in args.ranks.split(",")):
        for grid in args.grids.split(","):
            H.log(f"{grid} on {ranks} rank(s)")
            out = H.mpirun(ranks, [str(H.PY), str(Path(__file__).resolve()), "--worker", grid,
                                   "--steps", str(args.steps), "--rounds", str(args.rounds),
                                   "--widths", args.widths], timeout=3600)
            rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    info = H.machine()
    for row in rows:
        row.update(date=info["date"], loadavg_1m=info["loadavg_1m"])
    H.write_csv(HERE / "results.csv", rows)
    print(H.markdown_table(rows, ["grid", "ranks", "variant", "s_per_step_min", "s_per_step_median",
                                  "speedup_vs_step", "cpu_speedup_vs_step", "effective_GBps", "triad_GBps",
                                  "ratio_to_triad"]))
    print(json.dumps(info))
    plot(rows)
    return 0


def plot(rows) -> None:
    plt = H.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, ranks in zip(axes, (1, 2)):
        for grid in sorted({r["grid"] for r in rows}):
            sel = [r for r in rows if r["ranks"] == ranks and r["grid"] == grid and r["variant"] != "step"
                   and "w" not in r["variant"]]
            if sel:
                ax.plot([int(r["variant"][1:]) for r in sel], [r["speedup_vs_step"] for r in sel], "o-", label=grid)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.axhline(1.8, color="red", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tile depth T")
        ax.set_title(f"{ranks} rank(s)")
    axes[0].set_ylabel("speed-up over the single step (min of rounds)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(HERE / "wavefront.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
