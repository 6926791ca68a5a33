"""``hpcadj hesscheck``: second-order Taylor, symmetry and gradient-difference tests of H v."""

from __future__ import annotations

import json

from ..models.base import SolverError
from ..telemetry.jsonlog import peak_rss_bytes
from .common import (add_model_arguments, build_model, int_in, memory_baseline, positive_float, solver_failure,
                     world)

MIN_RATE = 2.9
#: the gradient-difference error must fall at least this fast (log2) when eps halves (2 for O(eps^2))
MIN_FD_RATE = 1.8
#: ... or already be this small (relative): a model with a linear gradient has nothing left to decay
FD_FLOOR = 1e-9
#: control-sized sets the command holds beside each gradient-difference session, which counts only its
#: own controls and gradient: m, v, w, g and H v at m for v and for w, and the first gradient of a pair
HELD_CONTROL_SETS = 8


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("hesscheck", help="verify Hessian-vector products (Taylor, symmetry, gradients)",
                              description="Verify H v for random directions v: the second-order Taylor "
                                          f"remainder must decay at rate >= {MIN_RATE}, <H v, w> must equal "
                                          "<v, H w>, and H v must match central differences of two "
                                          "gradients to O(eps^2). Exit 1 if not. With --gauss-newton only "
                                          "the symmetry test applies (the product is not the Hessian).")
    add_model_arguments(p)
    p.add_argument("--eps", type=positive_float, default=None,
                   help="first Taylor step, relative to the direction (model default: 0.5)")
    p.add_argument("--halvings", type=int_in(1, 20), default=4,
                   help="Taylor halvings (default 4; up to 6 more while the rate has not reached its need and "
                        "the remainders stand above J's noise)")
    p.add_argument("--fd-eps", type=positive_float, default=1e-3,
                   help="first gradient-difference step (and half of it; default 1e-3): up to 4 steps, each 4x "
                        "the last, until the errors fall at the O(eps^2) rate; errors within the solvers' "
                        "tolerance are reported as that limit, not as a failure")
    p.add_argument("--sym-tol", type=positive_float, default=1e-10,
                   help="largest relative |<Hv, w> - <v, Hw>| accepted (default 1e-10)")
    p.add_argument("--gauss-newton", action="store_true", help="check the Gauss-Newton product instead")
    p.add_argument("--memory", default=None, metavar="BYTES",
                   help="whole-process memory budget per rank (3GiB): the products and gradients are "
                        "checkpointed to fit it, by the rule hpcadj invert's nls/bntr use (default: store-all)")
    p.add_argument("--schedule", choices=("revolve", "mixed"), default="revolve",
                   help="the products' plan under --memory: revolve over restart states (default), or mixed: "
                        "restart states and steps' adjoint data in the same bytes, for a model that declares "
                        "them (wave); without --memory store-all keeps the data anyway")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    p.set_defaults(func=main)


