"""Kernel study (issue 15): ms per forward / adjoint / tangent step of the explicit models, the
achieved bandwidth for each kernel's minimal bytes, against a compiled STREAM-triad probe run in the
same processes (4 triad calls right before and 4 right after each kernel's repetitions: the ratio
takes the kernel's median over the triad's median of those 8, both from the same minutes of this
shared VM; the triad's best is kept beside it), and the previous numpy implementation (copied below)
timed in the same run.

    python experiments/kernels/run.py                 # wave 96^3, 128^3 and burgers 1024^2 on 1 and 2 ranks
    python experiments/kernels/run.py --quick         # small sizes, for make experiments
    python experiments/kernels/run.py --only burgers  # one model's cases; the CSV keeps the others' rows

Writes results.csv beside this file (or --out). Each case runs under its own mpirun.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

# minimal bytes per grid point each kernel must move (8-byte reads and writes of whole arrays; the
# write-allocate traffic of the output and the halo faces not counted)
MIN_BYTES = {
    # step: read (u_prev, u) 16, sigma 8, c 8; write the new pair 16
    ("wave", "step"): 48,
    # adjoint: read lam 16, u^i 8 (the split pair: u^{i-1} is not touched), sigma 8, c 8 (a, c^2 a made
    # per point); read+write dJ/dc 16; write lam_i 16
    ("wave", "adjoint"): 72,
    # tangent: read du 16, u^i 8, sigma 8, c 8, dc 8; write 16
    ("wave", "tangent"): 64,
    # three stage passes: (w -> w1) 32, (w, w1 -> w2) 48, (w, w2 -> w3) 48
    ("burgers", "step"): 112,
    # one pass (the stages as a wavefront through rings in cache): read u_i, lambda_{i+1}; write lambda_i
    ("burgers", "adjoint"): 48,
    # one pass: read u_i, du_i; write du_{i+1}
    ("burgers", "tangent"): 48,
}

# what the same step moves done stage by stage, one pass a stage (each stage's inputs read and its
# output written once): the work the one-pass kernels do, in the bytes a memory-bound stage-wise
# kernel must move for it; a one-pass kernel's time against these bytes is its *stage-wise
# equivalent* bandwidth (stencil codes with temporal blocking report the same "effective" figure)
STAGEWISE_BYTES = {
    # w1, w2 recomputed (32 + 48); backwards: stage 3 (w2, mu -> b, lambda) 64, 2 (w1, b -> c) 48,
    # 1 (w, c, lambda -> lambda) 64
    ("burgers", "adjoint"): 256,
    # stage 1 (w, d -> w1, d1) 64, stage 2 (w1, d1, w, d -> w2, d2) 96, stage 3 (w2, d2, d -> d3) 64
    ("burgers", "tangent"): 224,
}

TRIAD_REPS = 4  # triad calls before and after each kernel's reps

CASES = {
    "full": [("wave", "96x96x96", 1), ("wave", "96x96x96", 2), ("wave", "128x128x128", 1),
             ("wave", "128x128x128", 2), ("burgers", "1024x1024", 1), ("burgers", "1024x1024", 2)],
    "quick": [("wave", "32x32x32", 1), ("wave", "32x32x32", 2), ("burgers", "128x128", 2)],
}


# ---------------------------------------------------------------------------------------------
# the previous implementation (main at 9ab8fc1), numpy expressions, kept here only for the figure
def _old_laplacian(grid, padded, spacing):
    centre = padded[grid.inner]
    out = np.zeros_like(centre)
    for axis, _direction, nb, _inside in grid.neighbours():
        out += (padded[nb] - centre) / spacing[axis] ** 2
    return out


def _old_central_difference(grid, padded, axis, h):
    plus = minus = None
    for ax, direction, nb, _inside in grid.neighbours():
        if ax == axis:
            if direction > 0:
                plus = padded[nb]
            else:
                minus = padded[nb]
    return (plus - minus) / (2.0 * h)


def _old_pair_grid(m):
    """The dof-2 DMDA the old code worked on (the models now keep none), on the model's partition."""
    from hpcadj.models.dmda import Grid

    grid = Grid(m.comm, m.field.sizes_xyz, periodic=m.field.periodic, dof=2)
    assert (grid.start, grid.shape) == (m.field.start, m.field.shape), "the old grid's partition differs"
    return grid


