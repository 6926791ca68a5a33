"""Where a run stands: what the driver tells an observer as the run goes, and where a resumed run
starts. The driver (``adjoint/``) and durable progress (``restart/``) both use these types, so they
live below both.
"""

from __future__ import annotations

from dataclasses import dataclass


class RunObserver:
    """What the driver tells an observer as the run goes (every rank, same points of the plan).

    ``J`` is the objective accumulated so far. The base class ignores everything.
    """

    def stored(self, step: int, level, J: float) -> None:
        """A snapshot of the first sweep's frontier state ``step`` was written to ``level``."""

    def moved(self, step: int, level) -> None:
        """During the first sweep the snapshot of ``step`` was moved to ``level``."""

    def advanced(self, step: int, state, J: float) -> None:
        """The first sweep reached ``step`` (``state`` is u_step; do not change it)."""

    def adjoint(self, step: int, lam, grad: dict, J: float) -> None:
        """The reverse sweep computed ``lam`` = lambda_step; ``grad`` holds the gradient so far."""

    def stopping(self, step: int | None, lam, grad: dict, J: float) -> None:
        """A stop was requested; ``step`` is the adjoint step reached (None: still forward)."""


@dataclass
class ResumePoint:
    """Where a resumed run starts: the forward frontier and J there, and lambda_m if reverse had begun."""

    frontier: int
    J: float
    lam_step: int | None = None
    lam: object = None            # PETSc Vec, lambda at lam_step
    grad: dict | None = None      # control name -> PETSc Vec, gradient accumulated so far
