"""Provisioning's whole-process memory step: RAM slots from a memory budget, and the node's check.

With a budget (``--memory``, ``$HPCADJ_MEMORY``, SLURM's) :func:`fit_memory` sizes the RAM level from
what the model, the driver's states, staging and codecs leave, and the ranks on a node claim the
budget. Without one they claim the predicted peak of the plan chosen
(:func:`check_unbudgeted`), made once the plan is known: a mixed plan's RAM holds restart states and
steps' adjoint data at their own sizes (wave's store-all one field a step, not a restart pair).
"""

from __future__ import annotations

import os
from dataclasses import replace

from ..collective import agree_or_raise
from ..imports import mpi
from ..snapshot import layout_bytes
from .manager import LevelPlan
from .memory import MemoryPlan, budget_from_environment, least_budget, node_memory_bytes, plan_memory
from .options import Checkpointing, ConfigError, fmt_bytes, memory_bytes
from .schedules.storeall import store_all_slots

#: resident memory beyond what the working-set counts predict (allocator rounding, page tables,
#: MPI buffers): wave 64^3, 2 ranks, 38 RAM slots measured 3 MiB above its prediction
ALLOCATOR_SLACK_BYTES = 16 * 2 ** 20


def fit_memory(model, plans, ck: Checkpointing, probes: dict, baseline: int, notes: list):
    """Size the RAM level from the whole-process budget and refuse a budget this node cannot hold.

    Returns ``(memory, plans, reshaped, predicted)``: the :class:`MemoryPlan` (None without a budget),
    ``reshaped`` True when the budget replaced store-all's RAM level by a smaller one, and the
    prediction over the levels given, which :func:`check_unbudgeted` checks once the plan is chosen.
    """
    MPI = mpi()
    comm, n = model.comm, model.n_steps
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        budget, source = _memory_budget(ck, node.size, getattr(model, "sized", True))
        snapshot = comm.allreduce(layout_bytes(model.snapshot_layout()), op=MPI.MAX)
        controls = comm.allreduce(layout_bytes(model.control_layout()), op=MPI.MAX)
        baseline = comm.allreduce(int(baseline), op=MPI.MAX) + ALLOCATOR_SLACK_BYTES
        codec = _codec_memory(model, probes, snapshot)
        usable = store_all_slots(n)  # no plan stores more on one level
        capped = [replace(p, slots=min(p.slots, usable)) if p.kind == "ram" else p for p in plans]
        predicted = plan_memory(model, capped, budget_bytes=budget, baseline_bytes=baseline,
                                snapshot_bytes=snapshot, control_bytes=controls, **codec)
        reshaped = False
        if budget is not None:
            plans, reshaped = _ram_within(predicted, plans, ck, budget, source, n, notes)
            predicted = plan_memory(model, plans, budget_bytes=budget, baseline_bytes=baseline,
                                    snapshot_bytes=snapshot, control_bytes=controls, **codec)
            _check_node(comm, node, budget, source)
    finally:
        node.Free()
    if budget is None:
        return None, plans, reshaped, predicted
    predicted.detail["source"] = source
    return predicted, plans, reshaped, predicted


