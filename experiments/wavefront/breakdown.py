"""Where a rank's time goes in the tiled advance on several ranks, interleaved in the same processes.

Per tile of depth T (seconds per step, slowest rank, minimum and median over rounds): the depth-T
halo scatter alone; a whole tile as ``advance`` takes
it (the scatter overlapped with the owned planes' sweep); the same tile with the scatter waited for
first and the block swept upwards (no overlap; minus the scatter: the kernel); the kernel on a block of the same owned shape on
one rank alone (no halo planes, no exchange: what the redundant planes cost is the difference); the
single step; and a triad in the same processes.

    mpirun -n 2 .venv/bin/python experiments/wavefront/breakdown.py 128x128x128 8 [rounds] [width]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "kernels"))

import _harness as H
from run import Triad

from hpcadj.imports import mpi, petsc
from hpcadj.models.dmda import parse_grid
from hpcadj.models.wave import WaveModel

STEPS = 32


def _model(comm, grid, depth, width):
    model = WaveModel(comm, grid, n_steps=10 * STEPS)
    model.set_controls(model.default_controls())
    u = model.initial_state()
    for i in range(4):
        u = model.step(i, u)
    model.tile_width = width
    model.set_time_tile(depth)
    model.advance(0, u, depth).destroy()
    return model, u


def main() -> None:
    comm, MPI = mpi().COMM_WORLD, mpi()
    grid, depth = parse_grid(sys.argv[1]), int(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    width = int(sys.argv[4]) if len(sys.argv) > 4 else None
    model, u = _model(comm, grid, depth, width)
    solo, us = _model(MPI.COMM_SELF, tuple(reversed(model.field.shape)), depth, width)
    tiler, solo_tiler = model._tiler, solo._tiler
    params = []
    for j in range(depth):
        dt, r, dt2 = model._step_params(j)
        params.append((0.5 * dt, r, dt2, model._source_value(j)))
    traces = np.zeros((depth, max(tiler.n_traces, solo_tiler.n_traces)))
    out, outs = model._pool.new_vec(), solo._pool.new_vec()
    PETSc = petsc()
    modes = (PETSc.InsertMode.INSERT, PETSc.ScatterMode.FORWARD)
    scatter, seq, _H = tiler._halo_scatter(u)

    def halo():
        scatter.scatter(u, seq, *modes)

    def tile():
        tiler.run(u, out, params, traces)

    def blocking():
        down, tiler.down = tiler.down, False
        sweep = tiler.sweep
        tiler.sweep = lambda t: (sweep(t)[0], 0)
        try:
            tiler.run(u, out, params, traces)
        finally:
            tiler.down = down
            del tiler.sweep

    def solo_tile():
        solo_tiler.run(us, outs, params, traces)

    def single():
        H.single_steps(model, u, STEPS).destroy()

    halo()
    parts = {"halo": (halo, depth), "tile": (tile, depth), "tile_blocking": (blocking, depth),
             "solo_tile": (solo_tile, depth), "step": (single, STEPS)}
    triad = Triad(comm, n=1 << 23)
    times = {name: [] for name in parts}
    cpu = {name: [] for name in parts}
    bandwidth = []
    names = list(parts)
    for r in range(rounds):
        bandwidth += triad.samples(2)
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn, per = parts[name]
            comm.Barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(4 if per == depth else 1):
                fn()
            reps = 4 if per == depth else 1
            times[name].append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX) / (reps * per))
            cpu[name].append(comm.allreduce(time.process_time() - c0, op=MPI.MAX) / (reps * per))
        petsc().garbage_cleanup(comm)
    if comm.rank == 0:
        points = float(np.prod(grid))
        triad_gbps = max(bandwidth)
        row = {"grid": sys.argv[1], "ranks": comm.size, "T": depth, "width": tiler.width, "triad_GBps": triad_gbps,
               "owned": [int(v) for v in tiler.ext.m], "extended": [int(v) for v in tiler.ext.E]}
        for name in names:
            row[name] = {"ms_min": round(1e3 * min(times[name]), 3),
                         "ms_median": round(1e3 * statistics.median(times[name]), 3),
                         "cpu_ms_min": round(1e3 * min(cpu[name]), 3)}
        best = min(times["tile"])
        row["speedup"] = min(times["step"]) / best
        row["speedup_median"] = statistics.median(times["step"]) / statistics.median(times["tile"])
        row["effective_over_triad"] = 48 * points / best / 1e9 / triad_gbps
        print(json.dumps(row))


if __name__ == "__main__":
    main()
