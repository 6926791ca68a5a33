"""Command-line adapters of the models: the options each adds and how it is built from them.

The Stepper contract (``hpcadj.models.base``) is physics only; argparse lives here. A model reaches
``hpcadj run --model NAME`` through a :class:`ModelCLI`: the built-in models through the adapters
below, another package's through the ``hpcadj.models`` entry point, whose value is either

- a :class:`ModelCLI` (a class, instantiated without arguments, or an instance), or
- a Stepper class that itself defines the classmethods ``from_args(comm, args)`` and optionally
  ``add_arguments(parser)`` (the protocol before adapters existed; still honoured).
"""

from __future__ import annotations

import argparse
import importlib
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
        if not callable(from_args):
            raise ValueError(f"model class {self.cls.__name__} has no command-line adapter: register a "
                             f"ModelCLI (hpcadj.cli.models) under the entry point, or give the class "
                             f"a from_args(comm, args) classmethod")
        return from_args(comm, args)


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

        sizes = parse_grid(args.grid or "64x64")
        n_steps = args.steps if args.steps is not None else cls.default_steps
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
    """``--model wave``: --observed, --observed-from-model, --anomaly, --frequency."""

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

    def build(self, comm, args):
        from ..models.wave import WaveModel as cls

        if args.observed and args.observed_from_model:
            raise ValueError("give either --observed FILE or --observed-from-model, not both")
        anomaly = args.anomaly
        return cls(comm, parse_grid(args.grid or "64x64"), n_steps=args.steps, dt=args.dt,
                   frequency=args.frequency,
                   anomaly=cls.default_anomaly if anomaly is None else anomaly, observed=args.observed,
                   adaptive=args.adaptive, t_final=_t_final(args))


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


def adapter_for(target) -> ModelCLI:
    """The ModelCLI of an entry point's value: an adapter (class or instance), or a Stepper class
    with its own ``from_args``. Anything else gets an adapter whose ``build`` raises ValueError, so
    one broken plug-in does not break the command line for the other models."""
    from ..models.base import Stepper

    if isinstance(target, type) and issubclass(target, Stepper):
        return StepperClassCLI(target)
    adapter = target() if isinstance(target, type) else target
    if not (callable(getattr(adapter, "build", None)) and callable(getattr(adapter, "add_arguments", None))):
        return _Unusable(f"{target!r} is neither a ModelCLI (add_arguments, build) nor a Stepper class")
    return adapter


def model_cli(name: str) -> ModelCLI:
    """The command-line adapter of model ``name`` (ValueError for an unknown name)."""
    if name in BUILTIN:
        return BUILTIN[name]()
    models = registered_models()
    if name not in models:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(sorted(models))}")
    return adapter_for(_model(models[name]))