class OldWave:
    def __init__(self, m):
        self.m = m
        self.grid = _old_pair_grid(m)
        sigma = m._sponge()  # the arrays the old model kept
        self.a = 1.0 / (1.0 + 0.5 * m.dt * sigma)
        self.b = 1.0 - 0.5 * m.dt * sigma
        self.c = m._c.reshape(m.field.shape)
        self.c2 = self.c ** 2

    def interleaved(self, state):
        """The new model's (split) state as the old code's interleaved pair."""
        snap = self.m.snapshot(state)
        return self._pair(snap["u_prev"], snap["u"])

    def _pair(self, prev, cur):
        vec = self.grid.create_vec()
        w = self.grid.owned(vec)
        w[..., 0] = prev
        w[..., 1] = cur
        return vec

    def _source_term(self, i):
        m = self.m
        f = np.zeros(m.field.shape)
        if m._source_local is not None:
            f[m._source_local] = m._source_value(i)
        return f

    def _current_laplacian(self, state):
        m = self.m
        return _old_laplacian(m.field, self.grid.padded(state)[..., 1], m.h)

    def step(self, i, u):
        m = self.m
        w = self.grid.owned(u)
        lap = self._current_laplacian(u)
        nxt = self.a * (2.0 * w[..., 1] - self.b * w[..., 0] + m.dt ** 2 * (self.c2 * lap + self._source_term(i)))
        return self._pair(w[..., 1], nxt)

    def adjoint_step(self, i, u, u_next, lam_next, grad):
        m = self.m
        lam = self.grid.owned(lam_next)
        mu = self.a * lam[..., 1]
        scratch = self.grid.create_vec()
        self.grid.owned(scratch)[..., 1] = self.c2 * mu
        lap = _old_laplacian(m.field, self.grid.padded(scratch)[..., 1], m.h)
        new_prev = -self.b * mu
        new_cur = lam[..., 0] + 2.0 * mu + m.dt ** 2 * lap
        m.field.owned(grad["c"])[...] += 2.0 * m.dt ** 2 * self.c * mu * self._current_laplacian(u)
        return self._pair(new_prev, new_cur)


class OldBurgers:
    def __init__(self, m):
        self.m = m
        self.grid = _old_pair_grid(m)
        self._work = self.grid.create_vec()

    def interleaved(self, state):
        """The new model's (split) state as the old code's interleaved (u, v)."""
        snap = self.m.snapshot(state)
        return self.grid.vec_from(np.stack([snap["u"], snap["v"]], axis=-1))

    def _pad(self, block):
        self.grid.owned(self._work)[...] = block
        return self.grid.padded(self._work)

    def _grads(self, padded):
        m = self.m
        hy, hx = m.h
        return (_old_central_difference(self.grid, padded, 1, hx), _old_central_difference(self.grid, padded, 0, hy))

    def _advection(self, A, B):
        a = A[self.grid.inner]
        bx, by = self._grads(B)
        fx, _ = self._grads(A[..., :1] * B)
        _, fy = self._grads(A[..., 1:] * B)
        return 0.5 * (a[..., :1] * bx + a[..., 1:] * by + fx + fy)

    def _rhs(self, P, nu):
        return -self._advection(P, P) + nu * _old_laplacian(self.grid, P, self.m.h)

    def _rhs_adjoint(self, P, M, nu):
        m = self.m
        w, mu = P[self.grid.inner], M[self.grid.inner]
        wx, wy = self._grads(P)
        mx, my = self._grads(M)
        out = self._advection(P, M) + nu * _old_laplacian(self.grid, M, m.h)
        out[..., 0] -= 0.5 * np.sum(mu * wx - w * mx, axis=-1)
        out[..., 1] -= 0.5 * np.sum(mu * wy - w * my, axis=-1)
        dnu = float(np.sum(_old_laplacian(self.grid, P, m.h) * mu))
        return out, dnu

    def _stages(self, u):
        m = self.m
        dt, nu = m.dt, m.nu
        P0 = self.grid.padded(u)
        w0 = P0[self.grid.inner]
        w1 = w0 + dt * self._rhs(P0, nu)
        P1 = self._pad(w1)
        w2 = 0.75 * w0 + 0.25 * (w1 + dt * self._rhs(P1, nu))
        P2 = self._pad(w2)
        w3 = w0 / 3.0 + (2.0 / 3.0) * (w2 + dt * self._rhs(P2, nu))
        return P0, P1, P2, w3

    def step(self, i, u):
        *_s, w3 = self._stages(u)
        return self.grid.vec_from(w3)

    def adjoint_step(self, i, u, u_next, lam_next, grad):
        from hpcadj.models.common import scalar_add

        m = self.m
        dt, nu = m.dt, m.nu
        P0, P1, P2, _w3 = self._stages(u)
        a = self.grid.owned(lam_next).copy()
        lam = a / 3.0
        t, g2 = self._rhs_adjoint(P2, self.grid.padded(lam_next), nu)
        b = (2.0 / 3.0) * (a + dt * t)
        lam += 0.75 * b
        t, g1 = self._rhs_adjoint(P1, self._pad(b), nu)
        c = 0.25 * (b + dt * t)
        t, g0 = self._rhs_adjoint(P0, self._pad(c), nu)
        lam += c + dt * t
        scalar_add(m.comm, grad["nu"], dt * ((2.0 / 3.0) * g2 + 0.25 * g1 + g0))
        return self.grid.vec_from(lam)


