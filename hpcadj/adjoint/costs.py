"""What a session measures before it plans: step and level costs, and the memory baseline."""

from __future__ import annotations

from ..checkpoint.memory import process_rss_bytes
from ..checkpoint.options import Checkpointing, ConfigError
from ..checkpoint.schedules import CostProfile
from ..checkpoint.storage.base import LevelError


def measure_costs(model, checkpointing: Checkpointing | None = None, *, controls=None, repeats: int = 3,
                  slots: int | None = None, energy_model=None) -> CostProfile:
    """Measure the model's step costs and each level's write/read cost with the current ranks.

    Measures RAM and node-local disk always (``checkpointing.local_dir``), the HDF5 level when
    ``checkpointing.pfs_file`` is set, each with ``slots`` (default ``repeats``) slots. The profile's
    ``source`` is ``"calibrated"``. Collective.
    """
    from ..checkpoint.calibrate import calibrate
    from ..checkpoint.manager import LevelPlan

    ck = checkpointing or Checkpointing()
    slots = slots or repeats
    plans = [LevelPlan("ram", "ram", slots), LevelPlan("disk", "local", slots)]
    if ck.pfs_file:
        plans.append(LevelPlan("pfs", "pfs", slots))
    controls = controls if controls is not None else model.default_controls()
    try:
        profile = calibrate(model, controls, model.comm, plans, ck.config(), repeats=repeats,
                            energy_model=energy_model)
    except (OSError, LevelError) as exc:  # an unusable local directory or HDF5 file
        raise ConfigError(str(exc)) from None
    profile.source = "calibrated"
    return profile


def warmed_baseline(build_small) -> int | None:
    """The process's resident set after a store-all gradient of a tiny model, as the memory baseline.

    ``build_small()`` returns a model of the same kind on a tiny grid (a few steps). Its gradient
    pays the one-off costs no working-set count holds: JIT-compiled kernels (numba's, about 55 MiB
    for wave), PETSc's and the solvers' first allocations, the allocator's pools. Measured before
    the real model exists, the real model's states are then predicted on top of it. Collective.
    """
    import gc

    from ..imports import petsc
    from .verify import compute_gradient

    small = build_small()
    comm = small.comm
    result = compute_gradient(small, small.default_controls())
    for vec in result.gradient.values():
        vec.destroy()
    del small, result
    gc.collect()
    petsc().garbage_cleanup(comm)
    return process_rss_bytes()
