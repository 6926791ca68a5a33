"""Measure what a plan costs on this machine: step and adjoint-step time, and each level's I/O.

The result is a :class:`CostProfile` (seconds, and joules from the energy model, labelled with
its source) that ``plan`` and ``run --schedule auto`` use. Every timing is the slowest rank's
(ranks wait for each other at the next collective), the median over repeats.
"""

from __future__ import annotations

import statistics
import time

from ..checkpoint.schedules import CostProfile, LevelCost
from ..checkpoint.storage.factory import make_level
from .manager import CheckpointConfig, LevelPlan


def _timed(comm, fn, repeats: int) -> float:
    """Median over ``repeats`` of the slowest rank's seconds for ``fn()``."""
    from ..stack import mpi

    samples = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        samples.append(comm.allreduce(time.perf_counter() - t0, op=mpi().MAX))
    return statistics.median(samples)


def calibrate(model, controls, comm, plans: list[LevelPlan], config: CheckpointConfig,
              repeats: int = 3, energy_model=None) -> CostProfile:
    """A cost profile for ``model`` with the current ranks and the levels in ``plans``."""
    from ..telemetry import load_model

    energy = energy_model if energy_model is not None else load_model(None)
    cores = comm.size
    model.set_controls(controls)
    u = model.initial_state()
    states = [u]
    forward_s = _timed(comm, lambda: states.append(model.step(len(states) - 1, states[-1])), repeats)
    u_i, u_next = states[-2], states[-1]
    lam = u_next.copy()
    grad = {name: vec.duplicate() for name, vec in controls.items()}
    adjoint_s = _timed(comm, lambda: model.adjoint_step(len(states) - 2, u_i, u_next, lam, grad), repeats)

    layout = model.snapshot_layout()
    snapshot = model.snapshot(u_next)
    # bytes one snapshot moves on all ranks together: a write or read costs every rank's block, as
    # the run logs count it (the compute part is already scaled by ``cores``)
    nbytes = comm.allreduce(sum(f.local_nbytes for f in layout.values()))
    levels = []
    for plan in plans:
        levels.append(_level_cost(plan, layout, comm, config, snapshot, repeats, forward_s,
                                  energy, nbytes, cores))
    return CostProfile(forward_s=forward_s, adjoint_s=adjoint_s, levels=levels,
                       forward_j=energy.forward_step_joules(forward_s, cores),
                       adjoint_j=energy.adjoint_step_joules(adjoint_s, cores), source="model")


def _level_cost(plan, layout, comm, config, snapshot, repeats, forward_s, energy, nbytes, cores):
    """Write/read seconds per snapshot on one level kind, and the share of a write async I/O hides."""
    def measure(async_io: bool):
        level = make_level(plan.kind, repeats, layout, comm, name=f"calibrate-{plan.name}",
                           path=f"{config.pfs_file}.calibrate" if config.pfs_file else None,
                           local_dir=config.local_dir, async_io=async_io,
                           run_id=None)
        try:
            steps = iter(range(repeats))
            visible = _timed(comm, lambda: level.write(next(steps), snapshot), repeats)
            level.flush()
            total_write = level.stats.write_s / max(level.stats.writes, 1)
            reads = iter(range(repeats))
            read_s = _timed(comm, lambda: level.read(next(reads)), repeats)
            for step in range(repeats):
                level.free(step)
        finally:
            level.close()
        return visible, total_write, read_s

    sync_write, _, read_s = measure(async_io=False)
    overlap = 0.0
    if plan.kind != "ram" and config.async_io:
        visible, _, _ = measure(async_io=True)
        # hidden share of a write, at most what one forward step of compute can cover
        hidden = max(0.0, 1.0 - visible / sync_write) if sync_write > 0 else 0.0
        overlap = min(hidden, forward_s / sync_write if sync_write > 0 else 1.0, 1.0)
    kind = plan.kind
    return LevelCost(plan.name, write_s=sync_write, read_s=read_s,
                     write_j=energy.write_joules(kind, nbytes, sync_write, cores),
                     read_j=energy.read_joules(kind, nbytes, read_s, cores), overlap=overlap)
