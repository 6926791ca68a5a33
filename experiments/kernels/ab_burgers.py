"""Burgers' kernels against those of an older tree, on the same inputs in one process (issue 15).

    git archive 166e1a7 | tar -x -C /tmp/old          # the adjoint stage with the in-order dJ/dnu sum
    python experiments/kernels/ab_burgers.py --old /tmp/old [--grid 1024x1024] [--rounds 4] [--reps 13]

One rank, no mpirun. The model's step and adjoint step (outputs from its buffer pool, as the driver
has them) with the old kernels and with this tree's, alternating in rounds of --reps calls, then each
kernel alone: a forward stage and the adjoint stage's three modes (separate outputs, so no update in
place), the tangent stage's two loops (first stage; later stages, dnu nonzero) and, where the tree
has it, tangent_forward_stage's (a tree without it: the tangent step as before, w1 and w2 by
``stage`` and three tangent stages). Prints
medians over the rounds of each round's median, in ms, adjoint / step and tangent / step. Both trees'
kernels are compiled without numba's cache (it cannot reload a module run from a path); their
signatures are the same, the adjoint stage's sum <lap w, mu> (old) or <w, lap mu> (new) the same
quantity.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from _ab import load_kernels, median_ms

ROOT = Path(__file__).resolve().parent.parent.parent
KERNEL = Path("hpcadj") / "models" / "kernels" / "burgers.py"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="root of the older tree (a git archive)")
    ap.add_argument("--grid", default="1024x1024")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=13)
    args = ap.parse_args()
    from hpcadj.models import burgers
    from hpcadj.models.dmda import parse_grid
    from hpcadj.stack import mpi

    old_path = Path(args.old) / KERNEL
    try:
        sizes = parse_grid(args.grid)
        if not old_path.is_file():
            raise ValueError(f"no {KERNEL} under {args.old}")
        if len(sizes) != 2 or min(sizes) < 3 or args.rounds < 1 or args.reps < 3:
            raise ValueError(f"need a 2-D grid of at least 3x3, --rounds >= 1 and --reps >= 3, got "
                             f"{args.grid}, {args.rounds}, {args.reps}")
    except ValueError as exc:
        print(f"ab_burgers: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    trees = {"old": load_kernels(old_path, "old_burgers_kernels"),
             "new": load_kernels(ROOT / KERNEL, "new_burgers_kernels")}
    m = burgers.BurgersModel(mpi().COMM_SELF, sizes, n_steps=2)
    controls = m.default_controls()
    m.set_controls(controls)
    grad = {k: v.duplicate() for k, v in controls.items()}
    u = m.initial_state()
    u1 = m.step(0, u)
    W, F = m._block(u), m._faces(u, 0)
    M, FM = m._block(u1), m._faces(u1, 3)
    O1, O2 = m._block(m._scratch(2), readonly=False), m._block(m._scratch(3), readonly=False)
    args_ = (m.nu, m.dt, m._ih)

    dcontrols = {k: v.copy() for k, v in controls.items()}  # dnu = nu: the tangent's dnu loops
    dnu = float(m.nu)

    def unfused_tangent_step(k):
        """The tangent step of trees before tangent_forward_stage: w1, w2 by ``stage``, three tangent stages."""
        from hpcadj.models.burgers import scalar_value
        dt, nu, ih = m._step_dt(0, u), m.nu, m._ih
        dn = scalar_value(m.comm, dcontrols["nu"])
        (W0, F0), (W1, F1), (W2, F2) = m._stages(u, dt)
        d1v, d2v = m._scratch(2), m._scratch(3)
        out = m._pool.new_vec()
        D0 = m._block(u1)
        k.tangent_stage(*W0, *F0, *D0, *m._faces(u1, 3), *D0, 0.0, 1.0, True, nu, dn, dt, ih,
                        *m._block(d1v, readonly=False))
        k.tangent_stage(*W1, *F1, *m._block(d1v), *m._faces(d1v, 3), *D0, 0.75, 0.25, False, nu, dn, dt, ih,
                        *m._block(d2v, readonly=False))
        k.tangent_stage(*W2, *F2, *m._block(d2v), *m._faces(d2v, 3), *D0, 1.0 / 3.0, 2.0 / 3.0, False, nu, dn,
                        dt, ih, *m._block(out, readonly=False))
        return out

    def model_call(fn):
        def call():
            fn().destroy()
        return call

    def calls(k):
        return {"step": model_call(lambda: m.step(0, u)),
                "adjoint step": model_call(lambda: m.adjoint_step(0, u, u1, u1, grad)),
                "tangent step": model_call((lambda: m.tangent_step(0, u, u1, u1, dcontrols))
                                           if hasattr(k, "tangent_forward_stage") else
                                           (lambda: unfused_tangent_step(k))),
                "stage": lambda: k.stage(*W, *F, *W, 0.75, 0.25, False, *args_, *O1),
                "tangent stage 1": lambda: k.tangent_stage(*W, *F, *M, *FM, *W, 0.0, 1.0, True, m.nu, dnu, m.dt,
                                                           m._ih, *O1),
                "tangent stage 2": lambda: k.tangent_stage(*W, *F, *M, *FM, *W, 0.75, 0.25, False, m.nu, dnu,
                                                           m.dt, m._ih, *O1),
                **({"fused stage 1": lambda: k.tangent_forward_stage(*W, *F, *M, *FM, *W, *W, 0.0, 1.0, True, m.nu,
                                                                     dnu, m.dt, m._ih, *O2, *O1),
                    "fused stage 2": lambda: k.tangent_forward_stage(*W, *F, *M, *FM, *W, *W, 0.75, 0.25, False,
                                                                     m.nu, dnu, m.dt, m._ih, *O2, *O1)}
                   if hasattr(k, "tangent_forward_stage") else {}),
                **{f"adjoint stage {mode}": (lambda mode=mode: k.adjoint_stage(*W, *F, *M, *FM, mode, *args_,
                                                                               *O1, *O2))
                   for mode in (3, 2, 1)}}

    model_kern = burgers.kern
    times = {}
    try:
        for _ in range(args.rounds):
            for who, k in trees.items():
                burgers.kern = k
                for name, fn in calls(k).items():
                    times.setdefault((who, name), []).append(median_ms(fn, args.reps))
    finally:
        burgers.kern = model_kern
    ms = {k: float(np.median(v)) for k, v in times.items()}
    print(f"burgers {args.grid}, 1 rank: ms (median of {args.rounds} rounds of median-of-{args.reps})")
    for who in trees:
        print(f"  {who}: step {ms[(who, 'step')]:.2f}  adjoint step {ms[(who, 'adjoint step')]:.2f}  "
              f"adjoint / step {ms[(who, 'adjoint step')] / ms[(who, 'step')]:.2f}   stage "
              f"{ms[(who, 'stage')]:.2f}  adjoint stage 3/2/1 "
              + " / ".join(f"{ms[(who, f'adjoint stage {mode}')]:.2f}" for mode in (3, 2, 1)))
        print(f"  {who}: tangent step {ms[(who, 'tangent step')]:.2f}  tangent / step "
              f"{ms[(who, 'tangent step')] / ms[(who, 'step')]:.2f}   tangent stage first / not "
              f"{ms[(who, 'tangent stage 1')]:.2f} / {ms[(who, 'tangent stage 2')]:.2f}"
              + (f"   tangent+forward stage first / not {ms[(who, 'fused stage 1')]:.2f} / "
                 f"{ms[(who, 'fused stage 2')]:.2f}" if (who, 'fused stage 1') in ms else ""))


if __name__ == "__main__":
    main()
