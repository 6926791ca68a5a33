"""One gradient run as a library object: budgets -> plan -> levels -> driver -> result, logs and restart.

:class:`GradientSession` is what ``hpcadj run`` does, without the command line: a user who brings
their own :class:`~hpcadj.models.base.Stepper` gets the same checkpointed, restartable, logged
gradient. The life cycle follows PETSc's create → set up → solve::

    session = GradientSession(model, Checkpointing(ram="512MiB", disk="2GiB", pfs="4GiB",
                                                   pfs_file="ckpt.h5"),
                              restart=Restart("run-dir"), log_dir="logs")
    outcome = session.solve()          # set_up() first if not called
    outcome.result.gradient["u0"]      # a PETSc Vec; outcome.info is the ``run --json`` object

Every method is collective over the model's communicator: call it on every rank, in the same
order. Bad configuration raises :class:`ConfigError` (one line, the same on every rank) before any
work; a storage fault the driver cannot plan around ends the solve with status ``"failed"``, a
requested stop (``should_stop`` returning True, e.g. on SIGTERM) with ``"stopped"`` after the state
was made durable.
"""

from __future__ import annotations

import math
import os
import resource
import sys
import tempfile
import time
from dataclasses import dataclass, field

from ..checkpoint.schedules import CostProfile, simulate
from ..checkpoint.storage.base import LevelError, agree_run_id
from ..checkpoint.budget import parse_budget
from ..checkpoint.schedules.storeall import store_all_slots
from ..collective import agree_or_raise
from .driver import Driver, StopRequested, Unrecoverable
from ..checkpoint.manager import CheckpointConfig, build_levels, level_slots, make_plan, profile_for
from ..checkpoint.memory import (budget_from_environment, least_budget, node_memory_bytes, plan_memory,
                     process_rss_bytes)

#: phases summed in the summary (seconds, the slowest rank's)
PHASES = ("forward", "recompute", "adjoint", "io_wait")
#: schedules that keep every snapshot on one level: a second budget given with them is never used
ONE_LEVEL_SCHEDULES = ("store-all", "revolve", "online")
#: forward evaluations per step above which a plan is warned about (store-all makes 1, revolve with
#: 2 slots on 100 steps 8.5, one slot on 100 steps 49.5)
SLOW_RECOMPUTE_FACTOR = 10.0


def recompute_warning(forward_steps: int, n_steps: int, what: str) -> str | None:
    """The warning for ``what`` evaluating ``forward_steps`` forward steps for ``n_steps``, when
    that exceeds :data:`SLOW_RECOMPUTE_FACTOR` per step (None otherwise)."""
    factor = forward_steps / max(n_steps or 0, 1)
    if factor <= SLOW_RECOMPUTE_FACTOR:
        return None
    return (f"{what} evaluates {forward_steps} forward steps for {n_steps} (recompute factor {factor:.1f}): "
            f"the run will take about {factor:.0f} times as long as one with room for every state; raise "
            f"--ram/--disk/--pfs")


class ConfigError(ValueError):
    """A configuration no run can use (a budget too small, an unusable file): nothing was done."""


@dataclass
class Checkpointing:
    """Where snapshots may go and how the plan is chosen.

    Budgets are slots (``8``) or bytes (``"2GiB"``): per rank for ``ram`` and ``disk``, for the
    whole file for ``pfs``. With no budget at all every state is kept in RAM (store-all).
    ``schedule`` None is store-all without budgets, else ``auto`` (the cheapest plan over the
    levels, from ``costs``: a :class:`CostProfile`, a profile file from ``hpcadj calibrate``, or
    None for a brief calibration when the plan needs one).

    ``memory`` is the whole-process budget per rank in bytes (``"3GiB"``; default ``$HPCADJ_MEMORY``,
    else under SLURM the job's memory per task): the model's working set, the driver's states and
    the file levels' staging are predicted (:mod:`hpcadj.checkpoint.memory`) and the rest goes to RAM
    slots, ``ram`` staying an upper bound. ``memory_baseline`` is the process's resident set before
    the model was built (default: measured when the session is created, which counts the model twice
    and so errs on the safe side).
    """

    ram: object = None
    disk: object = None
    pfs: object = None
    local_dir: str | None = None
    pfs_file: str | None = None
    async_io: bool = True
    keep: bool = False
    schedule: str | None = None
    minimize: str = "time"
    costs: object = None
    memory: object = None
    memory_baseline: int | None = None
    compress: str | None = None       # codec spec for every level: none | lossless[:cname] | lossy:TOL
    compress_ram: str | None = None   # per-level specs override ``compress``
    compress_disk: str | None = None
    compress_pfs: str | None = None
    compress_probe_steps: int | None = None  # the compression probe's last state (default 4)

    def codecs(self) -> dict:
        """Level name -> codec of the compressed levels (ConfigError on a bad spec)."""
        from ..checkpoint.compression import level_codecs

        try:
            return level_codecs(self.compress, {"ram": self.compress_ram, "disk": self.compress_disk,
                                                "pfs": self.compress_pfs})
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def budgets(self) -> dict:
        return {"ram": self.ram, "disk": self.disk, "pfs": self.pfs}

    def check(self, comm) -> None:
        """Refuse contradictions and unusable paths before any work (collective)."""
        if self.pfs_file and self.pfs is None:
            raise ConfigError(f"--pfs-file {self.pfs_file} names the HDF5 level's file, but no --pfs budget "
                              "is given: add --pfs SLOTS|BYTES or drop --pfs-file")
        if self.minimize not in ("time", "energy"):
            raise ConfigError(f"minimize must be 'time' or 'energy', got {self.minimize!r}")
        if self.local_dir and self.disk is not None:
            agreed(comm, check_usable_directory, self.local_dir, "--local-dir")
        if self.memory is not None:
            memory_bytes(self.memory, "--memory")
        self.codecs()

    def config(self) -> CheckpointConfig:
        return CheckpointConfig(budgets=self.budgets, local_dir=self.local_dir, pfs_file=self.pfs_file,
                                async_io=self.async_io, keep=self.keep)


