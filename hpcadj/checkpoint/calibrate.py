"""Measure what a plan costs on this machine: step and adjoint-step time, and each level's I/O.

The result is a :class:`CostProfile` (seconds, and joules from the energy model, labelled with
its source) that ``plan`` and ``run --schedule auto`` use. Every timing is the slowest rank's, the
median over repeats, and a steady-state one: ``warmup`` untimed calls come first (JIT loading,
first-touch page faults of new buffers, a model's buffer pool filling, a level's first file or
slot), and each call is timed as the driver runs it (the last two states kept, ``garbage_cleanup``
after every call, the adjoint with its objective term). Steps and adjoint steps are timed in runs
of :data:`BLOCK` back-to-back calls with no barrier between them, as the driver runs them: ranks
that are not equally fast, or jitter on one of them, then cost what they cost in a run (a barrier
before every call hid a 30 % slower rank; predictions ran 16-26 % short). Timing the first calls
overestimated a wave 128^3 step several times over.

A model with an advance of its own (a time-tiled one) gets its cost as a function of the run length
m (:func:`advance_cost`): advances of m = 2, 4, T, 2T, 4T steps (T its tile depth; fewer in a run's
brief calibration) timed as the driver makes them, and a line ``fixed + m * per_step`` fitted through
them (:class:`~.schedules.costs.AdvanceCost`); a model without one gets none, and its plans price a
run of m steps as m single steps.

A model that declares its adjoint data gets the cost of a step reversed from them (:func:`data_cost`):
the capture of a step's data and the stand-in state its adjoint step reads (their memory's first
touch is the RAM level's, below).

A RAM level also gets its first-touch cost (``LevelCost.fill_s``): the mean seconds to fault in one
snapshot's worth of fresh memory over as many slots as the level has, held at once as a run holds
them, which a run pays once for every slot it fills (the state a level holds by reference is memory
the model's later steps cannot reuse).
"""

from __future__ import annotations

import os
import statistics
import time

from .schedules import CostProfile, LevelCost
from .schedules.costs import AdvanceCost
from ..snapshot import layout_bytes, mapped_empty
from .storage.factory import make_level
from .storage.base import LevelError, agree_run_id
from .storage.local import SCRATCH_PREFIX
from .manager import CheckpointConfig, LevelPlan
from ..collective import agree_or_raise
from ..imports import mpi, petsc
from ..telemetry import load_model


#: back-to-back calls per timed sample of a step or an adjoint step
BLOCK = 5


def _timed(comm, fn, repeats: int, calls: int = 1) -> float:
    """Median over ``repeats`` of the slowest rank's seconds per call of ``calls`` calls to ``fn()``."""
    samples = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append(comm.allreduce(time.perf_counter() - t0, op=mpi().MAX) / calls)
    return statistics.median(samples)


#: at most this many bytes a rank, and this many blocks, of fresh memory held while measuring a RAM
#: slot's first touch
FILL_PROBE_BYTES = 512 * 2 ** 20
FILL_PROBE_SLOTS = 64


