"""Telemetry: every phase timed (PETSc.Log events + in-memory totals), logged, and costed in energy."""

from .recorder import PhaseTotal, Telemetry

__all__ = ["PhaseTotal", "Telemetry"]
