"""Time-tiled advances of the burgers model against its single steps and a triad.

For each grid and rank count, one mpirun measures, interleaved round by round in the same
processes: a STREAM-like triad (experiments/kernels/run.py's ``Triad``), m single steps as the
driver takes them (``step``: three stage passes), m single steps each with the three stages fused
in one pass (``fused``: the tiled kernel at t = 1) and ``advance(0, u, m)`` at T = 2, 4, 8, 16
(``--time-tile``). Before timing,
every variant's end state is checked bitwise against the single steps'. Per variant: seconds per
step (slowest rank; minimum and median over the rounds), the speed-up over the single step, the
same in CPU seconds (slowest rank; less sensitive to other work), and the effective bandwidth (the
112 bytes a point the three stage passes of a single step move, over the time per step) against the
triad's. Writes results.csv, tiling.png and prints a table.

    .venv/bin/python experiments/burgers_tiling/run.py [--grids 768x768,1024x1024,2048x2048]
        [--grids-multi 1024x1024,2048x2048] [--ranks 1,2] [--steps 32] [--rounds 5] [--depths 2,4,8,16]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "kernels"))

import _harness as H  # noqa: E402

STEP_BYTES = 112  # per point: stage passes 32 + 48 + 48 (experiments/kernels)


def worker(grid: str, steps: int, rounds: int, depths) -> None:
    """Under mpirun: the interleaved measurement; rank 0 prints one JSON row per variant."""
    from run import Triad

    from hpcadj.imports import mpi, petsc
    from hpcadj.models.burgers import BurgersModel
    from hpcadj.models.dmda import parse_grid

    comm = mpi().COMM_WORLD
    MPI = mpi()
    model = BurgersModel(comm, parse_grid(grid), n_steps=10 * steps)
    model.set_controls(model.default_controls())
    u = model.initial_state()
    triad = Triad(comm, n=1 << 23)

    def single(_):
        return H.single_steps(model, u, steps)

    def tiled(depth):
        def go(_):
            model.set_time_tile(depth)
            return model.advance(0, u, steps)
        return go

    def fused(_):
        """Single steps, each the tiled kernel at t = 1: the three stages in one pass."""
        from hpcadj.models.kernels import burgers_tiled

        hu, hv = model._tile_halo(1)
        dts = np.array([model.dt])
        v = u
        for _i in range(steps):
            w = model._pool.new_vec()
            burgers_tiled.advance(*model._block(v), hu.strips(v), hv.strips(v), model.nu, dts, model._ih,
                                  *model._block(w, readonly=False))
            if v is not u:
                v.destroy()
            v = w
        return v

    variants = [("step", single), ("fused", fused)] + [(f"T{d}", tiled(d)) for d in depths]
    ref = single(0)
    for name, fn in variants[1:]:  # warm (compile, fault in the pool's buffers) and check bitwise
        out = fn(0)
        same = np.array_equal(out.getArray(readonly=True), ref.getArray(readonly=True))
        if not comm.allreduce(same, op=MPI.LAND):
            raise SystemExit(f"{name}: the advance is not bitwise the single steps'")
        out.destroy()
        petsc().garbage_cleanup(comm)
    ref.destroy()
    H.measure_variants(comm, grid, variants, steps, rounds, triad, STEP_BYTES)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grids", default="768x768,1024x1024,2048x2048", help="grids on one rank")
    p.add_argument("--grids-multi", default="1024x1024,2048x2048",
                   help="grids on more ranks (8-64 MiB a state per rank on two)")
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--depths", default="2,4,8,16")
    p.add_argument("--out", default="results.csv")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    depths = [int(d) for d in args.depths.split(",") if d]
    if args.worker:
        worker(args.worker, args.steps, args.rounds, depths)
        return 0
    rows = []
    for ranks in (int(r) for r in args.ranks.split(",")):
        for grid in (args.grids if ranks == 1 else args.grids_multi).split(","):
            H.log(f"{grid} on {ranks} rank(s)")
            load = H.machine()["loadavg_1m"]
            out = H.mpirun(ranks, [str(H.PY), str(Path(__file__).resolve()), "--worker", grid,
                                   "--steps", str(args.steps), "--rounds", str(args.rounds),
                                   "--depths", args.depths], timeout=3600)
            for line in out.splitlines():
                if line.startswith("{"):
                    row = json.loads(line)
                    row["loadavg_1m_before"] = load
                    row["loadavg_1m_after"] = H.machine()["loadavg_1m"]
                    rows.append(row)
    info = H.machine()
    for row in rows:
        row.update(date=info["date"])
    H.write_csv(HERE / args.out, rows)
    print(H.markdown_table(rows, ["grid", "ranks", "variant", "s_per_step_min", "s_per_step_median",
                                  "speedup_vs_step", "speedup_median", "cpu_speedup_vs_step", "effective_GBps",
                                  "triad_GBps", "ratio_to_triad", "loadavg_1m_before", "loadavg_1m_after"]))
    print(json.dumps(info))
    plot(rows)
    return 0


def plot(rows) -> None:
    plt = H.pyplot()
    ranks_seen = sorted({r["ranks"] for r in rows})
    fig, axes = plt.subplots(1, len(ranks_seen), figsize=(5 * len(ranks_seen), 4), sharey=True, squeeze=False)
    for ax, ranks in zip(axes[0], ranks_seen):
        for grid in sorted({r["grid"] for r in rows}):
            sel = [r for r in rows if r["ranks"] == ranks and r["grid"] == grid and r["variant"][0] == "T"]
            if sel:
                ax.plot([int(r["variant"][1:]) for r in sel], [r["speedup_vs_step"] for r in sel], "o-", label=grid)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.axhline(1.2, color="red", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tile depth T")
        ax.set_title(f"{ranks} rank(s)")
    axes[0][0].set_ylabel("speed-up over the single step (min of rounds)")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(HERE / "tiling.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
