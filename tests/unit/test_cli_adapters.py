"""Models reach the command line through CLI adapters (hpcadj.cli.models), not Stepper hooks: every
built-in model has one (plug-ins on the command line: tests/cli/test_cli_models.py)."""

import importlib

import pytest

from hpcadj.cli.models import BUILTIN, model_cli
from hpcadj.models import MODELS
from hpcadj.models.base import Stepper


def test_stepper_has_no_cli_hooks_and_every_builtin_has_an_adapter():
    assert not hasattr(Stepper, "from_args") and not hasattr(Stepper, "add_arguments")
    assert set(BUILTIN) == set(MODELS)
    for name, spec in MODELS.items():
        module, cls = spec.split(":")
        assert not hasattr(getattr(importlib.import_module(module), cls), "from_args"), name
        assert callable(model_cli(name).build)
    with pytest.raises(ValueError, match="unknown model"):
        model_cli("no-such-model")
