"""Where a wave adjoint step's time goes, against the triad in the same processes.

    git archive 3a83be4 | tar -x -C /tmp/old    # a tree whose adjoint kernel to compare against
    mpirun -n 2 python experiments/kernels/adjoint_parts.py [--old /tmp/old] [--grid 128] [--reps 15] [--rounds 3]

Times, as the driver makes them (the slowest rank's seconds, median of ``--reps`` calls, rounds
alternated so every part meets the same load): the whole ``model.adjoint_step`` with the driver's
garbage cleanup and ``add_objective_gradient``; its halo exchanges alone (lambda's and u^i's faces);
the compiled kernel alone on faces gathered beforehand; the pooled output Vec; the receivers' term;
the driver's finiteness check of lambda (made every 8th adjoint step); a step from stored adjoint
data as a mixed plan runs it (StoreData's capture, the stand-in state, the step; and the capture
alone); and a single forward step for scale. The kernel's GB/s count its minimal 72 bytes a point (the step's 48; README.md), over
the triad's median of the calls around each part. With ``--old``, that tree's adjoint kernel
(compiled without numba's cache) is timed in the same rounds on the same inputs, and its outputs
(lambda_i and dJ/dc) are compared with this tree's bit for bit: an A/B of a kernel change.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from _ab import load_kernels
from run import Triad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", type=int, default=128)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--old", help="root of an older tree (a git archive): its adjoint kernel beside this one")
    args = ap.parse_args()
    from hpcadj.adjoint.guards import finite
    from hpcadj.imports import mpi, petsc
    from hpcadj.models.kernels import wave as kern
    from hpcadj.models.wave import WaveModel

    PETSc = petsc()
    comm = mpi().COMM_WORLD
    n = args.grid
    m = WaveModel(comm, (n, n, n), n_steps=10, observed=None)
    controls = m.default_controls()
    m.set_controls(controls)
    u = m.initial_state().copy()
    u.getArray()[...] += np.random.default_rng(1 + comm.rank).standard_normal(u.getLocalSize()) * 1e-3
    u = m.step(0, u)
    lam = m.step(1, u)
    grad = {k: v.duplicate() for k, v in controls.items()}
    for v in grad.values():
        v.set(0.0)
    dt, r, dt2 = m._step_params(1)
    g = m.field.owned(grad["c"]).reshape(m._shape3)
    LP, LC = m._block(lam)
    U = m._block(u)[1]
    FL, FU, FQ = m._state_faces(lam, 1), m._state_faces(u, 0), m._q_faces(dt)
    kept = []

    def keep(v):
        kept.append(v)
        del kept[:-2]

    def whole():
        out = m.adjoint_step(1, u, None, lam, grad)
        PETSc.garbage_cleanup(comm)
        m.add_objective_gradient(1, u, out)
        keep(out)

    from hpcadj.checkpoint.storage.ram import RamLevel

    level = RamLevel(4, m.adjoint_data_layout(), name="data")
    slot = iter(range(10 ** 9))

    def capture():
        """StoreData then AdjointData as the driver runs them, the level a RAM data level."""
        n = next(slot)
        level.write(n, m.adjoint_data(1, u, None), donate=True)
        return n

    def from_data():
        n = capture()
        PETSc.garbage_cleanup(comm)
        state = m.adjoint_data_state(1, level.read(n))
        level.free(n)
        out = m.adjoint_step(1, state, None, lam, grad)
        PETSc.garbage_cleanup(comm)
        m.add_objective_gradient(1, state, out)
        keep(out)

    def capture_free():
        level.free(capture())

    out = m._pool.new_vec()
    OP, OC = m._block(out, readonly=False)
    parts = {
        "whole adjoint step (driver's calls)": whole,
        "data: capture, then step from it": from_data,
        "data: capture (StoreData) alone": capture_free,
        "halo faces (lambda, u^i)": lambda: (m._state_faces(lam, 1), m._state_faces(u, 0)),
        "kernel alone": lambda: kern.adjoint_step(LP, LC, FL, U, FU, m._sigma, 0.5 * dt, m._c, FQ,
                                                  m._ih2, m._has_z, dt2, r, g, OP, OC),
        "pooled output Vec + cleanup": lambda: (keep(m._pool.new_vec()), PETSc.garbage_cleanup(comm)),
        "receivers' term": lambda: m.add_objective_gradient(1, u, out),
        "driver's finite check (every 8th step)": lambda: comm.allreduce(finite([lam])),
        "forward step (scale)": lambda: (keep(m.step(1, u)), PETSc.garbage_cleanup(comm)),
    }
    same = None
    if args.old:
        old = load_kernels(Path(args.old) / "hpcadj" / "models" / "kernels" / "wave.py", "old_wave_kernels")
        g_old = np.zeros_like(g)
        OP2, OC2 = np.empty_like(OP), np.empty_like(OC)

        def old_kernel():
            old.adjoint_step(LP, LC, FL, U, FU, m._sigma, 0.5 * dt, m._c, FQ, m._ih2, m._has_z, dt2, r, g_old, OP2, OC2)

        g[...] = 0.0
        parts["kernel alone"]()
        old_kernel()
        same = comm.allreduce(bool(np.array_equal(OP, OP2) and np.array_equal(OC, OC2)
                                   and np.array_equal(g, g_old)), op=mpi().LAND)
        parts["old tree's kernel"] = old_kernel
    triad = Triad(comm)
    times = {k: [] for k in parts}
    bw = {k: [] for k in parts}
    for _ in range(args.rounds):
        for name, fn in parts.items():
            before = triad.samples(2)
            fn()
            for _ in range(args.reps):
                comm.Barrier()
                t0 = time.perf_counter()
                fn()
                times[name].append(comm.allreduce(time.perf_counter() - t0, op=mpi().MAX))
            bw[name] += before + triad.samples(2)
    points = n ** 3
    zero = comm.allreduce(int(np.count_nonzero(m._sigma == 0.0)))
    if comm.rank == 0:
        print(f"wave {n}^3, {comm.size} rank(s), {args.rounds} rounds x {args.reps} calls; sigma = 0 on "
              f"{zero / points:.2f} of the points")
        if same is not None:
            print(f"  the old tree's kernel gives bitwise the same lambda_i and dJ/dc: {same}")
        for name in parts:
            med = float(np.median(times[name]))
            tri = float(np.median(bw[name]))
            extra = ""
            if name in ("kernel alone", "old tree's kernel"):
                gbs = 72 * points / med / 1e9
                extra = f"  {gbs:.1f} GB/s at 72 B/pt = {gbs / tri:.2f} of the triad"
            if name.startswith("forward"):
                gbs = 48 * points / med / 1e9
                extra = f"  {gbs:.1f} GB/s at 48 B/pt = {gbs / tri:.2f} of the triad"
            print(f"  {name:38s} {1e3 * med:8.3f} ms (min {1e3 * min(times[name]):.3f})  triad {tri:.1f} GB/s{extra}")


if __name__ == "__main__":
    main()
