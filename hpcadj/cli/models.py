"""Command-line adapters of the models: the options each adds and how it is built from them.

The Stepper contract (``hpcadj.models.base``) is physics only; argparse lives here. A model reaches
``hpcadj run --model NAME`` through a :class:`ModelCLI`: the built-in models through the adapters
below, another package's through the ``hpcadj.models`` entry point, and any model through
``--model path/to/file.py:Name`` or ``--model package.module:Name`` (no installation). The named
object (or entry point's value) is one of

- a :class:`ModelCLI` (a class, instantiated without arguments, or an instance);
- a Stepper class: built by its own ``from_args(comm, args)`` classmethod when it has one (with
  options from its ``add_arguments(parser)``), else by its constructor from the shared options
  (``comm`` and, when it takes them, ``grid``/``sizes``, ``n_steps``, ``dt``);
- a factory ``factory(comm, args)`` returning a Stepper.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from typing import Protocol, runtime_checkable

from ..models import registered_models
from ..models.dmda import parse_grid


@runtime_checkable
class ModelCLI(Protocol):
    """What the command line needs of a model: its own options and a builder from parsed options."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the model's own options (defaults ``None``, so other models are not affected)."""

    def build(self, comm, args: argparse.Namespace):
        """The Stepper from parsed arguments (``args.grid`` is the --grid text or None, ``args.steps``,
        ``args.dt``); raise ValueError on bad input."""