# ---------------------------------------------------------------------------------------------
class Triad:
    """A compiled triad a = b + s c on every rank at once (3 x 128 MiB per rank): aggregate GB/s
    per call, the slowest rank's time."""

    def __init__(self, comm, n=1 << 24):
        from numba import njit

        @njit(cache=False)
        def triad(a, b, c, s):
            for i in range(a.size):
                a[i] = b[i] + s * c[i]

        self.comm, self.n, self._triad = comm, n, triad
        self.a, self.b, self.c = np.zeros(n), np.ones(n), np.full(n, 2.0)
        triad(self.a, self.b, self.c, 3.0)

    def samples(self, reps):
        """GB/s of ``reps`` calls."""
        out = []
        for _ in range(reps):
            self.comm.Barrier()
            t0 = time.perf_counter()
            self._triad(self.a, self.b, self.c, 3.0)
            dt = self.comm.allreduce(time.perf_counter() - t0, op=_max())
            out.append(self.comm.size * 24.0 * self.n / dt / 1e9)
        return out


def triad_probe(comm, n=1 << 24, reps=8):
    """The best aggregate GB/s of ``reps`` triad calls on every rank at once."""
    return max(Triad(comm, n).samples(reps))


def _max():
    from hpcadj.imports import mpi

    return mpi().MAX


def _time(comm, fn, reps):
    """Median and min over reps of the slowest rank's seconds; garbage cleaned as the driver does."""
    from hpcadj.imports import petsc

    PETSc = petsc()
    out = []
    for r in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        fn(r)
        dt = comm.allreduce(time.perf_counter() - t0, op=_max())
        PETSc.garbage_cleanup(comm)
        out.append(dt)
    out.sort()
    return float(np.median(out)), out[0]


