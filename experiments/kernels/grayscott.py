"""grayscott: the model's two Jacobians against the first model (numpy shell Jacobian + GMRES/Jacobi).

Runs the three in one process on the same grid (``stencil``: the default matrix-free Jacobian with
Jacobi; ``assembled``: AIJ with block Jacobi/ILU(0); ``old``: the model of d90d350, imported from
that tree beside this one, as ``ab_model.py`` does): a store-all gradient of J = 1/2 h^2 sum v_n^2
with respect to (u0, F, k), timing each step, adjoint step and tangent step (slowest rank, median),
and compares J and the gradients. Usage (bad arguments: one line on stderr, exit 2):

    git archive d90d350 | tar -x -C /tmp/old
    mpirun -n 2 python experiments/kernels/grayscott.py --old /tmp/old --grid 512 --steps 5 [--csv out.csv]
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from _ab import import_old
from hpcadj.imports import mpi, petsc


def _timed(comm, fn):
    comm.Barrier()
    t0 = time.perf_counter()
    out = fn()
    return out, comm.allreduce(time.perf_counter() - t0, op=mpi().MAX)


def gradient(model, comm):
    """Store-all forward, reverse sweep and one tangent sweep; per-call seconds and the results."""
    PETSc = petsc()
    controls = model.default_controls()
    model.set_controls(controls)
    states = [model.initial_state()]
    t_step, t_adj, t_tan, newton, linear = [], [], [], [], []
    for i in range(model.n_steps):
        u, t = _timed(comm, lambda: model.step(i, states[-1]))
        states.append(u)
        t_step.append(t)
        snes = model._snes
        newton.append(snes.getIterationNumber())
        linear.append(snes.getLinearSolveIterations())
        PETSc.garbage_cleanup(comm)
    J = model.objective(model.n_steps, states[-1])
    grad = {k: v.duplicate() for k, v in controls.items()}
    for v in grad.values():
        v.set(0.0)
    lam = model.objective_gradient(model.n_steps, states[-1])
    adj_its = []
    for i in reversed(range(model.n_steps)):
        lam, t = _timed(comm, lambda: model.adjoint_step(i, states[i], states[i + 1], lam, grad))
        t_adj.append(t)
        ksp = getattr(model, "_ksp_t", None) or model._ksp
        adj_its.append(ksp.getIterationNumber())
        PETSc.garbage_cleanup(comm)
    model.initial_adjoint(lam, grad)
    direction = {k: v.copy() for k, v in controls.items()}
    du = model.initial_tangent(direction)
    for i in range(model.n_steps):
        du, t = _timed(comm, lambda: model.tangent_step(i, states[i], states[i + 1], du, direction))
        t_tan.append(t)
        PETSc.garbage_cleanup(comm)
    dJ_tangent = float(du.dot(model.objective_gradient(model.n_steps, states[-1])))
    return {"J": J, "grad": grad, "dJ_tangent": dJ_tangent, "step_s": t_step, "adjoint_s": t_adj,
            "tangent_s": t_tan, "newton_its": newton, "linear_its": linear, "adjoint_its": adj_its}


def _relative_differences(r, old):
    """J, the tangent's dJ and each gradient field of run ``r`` against the old model's, relative."""
    rel = {"J": abs(r["J"] - old["J"]) / abs(old["J"]),
           "dJ_tangent": abs(r["dJ_tangent"] - old["dJ_tangent"]) / abs(old["dJ_tangent"])}
    for name in old["grad"]:
        diff = r["grad"][name].copy()
        diff.axpy(-1.0, old["grad"][name])
        rel[f"grad_{name}"] = diff.norm() / old["grad"][name].norm()
    return rel


def clear_options(prefix: str) -> None:
    """Remove the PETSc options a model set under ``prefix``, so the next model starts from none."""
    options = petsc().Options()
    for name in list(options.getAll()):
        if name.startswith(prefix):
            options.delValue(name)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=int, default=512, help="N for an N x N grid (default 512)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--csv", default=None, help="append a row per model to this CSV")
    parser.add_argument("--old", required=True, help="root of the tree holding the first model (a git archive "
                        "of d90d350)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    if args.grid < 3 or args.steps < 1:
        print("grayscott.py: --grid must be >= 3 and --steps >= 1", file=sys.stderr)
        return 2
    if not os.path.isfile(os.path.join(args.old, "hpcadj", "models", "grayscott.py")):
        print(f"grayscott.py: no hpcadj/models/grayscott.py under {args.old}", file=sys.stderr)
        return 2
    comm = mpi().COMM_WORLD
    old_module, where = import_old(Path(args.old), "grayscott")
    try:
        return compare(args, comm, old_module.GrayScottModel)
    finally:
        shutil.rmtree(where, ignore_errors=True)


def compare(args, comm, Old) -> int:
    """The three models' gradients on ``args``' grid: printed, and appended to ``args.csv``."""
    from hpcadj.models.grayscott import GrayScottModel as New
    results = {}
    for label, cls, extra in (("stencil", New, {"jacobian": "stencil"}),
                              ("assembled", New, {"jacobian": "assembled"}), ("old", Old, {})):
        model = cls(comm, (args.grid, args.grid), n_steps=args.steps, **extra)
        results[label] = gradient(model, comm)
        del model
        petsc().garbage_cleanup(comm)
        clear_options("grayscott_")  # both trees' models read options under this prefix
    old = results["old"]
    rows = []
    for label, r in results.items():
        rows.append({"model": f"grayscott-{label}", "grid": f"{args.grid}x{args.grid}", "ranks": comm.size,
                     "steps": args.steps,
                     "step_s_median": float(np.median(r["step_s"])),
                     "adjoint_s_median": float(np.median(r["adjoint_s"])),
                     "tangent_s_median": float(np.median(r["tangent_s"])),
                     "newton_its": float(np.mean(r["newton_its"])), "linear_its": float(np.mean(r["linear_its"])),
                     "adjoint_its": float(np.mean(r["adjoint_its"]))})
    rels = {label: _relative_differences(r, old) for label, r in results.items()}
    if comm.rank == 0:
        for row in rows:
            print(", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
        for row in rows[:-1]:
            for key in ("step_s_median", "adjoint_s_median", "tangent_s_median"):
                print(f"{row['model']} speedup {key}: {rows[-1][key] / row[key]:.1f}x")
            rel = rels[row["model"].split("-", 1)[1]]
            print(f"relative difference {row['model']} vs old: " + ", ".join(f"{k} {v:.2e}" for k, v in rel.items()))
        if args.csv:
            new_file = not os.path.exists(args.csv)
            with open(args.csv, "a", newline="") as fh:
                fields = list(rows[0]) + ["speedup_vs_old"] + list(rels["old"])
                writer = csv.DictWriter(fh, fieldnames=fields)
                if new_file:
                    writer.writeheader()
                for row in rows:
                    speed = rows[-1]["step_s_median"] / row["step_s_median"]
                    writer.writerow({**row, "speedup_vs_old": speed, **rels[row["model"].split("-", 1)[1]]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
