"""PDE time steppers on PETSc DMDA (physics only), selectable by name."""

from .base import Stepper

MODELS: dict[str, str] = {
    "heat": "hpcadj.models.heat:HeatModel",
    "burgers": "hpcadj.models.burgers:BurgersModel",
    "wave": "hpcadj.models.wave:WaveModel",
    "grayscott": "hpcadj.models.grayscott:GrayScottModel",
}


ENTRY_POINT_GROUP = "hpcadj.models"


def registered_models() -> dict[str, str]:
    """Built-in models plus those other packages declare under the ``hpcadj.models`` entry point."""
    from importlib.metadata import entry_points

    found = dict(MODELS)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
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
