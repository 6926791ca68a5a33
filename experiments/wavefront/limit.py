"""What any time tiling of the wave model's arithmetic could gain on this machine, measured.

Under ``mpirun -n R`` (every core busy, as in a run), each rank times in the same process, round by
round, on its own owned block of the wave model at GRID:

- ``step``: the single step as the driver takes it (``model.step``, from memory);
- ``step_cached``: the same compiled kernel over the same block cut into sub-blocks of PLANES x ROWS
  rows that stay in the L2 while each is stepped REPS times: the block's own points (sponge and
  interior alike) at the speed of the arithmetic alone, the floor no tiling of it can go under;
- ``tile_T``: the tiled advance at depth T (``Tiler.run``, halo exchange included);
- ``adjoint`` and ``adjoint_cached``: the adjoint kernel the same two ways;
- a triad.

The ratio ``step / step_cached`` is the most a tiled advance of the same arithmetic could be faster
than the single step; ``adjoint / adjoint_cached`` the same for a tiled adjoint. The gradient's floor
is then (forward steps x step_cached + adjoint steps x adjoint_cached) x points a rank: what a
checkpointed gradient would take were every sweep tiled perfectly.

    mpirun -n 2 .venv/bin/python experiments/wavefront/limit.py [GRID] [rounds] [forward steps] [adjoint steps]
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
from hpcadj.models.kernels import wave as kern
from hpcadj.models.wave import WaveModel

PLANES, ROWS, REPS = 4, 32, 8
STEPS = 16


def _faces(shape):
    mz, my, mx = shape
    return (np.zeros((my, mx)), np.zeros((my, mx)), np.zeros((mz, mx)), np.zeros((mz, mx)),
            np.zeros((mz, my)), np.zeros((mz, my)))


class Cached:
    """The block's sigma, c and two fields cut into cache-sized contiguous sub-blocks."""

    def __init__(self, sigma, c, fields):
        mz, my, _mx = sigma.shape
        self.parts = []
        for k in range(0, mz, PLANES):
            for j in range(0, my, ROWS):
                cut = (slice(k, k + PLANES), slice(j, j + ROWS))
                arrays = [np.ascontiguousarray(a[cut]) for a in (sigma, c, *fields)]
                shape = arrays[0].shape
                self.parts.append((arrays, _faces(shape), kern.zero_runs(arrays[0]),
                                   np.empty(shape), np.empty(shape), np.zeros(shape)))

    def step(self, hdt, ih2, dt2, r):
        """Seconds the step kernel spent over the sub-blocks (see :meth:`_timed`)."""
        return self._timed(kern.step, lambda sig, c, p, u, _lc, faces, runs, op, oc, _g:
                           (p, u, faces, sig, hdt, c, ih2, True, dt2, r, (-1, -1, -1), 0.0, runs, op, oc))

    def adjoint(self, hdt, ih2, dt2, r):
        """Seconds the adjoint kernel spent over the sub-blocks (see :meth:`_timed`)."""
        return self._timed(kern.adjoint_step, lambda sig, c, lp, lc, u, faces, _runs, op, oc, g:
                           (lp, lc, faces, u, faces, sig, hdt, c, faces, ih2, True, dt2, r, g, op, oc))

    def _timed(self, kernel, arguments):
        """Seconds ``kernel`` spent, summed over sub-blocks, REPS warm calls each (one cold call first)."""
        spent = 0.0
        for arrays, faces, runs, op, oc, g in self.parts:
            args = arguments(*arrays, faces, runs, op, oc, g)
            kernel(*args)
            t0 = time.perf_counter()
            for _ in range(REPS):
                kernel(*args)
            spent += (time.perf_counter() - t0) / REPS
        return spent


