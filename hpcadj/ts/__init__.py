"""Bring your own petsc4py TS: hpcadj's checkpointing under PETSc's own step-by-step adjoint."""

from .stepper import CONTROL_U0, TSRefused, TSStepper

__all__ = ["CONTROL_U0", "TSRefused", "TSStepper"]
