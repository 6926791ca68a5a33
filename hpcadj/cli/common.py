"""Options shared by the subcommands that build a model (run, gradcheck, calibrate)."""

from __future__ import annotations

import argparse
import math

from ..models import model_class, registered_models
from ..models.base import SolverError
from . import CliError


def int_in(low: int, high: int | None = None):
    """An argparse ``type=``: a whole number in [low, high] (no upper bound when ``high`` is None)."""
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"between {low} and {high}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value
    return convert


def positive_float(text: str) -> float:
    """An argparse ``type=``: a finite number > 0 (rejects nan, inf, 0, negatives and garbage)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--model, --grid, --steps, --dt and every model's own options."""
    models = registered_models()
    parser.add_argument("--model", default="heat", choices=sorted(models),
                        help="PDE model (default: heat)")
    parser.add_argument("--grid", default=None, metavar="NXxNY[xNZ]",
                        help="interior grid points per axis, e.g. 128x128 or 32x32x32")
    parser.add_argument("--steps", type=int, default=None, help="number of time steps n")
    parser.add_argument("--dt", type=positive_float, default=None, help="time step (model default if omitted)")
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


def solver_failure(exc: SolverError, hint: str = "") -> CliError:
    """A model solver that did not converge, as the one error line."""
    return CliError(f"{exc}{'; ' + hint if hint else ''}")


def world(args):
    """Initialise PETSc with the command line's PETSc options (``-log_view`` ...); return COMM_WORLD."""
    from ..stack import mpi, petsc

    petsc(args.petsc_options)
    return mpi().COMM_WORLD


