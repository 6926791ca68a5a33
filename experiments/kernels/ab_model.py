"""An explicit model (wave or burgers) against an older tree's, on the same inputs in one process
(issue 15).

    git archive cbccc56 | tar -x -C /tmp/old          # burgers: stage-by-stage tangent and adjoint steps
    python experiments/kernels/ab_model.py --old /tmp/old --model burgers [--grid 1024x1024] \
        [--rounds 4] [--reps 13]

One rank, no mpirun. The older tree's package is imported beside this one (as ``hpcadj_old``, from a
copy under the system's temporary directory), and both trees' models, each with its own kernels,
halos and buffers, run a step, an adjoint step and a tangent step from the same state, alternating
in rounds of --reps calls (each output destroyed and garbage cleaned after the call, as the driver
does). Prints the medians over the rounds of each round's median, in ms, the ratios to the step and
the largest relative difference between the trees' results (round-off: the arithmetic changed).
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
from pathlib import Path

import numpy as np

from _ab import import_old, median_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="root of the older tree (a git archive)")
    ap.add_argument("--model", choices=("burgers", "wave"), default="burgers")
    ap.add_argument("--grid", default=None, help="default: 1024x1024 (burgers), 128x128x128 (wave)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=13)
    args = ap.parse_args()
    from hpcadj.models.dmda import parse_grid
    from hpcadj.imports import mpi, petsc

    grid = args.grid or ("1024x1024" if args.model == "burgers" else "128x128x128")
    try:
        sizes = parse_grid(grid)
        if not (Path(args.old) / "hpcadj" / "models" / f"{args.model}.py").is_file():
            raise ValueError(f"no hpcadj/models/{args.model}.py under {args.old}")
        if (args.model == "burgers" and len(sizes) != 2) or min(sizes) < 5 or args.rounds < 1 or args.reps < 3:
            raise ValueError(f"need a grid of at least 5 points an axis (2-D for burgers), --rounds >= 1 "
                             f"and --reps >= 3, got {grid}, {args.rounds}, {args.reps}")
    except ValueError as exc:
        print(f"ab_model: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    PETSc = petsc()
    new_module = importlib.import_module(f"hpcadj.models.{args.model}")
    old_module, where = import_old(Path(args.old), args.model)
    try:
        comm = mpi().COMM_SELF
        cases = {}
        for who, module in (("old", old_module), ("new", new_module)):
            cls = module.BurgersModel if args.model == "burgers" else module.WaveModel
            m = cls(comm, sizes, n_steps=2)
            controls = m.default_controls()
            m.set_controls(controls)
            grad = {k: v.duplicate() for k, v in controls.items()}
            u = m.step(0, m.initial_state())
            lam = m.step(1, u)
            dcontrols = {k: v.copy() for k, v in controls.items()}  # a direction in every control
            cases[who] = {"step": lambda m=m, u=u: m.step(1, u),
                          "adjoint step": lambda m=m, u=u, lam=lam, grad=grad: m.adjoint_step(1, u, lam, lam, grad),
                          "tangent step": lambda m=m, u=u, lam=lam, dc=dcontrols: m.tangent_step(1, u, lam, lam, dc)}

        def destroyed(fn):
            def call():
                fn().destroy()
                PETSc.garbage_cleanup()
            return call

        diff = {}
        for name in cases["new"]:
            a, b = (cases[who][name]() for who in ("old", "new"))
            x, y = a.getArray(readonly=True), b.getArray(readonly=True)
            diff[name] = float(np.max(np.abs(x - y)) / np.max(np.abs(x)))
        times = {}
        for _ in range(args.rounds):
            for who, calls in cases.items():
                for name, fn in calls.items():
                    times.setdefault((who, name), []).append(median_ms(destroyed(fn), args.reps))
        ms = {k: float(np.median(v)) for k, v in times.items()}
        print(f"{args.model} {grid}, 1 rank: ms (median of {args.rounds} rounds of median-of-{args.reps})")
        for who in cases:
            step = ms[(who, "step")]
            print(f"  {who}: step {step:.2f}  adjoint step {ms[(who, 'adjoint step')]:.2f} "
                  f"({ms[(who, 'adjoint step')] / step:.2f} steps)  tangent step "
                  f"{ms[(who, 'tangent step')]:.2f} ({ms[(who, 'tangent step')] / step:.2f} steps)")
        print("  new / old: " + "  ".join(f"{name} {ms[('new', name)] / ms[('old', name)]:.2f}" for name in diff))
        print("  largest relative difference new vs old: " + "  ".join(f"{k} {v:.1e}" for k, v in diff.items()))
    finally:
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