def worker(model_name, grid, reps, old_reps):
    from hpcadj.models.burgers import BurgersModel
    from hpcadj.models.dmda import parse_grid
    from hpcadj.models.wave import WaveModel
    from hpcadj.imports import mpi

    comm = mpi().COMM_WORLD
    sizes = parse_grid(grid)
    t0 = time.perf_counter()
    if model_name == "wave":
        m = WaveModel(comm, sizes, n_steps=10, observed=None)
    else:
        m = BurgersModel(comm, sizes, n_steps=10)
    controls = m.default_controls()
    m.set_controls(controls)
    old = OldWave(m) if model_name == "wave" else OldBurgers(m)
    setup_s = time.perf_counter() - t0
    points = int(np.prod(sizes))
    u = m.initial_state().copy()  # a copy: u_0 is the model's own (states never change in place)
    # a state with content: a few steps (the wave starts from rest; its source then fills the block)
    noise = np.random.default_rng(1 + comm.rank).standard_normal(u.getLocalSize()) * 1e-3
    u.getArray()[...] += noise
    u = m.step(0, u)
    u1 = m.step(1, u)
    lam = u1.copy()
    grad = {k: v.duplicate() for k, v in controls.items()}
    for v in grad.values():
        v.set(0.0)
    dcontrols = {k: v.copy() for k, v in controls.items()}
    # determinism: a recomputed state is bitwise the first
    again = m.step(1, u)
    deterministic = comm.allreduce(bool(np.array_equal(again.getArray(readonly=True), u1.getArray(readonly=True))),
                                   op=mpi().LAND)
    kept = []

    def keep(v):  # the driver keeps the last two states; hold them like it does
        kept.append(v)
        del kept[:-2]

    rows, probe = {}, {}
    triad = Triad(comm)
    kernels = {"step": lambda r: keep(m.step(1, u)),
               "adjoint": lambda r: keep(m.adjoint_step(1, u, u1, lam, grad)),
               "tangent": lambda r: keep(m.tangent_step(1, u, u1, lam, dcontrols))}
    for kind, fn in kernels.items():  # each kernel's reps bracketed by triad calls: the same minutes
        before = triad.samples(TRIAD_REPS)
        rows[kind] = _time(comm, fn, reps)
        probe[kind] = before + triad.samples(TRIAD_REPS)
    # the old code's states: the pairs interleaved point by point (the new models store them split)
    u_old, u1_old, lam_old = (old.interleaved(v) for v in (u, u1, lam))
    rows["old_step"] = _time(comm, lambda r: keep(old.step(1, u_old)), old_reps)
    rows["old_adjoint"] = _time(comm, lambda r: keep(old.adjoint_step(1, u_old, u1_old, lam_old, grad)), old_reps)
    # the old and new step agree to round-off
    diff = old.interleaved(m.step(1, u)).getArray(readonly=True) - old.step(1, u_old).getArray(readonly=True)
    scale = comm.allreduce(float(np.max(np.abs(u1.getArray(readonly=True)), initial=0.0)), op=_max())
    rel = comm.allreduce(float(np.max(np.abs(diff), initial=0.0)), op=_max()) / scale
    kept.clear()
    out = []
    for kind in ("step", "adjoint", "tangent"):
        med, best = rows[kind]
        bw, bw_best = float(np.median(probe[kind])), max(probe[kind])
        nbytes = MIN_BYTES[(model_name, kind)] * points
        gbs = nbytes / med / 1e9
        stagewise = STAGEWISE_BYTES.get((model_name, kind), MIN_BYTES[(model_name, kind)])
        out.append({"model": model_name, "grid": grid, "ranks": comm.size, "kernel": kind,
                    "ms_median": round(med * 1e3, 3), "ms_min": round(best * 1e3, 3),
                    "min_bytes_per_point": MIN_BYTES[(model_name, kind)],
                    "GBps_median": round(gbs, 2), "triad_GBps": round(bw, 2),
                    "triad_best_GBps": round(bw_best, 2), "ratio_to_triad": round(gbs / bw, 3),
                    "ratio_to_triad_best": round(gbs / bw_best, 3),
                    "stagewise_bytes_per_point": stagewise,
                    "stagewise_ratio_to_triad": round(stagewise * points / med / 1e9 / bw, 3),
                    "old_ms_median": round(rows["old_" + kind][0] * 1e3, 3) if "old_" + kind in rows else "",
                    "speedup_vs_old": (round(rows["old_" + kind][0] / med, 2) if "old_" + kind in rows else ""),
                    "adjoint_over_step": round(rows["adjoint"][0] / rows["step"][0], 2) if kind == "adjoint" else "",
                    "deterministic": deterministic, "max_rel_diff_vs_old": f"{rel:.1e}",
                    "setup_s": round(setup_s, 2)})
    if comm.rank == 0:
        import json

        print("ROWS " + json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(HERE / "results.csv"))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "GRID"))
    ap.add_argument("--only", choices=("wave", "burgers"), help="run this model's cases only")
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker, reps=args.reps, old_reps=max(3, args.reps // 3))
        return
    import json

    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    rows = []
    for model, grid, ranks in CASES["quick" if args.quick else "full"]:
        if args.only and model != args.only:
            continue
        cmd = ["mpirun", "--oversubscribe", "-n", str(ranks), sys.executable, str(Path(__file__).resolve()),
               "--worker", model, grid, "--reps", str(args.reps)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        for line in proc.stdout.splitlines():
            if line.startswith("ROWS "):
                rows.extend(json.loads(line[5:]))
        for r in rows[-3:]:
            equivalent = (f" (stage-wise {r['stagewise_ratio_to_triad']:.2f})"
                          if r["stagewise_bytes_per_point"] != r["min_bytes_per_point"] else "")
            print(f"{r['model']:8s} {r['grid']:12s} {r['ranks']} {r['kernel']:8s} {r['ms_median']:9.2f} ms "
                  f"(min {r['ms_min']:.2f})  {r['GBps_median']:6.2f} GB/s  triad {r['triad_GBps']:.1f} "
                  f"(best {r['triad_best_GBps']:.1f})  "
                  f"ratio {r['ratio_to_triad']:.2f}{equivalent}  old {r['old_ms_median']} ms  "
                  f"x{r['speedup_vs_old']}", flush=True)
    if args.only and Path(args.out).exists():  # the other models' rows stay as they were measured
        with open(args.out, newline="") as f:
            others = [r for r in csv.DictReader(f) if r["model"] != args.only]
        rows = others + rows
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        # every row's columns (rows kept from an older run may lack the newer ones: left blank)
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), restval="")
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
