"""Options shared by the subcommands that build a model (run, gradcheck, calibrate)."""

from __future__ import annotations

import argparse

from ..models import model_class, registered_models
from . import CliError


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--model, --grid, --steps, --dt and every model's own options."""
    models = registered_models()
    parser.add_argument("--model", default="heat", choices=sorted(models),
                        help="PDE model (default: heat)")
    parser.add_argument("--grid", default=None, metavar="NXxNY[xNZ]",
                        help="interior grid points per axis, e.g. 128x128 or 32x32x32")
    parser.add_argument("--steps", type=int, default=None, help="number of time steps n")
    parser.add_argument("--dt", type=float, default=None, help="time step (model default if omitted)")
    for name in sorted(models):
        model_class(name).add_arguments(parser)


def build_model(args, comm):
    """The model selected on the command line; bad values become a CliError."""
    if args.steps is not None and args.steps < 1:
        raise CliError(f"--steps must be >= 1, got {args.steps}")
    if args.dt is not None and not args.dt > 0:
        raise CliError(f"--dt must be positive, got {args.dt}")
    try:
        return model_class(args.model).from_args(comm, args)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def world(args):
    """Initialise PETSc with the command line's PETSc options (``-log_view`` ...); return COMM_WORLD."""
    from ..stack import mpi, petsc

    petsc(args.petsc_options)
    return mpi().COMM_WORLD


