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
import time
from dataclasses import dataclass, field

from ..checkpoint.manager import build_levels
from ..checkpoint.memory import process_rss_bytes
from ..checkpoint.options import (Checkpointing, ConfigError, agreed, apply_time_tile, check_can_create, fmt_bytes,
                                  load_costs, memory_bytes)
from ..checkpoint.provision import PlannedRun, Resuming, provision, recompute_warning
from ..checkpoint.schedules import CostProfile, simulate
from ..checkpoint.storage.base import LevelError, agree_run_id
from ..models.base import begin_evaluation
from .driver import Driver, StopRequested, Unrecoverable

__all__ = ["Checkpointing", "ConfigError", "GradientSession", "Outcome", "PlannedRun", "Restart",
           "check_configuration", "compute_gradient_checkpointed", "fmt_bytes", "load_costs", "measure_costs",
           "memory_bytes", "warmed_baseline"]

#: phases summed in the summary (seconds, the slowest rank's)
PHASES = ("forward", "recompute", "adjoint", "io_wait")


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
class Outcome:
    """How a solve ended: ``status`` "complete" (``result`` and ``info`` set), "stopped" or "failed"
    (``message`` says why); :meth:`GradientSession.forward` ends "paused" (``result.J`` set)."""

    status: str
    result: object = None
    info: dict = field(default_factory=dict)
    message: str = ""


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
    checked : bool
        True when :func:`check_configuration` already accepted these options (the command line
        checks them before it builds the model; an inversion once for all its sessions).
    run_id : str, optional
        The id in the names of the levels' files (default: a fresh one); an inversion gives its
        sessions the id its run directory records, so a resume finds what a killed one left.
    """

    def __init__(self, model, checkpointing: Checkpointing | None = None, *, controls=None,
                 restart: Restart | None = None, log_dir: str | None = None, energy_model=None,
                 gradient_out: str | None = None, record: dict | None = None, progress: bool = False,
                 should_stop=None, on_message=None, resume_hint: str | None = None, checked: bool = False,
                 run_id: str | None = None):
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
        self._checked = checked
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
        self._config.run_id = run_id  # the level files' names (None: a fresh id; a run directory's own)
        self.telemetry = None
        baseline = self.checkpointing.memory_baseline
        self._baseline = baseline if baseline is not None else (process_rss_bytes() or 0)

    # -- set-up -------------------------------------------------------------------------------
    def check(self) -> None:
        """Refuse a configuration no run can use, before any work (collective); once per session."""
        if not self._checked:
            check_configuration(self.comm, self.checkpointing, self.restart, self.gradient_out)
            self._checked = True

    @property
    def resuming(self) -> bool:
        return self.restart is not None and self.restart.resume

    @property
    def memory(self):
        """The :class:`~hpcadj.checkpoint.memory.MemoryPlan` the RAM slots were sized with (None
        before planning, or without a memory budget)."""
        return self.planned.memory if self.planned is not None else None

    def plan(self) -> PlannedRun:
        """Check, open the run directory, and provision the levels and the plan
        (:func:`~hpcadj.checkpoint.provision.provision`; calibrating costs briefly when needed)."""
        if self.planned is not None:
            return self.planned
        self._steps = begin_evaluation(self.model)  # adaptive steps: this evaluation's own sequence
        try:
            self.check()
            apply_time_tile(self.model, self.checkpointing.time_tile)
            self._open_run_directory()
            self.planned = provision(self.model, self.controls, self.checkpointing, config=self._config,
                                     baseline_bytes=self._baseline, resuming=self._resuming(),
                                     durability=self._durable_seconds())
        except BaseException:
            self._release()
            raise
        self.notes += self.planned.notes
        for text in self.planned.warnings:
            self._on_message("warning", text)
        return self.planned

    def _resuming(self) -> Resuming | None:
        """What the resumed run recorded that provisioning must keep (None: not resuming)."""
        if not self.resuming:
            return None
        manifest = self.rundir.manifest
        recorded = None if self._fresh else (manifest["setup"].get("compression") or {})
        return Resuming(compression=recorded, ranks=manifest["ranks"])

    def _durable_seconds(self):
        """What the durable points of a restartable run add to a plan's makespan (None: no run directory)."""
        if self.restart is None:
            return None
        from ..restart import predicted_durable_seconds

        r = self.restart

        def seconds(schedule, plans, profile, makespan_s):
            return predicted_durable_seconds(schedule, plans, profile, r.durable_every, r.durable_interval,
                                             makespan_s, **r.durability_options())
        return seconds

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
            self.levels = build_levels(planned.plans, self.model.snapshot_layout(), self.comm, self._config,
                                       attach=self._attach_kinds())
        except Exception as exc:  # noqa: BLE001 - any level that cannot open is a refusal
            if self.log is not None:
                self.log.abort(str(exc))
            self._release()
            raise ConfigError(str(exc)) from None
        if self.rundir is not None and planned.probes and (not self.resuming or self._fresh):
            self.rundir.manifest["setup"]["compression"] = {
                k: {"codec": v.codec.spec, "slot_bytes": v.slot_bytes} for k, v in planned.probes.items()}
            self.rundir.save()
        return planned

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
        if planned.probes:  # compressed levels, and whether the gradient is approximate
            record["compression"] = {k: v.codec.spec for k, v in planned.probes.items()}
            record["lossy"] = planned.lossy
        try:
            self.log = open_run_log(self.log_dir, self.comm, record, energy_model=self.energy_model,
                                    overwrite=self.resuming)
        except LogDirError as exc:
            raise ConfigError(str(exc)) from None

    # -- solve --------------------------------------------------------------------------------
    #: (driver, progress, durability, seconds run) of a run forward() paused before its reverse sweep
    _paused = None
    #: the step sequence of this evaluation (adaptive steps; None with fixed steps)
    _steps = None

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

        if self._steps is not None:  # the model may have evaluated other controls since
            self.model.use_steps(self._steps)
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
        info.update(schedule=planned.schedule.name, minimize=ck.minimize, **profile.predicted(self._predicted(planned)),
                    costs_source=profile.source, levels=level_summary(comm, planned.plans, levels),
                    resumed=self.resuming)
        if planned.schedule.name == "mixed":
            from ..checkpoint.mixed_plan import mixed_summary

            info["mixed"] = mixed_summary(comm, planned, driver)
        if planned.probes:
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
        from ..telemetry.jsonlog import peak_rss_bytes

        comm, info, result = self.comm, outcome.info, outcome.result
        phase_s = self.telemetry.phase_seconds()
        info["phase_s"] = {k: comm.allreduce(phase_s.get(k, 0.0), op=mpi().MAX) for k in PHASES}
        info["peak_rss_bytes"] = comm.allreduce(peak_rss_bytes(), op=mpi().MAX)
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
        probes = self.planned.probes if self.planned is not None else {}
        if probes:  # a gradient from compressed (maybe lossy) checkpoints says so
            attrs["compression"] = ",".join(f"{k}={v.codec.spec}" for k, v in probes.items())
            attrs["lossy"] = self.planned.lossy
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
