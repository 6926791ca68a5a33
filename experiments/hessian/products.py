"""k H v at the same controls against k independent ones, in forward-step equivalents, store-all and
under a RAM budget of a tenth of store-all's.

Store-all of one H v keeps n + 1 pairs (u, du), 2 (n + 1) model states; the budget is a tenth of
that, B = (n + 1) / 5 states per rank. Rows: k independent composite runs (hessian_action; under B,
revolve over B / 2 pair slots); k products from one forward sweep (HessianProducts): store-all; under
B with the states on node-local disk (each product's du chain reversed by revolve over B du slots,
no forward step recomputed); under B without disk (the states recomputed per product, only J and
dJ/dm reused); and the same with Gauss-Newton products (lambda computed once). Unit: a plain
forward sweep's time / n. Writes products.csv beside this script.

    mpirun -n 1 python experiments/hessian/products.py [--models wave,grayscott] [--k 10]
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import tempfile

from hpcadj.imports import mpi, petsc

petsc()
from hpcadj.adjoint import hessian as H  # noqa: E402
from hpcadj.adjoint import verify as V  # noqa: E402
from hpcadj.adjoint import products as P  # noqa: E402
from hpcadj.adjoint.verify import evaluate_objective  # noqa: E402

from run import build, revolve_run, timed  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="wave,grayscott")
    p.add_argument("--k", type=int, default=10)
    args = p.parse_args()
    comm = mpi().COMM_WORLD
    local = tempfile.mkdtemp(prefix="hessian-products-") if comm.rank == 0 else None
    local = comm.bcast(local, root=0)
    rows = []
    for name in args.models.split(","):
        model = build(comm, name)
        n, k = model.n_steps, args.k
        budget = max(4, (n + 1) // 5)
        controls = model.default_controls()
        evaluate_objective(model, controls)
        _, unit = timed(comm, lambda: evaluate_objective(model, controls))
        dirs = [V.scaled_direction(model, controls, 100 + j, scale={c: 0.1 for c in controls}) for j in range(k)]
        H.hessian_action(model, controls, dirs[0])

        def record(what, plan, seconds, counts):
            rows.append({"model": name, "grid": model.describe().get("grid"), "steps": n, "ranks": comm.size,
                         "k": k, "what": what, "plan": plan, "seconds": round(seconds, 3),
                         "forward_step_equivalents": round(seconds / unit * n, 1), **counts})
            print(rows[-1], flush=True)

        def independent(gauss_newton, slots):
            forward = 0
            for d in dirs:
                if slots is None:
                    r = H.hessian_action(model, controls, d, gauss_newton=gauss_newton)
                else:
                    st = H.SecondOrderStepper(model, d, gauss_newton=gauss_newton)
                    r = revolve_run(comm, st, st.composite_controls(controls), slots)
                forward += r.forward_steps
            return {"forward": forward, "tangent": forward, "lambda": k * n}

        def reused(gauss_newton, **options):
            products = P.HessianProducts(model, controls, gauss_newton=gauss_newton, **options)
            for d in dirs:
                products.hessian_action(d)
            products.close()
            c = products.counts
            return {"forward": c["forward"], "tangent": c["tangent"], "lambda": c["lambda"]}

        for gn in (False, True):
            tag = "Gauss-Newton" if gn else "Newton"
            c, t = timed(comm, lambda: independent(gn, None))
            record(f"{k} {tag} Hv independent", "store-all", t, c)
            c, t = timed(comm, lambda: reused(gn))
            record(f"{k} {tag} Hv one forward sweep", "store-all", t, c)
            c, t = timed(comm, lambda: independent(gn, budget // 2))
            record(f"{k} {tag} Hv independent", f"B={budget} states: revolve {budget // 2} pair slots", t, c)
            c, t = timed(comm, lambda: reused(gn, ram=str(budget), local_dir=local))
            record(f"{k} {tag} Hv one forward sweep", f"B={budget} states: u on disk, revolve {budget} du slots",
                   t, c)
            c, t = timed(comm, lambda: reused(gn, ram=str(budget)))
            record(f"{k} {tag} Hv one forward sweep", f"B={budget} states: no disk, revolve {budget // 2} pair "
                   "slots", t, c)
    if comm.rank == 0:
        shutil.rmtree(local, ignore_errors=True)
        with open(os.path.join(HERE, "products.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