@dataclass
class Restart:
    """Make the run resumable: a manifest and durable states in ``run_dir``.

    ``durable_every``: a durable point every that many durable stores / adjoint steps;
    ``durable_interval``: also after that many seconds (None: Young's interval sqrt(2 C M) from the
    measured cost C of a durable point and ``mtbf`` M, default 4 h). ``resume`` continues the run
    recorded there (same model, controls and levels) from its newest durable point.
    """

    run_dir: str
    resume: bool = False
    durable_every: int = 10
    durable_interval: float | None = None
    mtbf: float | None = None

    def check(self) -> None:
        if self.durable_every < 1:
            raise ConfigError(f"--durable-every must be >= 1, got {self.durable_every}")
        if self.mtbf is not None and not (math.isfinite(self.mtbf) and self.mtbf > 0):
            raise ConfigError(f"--mtbf must be a positive number of seconds, got {self.mtbf}")
        if self.durable_interval is not None:
            if not (math.isfinite(self.durable_interval) and self.durable_interval > 0):
                raise ConfigError(f"--durable-interval must be 'auto' or a positive number of seconds, "
                                  f"got {self.durable_interval!r}")
            if self.mtbf is not None:
                raise ConfigError("--mtbf only informs --durable-interval auto; give one or the other")

    def durability_options(self) -> dict:
        return {"mtbf_s": self.mtbf} if self.mtbf else {}


@dataclass
class PlannedRun:
    """What :meth:`GradientSession.set_up` decided: the levels in use, the plan, its predicted cost."""

    plans: list
    schedule: object
    profile: CostProfile
    summary: object                 # the plan's simulated summary (forward steps, writes per level)
    predicted_s: float              # predicted makespan, durable points included
    predicted_durable_s: float = 0.0


@dataclass
class Outcome:
    """How a solve ended: ``status`` "complete" (``result`` and ``info`` set), "stopped" or "failed"
    (``message`` says why); :meth:`GradientSession.forward` ends "paused" (``result.J`` set)."""

    status: str
    result: object = None
    info: dict = field(default_factory=dict)
    message: str = ""


#: resident memory beyond what the working-set counts predict (allocator rounding, page tables,
#: MPI buffers): wave 64^3, 2 ranks, 38 RAM slots measured 3 MiB above its prediction
ALLOCATOR_SLACK_BYTES = 16 * 2 ** 20
#: a compressed level's transient buffers in states, for callers that know only a snapshot's bytes
#: (``hpcadj plan``): at least :func:`~hpcadj.checkpoint.compression.codec_memory_bytes` of a
#: snapshot of two fields or more, or of one field on the RAM pool
CODEC_STATES = 2