def main(args) -> int:
    from ..adjoint import hessian as H
    from ..adjoint import verify as V
    from ..adjoint.session import ConfigError
    from . import CliError

    comm = world(args)
    # before the model, the products' kernels warmed too
    baseline = memory_baseline(args, comm, second_order=True) if args.memory is not None else None
    model = build_model(args, comm)
    try:
        H.check_model(model, args.gauss_newton)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    controls = model.default_controls()
    gn = args.gauss_newton
    if args.schedule == "mixed" and H.SecondOrderStepper(model, gauss_newton=gn).adjoint_data_layout() is None:
        raise CliError(f"--schedule mixed needs a model whose Hessian products declare adjoint data; "
                       f"{model.name!r} declares none (use revolve)")
    plan = ck = None
    if args.memory is not None:  # every product and gradient of the command fits, checked before any work
        try:
            plan, ck = _budgeted_plan(model, controls, gn, args.memory, baseline, args.schedule)
        except ConfigError as exc:
            raise CliError(str(exc)) from None
    eps0 = args.eps if args.eps is not None else getattr(model, "hessian_taylor_eps", 0.5)
    scale = {k: 0.1 for k in controls}
    v = V.scaled_direction(model, controls, 11, scale=scale)
    w = V.scaled_direction(model, controls, 13, scale=scale)
    budget = None
    try:
        if args.memory is None:
            hv = H.hessian_action(model, controls, v, gauss_newton=gn)
            hw = H.hessian_action(model, controls, w, gauss_newton=gn)
        else:
            hv, hw, budget = _budgeted_products(model, controls, v, w, gn, plan)
        a, b = V.controls_dot(hv.hessian, w), V.controls_dot(v, hw.hessian)
        taylor = fd = None
        if not gn:
            taylor = V.second_order_taylor_test(model, controls, v, eps0=eps0, halvings=args.halvings, hess=hv,
                                                need=MIN_RATE)
            fd = V.difference_check(model, controls, v, hv, eps0=args.fd_eps, need=MIN_FD_RATE, floor=FD_FLOOR,
                                    checkpointing=ck)
    except SolverError as exc:
        raise solver_failure(exc, "a smaller --dt or --eps may help") from None
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if budget is not None:
        budget["peak_rss_bytes"] = comm.allreduce(peak_rss_bytes(), op=_max_op())
    sym = abs(a - b) / max(abs(a), abs(b), 1e-300)
    passed = sym <= args.sym_tol
    if not gn:
        passed = passed and taylor.rate >= MIN_RATE and fd.passed
    if comm.rank == 0:
        info = {**model.describe(), "ranks": comm.size, "J": hv.J, "product": "gauss-newton" if gn else "newton",
                "symmetry": {"vHw": b, "wHv": a, "relative": sym, "tolerance": args.sym_tol}, "passed": passed}
        if budget is not None:
            info["memory"] = budget
        if not gn:
            info["taylor"] = {"eps": taylor.eps, "remainders": taylor.remainders, "rates": taylor.rates,
                              "rate": taylor.rate, "min_rate": taylor.min_rate, "need": MIN_RATE,
                              "noise_floor": taylor.floor, "limited": taylor.limited}
            info["gradient_difference"] = {"eps": fd.eps, "relative_error": fd.errors, "rate": fd.rate,
                                           "need": MIN_FD_RATE, "floor": FD_FLOOR, "noise": fd.noise,
                                           "limited": fd.limited}
        if args.json:
            print(json.dumps(info))
        else:
            print(f"hpcadj hesscheck: {model.name} ({info['product']}), J = {hv.J:.12e}")
            if not gn:
                rates = " ".join(f"{r:.3f}" for r in taylor.rates)
                print(f"  second-order Taylor: remainder rates {rates}; asymptotic {taylor.rate:.3f} "
                      f"(need >= {MIN_RATE})")
                if taylor.limited:
                    print(f"    {taylor.limited}")
                (e1, e2), (r1, r2) = fd.eps[-1], fd.errors[-1]
                print(f"  gradient differences: relative error {r1:.2e} at eps {e1:.2g}, {r2:.2e} at {e2:.2g} "
                      f"(rate {fd.rate:.2f}, need >= {MIN_FD_RATE} or <= {FD_FLOOR:.0e})")
                if fd.limited:
                    print(f"    {fd.limited}")
            print(f"  symmetry: <Hv,w> {a:.15e} <v,Hw> {b:.15e} relative {sym:.2e} (need <= {args.sym_tol:.0e})")
            print("  PASSED" if passed else "  FAILED")
    return 0 if passed else 1


def _budgeted_plan(model, controls, gauss_newton: bool, memory, baseline, schedule: str = "revolve"):
    """The products' plan (by ``schedule``) and the gradients' checkpointing under ``memory`` from
    ``baseline``, both provisioned now (a budget either cannot hold is refused before any step)."""
    from ..adjoint.products import plan_products
    from ..adjoint.session import Checkpointing, GradientSession

    plan = plan_products(model, gauss_newton=gauss_newton, memory=memory, baseline=baseline, schedule=schedule)
    ck = Checkpointing(memory=memory, memory_baseline=baseline + HELD_CONTROL_SETS * _control_bytes(model))
    if not gauss_newton:  # the gradient differences' sessions
        session = GradientSession(model, ck, controls=controls)
        try:
            session.plan()
        finally:
            session.close()
    return plan, ck


def _control_bytes(model) -> int:
    """One control-sized set of fields on the largest rank (collective)."""
    from ..snapshot import layout_bytes

    return model.comm.allreduce(layout_bytes(model.control_layout()), op=_max_op())


def _budgeted_products(model, controls, v, w, gauss_newton: bool, plan):
    """H v and H w from one forward sweep under ``plan`` (:class:`~hpcadj.adjoint.products.HessianProducts`),
    and how they fitted the budget."""
    from ..adjoint.products import HessianProducts

    products = HessianProducts(model, controls, gauss_newton=gauss_newton, plan=plan)
    try:
        hv, hw = products.hessian_action(v), products.hessian_action(w)
    finally:
        products.close()
    plan = products.memory
    return hv, hw, {"budget": plan.budget_bytes, "mode": products.mode, "slots": products.plan_slots,
                    "schedule": "store-all" if products.plan.planned is None else products.plan.planned.schedule.name,
                    "predicted_peak_bytes": plan.peak_bytes, "forward_steps": products.counts["forward"],
                    "tangent_steps": products.counts["tangent"]}


def _max_op():
    from ..imports import mpi

    return mpi().MAX
