"""Optimisation on top of checkpointed gradients: TAO-driven inversion that never pays a forward
sweep twice at bitwise-identical controls, with durable iterates for SLURM restarts.

- :mod:`.space`: the inverted controls packed into the one Vec TAO optimises, and Tikhonov terms;
- :mod:`.cache`: evaluations keyed by a hash of every rank's control bytes and the configuration;
- :mod:`.iterates`: accepted iterates made durable (controls file and state, checksummed);
- :mod:`.driver`: :class:`Inversion`, the TAO loop with bounds, iteration cap, stop and resume.
"""

from .cache import EvaluationCache, Evaluation, control_hash
from .driver import Inversion, InversionError, InversionResult, StopInversion
from .iterates import IterateStore
from .space import ControlSpace

__all__ = ["ControlSpace", "EvaluationCache", "Evaluation", "Inversion", "InversionError", "InversionResult",
           "IterateStore", "StopInversion", "control_hash"]
