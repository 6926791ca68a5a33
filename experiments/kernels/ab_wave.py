"""Wave's kernels against those of an older tree, on the same inputs in one process (issue 15).

    git archive 300918a | tar -x -C /tmp/old          # the kernels that read s, a, c^2, c^2 a arrays
    python experiments/kernels/ab_wave.py --old /tmp/old [--grid 128] [--rounds 5] [--reps 21]

One rank, no mpirun. Prints the median ms of the step and the adjoint step, old and new, alternating
in rounds of --reps calls, and each adjoint / step. The old kernels get the coefficient arrays the
old model stored (s = dt/2 sigma, a = 1/(1+s), c^2, c^2 a), made here from the new model's sigma and c;
they are compiled without numba's cache (it cannot reload a module run from a path).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from _ab import load_kernels, median_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="root of the older tree (a git archive)")
    ap.add_argument("--grid", type=int, default=128, help="points per axis of the 3-D grid")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=21)
    args = ap.parse_args()
    path = Path(args.old) / "hpcadj" / "models" / "kernels" / "wave.py"
    if not path.is_file() or args.grid < 5 or args.rounds < 1 or args.reps < 1:
        print(f"ab_wave: need an older tree with {path.relative_to(args.old)}, --grid >= 5, --rounds and "
              f"--reps >= 1", file=sys.stderr)
        raise SystemExit(2)
    from hpcadj.models import kernels
    from hpcadj.models.kernels import wave as new
    from hpcadj.models.wave import WaveModel
    from hpcadj.imports import mpi

    old = load_kernels(path, "old_wave_kernels")
    n = args.grid
    m = WaveModel(mpi().COMM_SELF, (n, n, n), n_steps=10, observed=None)
    m.set_controls(m.default_controls())
    u = m.initial_state().copy()
    u.getArray()[...] += np.random.default_rng(1).standard_normal(u.getLocalSize()) * 1e-3
    u = m.step(0, u)
    lam = m.step(1, u)
    dt, r = m.dt, 1.0
    hdt, dt2 = 0.5 * dt, dt * dt
    sigma, c = m._sigma, m._c
    s = kernels.readonly(hdt * sigma)
    a = kernels.readonly(1.0 / (1.0 + s))
    c2 = kernels.readonly(c ** 2)
    ca = kernels.readonly(c2 * a)
    qf = m._q_faces(dt)
    P, C = m._block(u)
    FU = m._state_faces(u, 0)
    LP, LC = m._block(lam)
    FL = m._state_faces(lam, 1)
    out = m._pool.new_vec()
    OP, OC = m._block(out, readonly=False)
    g = np.zeros(m._shape3)
    ih2, src = m._ih2, m._source3
    runs = new.zero_runs(sigma)
    calls = {
        "old step": lambda: old.step(P, C, FU, s, c2, ih2, True, dt2, r, src, 0.0, OP, OC),
        "new step": lambda: new.step(P, C, FU, sigma, hdt, c, ih2, True, dt2, r, src, 0.0, runs, OP, OC),
        "old adjoint": lambda: old.adjoint_step(LP, LC, FL, C, FU, s, a, c, ca, qf, ih2, True, dt2, r, g, OP, OC),
        "new adjoint": lambda: new.adjoint_step(LP, LC, FL, C, FU, sigma, hdt, c, qf, ih2, True, dt2, r, g, OP, OC),
    }
    times = {k: [] for k in calls}
    for _ in range(args.rounds):
        for name, fn in calls.items():
            times[name].append(median_ms(fn, args.reps))
    ms = {k: float(np.median(v)) for k, v in times.items()}
    print(f"wave {n}^3, 1 rank: ms (median of {args.rounds} rounds of median-of-{args.reps})")
    for who in ("old", "new"):
        print(f"  {who}: step {ms[who + ' step']:.2f}  adjoint {ms[who + ' adjoint']:.2f}  "
              f"adjoint / step {ms[who + ' adjoint'] / ms[who + ' step']:.2f}")


if __name__ == "__main__":
    main()