def main() -> None:
    comm, MPI = mpi().COMM_WORLD, mpi()
    grid = parse_grid(sys.argv[1] if len(sys.argv) > 1 else "128x128x128")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    n_forward = int(sys.argv[3]) if len(sys.argv) > 3 else 567
    n_adjoint = int(sys.argv[4]) if len(sys.argv) > 4 else 300
    model = WaveModel(comm, grid, n_steps=10 * STEPS)
    model.set_controls(model.default_controls())
    u = model.initial_state()
    for i in range(8):
        u = model.step(i, u)
    prev, cur = (np.array(f) for f in model._block(u))
    dt, r, dt2 = model._step_params(0)
    hdt, ih2 = 0.5 * dt, model._ih2
    cached = Cached(model._sigma, model._c, (prev, cur, cur))
    lam = model.step(8, u)
    grad = {"c": model.field.create_vec()}
    tilers = {}
    for depth, width in ((8, None), (16, 32)):
        if depth <= model.time_tile_limit():
            model.tile_width = width
            model.set_time_tile(depth)
            model.advance(0, u, depth).destroy()
            tilers[f"tile_T{depth}" + (f"w{width}" if width else "")] = (model._tiler, depth)
    params = {d: [(0.5 * model._step_params(j)[0], *model._step_params(j)[1:], model._source_value(j))
                  for j in range(d)] for _t, d in tilers.values()}
    out = model._pool.new_vec()

    def single():
        H.single_steps(model, u, STEPS).destroy()
        return STEPS

    def adjoint():
        for _ in range(4):
            model.adjoint_step(8, u, lam, lam, grad).destroy()
        return 4

    def tiled(tiler, depth):
        def go():
            traces = np.zeros((depth, tiler.n_traces))
            for _ in range(2):
                tiler.run(u, out, params[depth], traces)
            return 2 * depth
        return go

    parts = {"step": single, "adjoint": adjoint} | {name: tiled(*tv) for name, tv in tilers.items()}
    kernel_parts = {"step_cached": lambda: cached.step(hdt, ih2, dt2, r),
                    "adjoint_cached": lambda: cached.adjoint(hdt, ih2, dt2, r)}
    for fn in parts.values():
        fn()
    triad = Triad(comm, n=1 << 23)
    times = {name: [] for name in (*parts, *kernel_parts)}
    bandwidth = []
    names = list(times)
    for rnd in range(rounds):
        bandwidth += triad.samples(2)
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:
            comm.Barrier()
            if name in kernel_parts:
                seconds = kernel_parts[name]()
            else:
                t0 = time.perf_counter()
                steps = parts[name]()
                seconds = (time.perf_counter() - t0) / steps
            times[name].append(comm.allreduce(seconds, op=MPI.MAX))
        petsc().garbage_cleanup(comm)
    if comm.rank == 0:
        points = float(np.prod(model.field.shape))  # rank 0's block; the blocks are equal here
        ns = {name: 1e9 * min(v) / points for name, v in times.items()}
        ns_median = {name: 1e9 * statistics.median(v) / points for name, v in times.items()}
        floor_s = (n_forward * ns["step_cached"] + n_adjoint * ns["adjoint_cached"]) * points / 1e9
        now_s = (n_forward * ns["step"] + n_adjoint * ns["adjoint"]) * points / 1e9
        row = {"grid": "x".join(map(str, grid)), "ranks": comm.size, "block": list(model.field.shape),
               "cached_block": [PLANES, ROWS, int(model.field.shape[-1])], "machine": H.machine(),
               "triad_GBps": round(max(bandwidth), 1), "ns_per_point_min": {k: round(v, 3) for k, v in ns.items()},
               "ns_per_point_median": {k: round(v, 3) for k, v in ns_median.items()},
               "step_bound": round(ns["step"] / ns["step_cached"], 2),
               "adjoint_bound": round(ns["adjoint"] / ns["adjoint_cached"], 2),
               "tiles_over_step": {k: round(ns["step"] / ns[k], 2) for k in tilers},
               "gradient_kernels_s": {"single_steps": round(now_s, 2), "floor": round(floor_s, 2),
                                      "forward_steps": n_forward, "adjoint_steps": n_adjoint}}
        print(json.dumps(row))


if __name__ == "__main__":
    main()
