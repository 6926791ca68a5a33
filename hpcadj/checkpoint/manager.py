"""The multi-level checkpoint manager's parts: budgets -> slots, levels from their plans, the plan.

Levels (:mod:`hpcadj.levelkinds`) are always ordered fastest first. A budget in bytes
becomes slots through the largest rank's snapshot block (or the global snapshot for a whole-file
budget), so every rank derives the same slot counts and hence the same plan. The order in which a
run uses these parts is :func:`hpcadj.checkpoint.provision.provision`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..snapshot import layout_bytes, layout_global_bytes
from .budget import parse_budget
from ..levelkinds import LEVEL_KINDS
from .schedules import CostProfile, ScheduleError, make_schedule, store_all_slots
from .storage.factory import make_level
from ..imports import mpi
from .storage.local import purge_node_local


@dataclass(frozen=True)
class CheckpointConfig:
    """What the user asked for: budgets per level (slots or bytes) and where file levels live; never
    changed in place (``dataclasses.replace`` makes a changed copy)."""

    budgets: dict = field(default_factory=dict)  # level name -> "8" | "2GiB" | None
    local_dir: str | None = None
    pfs_file: str | None = None
    async_io: bool = True
    keep: bool = False
    run_id: str | None = None


@dataclass(frozen=True)
class LevelPlan:
    """One level in use: its name, storage kind and slot count; for a compressed level its codec
    and the bytes of one encoded slot, and for a compressed RAM level the bytes of its pool."""

    name: str
    kind: str
    slots: int
    codec: object = None
    slot_bytes: int | None = None
    pool_bytes: int | None = None
    margin: float = 1.0


def snapshot_slot_bytes(layout, comm) -> dict[str, int]:
    """Bytes one snapshot costs each level kind's budget (identical on every rank)."""
    local = comm.allreduce(layout_bytes(layout), op=_mpi_max())
    return {"ram": local, "local": local, "pfs": layout_global_bytes(layout)}


def level_slots(config: CheckpointConfig, layout, comm, n_steps: int) -> list[LevelPlan]:
    """The levels with a positive budget, fastest first; RAM for store-all when no budget is given."""
    sizes = snapshot_slot_bytes(layout, comm)
    plans = []
    for name, kind in ((k.name, k.kind) for k in LEVEL_KINDS):
        text = config.budgets.get(name)
        if text is None:
            continue
        try:
            slots = parse_budget(text).to_slots(sizes[kind])
        except ValueError as exc:
            raise ValueError(f"--{name}: {exc}") from None
        if slots > 0:
            plans.append(LevelPlan(name, kind, slots))
    if not any(config.budgets.get(k.name) is not None for k in LEVEL_KINDS):
        plans.append(LevelPlan("ram", "ram", store_all_slots(n_steps)))
    if not plans:
        raise ValueError("no level has room for one snapshot: raise --ram, --disk or --pfs "
                         f"(one snapshot is {sizes['ram']} bytes per rank, {sizes['pfs']} bytes in all)")
    if any(p.kind == "pfs" for p in plans) and not config.pfs_file:
        raise ValueError("--pfs needs --pfs-file PATH.h5 (on a shared file system)")
    return plans


def build_levels(plans: list[LevelPlan], layout, comm, config: CheckpointConfig,
                 attach: frozenset = frozenset()):
    """Create the storage levels (collective: every rank, same order), each of the class its plan
    names (a compressed plan's codec gives an encoded or pooled level, see ``make_level``).

    Levels whose kind is in ``attach`` reopen the snapshots an earlier run with the same run id
    left; other file levels of a resumed run start empty under a fresh run id.
    """
    levels = []
    try:
        for plan in plans:
            reopen = plan.kind in attach
            run_id = config.run_id if reopen or not attach else None
            extra = {"attach": True} if reopen else {}
            if attach and not reopen and plan.kind == "local":
                extra = {"purge_run_id": config.run_id}
            if plan.codec is not None:
                extra.update(codec=plan.codec, slot_bytes=plan.slot_bytes, pool_bytes=plan.pool_bytes,
                             margin=plan.margin)
            levels.append(make_level(plan.kind, plan.slots, layout, comm, name=plan.name,
                                     path=config.pfs_file, local_dir=config.local_dir,
                                     async_io=config.async_io,
                                     keep=config.keep, run_id=run_id, **extra))
    except Exception:
        for level, plan in zip(levels, plans):
            if plan.kind not in attach:  # made fresh here, nothing of value in it: not kept
                level.keep = False
            level.close()
        raise
    if attach and not any(plan.kind == "local" for plan in plans):  # resumed without --disk

        purge_node_local(comm, config.local_dir, config.run_id)
    return levels


def profile_for(plans: list[LevelPlan], profile: CostProfile | None) -> CostProfile:
    """The cost profile restricted to the levels in use, matched by name (defaults where missing)."""
    default = CostProfile.default(3)
    source = profile or default
    by_name = {lv.name: lv for lv in source.levels}
    fallback = {lv.name: lv for lv in default.levels}
    levels = [by_name.get(p.name) or fallback[p.name] for p in plans]
    return CostProfile(forward_s=source.forward_s, adjoint_s=source.adjoint_s, levels=levels,
                       forward_j=source.forward_j, adjoint_j=source.adjoint_j, source=source.source,
                       relative=source.relative, advance=source.advance, data_s=source.data_s)


def make_plan(name: str, n_steps: int, plans: list[LevelPlan], profile: CostProfile,
              minimize: str = "time"):
    """The schedule ``name`` over the levels in use, optimised for ``minimize`` where it plans."""
    capacities = [p.slots for p in plans]
    try:
        return make_schedule(name, n_steps, capacities, costs=profile.vector(minimize))
    except ScheduleError as exc:
        raise ValueError(str(exc)) from None


def _mpi_max():
    return mpi().MAX
