"""hpcadj: exact discrete adjoints of MPI-distributed PETSc time steppers inside a memory budget.

The public API, importable from here (``from hpcadj import GradientSession, Checkpointing``) and
documented in docs/api.md. Names load on first use (PEP 562), so ``import hpcadj`` and the command
line's start-up import no PETSc, MPI or numpy.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    # a checkpointed gradient as a library call
    "GradientSession": "hpcadj.adjoint.session",
    "Checkpointing": "hpcadj.checkpoint.options",
    "Restart": "hpcadj.adjoint.session",
    "Outcome": "hpcadj.adjoint.session",
    "PlannedRun": "hpcadj.checkpoint.provision",
    "ConfigError": "hpcadj.checkpoint.options",
    "measure_costs": "hpcadj.adjoint.session",
    # the model seam
    "Stepper": "hpcadj.models.base",
    "SolverError": "hpcadj.models.base",
    "Grid": "hpcadj.models.dmda",
    "FieldLayout": "hpcadj.snapshot",
    "AdaptiveSteps": "hpcadj.models.adaptive",
    "StepSequence": "hpcadj.models.adaptive",
    "scalar_vec": "hpcadj.models.common",
    "scalar_value": "hpcadj.models.common",
    "scalar_add": "hpcadj.models.common",
    # a user's own petsc4py TS as a Stepper
    "TSStepper": "hpcadj.ts",
    # verification
    "taylor_test": "hpcadj.adjoint.verify",
    "dot_product_test": "hpcadj.adjoint.verify",
    "check_contract": "hpcadj.adjoint.contract",
    "ContractReport": "hpcadj.adjoint.contract",
    # the lower layer: plans, levels, the driver
    "compute_gradient": "hpcadj.adjoint.verify",
    "Driver": "hpcadj.adjoint.driver",
    "GradientResult": "hpcadj.adjoint.driver",
    "make_schedule": "hpcadj.checkpoint.schedules",
    "CostProfile": "hpcadj.checkpoint.schedules",
    "make_level": "hpcadj.checkpoint.storage",
    "Level": "hpcadj.checkpoint.storage",
}

__all__ = sorted(_EXPORTS)  # noqa: PLE0605 - one table of names, loaded lazily


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hpcadj' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