class StepperClassCLI:
    """A Stepper class that carries its own ``from_args``/``add_arguments`` classmethods, as a ModelCLI."""

    def __init__(self, cls):
        self.cls = cls

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        hook = getattr(self.cls, "add_arguments", None)
        if callable(hook):
            hook(parser)

    def build(self, comm, args):
        from_args = getattr(self.cls, "from_args", None)
        if callable(from_args):
            return from_args(comm, args)
        return self.construct(comm, args)

    #: constructor parameters filled from the shared options, and how
    GRID_PARAMETERS = ("grid", "sizes", "shape")
    STEPS_PARAMETERS = ("n_steps", "steps")

    def construct(self, comm, args):
        """``cls(comm, ...)`` with the shared options the constructor takes (only those given, so
        its own defaults stay; an option it cannot take is left unread and refused as unused)."""
        from ..models.dmda import parse_grid

        try:
            params = inspect.signature(self.cls).parameters
        except (TypeError, ValueError):
            params = {}
        kwargs, filled = {}, {"comm"}
        for names, dest, convert in ((self.GRID_PARAMETERS, "grid", parse_grid),
                                     (self.STEPS_PARAMETERS, "steps", int), (("dt",), "dt", float)):
            name = next((n for n in names if n in params), None)
            if name is None:
                continue
            filled.add(name)
            value = getattr(args, dest)
            if value is not None:
                kwargs[name] = convert(value)
        required = [n for n, p in list(params.items())[1:] if n not in filled and p.default is p.empty
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if required:
            raise ValueError(f"model class {self.cls.__name__} needs {', '.join(required)}, which the "
                             f"command line cannot give: name a factory(comm, args) or a ModelCLI instead")
        return self.cls(comm, **kwargs)


class FactoryCLI:
    """A plain callable ``factory(comm, args) -> Stepper`` as a ModelCLI (no options of its own)."""

    def __init__(self, factory, label: str):
        self.factory, self.label = factory, label

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass

    def build(self, comm, args):
        from ..models.base import Stepper

        model = self.factory(comm, args)
        if not isinstance(model, Stepper):
            raise ValueError(f"{self.label} returned {type(model).__name__}, not a Stepper")
        return model


class _Unusable:
    """An entry point whose value is no model: adds no options, and ``build`` says why."""

    def __init__(self, why: str):
        self.why = why

    def add_arguments(self, parser) -> None:
        pass

    def build(self, comm, args):
        raise ValueError(self.why)


def _model(spec: str):
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def _t_final(args):
    """--t-final, which --adaptive needs and only --adaptive uses."""
    if args.adaptive and args.t_final is None:
        raise ValueError("--adaptive needs --t-final T (the simulated end time)")
    if args.t_final is not None and not args.adaptive:
        raise ValueError("--t-final is the end time of an --adaptive run: add --adaptive or give --steps")
    if args.adaptive and args.steps is not None:
        raise ValueError("--adaptive decides the number of steps itself: drop --steps")
    return args.t_final


class HeatCLI:
    """``--model heat``: --theta, --observations."""

    def add_arguments(self, parser):
        group = parser.add_argument_group("heat model")
        group.add_argument("--theta", type=float, default=None,
                           help="theta-scheme weight: 0.5 Crank-Nicolson (default), 1 backward Euler")
        group.add_argument("--observations", default=None, metavar="FILE.h5",
                           help="observed states: datasets 'steps' (k) and 'u' (k, [nz,] ny, nx); "
                                "default: the final state against 0")
        group.add_argument("--tolerance", type=float, default=None,
                           help="heat --adaptive: accepted error estimate per step, max norm (default 1e-4)")

    def build(self, comm, args):
        from ..models.heat import HeatModel as cls
        from ..models.observations import Observations

        from . import together

        sizes = parse_grid(args.grid or "64x64")
        n_steps = args.steps if args.steps is not None else cls.default_steps
        observations = None
        with together(comm, errors=ValueError, raise_as=ValueError):  # before the collective set-up
            observations = Observations.from_file(args.observations) if args.observations else None
        return cls(comm, sizes, n_steps=n_steps, dt=args.dt if args.dt is not None else cls.default_dt,
                   theta=args.theta if args.theta is not None else 0.5, observations=observations,
                   adaptive=args.adaptive, t_final=_t_final(args), tolerance=args.tolerance)


class BurgersCLI:
    """``--model burgers``: --viscosity, --cfl."""

    def add_arguments(self, parser):
        from ..models.burgers import BurgersModel as cls

        group = parser.add_argument_group("burgers model")
        group.add_argument("--viscosity", type=float, default=None,
                           help=f"burgers: viscosity nu (default {cls.default_nu})")
        group.add_argument("--cfl", type=float, default=None,
                           help=f"burgers: fraction of the RK3 stability limit for the default dt "
                                f"(default {cls.default_cfl})")

    def build(self, comm, args):
        from ..models.burgers import BurgersModel as cls

        sizes = parse_grid(args.grid or "64x64")
        nu = args.viscosity if args.viscosity is not None else cls.default_nu
        cfl = args.cfl if args.cfl is not None else cls.default_cfl
        n_steps = args.steps if args.steps is not None else cls.default_steps
        return cls(comm, sizes, n_steps=n_steps, nu=nu, dt=args.dt, cfl=cfl, adaptive=args.adaptive,
                   t_final=_t_final(args))


class WaveCLI:
    """``--model wave``: --observed, --observed-from-model, --anomaly, --frequency, --source-x."""

    def add_arguments(self, parser):
        from ..models.wave import WaveModel as cls

        group = parser.add_argument_group("wave model")
        group.add_argument("--observed", default=None, metavar="FILE.h5",
                           help="wave: observed traces, dataset 'traces' of shape (steps+1, receivers)")
        group.add_argument("--observed-from-model", action="store_true", default=None,
                           help="wave: observed traces from a run with the true model c_bg (1 + A gaussian) "
                                "(the default without --observed)")
        group.add_argument("--anomaly", type=float, default=None,
                           help=f"wave: relative amplitude A of the true model's anomaly "
                                f"(default {cls.default_anomaly})")
        group.add_argument("--frequency", type=float, default=None,
                           help="wave: Ricker peak frequency f0 (default 1/(12 h))")
        group.add_argument("--source-x", type=float, default=None, metavar="X",
                           help="wave: the source's position along the receivers' line, a fraction of the "
                                "width in (0, 1) (default 0.5); hpcadj invert --shots places its shots itself")

    def build(self, comm, args):
        from ..models.wave import WaveModel as cls

        if args.observed and args.observed_from_model:
            raise ValueError("give either --observed FILE or --observed-from-model, not both")
        anomaly = args.anomaly
        return cls(comm, parse_grid(args.grid or "64x64"), n_steps=args.steps, dt=args.dt,
                   frequency=args.frequency,
                   anomaly=cls.default_anomaly if anomaly is None else anomaly, observed=args.observed,
                   adaptive=args.adaptive, t_final=_t_final(args), source_x=args.source_x)


class GrayScottCLI:
    """``--model grayscott``: --feed, --kill."""

    def add_arguments(self, parser):
        from ..models.grayscott import GrayScottModel as cls

        group = parser.add_argument_group("grayscott model")
        group.add_argument("--feed", type=float, default=None,
                           help=f"grayscott: feed rate F (default {cls.default_feed})")
        group.add_argument("--kill", type=float, default=None,
                           help=f"grayscott: kill rate k (default {cls.default_kill})")

    def build(self, comm, args):
        from ..models.grayscott import GrayScottModel as cls

        return cls(comm, parse_grid(args.grid or "64x64"),
                   n_steps=args.steps if args.steps is not None else cls.default_steps,
                   dt=args.dt if args.dt is not None else cls.default_dt,
                   feed=cls.default_feed if args.feed is None else args.feed,
                   kill=cls.default_kill if args.kill is None else args.kill)


BUILTIN: dict[str, type] = {"heat": HeatCLI, "burgers": BurgersCLI, "wave": WaveCLI,
                            "grayscott": GrayScottCLI}


def _is_adapter(obj) -> bool:
    return callable(getattr(obj, "build", None)) and callable(getattr(obj, "add_arguments", None))


def adapter_for(target, label: str | None = None) -> ModelCLI:
    """The ModelCLI of an entry point's or ``--model`` spec's value: an adapter (class or instance),
    a Stepper class, or a factory ``factory(comm, args) -> Stepper``. Anything else gets an adapter
    whose ``build`` raises ValueError, so one broken plug-in does not break the other models."""
    from ..models.base import Stepper

    label = label or repr(target)
    if isinstance(target, type) and issubclass(target, Stepper):
        return StepperClassCLI(target)
    if _is_adapter(target):
        return target() if isinstance(target, type) else target
    if callable(target) and not isinstance(target, type):
        return FactoryCLI(target, label)
    return _Unusable(f"{label} is {_what(target)}, not a Stepper class, a ModelCLI (add_arguments, build) "
                     f"or a factory(comm, args) returning a Stepper")


def _what(obj) -> str:
    if isinstance(obj, type):
        return f"the class {obj.__name__}"
    kind = type(obj).__name__
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


SPEC_FORMS = "path/to/file.py:Name or package.module:Name"


def is_spec(name: str) -> bool:
    """Whether a --model value names a user's object (``file.py:Name``, ``pkg.mod:Name``)."""
    return ":" in name or name.endswith(".py")


#: --model specs loaded for the current command (hpcadj.cli.main fills it before building the parser)
PLUGGED: dict[str, ModelCLI] = {}


def plug(spec: str) -> ModelCLI:
    """Load the --model spec and remember its adapter for this command (ValueError: one line)."""
    PLUGGED.clear()
    target = load_spec(spec)
    adapter = adapter_for(target, spec)
    if isinstance(adapter, _Unusable):
        raise ValueError(f"--model {adapter.why}")
    PLUGGED[spec] = adapter
    return adapter


def load_spec(spec: str):
    """The object ``path/to/file.py:Name`` or ``package.module:Name`` names; ValueError with one
    line (the user's exception type, message and file:line) when it cannot be loaded."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ValueError(f"--model {spec}: expected a model name or {SPEC_FORMS}")
    if where.endswith(".py") or os.sep in where or "/" in where:
        module = _load_file(spec, where)
    else:
        module = _import_module(spec, where)
    try:
        return getattr(module, name)
    except AttributeError:
        raise ValueError(f"--model {spec}: {where} has no attribute {name!r}") from None


def _load_file(spec: str, path: str):
    if not os.path.isfile(path):
        raise ValueError(f"--model {spec}: no such file: {path}")
    path = os.path.abspath(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    module_name = f"hpcadj_model_{stem}_{abs(hash(path)):x}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ValueError(f"--model {spec}: {path} is not a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    folder = os.path.dirname(path)
    if folder not in sys.path:  # as `python file.py` would: its siblings import
        sys.path.insert(0, folder)
    sys.modules[module_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code: reported as one line
        sys.modules.pop(module_name, None)
        raise ValueError(f"--model {spec}: {user_error(exc)}") from None
    return module


def _import_module(spec: str, dotted: str):
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        if exc.name and (dotted == exc.name or dotted.startswith(exc.name + ".")):
            raise ValueError(f"--model {spec}: no module named {exc.name!r} (is its directory on "
                             f"PYTHONPATH?)") from None
        raise ValueError(f"--model {spec}: {user_error(exc)}") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code: reported as one line
        raise ValueError(f"--model {spec}: {user_error(exc)}") from None


def user_error(exc: BaseException) -> str:
    """``Type: message (file:line)``: where the exception was raised, in one line."""
    message = " ".join(str(exc).split())
    if isinstance(exc, SyntaxError) and exc.filename:
        message = " ".join((exc.msg or "").split())
        where = f"{exc.filename}:{exc.lineno}"
    else:
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
    return f"{type(exc).__name__}: {message} ({where})" if message else f"{type(exc).__name__} ({where})"


def spec_in_argv(argv: list[str]) -> str | None:
    """The value of the last ``--model`` in ``argv`` when it is a spec (before ``--``)."""
    found = None
    for i, token in enumerate(argv):
        if token == "--":
            break
        if token == "--model" and i + 1 < len(argv):
            found = argv[i + 1]
        elif token.startswith("--model="):
            found = token.split("=", 1)[1]
    return found if found is not None and is_spec(found) else None


def model_names() -> list[str]:
    """The names ``--model`` takes: built-in, entry points, and the spec of this command."""
    return sorted(registered_models()) + [s for s in PLUGGED if s not in registered_models()]


def model_cli(name: str) -> ModelCLI:
    """The command-line adapter of model ``name`` (ValueError for an unknown name)."""
    if name in BUILTIN:
        return BUILTIN[name]()
    if name in PLUGGED:
        return PLUGGED[name]
    models = registered_models()
    if name not in models:
        if is_spec(name):
            return plug(name)
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(sorted(models))}, or name "
                         f"your own as {SPEC_FORMS}")
    return adapter_for(_model(models[name]), name)
