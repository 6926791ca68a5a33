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


#: forward steps of the warm-up model: the first sweep's single-step input checks, then advances
WARM_UP_STEPS = 6
#: RAM slots of the warm-up's revolve plan: fewer than its steps, so both sweeps run advances
WARM_UP_SLOTS = 2


def warm_up(model, second_order: bool = False) -> None:
    """Run once on ``model`` (tiny, :data:`WARM_UP_STEPS` fixed steps) everything a command's
    computation loads on first use: a revolve-checkpointed gradient, whose first sweep and
    recomputations hand runs of steps to the model's ``advance`` (wave's tiled kernels) beside its
    single and adjoint steps; for a model declaring adjoint data, its data check and a gradient
    reversing every step from its data; with ``second_order`` a Hessian product (tangent and
    second-order adjoint steps). Collective."""
    from ..checkpoint.schedules import Revolve
    from ..checkpoint.storage import RamLevel
    from .hessian import hessian_action
    from .verify import compute_gradient, scaled_direction

    controls = model.default_controls()
    slots = min(WARM_UP_SLOTS, model.n_steps)
    compute_gradient(model, controls, schedule=Revolve(model.n_steps, [slots]),
                     levels=[RamLevel(slots, model.snapshot_layout())])
    if model.adjoint_data_layout() is not None:
        # a mixed plan's reverse steps from data load their own kernels (and the data check's)
        from ..checkpoint.mixed_plan import mixed_sizes
        from ..checkpoint.options import ConfigError
        from ..checkpoint.schedules.mixed import Mixed
        from .data_check import refuse_untrusted_data

        try:
            refuse_untrusted_data(model, controls, "the warm-up's mixed plan")
        except ConfigError:
            return  # the real model's check refuses it with the run's own words, if a plan needs data
        r, d = mixed_sizes(model)
        compute_gradient(model, controls, schedule=Mixed(model.n_steps, [model.n_steps * max(r, d)], r, d,
                                                         states_suffice=False),
                         levels=[RamLevel(slots, model.snapshot_layout())])
    if second_order:
        hessian_action(model, controls, scaled_direction(model, controls, 1))


def warmed_baseline(build_small, second_order: bool = False) -> int | None:
    """The process's resident set after :func:`warm_up` of a tiny model, as the memory baseline.

    ``build_small()`` returns a model of the same kind on a tiny grid with :data:`WARM_UP_STEPS`
    steps. The warm-up pays the one-off costs no working-set count holds: JIT-compiled kernels
    (numba's, about 55 MiB for wave, its tiled advance's too), PETSc's and the solvers' first
    allocations, the allocator's pools. Measured before the real model exists, the real model's
    states are then predicted on top of it. Collective.
    """
    import gc

    from ..imports import petsc

    small = build_small()
    comm = small.comm
    warm_up(small, second_order)
    del small
    gc.collect()
    petsc().garbage_cleanup(comm)
    return process_rss_bytes()
