"""Cost of Hessian-vector products against the gradient, in forward-step equivalents.

For each model: one forward step's time (a plain forward sweep / n), then the gradient, one H v and
k = 10 H v at the same controls, each with store-all in RAM and with a RAM budget of a tenth of
store-all's (revolve; the H v plans' slots hold the pair (u, du)); k products as k independent runs
and, store-all only, from one kept forward sweep (HessianProducts). Wall times over the slowest
rank, divided by n times the step time. Writes results.csv beside this script.

    mpirun -n 1 python experiments/hessian/run.py [--models wave,burgers] [--k 10]
"""

from __future__ import annotations

import argparse
import csv
import os
import time

from hpcadj.imports import mpi, petsc

petsc()
from hpcadj.adjoint import Driver, compute_gradient  # noqa: E402
from hpcadj.adjoint import hessian as H  # noqa: E402
from hpcadj.adjoint import verify as V  # noqa: E402
from hpcadj.adjoint import products as P  # noqa: E402
from hpcadj.checkpoint.manager import CheckpointConfig, build_levels, level_slots, make_plan, profile_for  # noqa: E402
from hpcadj.adjoint.verify import evaluate_objective  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def build(comm, name):
    if name == "wave":
        from hpcadj.models.wave import WaveModel
        return WaveModel(comm, (96, 96), n_steps=200)
    if name == "burgers":
        from hpcadj.models.burgers import BurgersModel
        return BurgersModel(comm, (96, 96), n_steps=100)
    if name == "heat":
        from hpcadj.models.heat import HeatModel
        return HeatModel(comm, (96, 96), n_steps=100, dt=1e-4)
    from hpcadj.models.grayscott import GrayScottModel
    return GrayScottModel(comm, (64, 64), n_steps=20)


def timed(comm, fn):
    comm.Barrier()
    t0 = time.perf_counter()
    out = fn()
    return out, comm.allreduce(time.perf_counter() - t0, op=mpi().MAX)


def revolve_run(comm, stepper, controls, slots):
    """One Driver run of ``stepper`` under revolve with ``slots`` RAM slots."""
    layout = stepper.snapshot_layout()
    config = CheckpointConfig(budgets={"ram": str(slots)})
    plans = level_slots(config, layout, comm, stepper.n_steps)
    plan = make_plan("revolve", stepper.n_steps, plans, profile_for(plans, None))
    levels = build_levels(plans, layout, comm, config)
    try:
        return Driver(stepper, levels).run(plan, controls)
    finally:
        for level in levels:
            level.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="wave,burgers")
    p.add_argument("--k", type=int, default=10)
    args = p.parse_args()
    comm = mpi().COMM_WORLD
    rows = []
    for name in args.models.split(","):
        model = build(comm, name)
        n = model.n_steps
        controls = model.default_controls()
        evaluate_objective(model, controls)  # warm-up (JIT, first allocations)
        _, t_fwd = timed(comm, lambda: evaluate_objective(model, controls))
        unit = t_fwd  # n forward steps
        slots = max(2, n // 10)
        dirs = [V.scaled_direction(model, controls, 100 + j, scale={c: 0.1 for c in controls}) for j in range(args.k)]
        H.hessian_action(model, controls, dirs[0])  # warm-up of the second-order paths

        def record(what, budget, seconds, forward_steps=None):
            rows.append({"model": name, "grid": model.describe().get("grid"), "steps": n, "ranks": comm.size,
                         "what": what, "budget": budget, "seconds": round(seconds, 4),
                         "forward_step_equivalents": round(seconds / unit * n, 1),
                         "per_step": round(seconds / unit, 2), "forward_steps": forward_steps})

        record("forward sweep", "-", t_fwd, n)
        r, t = timed(comm, lambda: compute_gradient(model, controls))
        record("gradient", "store-all", t, r.forward_steps)
        r, t = timed(comm, lambda: revolve_run(comm, model, controls, slots))
        record("gradient", f"revolve {slots} slots", t, r.forward_steps)
        r, t = timed(comm, lambda: H.hessian_action(model, controls, dirs[0]))
        record("1 Hv", "store-all", t, r.forward_steps)
        st = H.SecondOrderStepper(model, dirs[0])
        r, t = timed(comm, lambda: revolve_run(comm, st, st.composite_controls(controls), slots))
        record("1 Hv", f"revolve {slots} pair slots", t, r.forward_steps)
        _, t = timed(comm, lambda: [H.hessian_action(model, controls, d) for d in dirs])
        record(f"{args.k} Hv independent", "store-all", t, args.k * n)

        def budgeted():
            total = 0
            for d in dirs:
                s = H.SecondOrderStepper(model, d)
                total += revolve_run(comm, s, s.composite_controls(controls), slots).forward_steps
            return total

        steps, t = timed(comm, budgeted)
        record(f"{args.k} Hv independent", f"revolve {slots} pair slots", t, steps)

        def reused():
            products = P.HessianProducts(model, controls)
            for d in dirs:
                products.hessian_action(d)
            return products

        _, t = timed(comm, reused)
        record(f"{args.k} Hv one forward sweep", "store-all (HessianProducts)", t, n)
    if comm.rank == 0:
        with open(os.path.join(HERE, "results.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        for row in rows:
            print(row)


if __name__ == "__main__":
    main()
