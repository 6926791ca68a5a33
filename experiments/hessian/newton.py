"""Newton-CG and Gauss-Newton inversions of the wave model against L-BFGS, measured side by side.

One wave problem (the built-in generated true model: the background c_bg = 1 + 0.5 depth with a
Gaussian anomaly; its observed traces; start c = c_bg, the truth with the anomaly smoothed away) is
inverted for c by several TAO solvers in one process, one after the other:

- ``blmvm``: bounded L-BFGS on checkpointed gradients (hpcadj.inversion.cache.EvaluationCache);
- ``bntr``: bounded trust-region Newton-CG whose Hessian is a shell matrix of checkpointed products
  (hpcadj.inversion.newton.HessianShell), exact (``newton``) or Gauss-Newton (``gn``);
- a row name ending in ``@tenth`` runs under a RAM budget of a tenth of store-all: gradients by
  revolve over (n + 1) / 10 state slots, products by revolve over as many pair (u, du) slots.

Every solver has bounds c in [C_LO, C_HI] and dt is fixed for C_HI, so no trial step breaks the
leapfrog's CFL condition. Each run stops at the target misfit (``-tao_fmin``: --target times the
starting misfit), at its iteration cap or at its wall limit, whichever comes first. Reported per row:
iterations, gradient and objective evaluations, H v products, model steps, wall, forward-step
equivalents (wall over one plain forward step's wall, measured just before the row), final misfit,
model error ||c - c_true|| / ||c_start - c_true||, and the same figures at the first accepted
iterate reaching the *common misfit* (the largest final misfit over the rows, so every row reached
it), with ratios against the L-BFGS row of the same budget. Writes NAME.csv (rows) and
NAME_history.csv (accepted iterates; ``--name``, default newton) beside this script, or under --out.

    mpirun -n 1 python experiments/hessian/newton.py --quick
    mpirun -n 1 python experiments/hessian/newton.py --grid 362 --time-limit 480 --name newton_362
    mpirun -n 1 python experiments/hessian/newton.py --grid 512 --rows blmvm,bntr:gn --time-limit 720 --name newton_512
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import time

from hpcadj.imports import mpi, petsc

HERE = os.path.dirname(os.path.abspath(__file__))
C_LO, C_HI = 0.5, 2.0
ROWS = "blmvm,bntr:newton,bntr:gn,blmvm@tenth,bntr:gn@tenth"


class Stop(Exception):
    """Raised in a TAO callback when a run passes its wall limit."""


def build(comm, grid: int, t_final: float, cfl: float, frequency: float):
    """The wave model with dt fixed for c = C_HI, steps covering ``t_final`` and a Ricker source of
    peak ``frequency`` (one physical problem whatever the grid)."""
    from hpcadj.models.wave import WaveModel

    h = 1.0 / (grid + 1)
    dt = cfl * h / (C_HI * math.sqrt(2.0))
    return WaveModel(comm, (grid, grid), n_steps=int(math.ceil(t_final / dt)), dt=dt, frequency=frequency)


def forward_seconds(model, controls, repeat: int = 2) -> float:
    """Wall of one plain forward sweep (slowest rank; the least of ``repeat``)."""
    from hpcadj.adjoint.verify import evaluate_objective

    comm, best = model.comm, math.inf
    for _ in range(repeat):
        comm.Barrier()
        t0 = time.perf_counter()
        evaluate_objective(model, controls)
        best = min(best, comm.allreduce(time.perf_counter() - t0, op=mpi().MAX))
    return best


def model_error(c, c_true, reference: float) -> float:
    d = c.copy()
    d.axpy(-1.0, c_true)
    out = d.norm() / reference
    d.destroy()
    return out


def solve(model, row: str, start, c_true, err0: float, *, target: float, max_it: int, cg_its: int,
          time_limit: float, slots: int):
    """One TAO run of ``row`` (``tao[:product][@tenth]``); (summary dict, accepted-iterate list)."""
    from hpcadj import Checkpointing
    from hpcadj.inversion.newton import HessianShell
    from hpcadj.inversion.cache import EvaluationCache
    from hpcadj.inversion.space import ControlSpace

    PETSc = petsc()
    comm = model.comm
    spec, _, budget = row.partition("@")
    tao_type, _, product = spec.partition(":")
    tenth = budget == "tenth"
    space = ControlSpace(start, ["c"])
    checkpointing = Checkpointing(ram=slots, schedule="revolve") if tenth else Checkpointing()
    cache = EvaluationCache(model, space, checkpointing, policy="keep")
    shell = mat = None
    t0 = time.perf_counter()
    history = []

    def late():
        if comm.allreduce(time.perf_counter() - t0 > time_limit, op=mpi().LOR):
            raise Stop()

    def objective(tao, x):
        e = cache.objective(x)
        late()
        return e.J

    def gradient(tao, x, g):
        cache.gradient(x).gradient.copy(g)
        late()

    def objective_gradient(tao, x, g):
        e = cache.gradient(x)
        e.gradient.copy(g)
        late()
        return e.J

    tao = PETSc.TAO().create(comm=comm)
    tao.setType(tao_type)
    tao.setObjective(objective)
    tao.setGradient(gradient, space.new())
    tao.setObjectiveGradient(objective_gradient, space.new())
    x = space.pack(start)
    tao.setSolution(x)
    lower, upper = space.fill({"c": C_LO}, C_LO), space.fill({"c": C_HI}, C_HI)
    tao.setVariableBounds((lower, upper))
    tao.setTolerances(gatol=0.0, grtol=0.0, gttol=0.0)
    tao.setMaximumIterations(max_it)
    options = PETSc.Options()
    options.setValue("-tao_fmin", repr(target))
    try:
        tao.setFromOptions()
    finally:
        options.delValue("-tao_fmin")
    if tao_type in ("nls", "bntr"):
        kept = {"ram": 2 * slots} if tenth else {}
        shell = HessianShell(model, space, gauss_newton=product == "gn", **kept)
        mat = shell.matrix()
        tao.setHessian(shell.point, mat)
        ksp = tao.getKSP()
        if ksp.getPC().getType() in (None, "", "ilu", "icc", "jacobi", "bjacobi"):
            ksp.getPC().setType("none")
        ksp.setTolerances(max_it=cg_its)
    unpacked = space.unpack(x)
    c_now = unpacked.pop("c")
    for vec in unpacked.values():
        vec.destroy()

    def monitor(t):
        its, f, gnorm, _c, _step, _reason = t.getSolutionStatus()
        sol = space.unpack(t.getSolution())
        sol["c"].copy(c_now)
        for vec in sol.values():
            vec.destroy()
        products = shell.counts()["hessian_products"] if shell is not None else 0
        history.append({"row": row, "iteration": its, "misfit": f, "grad_norm": gnorm,
                        "seconds": comm.allreduce(time.perf_counter() - t0, op=mpi().MAX),
                        "gradients": cache.requests["gradient"], "products": products,
                        "model_error": model_error(c_now, c_true, err0)})

    tao.setMonitor(monitor)
    status = None
    try:
        tao.solve()
        status = str(int(tao.getConvergedReason()))
    except Stop:
        status = "wall limit"
    wall = comm.allreduce(time.perf_counter() - t0, op=mpi().MAX)
    counts = cache.counts()
    cache.drop()
    hess = {"hessian_products": 0, "hessian_forward_steps": 0, "hessian_tangent_steps": 0,
            "hessian_adjoint_steps": 0}
    if shell is not None:
        shell.close()
        hess.update(shell.counts())
    last = history[-1]
    summary = {"row": row, "tao": tao_type, "product": product or "-",
               "budget": f"revolve {slots} slots" if tenth else "store-all",
               "status": status, "iterations": last["iteration"],
               "gradients": counts["gradient_requests"], "objectives": counts["objective_requests"],
               "hv_products": hess["hessian_products"],
               "forward_steps": counts["forward_steps"] + hess["hessian_forward_steps"],
               "tangent_steps": hess["hessian_tangent_steps"],
               "adjoint_steps": counts["adjoint_steps"] + hess["hessian_adjoint_steps"],
               "wall_s": wall, "misfit": last["misfit"], "model_error": last["model_error"]}
    tao.destroy()
    for vec in (x, lower, upper, c_now):
        vec.destroy()
    return summary, history


def at_misfit(history: list, level: float) -> dict:
    """The first accepted iterate whose misfit is at most ``level`` (None: none was)."""
    for record in history:
        if record["misfit"] <= level:
            return record
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="48x48, a run of about a minute")
    p.add_argument("--grid", type=int, default=256)
    p.add_argument("--t-final", type=float, default=0.8)
    p.add_argument("--cfl", type=float, default=0.9, help="of the leapfrog limit at c = C_HI")
    p.add_argument("--frequency", type=float, default=5.4, help="the Ricker source's peak frequency")
    p.add_argument("--rows", default=ROWS)
    p.add_argument("--target", type=float, default=0.1, help="target misfit / starting misfit")
    p.add_argument("--max-it", type=int, default=80, help="iteration cap of the L-BFGS rows")
    p.add_argument("--newton-max-it", type=int, default=15, help="iteration cap of the Newton rows")
    p.add_argument("--cg-its", type=int, default=10, help="Krylov iterations (H v products) per Newton step")
    p.add_argument("--time-limit", type=float, default=600.0, help="wall seconds per row")
    p.add_argument("--out", default=HERE)
    p.add_argument("--name", default="newton", help="writes NAME.csv and NAME_history.csv")
    args = p.parse_args()
    if args.quick:
        args.grid, args.max_it, args.newton_max_it, args.time_limit = 48, 40, 8, 30.0
    comm = mpi().COMM_WORLD
    PETSc = petsc()
    from hpcadj.adjoint.verify import evaluate_objective
    from hpcadj.checkpoint.manager import snapshot_slot_bytes

    model = build(comm, args.grid, args.t_final, args.cfl, args.frequency)
    n = model.n_steps
    slots = max(2, (n + 1) // 10)
    start = model.default_controls()
    c_true = model.true_model()
    err0 = model_error(start["c"], c_true, 1.0)
    forward_seconds(model, start, repeat=1)  # warm-up: compilation, first allocations
    f0 = evaluate_objective(model, start)
    state_mib = snapshot_slot_bytes(model.snapshot_layout(), comm)["ram"] / 2 ** 20
    say = PETSc.Sys.Print
    say(f"wave {args.grid}x{args.grid}, {n} steps, dt {model.dt:.3g}, {comm.size} rank(s); state "
        f"{state_mib:.2f} MiB/rank (pair {2 * state_mib:.2f}); misfit at start {f0:.4g}, target "
        f"{args.target * f0:.4g}; model error at start 1 (||c_bg - c_true|| = {err0:.4g})")
    rows, histories = [], []
    for row in args.rows.split(","):
        unit = forward_seconds(model, start) / n
        newton = row.split("@")[0].split(":")[0] in ("nls", "bntr")
        summary, history = solve(model, row, start, c_true, err0, target=args.target * f0,
                                 max_it=args.newton_max_it if newton else args.max_it, cg_its=args.cg_its,
                                 time_limit=args.time_limit, slots=slots)
        summary["step_s"] = unit
        summary["fse"] = summary["wall_s"] / unit
        rows.append(summary)
        histories.append(history)
        say(f"{row}: {summary['status']}, {summary['iterations']} it, misfit {summary['misfit']:.4g}, "
            f"{summary['wall_s']:.1f} s")
    common = max(r["misfit"] for r in rows)
    for summary, history in zip(rows, histories):
        hit = at_misfit(history, common)
        summary["common_misfit"] = common
        summary["it_to_common"] = hit["iteration"]
        summary["wall_to_common_s"] = hit["seconds"]
        summary["fse_to_common"] = hit["seconds"] / summary["step_s"]
    for summary in rows:
        ref = next((r for r in rows if r["tao"] in ("lmvm", "blmvm") and r["budget"] == summary["budget"]), None)
        for key in ("it_to_common", "fse_to_common", "wall_to_common_s"):
            summary[f"{key}_vs_lbfgs"] = summary[key] / ref[key] if ref and ref[key] else float("nan")
    if comm.rank == 0:
        os.makedirs(args.out, exist_ok=True)
        for name, records in ((f"{args.name}.csv", rows),
                              (f"{args.name}_history.csv", [r for h in histories for r in h])):
            path = os.path.join(args.out, name)
            with open(path + ".part", "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(records[0]))
                writer.writeheader()
                writer.writerows(records)
            os.replace(path + ".part", path)
    say(f"\ncommon misfit {common:.4g} (the largest final misfit); ratios against L-BFGS of the same budget")
    say("| row | budget | status | it | gradients | objectives | Hv | forward / tangent / adjoint steps | "
        "wall s | fse | misfit | model error | to common: it, fse, wall s | vs L-BFGS: it, fse |")
    say("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        say(f"| {r['row']} | {r['budget']} | {r['status']} | {r['iterations']} | {r['gradients']} | "
            f"{r['objectives']} | {r['hv_products']} | {r['forward_steps']} / {r['tangent_steps']} / "
            f"{r['adjoint_steps']} | {r['wall_s']:.1f} | {r['fse']:.0f} | {r['misfit']:.3g} | "
            f"{r['model_error']:.3f} | {r['it_to_common']}, {r['fse_to_common']:.0f}, {r['wall_to_common_s']:.1f} | "
            f"{r['it_to_common_vs_lbfgs']:.2f}, {r['fse_to_common_vs_lbfgs']:.2f} |")
    for vec in list(start.values()) + [c_true]:
        vec.destroy()


if __name__ == "__main__":
    main()