def _memory_budget(ck: Checkpointing, node_ranks: int, sized: bool = True) -> tuple[int | None, str]:
    """The whole-process budget per rank in bytes and where it came from (None: no budget; the
    environment's is not applied to a run of unknown snapshot size)."""
    if ck.memory is not None:
        return memory_bytes(ck.memory, "--memory"), "--memory"
    found = budget_from_environment(os.environ) if sized else None
    if found is None:
        return None, ""
    text, source, per_node = found
    nbytes = memory_bytes(text, source)
    return (nbytes // max(1, node_ranks) if per_node else nbytes), source


def _codec_memory(model, probes: dict, snapshot: int) -> dict:
    """plan_memory's compression terms: a compressed RAM slot's bytes (its worst probed size; the
    pool may then plan more) and the codecs' transient buffers
    (:func:`~hpcadj.checkpoint.compression.codec_memory_bytes`, collective)."""
    from .compression import codec_memory_bytes

    if not probes:
        return {}
    layout = model.snapshot_layout()
    largest = model.comm.allreduce(max((f.local_nbytes for f in layout.values()), default=0), op=mpi().MAX)
    ram = probes.get("ram")
    files = any(name != "ram" for name in probes)
    return {"ram_slot_bytes": ram.slot_bytes if ram else None,
            "codec_bytes": codec_memory_bytes(snapshot, largest, files)}


def _ram_within(predicted: MemoryPlan, plans, ck: Checkpointing, budget: int, source: str, n: int, notes: list):
    """RAM slots from what the budget leaves; ConfigError naming the least budget if nothing fits."""
    fit = predicted.ram_slots_fit
    ram = [p for p in plans if p.kind == "ram"]
    others = [p for p in plans if p.kind != "ram"]
    explicit = ck.ram is not None
    wanted = ram[0].slots if ram and (explicit or not others) else None
    slots = min(fit if wanted is None else min(fit, wanted), store_all_slots(n))
    needed = 0 if others else 1  # u_0 needs a slot somewhere
    if predicted.fixed_bytes > budget or slots < needed:
        least = least_budget(predicted, needed)
        parts = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in predicted.breakdown().items() if k != "ram slots")
        raise ConfigError(f"{source} {fmt_bytes(budget)} per rank cannot hold this gradient: the process "
                          f"needs {fmt_bytes(predicted.fixed_bytes)} before any RAM slot (baseline "
                          f"{fmt_bytes(predicted.baseline_bytes)}, {parts}); the least budget that would "
                          f"do is {fmt_bytes(least)}"
                          + ("" if others else " (with one RAM slot; or add --disk/--pfs)"))
    reshaped = not explicit and not others and slots < (ram[0].slots if ram else 0)
    if ram and wanted is not None and slots < wanted and explicit:
        notes.append(f"--ram {ck.ram} capped to {slots} slots by {source} {fmt_bytes(budget)}")
    return ([LevelPlan("ram", "ram", slots)] if slots > 0 else []) + others, reshaped


def _check_node(comm, node, claim: int, source: str) -> None:
    """ConfigError when the ranks sharing this node claim more memory than the node holds."""
    total = node.allreduce(int(claim))
    capacity, what = node_memory_bytes()
    capacity = node.allreduce(capacity if capacity is not None else -1, op=mpi().MIN)
    problem = None
    if capacity > 0 and total > capacity:
        basis = f"{source} per rank" if source else "the predicted peak (model, working states, RAM slots)"
        problem = (f"the {node.size} rank(s) on {os.uname().nodename} would need {fmt_bytes(total)} "
                   f"({basis}), more than {what} holds ({fmt_bytes(capacity)}): lower --ram/--memory, "
                   f"or spread the ranks over more nodes")
    agree_or_raise(comm, problem, ConfigError, first=True)




def check_unbudgeted(model, predicted: MemoryPlan, planned) -> None:
    """ConfigError when the ranks on a node, without a memory budget, would need more than it holds
    for ``planned``: the predicted peak with the RAM level's bytes as the plan holds them (a mixed
    plan's peak of restart states and steps' data, in its units; other plans their slots)."""
    from .schedules.mixed import Mixed
    from .schedules.mixed_levels import MixedLevels

    claim = predicted.peak_bytes
    summary = planned.summary
    if isinstance(planned.schedule, (Mixed, MixedLevels)) and summary is not None:
        unit = predicted.snapshot_bytes // summary.sizes[0]
        claim += summary.peak[0] * unit - predicted.ram_slot_bytes
    node = model.comm.Split_type(mpi().COMM_TYPE_SHARED)
    try:
        _check_node(model.comm, node, claim, "")
    finally:
        node.Free()

