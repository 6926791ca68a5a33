"""``hpcadj gradcheck``: Taylor test per control and the tangent-linear/adjoint dot-product test."""

from __future__ import annotations

import json

from ..models.base import SolverError
from .common import add_model_arguments, build_model, int_in, positive_float, solver_failure, world

MIN_RATE = 1.95
#: beyond this the Taylor remainders are round-off (eps 2^-30 ~ 1e-9 eps): more halvings only cost runs
MAX_HALVINGS = 30


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("gradcheck", help="verify the gradient (Taylor and dot-product tests)",
                              description="Verify dJ/d(controls): the Taylor remainder must decay at "
                                          f"rate >= {MIN_RATE} for every control, and the tangent-linear "
                                          "and adjoint directional derivatives must agree. Exit 1 if not.")
    add_model_arguments(p)
    p.add_argument("--eps", type=positive_float, default=1e-2, help="first Taylor step (default 1e-2)")
    p.add_argument("--halvings", type=int_in(1, MAX_HALVINGS), default=4,
                   help=f"Taylor halvings, 1..{MAX_HALVINGS} (default 4; up to 6 more while the rate has not "
                        f"reached {MIN_RATE} and the remainders stand above J's noise)")
    p.add_argument("--dot-tol", type=positive_float, default=None,
                   help="largest relative TLM/adjoint mismatch accepted (default: the model's "
                        "dot_product_tolerance, else what round-off and solver tolerance explain at "
                        "its steps and norms)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    p.set_defaults(func=main)


def main(args) -> int:
    from ..adjoint import dot_product_test, taylor_test
    from ..adjoint.session import GradientSession
    from . import CliError

    if not args.eps > 0 or args.halvings < 1:
        raise CliError("--eps must be positive and --halvings >= 1")
    comm = world(args)
    model = build_model(args, comm)
    controls = model.default_controls()
    tol = args.dot_tol if args.dot_tol is not None else getattr(model, "dot_product_tolerance", None)
    try:
        gradient = GradientSession(model, controls=controls).solve().result
        taylor = {name: taylor_test(model, controls, name, eps0=args.eps, halvings=args.halvings,
                                    gradient=gradient, need=MIN_RATE) for name in sorted(controls)}
        # a model without a tangent-linear step (a user's TS: hpcadj.ts) is checked by Taylor alone
        dot = dot_product_test(model, controls, gradient=gradient) if getattr(model, "has_tangent", True) else None
    except SolverError as exc:
        raise solver_failure(exc, "a smaller --dt or --eps may help") from None
    if dot is not None and tol is None:
        tol = dot.limit
    passed = all(t.rate >= MIN_RATE for t in taylor.values()) and (dot is None or dot.relative_mismatch <= tol)
    if comm.rank == 0:
        info = {**model.describe(), "ranks": comm.size, "J": gradient.J,
                "taylor": {name: {"eps": t.eps, "remainders": t.remainders, "rates": t.rates, "rate": t.rate,
                                  "min_rate": t.min_rate, "noise_floor": t.floor, "limited": t.limited}
                           for name, t in taylor.items()},
                "dot_product": None if dot is None else {"tangent": dot.tangent, "adjoint": dot.adjoint,
                                                         "relative_mismatch": dot.relative_mismatch, "tolerance": tol},
                "passed": passed}
        if args.json:
            print(json.dumps(info))
        else:
            print(f"hpcadj gradcheck: {model.name}, J = {gradient.J:.12e}")
            for name, t in taylor.items():
                rates = " ".join(f"{r:.3f}" for r in t.rates)
                print(f"  Taylor {name:>8}: remainder rates {rates}; asymptotic {t.rate:.3f} (need >= {MIN_RATE})")
                if t.limited:
                    print(f"    {t.limited}")
            if dot is None:
                print("  dot product: not run (the model has no tangent-linear step)")
            else:
                print(f"  dot product: TLM {dot.tangent:.15e} adjoint {dot.adjoint:.15e} "
                      f"relative mismatch {dot.relative_mismatch:.2e} (need <= {tol:.1e})")
            print("  PASSED" if passed else "  FAILED")
    return 0 if passed else 1
