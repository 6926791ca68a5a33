"""``hpcadj check``: the model against the Stepper contract, PASSED/FAILED per property."""

from __future__ import annotations

import copy
import json
import shlex

from .common import add_model_arguments, build_model, int_in, positive_float, world


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "check", help="check a model against the Stepper contract",
        description="Exercise a few steps of the model and report PASSED, FAILED, WARNING or NOT CHECKED "
                    "per property: step pure and repeatable bitwise, inputs untouched, snapshot/restore "
                    "round trip, adjoint = transpose of the tangent (without a tangent step, e.g. a PETSc "
                    "TS: against central differences of the step), a changed control changing the step, "
                    "describe() changing with a setting (with --vary), declared working set against "
                    "measured. Exit 1 if one FAILED.")
    add_model_arguments(p)
    p.add_argument("--check-steps", type=int_in(1), default=3, metavar="K",
                   help="steps of the model exercised by every check (default 3)")
    p.add_argument("--vary", default=None, metavar="'OPTIONS'",
                   help="model options of a second configuration, e.g. --vary '--dt 2e-4': its describe() "
                        "must differ (without it that property is NOT CHECKED)")
    p.add_argument("--dot-tol", type=positive_float, default=None,
                   help="largest relative mismatch of the per-step dot products (default 1e-8)")
    p.add_argument("--memory-tol", type=positive_float, default=0.5,
                   help="relative tolerance of the working-set comparison (default 0.5)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    p.set_defaults(func=main)


def varied(args):
    """The parsed arguments with ``--vary``'s model options applied on top (a CliError if they are
    not model options or change nothing)."""
    from . import CliError, Parser

    tokens = shlex.split(args.vary)
    if not tokens:
        raise CliError("--vary needs model options, e.g. --vary '--dt 2e-4'")
    parser = Parser(prog="hpcadj check --vary", add_help=False)
    add_model_arguments(parser)
    other = parser.parse_args(tokens, namespace=copy.copy(args))
    if all(getattr(other, dest) == getattr(args, dest) for dest in vars(args)):
        raise CliError(f"--vary {args.vary!r} changes no model option")
    return other


def main(args) -> int:
    from ..adjoint.contract import check_contract
    from . import CliError

    comm = world(args)
    other = varied(args) if args.vary is not None else None
    model = build_model(args, comm)
    variant = build_model(other, comm) if other is not None else None
    try:
        report = check_contract(model, steps=args.check_steps, variant=variant,
                                factory=lambda: build_model(args, comm), tolerance=args.dot_tol,
                                memory_tolerance=args.memory_tol)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if comm.rank == 0:
        if args.json:
            print(json.dumps(report.as_dict()))
        else:
            print("\n".join(report.lines()))
    return 0 if report.passed else 1