class GradientSession:
    """A checkpointed gradient of ``model`` (a Stepper) with respect to its controls.

    Parameters
    ----------
    model : Stepper
        The time stepper; its communicator is the session's.
    checkpointing : Checkpointing, optional
        Budgets, directories and plan choice (default: store-all in RAM).
    controls : dict, optional
        name -> PETSc Vec (default: ``model.default_controls()``).
    restart : Restart, optional
        Make the run resumable (or resume it).
    log_dir : str, optional
        JSON-lines telemetry (one file per rank, ``run.json``, ``summary.json``).
    energy_model : EnergyModel, optional
        Constants of the modelled energy when no counter is readable.
    gradient_out : str, optional
        Write the gradients as global datasets ``grad_<control>`` of this parallel HDF5 file.
    record : dict, optional
        Extra facts for the log's ``run.json`` (e.g. ``argv``).
    progress : bool
        Progress bars / lines on rank 0 (stderr).
    should_stop : callable, optional
        Polled after every step; True on any rank stops the run on every rank (state made durable).
    on_message : callable, optional
        ``on_message(kind, text)`` as things happen, on every rank: ``"warning"`` (extreme
        recomputation) and ``"fault"`` (what a resume found unusable, a stale lock taken over).
        Default: kept in ``messages``. The planner's notes (a level left empty, a calibration made,
        a resume that starts afresh) are kept in ``notes``.
    resume_hint : str, optional
        How a stopped run's message tells the caller to continue (default: the
        ``Restart(..., resume=True)`` call; the command line says ``--resume``).
    """

    def __init__(self, model, checkpointing: Checkpointing | None = None, *, controls=None,
                 restart: Restart | None = None, log_dir: str | None = None, energy_model=None,
                 gradient_out: str | None = None, record: dict | None = None, progress: bool = False,
                 should_stop=None, on_message=None, resume_hint: str | None = None):
        self.model = model
        self.comm = model.comm
        self.checkpointing = checkpointing or Checkpointing()
        self.controls = controls if controls is not None else model.default_controls()
        self.restart = restart
        self.log_dir = log_dir
        self.energy_model = energy_model
        self.gradient_out = gradient_out
        self.record = dict(record or {})
        self.progress = progress
        self.should_stop = should_stop
        self.resume_hint = resume_hint
        self._lock = None    # the run directory's RunLock while this session holds it
        self._fresh = False  # resuming a run that had nothing durable: it starts afresh
        self.notes: list[str] = []
        self.messages: list[tuple[str, str]] = []
        self._on_message = on_message or (lambda kind, text: self.messages.append((kind, text)))
        self.planned: PlannedRun | None = None
        self.levels: list = []
        self.rundir = None
        self.log = None
        self.faults: list[str] = []
        self._config = self.checkpointing.config()
        self.telemetry = None
        self.memory = None  # the MemoryPlan the RAM slots were sized with (see plan())
        self._probed: dict = {}  # compressed levels' probe (see _compressed_slots)
        self._codec_rss = 0  # resident bytes the codecs keep (compression.codec_footprint)
        baseline = self.checkpointing.memory_baseline
        self._baseline = baseline if baseline is not None else (process_rss_bytes() or 0)

    # -- set-up -------------------------------------------------------------------------------
    def check(self) -> None:
        """Refuse a configuration no run can use, before any work (collective)."""
        check_configuration(self.comm, self.checkpointing, self.restart, self.gradient_out)

    @property
    def resuming(self) -> bool:
        return self.restart is not None and self.restart.resume

    def plan(self) -> PlannedRun:
        """Choose the levels and the plan (calibrating the costs briefly when the plan needs them)."""
        if self.planned is not None:
            return self.planned
        try:
            return self._plan()
        except BaseException:
            self._release()
            raise

    def _plan(self) -> PlannedRun:
        self.check()
        model, comm = self.model, self.comm
        self._open_run_directory()
        if model.n_steps is None:
            self.planned = self._plan_online()
            return self.planned
        try:
            plans = level_slots(self._config, model.snapshot_layout(), comm, model.n_steps)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        ck = self.checkpointing
        self._probe_compression(plans)
        plans, reshaped = self._fit_memory(plans)
        plans = self._compressed_slots(plans)
        store_all = all(b is None for b in ck.budgets.values()) and not reshaped
        name = ck.schedule or ("store-all" if store_all else "auto")
        profile = load_costs(ck.costs)
        if profile is None and name in ("auto", "multilevel") and len(plans) > 1:
            from ..checkpoint.calibrate import calibrate

            try:
                profile = calibrate(model, self.controls, comm, plans, self._config, repeats=2)
            except (OSError, LevelError) as exc:  # an unusable local directory or HDF5 file
                raise ConfigError(f"cannot measure the levels' costs (give --costs PROFILE.json to skip "
                                  f"it): {exc}") from None
            profile.source = "calibrated"
            self.notes.append("no --costs profile given: calibrated step and level costs briefly")
        profile = profile_for(plans, profile)
        if self._probed:
            from ..checkpoint.compression import adjust_profile

            profile = adjust_profile(profile, plans, self._probed)
            plans = self._grow_pool(name, plans, profile)
        try:
            schedule = make_plan(name, model.n_steps, plans, profile, ck.minimize)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        summary = self._check_plan(name, schedule, plans, profile)
        predicted = profile.predicted_seconds(summary)
        durable_s = 0.0
        if self.restart is not None:
            from ..restart import predicted_durable_seconds

            r = self.restart
            durable_s = predicted_durable_seconds(schedule, plans, profile, r.durable_every,
                                                  r.durable_interval, predicted, **r.durability_options())
        self.planned = PlannedRun(plans, schedule, profile, summary, predicted + durable_s, durable_s)
        return self.planned

    def _probe_compression(self, plans) -> None:
        """Probe the compressed levels' sizes (RAM's too: a memory budget may add a RAM level)."""
        from ..checkpoint.compression import codec_footprint, probe

        names = {p.name for p in plans} | {"ram"}
        codecs = {k: v for k, v in self.checkpointing.codecs().items() if k in names}
        self._codec_rss = codec_footprint(codecs, self.model.snapshot_layout())
        try:
            self._probed = probe(self.model, self.controls, codecs, self.comm,
                                 self.checkpointing.compress_probe_steps)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def _recorded_compression(self) -> None:
        """A resumed run's compressed levels keep the codec and slot bytes its manifest recorded."""
        if self._fresh:  # nothing durable: this run records its own compression (set_up)
            return
        recorded = self.rundir.manifest["setup"].get("compression") or {}
        now = {k: v["codec"].spec for k, v in self._probed.items()}
        then = {k: v["codec"] for k, v in recorded.items()}
        if then != now:
            raise ConfigError(f"--resume with other compression than the run recorded ({then or 'none'}, now "
                              f"{now or 'none'}): resume with the run's --compress options")
        ranks = self.rundir.manifest["ranks"]
        if ranks == self.comm.size:  # the attached levels' slots as written
            for name, info in recorded.items():
                self._probed[name]["slot_bytes"] = int(info["slot_bytes"])
        elif "pfs" in recorded:
            raise ConfigError(f"the compressed HDF5 level holds one encoded block per rank of the {ranks} rank(s) "
                              f"that wrote it: resume on {ranks} rank(s) (another rank count needs an "
                              f"uncompressed --pfs level)")

    def _plan_online(self) -> PlannedRun:
        """The plan of a run whose n is unknown until it ends (adaptive steps): an online plan.

        Store-all (no budget) keeps up to the model's step bound in RAM; costs come from --costs or
        the defaults (a calibration would take steps of the model, deciding its sequence early).
        """
        from ..checkpoint.schedules.online_plans import make_online_plan

        model, ck = self.model, self.checkpointing
        name = ck.schedule or "online"
        if name != "online":
            raise ConfigError(f"--schedule {name} needs the number of steps, which adaptive steps decide as the "
                              f"run goes: use --schedule online")
        if ck.memory is not None or self._probed or ck.codecs():
            raise ConfigError("adaptive steps (unknown n) do not combine with --memory or --compress yet")
        try:
            plans = level_slots(self._config, model.snapshot_layout(), self.comm, model.steps.max_steps)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        profile = profile_for(plans, load_costs(ck.costs))
        store_all = all(b is None for b in ck.budgets.values())
        schedule = make_online_plan([p.slots for p in plans], profile.vector(ck.minimize), done=model.done,
                                    store_all=store_all)
        return PlannedRun(plans, schedule, profile, None, float("nan"), 0.0)

    def _predicted(self, planned: PlannedRun) -> float:
        """The plan's predicted makespan; an online plan's is known once n is: its plan for that n, simulated."""
        if planned.summary is not None or self.model.n_steps is None:
            return planned.predicted_s
        from ..checkpoint.schedules.online_plans import OnlineStoreAll, make_online_plan

        n, caps = self.model.n_steps, [p.slots for p in planned.plans]
        costs = planned.profile.vector(self.checkpointing.minimize)
        store_all = isinstance(planned.schedule.planner, OnlineStoreAll)
        summary = simulate(make_online_plan(caps, costs, n_steps=n, store_all=store_all).actions(), n, caps, costs)
        return planned.profile.predicted_seconds(summary)

    def _compressed_slots(self, plans):
        """Turn the compressed levels' byte budgets into slots; the RAM level becomes a byte pool."""
        from ..checkpoint.compression import resized_plans
        from ..checkpoint.manager import LevelPlan

        self._probed = {k: v for k, v in self._probed.items() if any(p.name == k for p in plans)}
        if self.resuming:
            self._recorded_compression()
        for name, info in self._probed.items():
            if info["codec"].lossy:
                self.notes.append(f"LOSSY checkpoints on level {name} ({info['codec'].spec}, absolute "
                                  f"pointwise bound): the gradient is approximate")
        plans = resized_plans(plans, self.checkpointing.budgets, self._probed, self.comm,
                              ram_fixed=self.memory is not None)
        ram = next((p for p in plans if p.kind == "ram" and p.name in self._probed), None)
        if ram is not None:
            info = self._probed[ram.name]
            budget = parse_budget(self.checkpointing.ram) if self.checkpointing.ram is not None else None
            if self.memory is not None:  # what the memory budget leaves for RAM slots
                pool = self.memory.budget_bytes - self.memory.fixed_bytes
                if budget is not None and budget.nbytes is not None:
                    pool = min(pool, budget.nbytes)
                info["search"] = budget is None or budget.nbytes is not None
            elif budget is not None and budget.nbytes is not None:
                pool, info["search"] = budget.nbytes, True
            else:
                pool, info["search"] = ram.slots * info["slot_bytes"], False
            info["pool_bytes"] = int(pool)
            if info["search"]:  # worst-case slots within the pool (a raw slot count may exceed them)
                slots = max(1, min(ram.slots, int(pool) // info["slot_bytes"]) if self.memory is not None
                            else int(pool) // info["slot_bytes"])
                plans = [LevelPlan(p.name, p.kind, slots) if p is ram else p for p in plans]
        return plans

    def _grow_pool(self, name: str, plans, profile):
        """The RAM pool's slots raised to what its bytes hold at the probed sizes (see
        :func:`~hpcadj.checkpoint.compression.pooled_capacity`)."""
        from ..checkpoint.compression import pooled_capacity
        from ..checkpoint.manager import LevelPlan

        index = next((i for i, p in enumerate(plans) if p.kind == "ram" and p.name in self._probed), None)
        if index is None or not self._probed[plans[index].name].get("search"):
            return plans
        info = self._probed[plans[index].name]
        minimize = self.checkpointing.minimize

        def planner(candidate):
            return make_plan(name, self.model.n_steps, candidate, profile, minimize)

        slots = pooled_capacity(plans, index, info["pool_bytes"], info, planner, name, self.model.n_steps)
        if slots > plans[index].slots:
            self.notes.append(f"compressed RAM pool {fmt_bytes(info['pool_bytes'])}: {slots} slots at the "
                              f"probed sizes (worst-case slots: {plans[index].slots})")
        if self.memory is not None:
            self.memory.ram_slot_bytes = info["pool_bytes"]
            self.memory.detail["ram_slots"] = slots
        return [LevelPlan(p.name, p.kind, slots) if i == index else p for i, p in enumerate(plans)]

    def _fit_memory(self, plans):
        """Size the RAM level from the whole-process budget and refuse what this node cannot hold.

        Returns ``(plans, reshaped)``, ``reshaped`` True when the budget replaced store-all's RAM
        level by a smaller one. Sets ``self.memory`` (the :class:`MemoryPlan`, None without budget).
        """
        from ..imports import mpi
        from ..checkpoint.manager import LevelPlan

        MPI = mpi()
        comm, model = self.comm, self.model
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            budget, source = self._memory_budget(node.size)
            snapshot = comm.allreduce(sum(f.local_nbytes for f in model.snapshot_layout().values()), op=MPI.MAX)
            controls = comm.allreduce(sum(f.local_nbytes for f in model.control_layout().values()), op=MPI.MAX)
            baseline = comm.allreduce(int(self._baseline) + self._codec_rss, op=MPI.MAX) + ALLOCATOR_SLACK_BYTES
            usable = store_all_slots(model.n_steps)  # no plan stores more on one level
            capped = [p if p.kind != "ram" else LevelPlan(p.name, p.kind, min(p.slots, usable)) for p in plans]
            predicted = plan_memory(model, capped, budget_bytes=budget, baseline_bytes=baseline,
                                    snapshot_bytes=snapshot, control_bytes=controls, **self._codec_memory(snapshot))
            reshaped = False
            if budget is not None:
                predicted, plans, reshaped = self._ram_within(predicted, plans, budget, source, snapshot)
            self._check_node(node, budget if budget is not None else predicted.peak_bytes, source)
        finally:
            node.Free()
        self.memory = predicted if budget is not None else None
        if self.memory is not None:
            self.memory.detail["source"] = source
        return plans, reshaped

    def _memory_budget(self, node_ranks: int) -> tuple[int | None, str]:
        """The whole-process budget per rank in bytes and where it came from (None: no budget)."""
        if self.checkpointing.memory is not None:
            return memory_bytes(self.checkpointing.memory, "--memory"), "--memory"
        found = budget_from_environment(os.environ)
        if found is None:
            return None, ""
        text, source, per_node = found
        nbytes = memory_bytes(text, source)
        return (nbytes // max(1, node_ranks) if per_node else nbytes), source

    def _ram_within(self, predicted, plans, budget: int, source: str, snapshot: int):
        """RAM slots from what the budget leaves; ConfigError naming the least budget if nothing fits."""
        from ..checkpoint.manager import LevelPlan

        fit = predicted.ram_slots_fit
        ram = [p for p in plans if p.kind == "ram"]
        others = [p for p in plans if p.kind != "ram"]
        explicit = self.checkpointing.ram is not None
        wanted = ram[0].slots if ram and (explicit or not others) else None
        slots = min(fit if wanted is None else min(fit, wanted), store_all_slots(self.model.n_steps))
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
            self.notes.append(f"--ram {self.checkpointing.ram} capped to {slots} slots by {source} "
                              f"{fmt_bytes(budget)}")
        plans = ([LevelPlan("ram", "ram", slots)] if slots > 0 else []) + others
        predicted = plan_memory(self.model, plans, budget_bytes=budget, baseline_bytes=predicted.baseline_bytes,
                                snapshot_bytes=snapshot, control_bytes=predicted.detail["control_bytes"],
                                **self._codec_memory(snapshot))
        return predicted, plans, reshaped

    def _codec_memory(self, snapshot: int) -> dict:
        """plan_memory's compression terms: a compressed RAM slot's bytes (its worst probed size; the
        pool may then plan more, see _grow_pool) and the codecs' transient buffers
        (:func:`~hpcadj.checkpoint.compression.codec_memory_bytes`, collective)."""
        from ..imports import mpi
        from ..checkpoint.compression import codec_memory_bytes

        if not self._probed:
            return {}
        layout = self.model.snapshot_layout()
        largest = self.comm.allreduce(max((f.local_nbytes for f in layout.values()), default=0), op=mpi().MAX)
        ram = self._probed.get("ram")
        files = any(name != "ram" for name in self._probed)
        return {"ram_slot_bytes": ram["slot_bytes"] if ram else None,
                "codec_bytes": codec_memory_bytes(snapshot, largest, files)}

    def _check_node(self, node, claim: int, source: str) -> None:
        """ConfigError when the ranks sharing this node claim more memory than the node holds."""
        from ..imports import mpi

        total = node.allreduce(int(claim))
        capacity, what = node_memory_bytes()
        capacity = node.allreduce(capacity if capacity is not None else -1, op=mpi().MIN)
        problem = None
        if capacity > 0 and total > capacity:
            basis = f"{source} per rank" if source else "the predicted peak (model, working states, RAM slots)"
            problem = (f"the {node.size} rank(s) on {os.uname().nodename} would need {fmt_bytes(total)} "
                       f"({basis}), more than {what} holds ({fmt_bytes(capacity)}): lower --ram/--memory, "
                       f"or spread the ranks over more nodes")
        agree_or_raise(self.comm, problem, ConfigError, first=True)

    def _check_plan(self, name, schedule, plans, profile):
        """Simulate the plan; refuse or note levels it never writes, warn about extreme recomputation."""
        summary = simulate(schedule.actions(), schedule.n_steps, [p.slots for p in plans],
                           profile.vector("time"))
        unused = [p for p, writes in zip(plans, summary.writes) if writes == 0]
        budgets = {name: (text if text is not None else f"{p.slots} (slots the memory budget leaves)")
                   for name, text in self.checkpointing.budgets.items() for p in plans if p.name == name}
        if unused and name in ONE_LEVEL_SCHEDULES:
            used = [p.name for p, writes in zip(plans, summary.writes) if writes] or [plans[0].name]
            flags = ", ".join(f"--{p.name} {budgets[p.name]}" for p in unused)
            raise ConfigError(f"--schedule {name} keeps its snapshots on one level ({used[0]}), so {flags} "
                              f"would never be used: drop it, or use --schedule auto or multilevel")
        for p in unused if not self.resuming else ():  # a resume re-plans: this plan is not the one run
            self.notes.append(f"level {p.name} (--{p.name} {budgets[p.name]}) holds no snapshot in this plan: "
                          f"the planner found it not worth its cost")
        text = recompute_warning(summary.forward_steps, schedule.n_steps, "this plan")
        if text:
            self._on_message("warning", text)
        return summary

    def _replanned(self, forward_steps: int) -> None:
        """The driver re-planned after a storage fault: warn when the run now recomputes too much."""
        text = recompute_warning(forward_steps, self.model.n_steps,
                                 "after a storage fault the re-planned run")
        if text:
            self._on_message("warning", text)

    def set_up(self) -> PlannedRun:
        """Plan, open the log and create the levels (reopening a resumed run's snapshots)."""
        planned = self.plan()
        if self.levels:
            return planned
        if self.log_dir and self.log is None:
            self._open_log(planned)
        from ..telemetry import Telemetry

        self.telemetry = Telemetry(sinks=[self.log] if self.log is not None else [])
        try:
            compressed = {name: (info["codec"], info["slot_bytes"]) for name, info in self._probed.items()
                          if "pool_bytes" not in info}
            self.levels = build_levels(planned.plans, self.model.snapshot_layout(), self.comm, self._config,
                                       attach=self._attach_kinds(), compressed=compressed)
            self._pool_levels(planned.plans)
        except Exception as exc:
            if self.log is not None:
                self.log.abort(str(exc))
            self._release()
            raise ConfigError(str(exc)) from None
        if self.rundir is not None and self._probed and (not self.resuming or self._fresh):
            self.rundir.manifest["setup"]["compression"] = {
                k: {"codec": v["codec"].spec, "slot_bytes": v["slot_bytes"]} for k, v in self._probed.items()}
            self.rundir.save()
        return planned

    def _pool_levels(self, plans) -> None:
        """The compressed RAM level as a byte pool (:class:`PooledLevel`) in place of the plain one."""
        from ..checkpoint.storage.compressed import PooledLevel

        for i, plan in enumerate(plans):
            info = self._probed.get(plan.name)
            if info is not None and "pool_bytes" in info:
                self.levels[i].close()
                self.levels[i] = PooledLevel(info["codec"], self.model.snapshot_layout(), plan.slots,
                                             info["pool_bytes"], self.comm, name=plan.name,
                                             margin=info["margin"])

    def _open_run_directory(self) -> None:
        """Lock the run directory; create the run's manifest, or open the recorded run and check it is
        this configuration (``describe()``, the controls, the trajectory's fingerprint: one forward
        and one adjoint step) and take its level set-up. A recorded run with nothing durable yet
        starts afresh."""
        if self.restart is None or self.rundir is not None:
            return
        from ..restart import RunDirectory, RunDirError, controls_fingerprint, trajectory_fingerprint

        model, comm, config = self.model, self.comm, self._config
        shapes = {name: list(f.global_shape) for name, f in sorted(model.snapshot_layout().items())}
        identity = {"shape": shapes, **model.describe(),
                    "controls": controls_fingerprint(model, self.controls, comm)}
        rundir = RunDirectory(self.restart.run_dir, comm)
        try:
            rundir.acquire(create=not self.restart.resume)
            self._lock = rundir.lock
            if self.restart.resume:
                setup = rundir.open(identity)["setup"]
                rundir.check_trajectory(trajectory_fingerprint(model, self.controls, comm))
                if rundir.nothing_durable():
                    self._fresh = True
                    rundir.start_afresh()
                    self.notes.append(f"nothing durable in {rundir.path} yet (the run ended before its first "
                                      f"durable point): starting afresh")
                config.run_id = setup["run_id"]
                config.local_dir = config.local_dir or setup.get("local_dir")
                config.pfs_file = config.pfs_file or setup.get("pfs_file")
            else:
                trajectory = trajectory_fingerprint(model, self.controls, comm)
                config.run_id = agree_run_id(comm)
                rundir.create(identity, {"run_id": config.run_id, "local_dir": config.local_dir,
                                         "pfs_file": config.pfs_file}, trajectory)
        except RunDirError as exc:
            raise ConfigError(str(exc)) from None
        if rundir.lock.taken_over:  # said once the run is accepted (a refusal stays one line)
            self._on_message("fault", rundir.lock.taken_over)
        config.keep = True  # snapshots must outlive a crash; removed when the run completes
        self.rundir = rundir

    def _release(self) -> None:
        """Give the run directory's lock up (any way the session ends)."""
        if self._lock is not None:
            self._lock.release()

    def _attach_kinds(self) -> frozenset:
        """Levels a resumed run reopens: node-local files only on the same rank count, HDF5 always."""
        if not self.resuming:
            return frozenset()
        return frozenset({"local", "pfs"} if self.rundir.manifest["ranks"] == self.comm.size else {"pfs"})

    def _open_log(self, planned: PlannedRun) -> None:
        from ..telemetry import LogDirError, open_run_log

        ck, model = self.checkpointing, self.model
        record = {**self.record, **model.describe(), "schedule": planned.schedule.name,
                  "minimize": ck.minimize,
                  "levels": [{"name": p.name, "kind": p.kind, "capacity": p.slots} for p in planned.plans],
                  "snapshot_bytes": model.snapshot_bytes(), "budgets": ck.budgets,
                  "async_io": ck.async_io, "resumed": self.resuming}
        if self._probed:  # compressed levels, and whether the gradient is approximate
            record["compression"] = {k: v["codec"].spec for k, v in self._probed.items()}
            record["lossy"] = any(v["codec"].lossy for v in self._probed.values())
        try:
            self.log = open_run_log(self.log_dir, self.comm, record, energy_model=self.energy_model,
                                    overwrite=self.resuming)
        except LogDirError as exc:
            raise ConfigError(str(exc)) from None

    # -- solve --------------------------------------------------------------------------------
    #: (driver, progress, durability, seconds run) of a run forward() paused before its reverse sweep
    _paused = None

    def forward(self) -> Outcome:
        """The first sweep only: status "paused" with ``result.J``, the plan's snapshots and the
        states it holds kept; :meth:`solve` then runs the reverse sweep from them without repeating
        a forward step, :meth:`close` discards them. "stopped"/"failed" as for solve()."""
        try:
            planned = self.set_up()
            outcome = self._execute(planned, pause=True)
        except BaseException as exc:
            if self.log is not None and not self.log.closed:
                self.log.abort(f"{type(exc).__name__}: {exc}")
            self._release()
            raise
        if outcome.status != "paused":
            self._release()
            if self.log is not None:
                self.log.close({"status": outcome.status})
        return outcome

    def solve(self) -> Outcome:
        """Run the gradient (resumed where asked; after forward(), its reverse sweep); the levels are
        closed when it returns."""
        try:
            planned = self.set_up()
            outcome = self._execute(planned)
        except BaseException as exc:
            if self.log is not None and not self.log.closed:
                self.log.abort(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self._release()
        if outcome.status != "complete":
            if self.log is not None:
                self.log.close({"status": outcome.status})
            return outcome
        self._finish(outcome)
        return outcome

    def _execute(self, planned: PlannedRun, pause: bool = False) -> Outcome:
        from ..telemetry import SweepProgress
        from ..restart import Durability, resume_point

        if self._paused is not None:  # forward() ran the first sweep: the reverse sweep is left
            driver, progress, durability, elapsed = self._paused
            if pause:
                return Outcome("paused", result=driver.result)
            self._paused = None
            return self._drive(planned, driver, progress, durability, elapsed, driver.proceed)
        model, comm, levels = self.model, self.comm, self.levels
        ck, profile = self.checkpointing, planned.profile
        costs = profile.vector(ck.minimize)
        schedule, point = planned.schedule, None
        if self.resuming:
            resumed, point = resume_point(self.rundir, model, self.controls, levels, costs,
                                          online=schedule if getattr(schedule, "online", False) else None)
            schedule = resumed or schedule
        durability = None
        if self.rundir is not None:
            r = self.restart
            durability = Durability(self.rundir, model, levels, r.durable_every, interval=r.durable_interval,
                                    **r.durability_options())
        unknown_n = model.n_steps is None  # adaptive steps: progress shows steps and simulated time
        progress = SweepProgress(model.n_steps, rank=comm.rank, ranks=comm.size, quiet=not self.progress,
                                 levels=levels, plan=None if unknown_n else schedule, costs=profile.vector("time"),
                                 sim_time=model.time_reached if unknown_n else None)
        driver = Driver(model, levels, self.telemetry, progress=progress, costs=costs, observer=durability,
                        should_stop=self.should_stop, on_replan=self._replanned)
        self._report_recovered()
        return self._drive(planned, driver, progress, durability, 0.0,
                           lambda: driver.run(schedule, self.controls, resume=point, pause_before_reverse=pause))

    def _drive(self, planned: PlannedRun, driver, progress, durability, elapsed: float, run) -> Outcome:
        """``run()`` (the driver's run or its proceed), then the levels closed and the run's summary;
        a run paused before its reverse sweep keeps levels, driver and progress for the next call."""
        from ..imports import mpi

        model, comm, levels = self.model, self.comm, self.levels
        ck, profile = self.checkpointing, planned.profile
        comm.Barrier()
        t0 = time.perf_counter() - elapsed
        stopped = paused = False
        try:
            result = run()
            for level in levels:
                level.flush()
            if driver.paused:
                paused = True
                self._paused = (driver, progress, durability, time.perf_counter() - t0)
                return Outcome("paused", result=result)
            wall_s = comm.allreduce(time.perf_counter() - t0, op=mpi().MAX)
        except StopRequested:
            stopped = True
            return Outcome("stopped", message=self._stop_message(driver))
        except Unrecoverable as exc:
            return Outcome("failed", message=str(exc))
        finally:
            for level in levels if not paused else ():
                if stopped:
                    level.keep = True
                elif self.rundir is not None:
                    level.keep = ck.keep
                level.close()
            if not paused:
                progress.close()
        if durability is not None:
            durability.finished()
        self.faults += driver.faults
        info = run_summary(model, comm, result, wall_s)
        info.update(actions=driver.actions_done, faults=list(self.faults))
        if durability is not None:
            info["durable"] = {"points": durability.points,
                               "seconds": comm.allreduce(durability.seconds, op=mpi().MAX),
                               "interval_s": durability.interval}
        if self.rundir is not None:
            info["predicted_durable_s"] = planned.predicted_durable_s
            # the trajectory fingerprint's steps (hpcadj.restart.trajectory_fingerprint), beside forward_steps
            info["run_dir_check"] = {"forward_steps": 1, "adjoint_steps": 1}
        if self.memory is not None:
            info["memory"] = {**self.memory.as_dict(), "source": self.memory.detail["source"]}
        info.update(schedule=planned.schedule.name, minimize=ck.minimize, predicted_s=self._predicted(planned),
                    costs_source=profile.source, levels=level_summary(comm, planned.plans, levels),
                    resumed=self.resuming)
        if self._probed:
            from ..checkpoint.compression import summary

            info["compression"] = summary(comm, levels)
            info["lossy"] = any(c["lossy"] for c in info["compression"].values())
        return Outcome("complete", result=result, info=info)

    def _stop_message(self, driver) -> str:
        """Where the run stopped, and how to continue it (``resume_hint``: what the caller calls)."""
        if driver.lam_step is None:
            where = f"stopped in the forward sweep at step {driver.frontier}"
        else:
            where = f"stopped in the reverse sweep at adjoint step {driver.lam_step}"
        if self.restart is None:
            return f"{where}; nothing was made durable (no run directory): a new solve starts over"
        hint = self.resume_hint or f"GradientSession(..., restart=Restart({self.restart.run_dir!r}, resume=True))"
        return f"{where}; state is durable in {self.restart.run_dir}; continue with {hint}"

    def _report_recovered(self) -> None:
        """What a resume found unusable (corrupt durable files, snapshots dropped on attach): a
        ``fault`` log event each, listed in ``faults`` and passed to ``on_message``."""
        found = list(self.rundir.faults) if self.rundir is not None else []
        for level in self.levels:
            found += [f"{level.name}: dropped on attach: {why}" for why in getattr(level, "attach_dropped", [])]
            note = getattr(level, "attach_note", None)
            if note and note.startswith("removed"):
                found.append(f"{level.name}: {note}")
        for fault in found:
            self.faults.append(fault)
            self.telemetry.record("fault", t0=time.time(), seconds=0.0, detail=fault)
            self._on_message("fault", fault)

    def _finish(self, outcome: Outcome) -> None:
        """Phase totals, peak memory, the gradient file and the log's summary."""
        from ..imports import mpi

        comm, info, result = self.comm, outcome.info, outcome.result
        phase_s = self.telemetry.phase_seconds()
        info["phase_s"] = {k: comm.allreduce(phase_s.get(k, 0.0), op=mpi().MAX) for k in PHASES}
        info["peak_rss_bytes"] = comm.allreduce(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                                                op=mpi().MAX)
        if self.notes:
            info["notes"] = list(self.notes)
        if self.gradient_out:
            self.write_gradient(self.gradient_out, result)
        if self.log is not None:
            summary_out = self.log.close({**info, "levels": {lv["name"]: lv for lv in info["levels"]}})
            if "energy" in summary_out:
                info["energy"] = summary_out["energy"].get("total")

    def write_gradient(self, path: str, result) -> None:
        """The gradients as global natural-ordered datasets ``grad_<control>`` (parallel HDF5)."""
        from ..fieldio import write_fields

        model = self.model
        layouts = {f"grad_{k}": v for k, v in model.control_layout().items()}
        arrays = {f"grad_{k}": v for k, v in model.control_arrays(result.gradient).items()}
        attrs = {"J": result.J, "model": model.name, "steps": model.n_steps}
        if self._probed:  # a gradient from compressed (maybe lossy) checkpoints says so
            attrs["compression"] = ",".join(f"{k}={v['codec'].spec}" for k, v in self._probed.items())
            attrs["lossy"] = any(v["codec"].lossy for v in self._probed.values())
        write_fields(path, self.comm, layouts, arrays, attrs=attrs)

    def close(self) -> None:
        """Close the levels of a session that was set up but not solved (solve closes them itself),
        discarding what forward() kept, and give the run directory up."""
        self._release()
        for level in self.levels:
            level.close()
        if self._paused is not None:
            from ..imports import petsc

            self._paused[1].close()
            self._paused = None
            petsc().garbage_cleanup(self.comm)
        if self.log is not None and not self.log.closed:
            self.log.abort("closed before solving")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.planned is not None and not exc[0] and self._paused is None:
            return
        self.close()


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


def compute_gradient_checkpointed(model, checkpointing: Checkpointing | None = None, **kwargs):
    """J and dJ/d(controls) under ``checkpointing`` in one call; raises on a stopped or failed run."""
    outcome = GradientSession(model, checkpointing, **kwargs).solve()
    if outcome.status != "complete":
        raise RuntimeError(outcome.message)
    return outcome.result


def load_costs(costs) -> CostProfile | None:
    """A cost profile from a :class:`CostProfile`, a path to a profile file, or None."""
    if costs is None or isinstance(costs, CostProfile):
        return costs
    try:
        return CostProfile.load(costs)
    except (ValueError, UnicodeDecodeError) as exc:
        message = str(exc)
        raise ConfigError(message if str(costs) in message else f"{costs}: {message}") from None
    except OSError as exc:
        raise ConfigError(f"{costs}: {exc.strerror or exc}") from None


def run_summary(model, comm, result, wall_s: float) -> dict:
    """The run's facts as the ``run --json`` object (``grid`` null for a model whose describe() has none)."""
    norms = {name: result.gradient[name].norm() for name in sorted(result.gradient)}
    out = {"grid": None, **model.describe(), "ranks": comm.size, "J": result.J,
           "grad_norm": norms.get("u0", next(iter(norms.values()))),
           "forward_steps": result.forward_steps, "recomputed_steps": result.recomputed_steps,
           "adjoint_steps": result.adjoint_steps, "snapshot_bytes": model.snapshot_bytes(),
           "wall_s": wall_s}
    for name, value in norms.items():
        if name != "u0":
            out[f"grad_{name}_norm"] = value
    out["grad_norms"] = norms
    return out


def level_summary(comm, plans, levels) -> list[dict]:
    """Per level: counts, bytes and seconds (bytes summed over ranks, seconds the slowest rank's)."""
    from ..imports import mpi

    MPI = mpi()
    out = []
    for plan, level in zip(plans, levels):
        s = level.stats
        out.append({"name": plan.name, "kind": plan.kind, "slots": plan.slots, "writes": s.writes,
                    "reads": s.reads, "bytes_written": comm.allreduce(s.bytes_written),
                    "bytes_read": comm.allreduce(s.bytes_read),
                    "write_s": comm.allreduce(s.write_s, op=MPI.MAX),
                    "read_s": comm.allreduce(s.read_s, op=MPI.MAX),
                    "wait_s": comm.allreduce(s.wait_s, op=MPI.MAX), "peak_slots": s.peak_slots})
    return out


# -- checks of the configuration and its paths, agreed across ranks ------------------------------
def check_configuration(comm, checkpointing: Checkpointing, restart: Restart | None = None,
                        gradient_out: str | None = None) -> None:
    """ConfigError on every rank for a configuration no run can use (needs no model: callable first)."""
    if gradient_out:
        agreed(comm, check_can_create, gradient_out, "--gradient-out")
    checkpointing.check(comm)
    if checkpointing.pfs_file and not (restart is not None and restart.resume):
        agreed(comm, check_can_create, checkpointing.pfs_file, "--pfs-file")
    if restart is not None:
        restart.check()


def agreed(comm, check, *args) -> None:
    """Run ``check(*args)`` on every rank; if it raised ConfigError on any, raise the first rank's on
    all (a check that failed on some ranks only would leave the others waiting in a collective)."""
    try:
        check(*args)
        error = None
    except ConfigError as exc:
        error = str(exc)
    agree_or_raise(comm, error, ConfigError, first=True)


def check_can_create(path: str, flag: str | None = None) -> None:
    """ConfigError unless a file can be created beside ``path`` (tried for real: root passes every
    permission check, yet cannot create files under /proc or on a read-only mount)."""
    from ..fieldio import check_writable

    try:
        check_writable(path)
        parent = os.path.dirname(os.path.abspath(path)) or "."
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".hpcadj-probe-"):
            pass
    except ValueError as exc:
        raise ConfigError(f"{flag + ' ' if flag else ''}{exc}") from None
    except OSError as exc:
        raise ConfigError(f"{flag + ' ' if flag else ''}cannot write {path}: {exc.strerror or exc}") from None


def check_usable_directory(path: str, flag: str) -> None:
    """ConfigError unless ``path`` is a directory files can be created in, or can be made into one."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        what = "is not a directory" if existing == os.path.abspath(path) else f"lies under the file {existing}"
        raise ConfigError(f"{flag} {path} {what}")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".hpcadj-probe-"):
            pass
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot create files in {existing} ({exc.strerror or exc})") from None


def memory_bytes(text, flag: str) -> int:
    """A whole-process budget in bytes (``"3GiB"``, or an int of bytes); ConfigError otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise ConfigError(f"{flag} must be a positive number of bytes, got {text}")
        return text
    try:
        budget = parse_budget(text)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None
    if budget.nbytes is None:
        raise ConfigError(f"{flag} {text} is a slot count: give bytes per rank, e.g. 3GiB")
    if budget.nbytes <= 0:
        raise ConfigError(f"{flag} must be a positive number of bytes, got {text}")
    return budget.nbytes


def fmt_bytes(n: int) -> str:
    """Bytes for people: 1.50 GiB, 320.0 MiB."""
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.1f} MiB"


def print_warning(comm, message: str) -> None:
    """A warning line on stderr, from rank 0 only."""
    if comm.rank == 0:
        print(f"hpcadj: warning: {message}", file=sys.stderr, flush=True)
