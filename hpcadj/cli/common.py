"""Options shared by the subcommands that build a model (run, gradcheck, calibrate)."""

from __future__ import annotations

import argparse
import math

from ..models import registered_models
from ..models.base import SolverError
from . import CliError, petsc_error, raised_from, start_agreement, together
from .models import SPEC_FORMS, is_spec, model_cli, model_names


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


def byte_count(text: str) -> int:
    """An argparse ``type=``: a positive number of bytes, bare (``8388608``) or with a unit (``8MiB``)."""
    from ..checkpoint.budget import parse_budget

    try:
        budget = parse_budget(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    value = budget.slots if budget.nbytes is None else budget.nbytes
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse ``type=``: a finite number > 0 (rejects nan, inf, 0, negatives and garbage)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def model_name(text: str) -> str:
    """An argparse ``type=``: a registered model's name, or a spec of the user's own model."""
    if text in registered_models() or is_spec(text):
        return text
    raise argparse.ArgumentTypeError(f"unknown model {text!r}: choose from {', '.join(sorted(registered_models()))}, "
                                     f"or name your own as {SPEC_FORMS}")


def step_count(text: str) -> int:
    """An argparse ``type=``: a whole number of steps (``2.7`` is refused, not taken as 2)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def add_model_arguments(parser: argparse.ArgumentParser, default: str | None = "heat",
                        steps: bool = True) -> None:
    """--model, --grid, --steps (unless the command has its own), --dt and every model's own options.

    Records which model added which option (``args.model_options``) and the shared options
    (``args.common_model_options``), so :func:`build_model` can refuse a flag the model never uses.
    """
    names = model_names()
    parser.add_argument("--model", default=default, type=model_name, metavar="MODEL",
                        help=f"PDE model: {', '.join(n for n in names if not is_spec(n))}, or your own as "
                             f"{SPEC_FORMS} (a Stepper class, a ModelCLI or a factory(comm, args))"
                             + (f" (default: {default})" if default else ""))
    start = len(parser._actions)
    parser.add_argument("--grid", default=None, metavar="NXxNY[xNZ]",
                        help="interior grid points per axis, e.g. 128x128 or 32x32x32")
    if steps:
        parser.add_argument("--steps", type=step_count, default=None, help="number of time steps n")
    parser.add_argument("--dt", type=positive_float, default=None, help="time step (model default if omitted)")
    parser.add_argument("--adaptive", action="store_true", default=False,
                        help="adaptive time steps up to --t-final (heat, burgers, wave): n is unknown until the "
                             "run ends; needs --schedule online with a budget")
    parser.add_argument("--t-final", type=positive_float, default=None, metavar="T",
                        help="simulated end time of an --adaptive run")
    common = _options(parser._actions[start:])
    owners = {}
    for name in names:
        start = len(parser._actions)
        model_cli(name).add_arguments(parser)
        owners.update({opt: name for opt in _options(parser._actions[start:])})
    parser.set_defaults(common_model_options=common, model_options=owners)


def _options(actions) -> tuple:
    """(dest, first option string, default) of each action."""
    return tuple((a.dest, a.option_strings[0], a.default) for a in actions if a.option_strings)


class _ReadTracker(argparse.Namespace):
    """The parsed arguments, remembering which of them a model's CLI adapter reads."""

    def __init__(self, args: argparse.Namespace):
        super().__init__(**vars(args))
        object.__setattr__(self, "_read", set())

    def __getattribute__(self, name):
        if name == "__dict__":  # vars(args): everything may have been read
            object.__getattribute__(self, "_read").add("*")
        elif not name.startswith("_"):
            object.__getattribute__(self, "_read").add(name)
        return object.__getattribute__(self, name)


def _build_user_model(adapter, spec: str, comm, args):
    """Build a --model spec's model; an exception in the user's code becomes one line naming its
    type, message and file:line (memory running out and ValueError keep their own handling)."""
    from . import out_of_memory
    from .models import user_error

    try:
        return adapter.build(comm, args)
    except ValueError as exc:
        if spec in str(exc):
            raise
        raise ValueError(f"--model {spec}: {exc}") from exc
    except SolverError:
        raise
    except (Exception, SystemExit) as exc:  # the user's code: one line, not a traceback
        if out_of_memory(exc):
            raise
        raise ValueError(f"--model {spec}: building the model failed: {user_error(exc)}") from None


def unused_model_options(args, read: set) -> list[str]:
    """The model flags given on the command line that the selected model does not use: another
    model's own options, and shared ones (--grid, --steps, --dt) its adapter's ``build`` never read."""
    unused = []
    for (dest, flag, default), owner in getattr(args, "model_options", {}).items():
        if owner != args.model and getattr(args, dest, default) != default:
            unused.append(f"{flag} (an option of model {owner})")
    if "*" not in read:
        for dest, flag, default in getattr(args, "common_model_options", ()):
            if dest not in read and getattr(args, dest, default) != default:
                unused.append(flag)
    return unused


def build_model(args, comm):
    """The model selected on the command line; bad values, a flag the model does not use and a
    grid that does not fit in memory become a CliError (a MemoryError for the last)."""
    if args.steps is not None and args.steps < 1:
        raise CliError(f"--steps must be >= 1, got {args.steps}")
    if args.dt is not None and not args.dt > 0:
        raise CliError(f"--dt must be positive, got {args.dt}")
    tracked = _ReadTracker(args)
    with together(comm):  # a user's factory, an observations file: either may fail on some ranks only
        try:
            adapter = model_cli(args.model)
            model = _build_user_model(adapter, args.model, comm, tracked) if is_spec(args.model) else \
                adapter.build(comm, tracked)
        except ValueError as exc:
            from . import out_of_memory

            if out_of_memory(exc.__context__):  # e.g. the DMDA's own allocation, reported as "cannot split"
                raise MemoryError(f"PETSc could not allocate the {args.grid or 'default'} grid over "
                                  f"{comm.size} rank(s)") from exc.__context__
            raise CliError(str(exc)) from None
    unused = unused_model_options(args, object.__getattribute__(tracked, "_read"))
    if unused:
        one = len(unused) == 1
        raise CliError(f"model {args.model} does not use {', '.join(unused)}: drop {'it' if one else 'them'} "
                       f"({'it' if one else 'they'} would be ignored)")
    return model


def has_budget(args) -> bool:
    """Whether a whole-process memory budget applies: --memory, else $HPCADJ_MEMORY or SLURM's."""
    import os

    from ..checkpoint.memory import budget_from_environment

    return getattr(args, "memory", None) is not None or budget_from_environment(os.environ) is not None


def memory_baseline(args, comm, *, second_order: bool = False) -> int | None:
    """The resident set a budget's working set is counted from, measured once by every command
    before its model is built: under a budget (:func:`has_budget`), after a warm-up of the same model
    on a tiny grid (:func:`hpcadj.adjoint.costs.warm_up`: a checkpointed gradient, with
    ``second_order`` a Hessian product too), so that what the computation loads is in it; without a
    budget, or when the model's options are tied to its real grid (``--observations``), as it is now.
    Collective."""
    import copy

    from ..adjoint.costs import WARM_UP_STEPS, warmed_baseline
    from ..checkpoint.memory import process_rss_bytes

    if not has_budget(args):
        return process_rss_bytes()
    small = copy.copy(args)
    side = str(max(8, 2 * comm.size))  # a time tile of depth 2 still fits every rank's block
    small.grid = "x".join([side] * (args.grid.count("x") + 1)) if args.grid else None
    small.steps, small.adaptive, small.t_final = WARM_UP_STEPS, False, None  # the same kernels, fixed steps
    try:
        return warmed_baseline(lambda: build_model(small, comm), second_order)
    except (CliError, ValueError):
        return process_rss_bytes()


def storage_failure(exc: BaseException) -> BaseException | None:
    """The failing file system or checkpoint level ``exc`` is, or wraps, escaping a command (None if
    neither): a level's LevelError, an output file's WriteError, a run directory's RunDirError (each
    the same on every rank where the operation is collective), found also behind a PETSc.Error that
    carries it as ``__cause__`` or ``__context__`` (newer petsc4py hands back an exception raised
    in a callback, a TAO objective or a Python Mat's ``mult``, that way). Every command ends with its
    message as the one error line."""
    from ..checkpoint.storage.base import LevelError
    from ..fieldio import WriteError
    from ..restart import RunDirError

    for error in raised_from(exc):
        if isinstance(error, (LevelError, WriteError, RunDirError)):
            return error
        if not petsc_error(error):
            return None
    return None


def solver_failure(exc: SolverError, hint: str = "") -> CliError:
    """A model solver that did not converge, as the one error line."""
    return CliError(f"{exc}{'; ' + hint if hint else ''}")


def check_can_create(path: str, flag: str | None = None) -> None:
    """CliError unless a file can be created beside ``path`` (see checkpoint.options)."""
    from ..checkpoint import options

    try:
        options.check_can_create(path, flag)
    except options.ConfigError as exc:
        raise CliError(str(exc)) from None


def check_usable_directory(path: str, flag: str) -> None:
    """CliError unless ``path`` is a directory files can be created in, or can be made into one."""
    from ..checkpoint import options

    try:
        options.check_usable_directory(path, flag)
    except options.ConfigError as exc:
        raise CliError(str(exc)) from None


def world(args):
    """Initialise PETSc with the command line's PETSc options (``-log_view`` ...); return COMM_WORLD."""
    from ..imports import mpi, petsc

    petsc(args.petsc_options)
    start_agreement()
    return mpi().COMM_WORLD


