"""What a gradient costs in process memory per rank, predicted before any work.

Pure: no MPI, no PETSc, no I/O. :func:`plan_memory` adds up, in bytes on this rank,

- ``model``: the stepper's own working set, :meth:`Stepper.working_set_states` state-equivalents
  (operators, solver work vectors, scratch, its copies of the controls, transients of a step or an
  adjoint step), one state-equivalent being one snapshot's bytes on this rank;
- ``working_states``: what the driver holds beside the model (:data:`DRIVER_STATES` states, see
  below) plus the caller's controls and the gradient (two control-sized sets of fields);
- ``staging``: the buffers of file levels (:func:`staging_snapshots` snapshots each);
- ``ram_slots``: the RAM levels' slots, one snapshot each.

With a whole-process ``budget`` and the process ``baseline`` (its resident set measured just before
the model is built, or any earlier point whose RSS already holds the imports), the result also says
how many RAM slots fit: ``(budget - baseline - model - working_states - staging) // snapshot``.

The driver's count (``hpcadj/adjoint/driver.py``): recomputing in the reverse sweep it holds the
state kept from the previous adjoint step and a step's input u_i while the step builds u_{i+1}
(the restored u_{n0} is let go once stepped past, and no state before u_i is held): 3 states;
lambda is alive throughout: 4. An adjoint step holds u_i, u_{i+1}, lambda_{i+1} and builds
lambda_i: 4 (3 for a model whose adjoint reads no u_{i+1}, ``Stepper.adjoint_reads_next``: the
driver frees it before the step); lambda_{i+1} and u_{i+1} are freed before dJ_i/du_i is made. Hence
``DRIVER_STATES = 4`` (the driver lets go of u_{n0}, u_{i-1} and lambda_{i+1} as early as it
can). A state a RAM level holds by reference (a donated snapshot) is counted as its slot only.

Measured against real runs in ``experiments/memory_budget``: the prediction is an upper bound
there (the peaks of the parts do not all coincide), within the margins reported in its README.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..snapshot import layout_bytes

#: states the driver holds at its peak (reverse-sweep recomputation: 3 states + lambda)
DRIVER_STATES = 4
#: more states a plan holding steps' adjoint data keeps beside them: the pair the next data are
#: captured from stays alive past the step, and a step reversed from data works on a stand-in state
#: (wave 96^3 under --memory, 1 rank: 1.8 states above the prediction without them)
DATA_DRIVER_STATES = 2
#: state-equivalents assumed for a model that declares no working set (see Stepper.working_set_states)
DEFAULT_MODEL_STATES = 32.0


@dataclass(frozen=True)
class LevelSpec:
    """One storage level as the memory plan sees it (duck-compatible with manager.LevelPlan).

    ``kind`` is ``ram``, ``local`` or ``pfs``; ``slots`` its snapshot slots; file levels stage
    snapshots: ``async_io``, ``queue_depth`` and ``prefetch_depth`` as in ``make_level``.
    """

    name: str
    kind: str
    slots: int
    async_io: bool = True
    queue_depth: int = 2
    prefetch_depth: int = 1


def staging_snapshots(level) -> int:
    """Snapshots a level holds in process memory beyond its slots (0 for RAM).

    An asynchronous file level (``checkpoint/storage/aio.py``) holds at most ``queue_depth`` donated
    snapshots (views that keep the driver's state Vecs alive until written) and at most
    ``queue_depth`` staging copies (writes of a Move), plus ``prefetch_depth`` prefetched reads,
    or one plain read on its way to the new state: 2 q + max(p, 1). A synchronous file level writes
    inline: one copy and one read, 2.
    """
    kind = getattr(level, "kind", "ram")
    if kind == "ram":
        return 0
    if not getattr(level, "async_io", True):
        return 2
    q = int(getattr(level, "queue_depth", 2))
    p = int(getattr(level, "prefetch_depth", 1))
    return 2 * q + max(p, 1)


@dataclass
class MemoryPlan:
    """Bytes per rank by part; ``ram_slots_fit`` when a budget was given (else None)."""

    snapshot_bytes: int
    model_bytes: int
    working_bytes: int
    staging_bytes: int
    ram_slot_bytes: int
    baseline_bytes: int = 0
    budget_bytes: int | None = None
    ram_slots_fit: int | None = None
    model_states: float = 0.0
    detail: dict = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        """Everything above the baseline: model + working states + staging + RAM slots."""
        return self.model_bytes + self.working_bytes + self.staging_bytes + self.ram_slot_bytes

    @property
    def peak_bytes(self) -> int:
        """Predicted peak resident set of the process: baseline + total."""
        return self.baseline_bytes + self.total_bytes

    @property
    def fixed_bytes(self) -> int:
        """What no RAM-slot count changes: baseline + model + working states + staging."""
        return self.baseline_bytes + self.model_bytes + self.working_bytes + self.staging_bytes

    @property
    def fits(self) -> bool | None:
        """Whether the planned slots fit the budget (None without a budget)."""
        return None if self.budget_bytes is None else self.peak_bytes <= self.budget_bytes

    def breakdown(self) -> dict[str, int]:
        """{model, working states, staging, ram slots} in bytes per rank."""
        return {"model": self.model_bytes, "working states": self.working_bytes,
                "staging": self.staging_bytes, "ram slots": self.ram_slot_bytes}

    def as_dict(self) -> dict:
        out = {**self.breakdown(), "snapshot": self.snapshot_bytes, "baseline": self.baseline_bytes,
               "total": self.total_bytes, "peak": self.peak_bytes, "model_states": self.model_states}
        if self.budget_bytes is not None:
            out.update(budget=self.budget_bytes, ram_slots_fit=self.ram_slots_fit)
        return out


def model_states(stepper) -> float:
    """The stepper's declared working set in state-equivalents (the default where it has none)."""
    declare = getattr(stepper, "working_set_states", None)
    value = declare() if callable(declare) else DEFAULT_MODEL_STATES
    value = float(value)
    if not value >= 0 or not math.isfinite(value):
        raise ValueError(f"{type(stepper).__name__}.working_set_states() must be a finite number >= 0, "
                         f"got {value}")
    return value


def plan_memory(stepper, levels=(), *, budget_bytes: int | None = None, baseline_bytes: int = 0,
                snapshot_bytes: int | None = None, control_bytes: int | None = None,
                ram_slot_bytes: int | None = None, codec_bytes: int = 0) -> MemoryPlan:
    """Predict this rank's memory for a gradient of ``stepper`` over ``levels``.

    Parameters
    ----------
    stepper : Stepper
        Read for ``snapshot_layout()``, ``control_layout()`` and ``working_set_states()`` only
        (nothing collective; no controls need be set).
    levels : sequence
        Objects with ``kind`` and ``slots`` (:class:`LevelSpec`, ``manager.LevelPlan``), and for
        file levels optionally ``async_io``, ``queue_depth``, ``prefetch_depth`` (defaults of
        ``make_level``: True, 2, 1). RAM levels' slots count as ``ram_slots``.
    budget_bytes : int, optional
        The whole-process budget of this rank. Then ``ram_slots_fit`` is the number of RAM slots
        that fit beside everything else (0 when even the rest does not fit; compare
        ``fixed_bytes`` with the budget to tell the least budget that would).
    baseline_bytes : int
        The process's resident set before the model is built (e.g. VmRSS from /proc/self/status).
    snapshot_bytes, control_bytes : int, optional
        Override the per-rank bytes of one snapshot / of all control fields (e.g. the largest
        rank's, so that every rank derives the same slot count); default: this rank's layouts.
    ram_slot_bytes : int, optional
        Bytes one RAM slot takes when the RAM level stores compressed snapshots (default: one
        snapshot); ``codec_bytes`` the codec's transient buffers (counted with the working states).

    Returns a :class:`MemoryPlan`. Raises ValueError for negative inputs.
    """
    if snapshot_bytes is None:
        snapshot_bytes = layout_bytes(stepper.snapshot_layout())
    if control_bytes is None:
        layout = getattr(stepper, "control_layout", None)
        control_bytes = layout_bytes(layout()) if callable(layout) else snapshot_bytes
    if snapshot_bytes < 0 or control_bytes < 0 or baseline_bytes < 0:
        raise ValueError("snapshot, control and baseline bytes must be >= 0")
    if budget_bytes is not None and budget_bytes < 0:
        raise ValueError(f"budget must be >= 0 bytes, got {budget_bytes}")
    states = model_states(stepper)
    model = int(math.ceil(states * snapshot_bytes))
    working = DRIVER_STATES * snapshot_bytes + 2 * control_bytes + int(codec_bytes)
    slot = int(snapshot_bytes if ram_slot_bytes is None else ram_slot_bytes)
    staging_per_level = {}
    ram_slots = 0
    for level in levels:
        slots = int(level.slots)
        if slots < 0:
            raise ValueError(f"level {getattr(level, 'name', level)!r}: slots must be >= 0")
        if getattr(level, "kind", "ram") == "ram":
            ram_slots += slots
        else:
            staging_per_level[getattr(level, "name", level.kind)] = staging_snapshots(level)
    staging = sum(staging_per_level.values()) * snapshot_bytes
    plan = MemoryPlan(snapshot_bytes=int(snapshot_bytes), model_bytes=model, working_bytes=int(working),
                      staging_bytes=int(staging), ram_slot_bytes=int(ram_slots * slot),
                      baseline_bytes=int(baseline_bytes), budget_bytes=budget_bytes, model_states=states,
                      detail={"driver_states": DRIVER_STATES, "control_bytes": int(control_bytes),
                              "ram_slots": ram_slots, "staging_snapshots": staging_per_level,
                              "ram_slot_bytes": slot, "codec_bytes": int(codec_bytes)})
    if budget_bytes is not None:
        room = budget_bytes - plan.fixed_bytes
        plan.ram_slots_fit = max(0, room // slot) if slot > 0 and room > 0 else 0
    return plan


def least_budget(plan: MemoryPlan, ram_slots: int = 0) -> int:
    """The least whole-process budget (bytes per rank) that holds ``plan`` with ``ram_slots`` slots."""
    return plan.fixed_bytes + int(ram_slots) * plan.detail.get("ram_slot_bytes", plan.snapshot_bytes)


def process_rss_bytes() -> int | None:
    """This process's resident set now (VmRSS), or None where /proc is unavailable.

    The one impure helper here, for callers that measure the baseline.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


#: the whole-process budget per rank when no --memory is given
MEMORY_ENV = "HPCADJ_MEMORY"


def budget_from_environment(environ) -> tuple[str, str, bool] | None:
    """The memory budget the environment sets: ``(text, source, per_node)`` or None.

    ``$HPCADJ_MEMORY`` (per rank, as ``--memory``) first; else under SLURM the job's memory per
    task: ``SLURM_MEM_PER_CPU`` (MiB) times ``SLURM_CPUS_PER_TASK`` (default 1), or
    ``SLURM_MEM_PER_NODE`` (MiB) for the whole node (``per_node`` True: the caller divides it among
    the node's ranks).
    """
    text = (environ.get(MEMORY_ENV) or "").strip()
    if text:
        return text, f"${MEMORY_ENV}", False
    per_cpu = (environ.get("SLURM_MEM_PER_CPU") or "").strip()
    if per_cpu.isdigit() and int(per_cpu) > 0:
        cpus = (environ.get("SLURM_CPUS_PER_TASK") or "1").strip()
        cpus = int(cpus) if cpus.isdigit() and int(cpus) > 0 else 1
        return f"{int(per_cpu) * cpus}MiB", "SLURM_MEM_PER_CPU", False
    per_node = (environ.get("SLURM_MEM_PER_NODE") or "").strip()
    if per_node.isdigit() and int(per_node) > 0:
        return f"{int(per_node)}MiB", "SLURM_MEM_PER_NODE", True
    return None


def node_memory_bytes() -> tuple[int | None, str]:
    """What this node (or the cgroup this process runs in) can hold: ``(bytes, what)``.

    The smaller of MemTotal and a cgroup limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``);
    ``(None, ...)`` where neither is readable.
    """
    best, what = None, "unknown"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    best, what = int(line.split()[1]) * 1024, "the node's memory (MemTotal)"
                    break
    except OSError:
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and (best is None or int(text) < best):
            best, what = int(text), f"this job's memory limit ({path})"
    return best, what
