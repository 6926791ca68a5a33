"""PDE time steppers on PETSc DMDA (physics only), selectable by name."""

from .base import Stepper

MODELS: dict[str, str] = {
    "heat": "hpcadj.models.heat:HeatModel",
}


def model_class(name: str) -> type[Stepper]:
    """The Stepper class registered as ``name`` (ValueError for an unknown name)."""
    import importlib

    try:
        module, cls = MODELS[name].split(":")
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}") from None
    return getattr(importlib.import_module(module), cls)


__all__ = ["MODELS", "Stepper", "model_class"]
