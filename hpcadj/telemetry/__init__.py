"""Telemetry: every phase timed (PETSc.Log events + in-memory totals), logged, and costed in energy."""

from .energy import EnergyMeter, RaplReader, sacct_energy
from .energy_model import EnergyModel, load_model
from .jsonlog import LogDirError, RunLog, open_run_log
from .progress import SweepProgress
from .recorder import PhaseTotal, Telemetry

__all__ = ["EnergyMeter", "EnergyModel", "LogDirError", "PhaseTotal", "RaplReader", "RunLog",
           "SweepProgress", "Telemetry", "load_model", "open_run_log", "sacct_energy"]