def _fill_seconds(comm, nbytes: int, slots: int, repeats: int) -> float:
    """Mean seconds a run pays to fault in one fresh RAM slot (``nbytes`` a rank), slowest rank.

    A run fills its slots one after another and keeps them, so the blocks here are held too, on
    every rank at once, as many as the level has slots (at most FILL_PROBE_SLOTS blocks and
    FILL_PROBE_BYTES a rank; at least ``repeats``, 3 or more): freed and allocated again, a block
    reuses the pages just freed and reads a warm figure. On a virtual machine the first few hundred
    MiB may come from such warm pages while the rest costs a host page fault each (seen: 8 ms per
    16 MiB slot for the first 24 of two ranks' slots, 59 ms for the last 8 of 32). Slots beyond the
    probe are priced at the mean of its last quarter."""
    probe = max(min(slots, FILL_PROBE_SLOTS, FILL_PROBE_BYTES // max(nbytes, 1)), repeats, 3)
    samples, held = [], []
    for _ in range(probe):
        comm.Barrier()
        t0 = time.perf_counter()
        block = mapped_empty((max(nbytes // 8, 1),), "f8")
        block.fill(0.0)
        elapsed = time.perf_counter() - t0
        held.append(block)
        samples.append(comm.allreduce(elapsed, op=mpi().MAX))
    del held
    if slots <= probe:
        return statistics.fmean(samples)
    tail = statistics.fmean(samples[-max(probe // 4, 1):])
    return (sum(samples) + (slots - probe) * tail) / slots


def _fit_line(runs: list) -> tuple[float, float]:
    """Least-squares ``(fixed, per_step)`` through ``runs`` ([m, seconds] pairs), both kept >= 0."""
    ms = [m for m, _ in runs]
    ts = [t for _, t in runs]
    if len(set(ms)) >= 2:
        mean_m, mean_t = statistics.fmean(ms), statistics.fmean(ts)
        slope = (sum((m - mean_m) * (t - mean_t) for m, t in runs) / sum((m - mean_m) ** 2 for m in ms))
        fixed = mean_t - slope * mean_m
        if fixed >= 0 and slope >= 0:
            return fixed, slope
    per_step = sum(m * t for m, t in runs) / sum(m * m for m in ms)  # through the origin
    return 0.0, max(per_step, 0.0)


def advance_cost(model, comm, repeats: int = 3, brief: bool = False) -> AdvanceCost | None:
    """The model's own advance timed over run lengths m = 2, 4, T, 2T, 4T (T its tile depth, 8 if it
    has none; ``brief``: 2, T and 4T), each from u_0 as a recomputation makes it (the input kept, the
    result freed, ``garbage_cleanup`` after), the slowest rank's median; None for a model whose
    advance is the default loop over ``step``. Collective."""
    if not getattr(model, "has_own_advance", lambda: False)() or (model.n_steps or 0) < 2:
        return None
    depth = model.tile_depth() if hasattr(model, "tile_depth") else None
    T = depth or 8
    wanted = (2, T, 4 * T) if brief else (2, 4, T, 2 * T, 4 * T)
    lengths = sorted({min(m, model.n_steps) for m in wanted if m >= 2})
    start = model.initial_state()

    def advance(m):
        model.advance(0, start, m).destroy()
        petsc().garbage_cleanup(comm)

    runs = []
    for m in lengths:
        advance(m)  # warm-up: the tiler's buffers, the kernels' first call
        runs.append([m, _timed(comm, lambda: advance(m), repeats)])
    start.destroy()
    fixed, per_step = _fit_line(runs)
    return AdvanceCost(fixed_s=fixed, step_s=per_step, first=bool(model.advance_objective), depth=depth,
                       runs=runs)


def data_cost(model, comm, i: int, u, u_next, repeats: int = 3) -> float | None:
    """Seconds of a step reversed from its adjoint data beyond its adjoint step: the capture of
    step i's data from (u, u_next) and the stand-in state built from them, in warm memory (the first
    touch of the memory data slots hold is the RAM level's ``fill_s``, priced per slot of a plan's
    peak as for restart states); the slowest rank's median over ``repeats`` blocks of ``BLOCK``.
    None for a model that declares no adjoint data. Collective."""
    layout = model.adjoint_data_layout() if hasattr(model, "adjoint_data_layout") else None
    if layout is None:
        return None

    def reversed_from_data():
        data = model.adjoint_data(i, u, u_next)
        model.adjoint_data_state(i, data).destroy()
        petsc().garbage_cleanup(comm)

    reversed_from_data()  # warm-up: the pool's buffer, the capture's memory
    return _timed(comm, reversed_from_data, repeats, BLOCK)


def calibrate(model, controls, comm, plans: list[LevelPlan], config: CheckpointConfig,
              repeats: int = 3, energy_model=None, warmup: int = 2, brief: bool = False) -> CostProfile:
    """A cost profile for ``model`` with the current ranks and the levels in ``plans`` (``brief``: a
    run's own calibration, fewer advance lengths)."""
    energy = energy_model if energy_model is not None else load_model(None)
    cores = comm.size
    model.set_controls(controls)
    states = [model.initial_state()]
    steps = [0]

    def forward():
        i = steps[0] % max(model.n_steps, 1)
        states.append(model.step(i, states[-1]))
        del states[:-2]  # the driver keeps two
        steps[0] += 1
        petsc().garbage_cleanup(comm)

    for _ in range(warmup):
        forward()
    forward_s = _timed(comm, forward, repeats, BLOCK)
    u_i, u_next = states[-2], states[-1]
    grad = {name: vec.duplicate() for name, vec in controls.items()}
    lams = [u_next.copy()]
    i_adj = max(min(steps[0], model.n_steps) - 1, 0)

    def adjoint():
        lam = model.adjoint_step(i_adj, u_i, u_next, lams[-1], grad)
        model.add_objective_gradient(i_adj, u_i, lam)
        lams.append(lam)
        del lams[:-2]
        petsc().garbage_cleanup(comm)

    for _ in range(warmup):
        adjoint()
    adjoint_s = _timed(comm, adjoint, repeats, BLOCK)
    lams.clear()
    data_s = data_cost(model, comm, i_adj, u_i, u_next, repeats)
    advance = advance_cost(model, comm, repeats, brief)

    layout = model.snapshot_layout()
    snapshot = model.snapshot(u_next)
    # bytes one snapshot moves on all ranks together: a write or read costs every rank's block, as
    # the run logs count it (the compute part is already scaled by ``cores``)
    nbytes = comm.allreduce(layout_bytes(layout))
    levels = []
    for plan in plans:
        levels.append(_level_cost(plan, layout, comm, config, snapshot, repeats, forward_s,
                                  energy, nbytes, cores, model))
    return CostProfile(forward_s=forward_s, adjoint_s=adjoint_s, levels=levels,
                       forward_j=energy.forward_step_joules(forward_s, cores),
                       adjoint_j=energy.adjoint_step_joules(adjoint_s, cores), source="model",
                       advance=advance, data_s=data_s)


def remove_stale_scratch(comm, path: str) -> None:
    """Remove the shared scratch file ``path`` a killed calibration left (the name is calibration's
    own); rank 0 removes it, and a failure is every rank's LevelError at once. Collective."""
    problem = None
    if comm.rank == 0 and os.path.isfile(path):
        try:
            os.remove(path)
        except OSError as exc:
            problem = f"cannot remove {path}, left by a killed calibration: {exc.strerror or exc}"
    agree_or_raise(comm, problem, LevelError, first=True)


def _level_cost(plan, layout, comm, config, snapshot, repeats, forward_s, energy, nbytes, cores, model):
    """Write/read seconds per snapshot on one level kind, and the share of a write async I/O hides.

    Writes donate the snapshot as the driver's stores do (a RAM level then holds it by reference,
    an asynchronous one writes it without a staging copy). A read is timed as the driver's restore
    runs it: the level's read and the model's ``restore`` of it into a state (a RAM read alone
    returns views and costs nothing; the copy into a state is the cost)."""
    def restore(level, step):
        model.restore(level.read(step))
        petsc().garbage_cleanup(comm)

    scratch = f"{config.pfs_file}.calibrate" if config.pfs_file else None
    if plan.kind == "pfs" and scratch:
        remove_stale_scratch(comm, scratch)

    def measure(async_io: bool):
        # a scratch run id: node-local files of a calibration killed here are swept by the next level
        level = make_level(plan.kind, repeats, layout, comm, name=f"calibrate-{plan.name}",
                           path=scratch, local_dir=config.local_dir, async_io=async_io,
                           run_id=SCRATCH_PREFIX + agree_run_id(comm))
        try:
            for step in range(repeats):  # warm-up: the slots', files' and page cache's first touch
                level.write(step, snapshot, donate=True)
            level.flush()
            for step in range(repeats):
                level.read(step)
                level.free(step)
            steps = iter(range(repeats))
            visible = _timed(comm, lambda: level.write(next(steps), snapshot, donate=True), repeats)
            level.flush()
            total_write = level.stats.write_s / max(level.stats.writes, 1)
            reads = iter(range(repeats))
            read_s = _timed(comm, lambda: restore(level, next(reads)), repeats)
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
    local = layout_bytes(layout)
    fill_s = _fill_seconds(comm, local, plan.slots, repeats) if kind == "ram" else 0.0
    return LevelCost(plan.name, write_s=sync_write, read_s=read_s,
                     write_j=energy.write_joules(kind, nbytes, sync_write, cores),
                     read_j=energy.read_joules(kind, nbytes, read_s, cores), overlap=overlap, fill_s=fill_s)
