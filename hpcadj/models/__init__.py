"""PDE time steppers on PETSc DMDA (physics only), selectable by name."""

import functools

from .base import Stepper

MODELS: dict[str, str] = {
    "heat": "hpcadj.models.heat:HeatModel",
    "burgers": "hpcadj.models.burgers:BurgersModel",
    "wave": "hpcadj.models.wave:WaveModel",
    "grayscott": "hpcadj.models.grayscott:GrayScottModel",
}


ENTRY_POINT_GROUP = "hpcadj.models"


@functools.cache
def _declared() -> tuple[tuple[str, str], ...]:
    """(name, target) of every ``hpcadj.models`` entry point, read once a process: each scan reads
    every installed distribution's metadata (30-50 ms), and a command's start-up asks a dozen times."""
    from importlib.metadata import entry_points

    return tuple((ep.name, ep.value) for ep in entry_points(group=ENTRY_POINT_GROUP))


def registered_models() -> dict[str, str]:
    """Built-in models plus those other packages declare under the ``hpcadj.models`` entry point."""
    found = dict(MODELS)
    for name, value in _declared():
        found.setdefault(name, value)
    return found


def model_class(name: str) -> type[Stepper]:
    """The Stepper class registered as ``name`` (ValueError for an unknown name)."""
    import importlib

    models = registered_models()
    try:
        module, cls = models[name].split(":")
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(sorted(models))}") from None
    return getattr(importlib.import_module(module), cls)


__all__ = ["ENTRY_POINT_GROUP", "MODELS", "Stepper", "model_class", "registered_models"]
