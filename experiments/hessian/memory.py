"""``hpcadj invert --memory`` with a Newton type (nls, bntr) at size: peak RSS against the budget,
the products' recomputation and the wall, against the same inversion without a budget.

One row per run, each in its own process (peak RSS of the solve: VmHWM reset when the inversion
starts, after the model's construction; the largest rank's): a built-in model (default burgers, inverted for u0: a misfit from the first step, so a few
steps make a real inversion at any grid) through ``hpcadj.cli.main`` (the command's own path:
``--memory`` -> Checkpointing -> gradient sessions and Hessian products). Appends the row to
NAME.csv beside this script.

    mpirun -n 1 python experiments/hessian/memory.py --grid 724 --steps 40 --tao bntr --memory 500MiB
    mpirun -n 1 python experiments/hessian/memory.py --grid 724 --steps 40 --tao bntr
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 2 ** 20


def vm_hwm() -> int:
    """This process's peak resident set since the last reset (VmHWM)."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="burgers")
    p.add_argument("--invert", default="u0")
    p.add_argument("--grid", type=int, default=724)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--tao", default="bntr", choices=("nls", "bntr"))
    p.add_argument("--memory", default=None, help="whole-process budget per rank (none: store-all)")
    p.add_argument("--max-it", type=int, default=2)
    p.add_argument("--cg", type=int, default=5, help="Krylov products a Newton step at most")
    p.add_argument("--name", default="memory")
    args = p.parse_args()
    from hpcadj.imports import mpi

    from hpcadj.cli import main as hpcadj

    comm = mpi().COMM_WORLD
    argv = ["invert", "--model", args.model, "--grid", f"{args.grid}x{args.grid}", "--steps", str(args.steps),
            "--invert", args.invert, "--tao", args.tao, "--max-it", str(args.max_it), "--gatol", "0", "--grtol", "0",
            "--json", {"nls": "-tao_nls_ksp_max_it", "bntr": "-tao_bnk_ksp_max_it"}[args.tao], str(args.cg)]
    if args.memory:
        argv += ["--memory", args.memory]
    from hpcadj.inversion import driver

    solve = driver.Inversion.solve

    def measured(self):  # the solve's peak: the model's construction transients are not the budget's
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return solve(self)

    driver.Inversion.solve = measured
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        rc = hpcadj(argv)
    wall = comm.allreduce(time.perf_counter() - t0, op=mpi().MAX)
    peak = comm.allreduce(vm_hwm(), op=mpi().MAX)
    if comm.rank != 0:
        return
    info = json.loads(out.getvalue()) if rc == 0 else {}
    n, state = args.steps, 2 * args.grid ** 2 * 8 // comm.size  # two fields a state (wave, burgers)
    products = max(info.get("hessian_products", 0), 1)
    row = {"model": args.model, "grid": f"{args.grid}x{args.grid}", "steps": n, "ranks": comm.size, "tao": args.tao,
           "state_mib": round(state / MiB, 2), "memory": args.memory or "none", "rc": rc,
           "iterations": info.get("iterations"), "misfit": info.get("misfit"),
           "products": info.get("hessian_products"), "product_sweeps": info.get("hessian_forward_sweeps"),
           "product_forward_steps": info.get("hessian_forward_steps"),
           "product_tangent_steps": info.get("hessian_tangent_steps"),
           "forward_per_product": round(info.get("hessian_forward_steps", 0) / products / n, 2),
           "tangent_per_product": round(info.get("hessian_tangent_steps", 0) / products / n, 2),
           "gradient_forward_steps": info.get("forward_steps"), "sessions": info.get("sessions"),
           "predicted_product_peak_mib": round(info.get("hessian_predicted_peak_bytes", 0) / MiB, 1),
           "solve_peak_rss_mib": round(peak / MiB, 1), "wall_s": round(wall, 1),
           "store_all_products_mib": round(2 * (n + 1) * state / MiB, 1)}
    print(json.dumps(row))
    path = os.path.join(HERE, f"{args.name}.csv")
    new = not os.path.exists(path)
    with open(path, "a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(row))
        if new:
            writer.writeheader()
        writer.writerow(row)


if __name__ == "__main__":
    main()
