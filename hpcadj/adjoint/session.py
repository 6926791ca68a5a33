"""One gradient run as a library object, sequenced: check -> open -> provision -> set up -> execute -> report.

What it sequences lives beside it: ``runsetup`` (restart options, the configuration check, the run
directory), ``costs`` (measured costs, the memory baseline), ``report`` (the ``run --json`` object,
the log's record, the gradient file); provisioning in :mod:`hpcadj.checkpoint.provision`.

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

import time
from dataclasses import replace

from ..checkpoint.manager import build_levels
from ..checkpoint.memory import process_rss_bytes
from ..checkpoint.options import Checkpointing, ConfigError, apply_time_tile, fmt_bytes, load_costs, memory_bytes
from ..checkpoint.provision import PlannedRun, Resuming, provision, recompute_warning
from ..models.base import begin_evaluation
from .costs import measure_costs, warmed_baseline
from .data_check import refuse_untrusted_data
from .driver import Driver, StopRequested, Unrecoverable
from .report import Outcome, completed_info, finish_info, log_record, stop_message, write_gradient
from .runsetup import (Restart, attach_kinds, check_configuration, durable_seconds, open_durability, open_run_directory,
                       recovered_faults)
from ..imports import mpi, petsc
from ..telemetry import LogDirError, SweepProgress, Telemetry, open_run_log

__all__ = ["Checkpointing", "ConfigError", "GradientSession", "Outcome", "PlannedRun", "Restart",
           "check_configuration", "compute_gradient_checkpointed", "fmt_bytes", "load_costs", "measure_costs",
           "memory_bytes", "warmed_baseline"]


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
        # the level files' names: run_id (None: a fresh id; a run directory's own)
        self._config = replace(self.checkpointing.config(), run_id=run_id)
        self.telemetry = None
        baseline = self.checkpointing.memory_baseline
        self._baseline = baseline if baseline is not None else (process_rss_bytes() or 0)

    # -- set-up -------------------------------------------------------------------------------
    def check(self) -> None:
        """Refuse a configuration no run can use, before any work (collective); once per session."""
        if not self._checked:
            check_configuration(self.comm, self.checkpointing, self.restart, self.gradient_out)
            if self.checkpointing.schedule == "mixed":
                self._trust_data()
            self._checked = True

    def _trust_data(self) -> None:
        """Refuse, before any gradient, a model whose declared adjoint data a mixed plan would reverse
        steps from but which disagree with what its adjoint step reads; once per model object."""
        what = "--schedule mixed" if self.checkpointing.schedule == "mixed" else "the mixed plan chosen"
        refuse_untrusted_data(self.model, self.controls, what)

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
            planned = provision(self.model, self.controls, self.checkpointing, config=self._config,
                                baseline_bytes=self._baseline, resuming=self._resuming(),
                                durability=durable_seconds(self.restart) if self.restart else None)
            if planned.schedule.name == "mixed":
                self._trust_data()
            self.planned = planned
        except BaseException:
            self._release(refused=True)
            raise
        self.notes += self.planned.notes
        for text in self.planned.warnings:
            self._on_message("warning", text)
        return self.planned

    def _resuming(self) -> Resuming | None:
        """What the resumed run recorded that provisioning must keep (None: not resuming)."""
        if not self.resuming:
            return None
        recorded = None if self._fresh else self.rundir.recorded_compression()
        return Resuming(compression=recorded, ranks=self.rundir.recorded_ranks)

    def _replanned(self, forward_steps: int) -> None:
        """The driver re-planned after a storage fault: warn when the run now recomputes too much."""
        text = recompute_warning(forward_steps, self.model.n_steps, "after a storage fault the re-planned run")
        if text:
            self._on_message("warning", text)

    def set_up(self) -> PlannedRun:
        """Plan, open the log and create the levels (reopening a resumed run's snapshots)."""
        planned = self.plan()
        if self.levels:
            return planned
        if self.log_dir and self.log is None:
            self._open_log(planned)

        self.telemetry = Telemetry(sinks=[self.log] if self.log is not None else [])
        try:
            self.levels = build_levels(planned.plans, self.model.snapshot_layout(), self.comm, self._config,
                                       attach=attach_kinds(self.rundir, self.comm) if self.resuming else frozenset())
        except Exception as exc:  # noqa: BLE001 - any level that cannot open is a refusal
            if self.log is not None:
                self.log.abort(str(exc))
            self._release(refused=True)
            raise ConfigError(str(exc)) from None
        if self.rundir is not None and planned.probes and (not self.resuming or self._fresh):
            self.rundir.record_compression({k: {"codec": v.codec.spec, "slot_bytes": v.slot_bytes}
                                            for k, v in planned.probes.items()})
        return planned

    def _open_run_directory(self) -> None:
        """Lock and open the run directory (:func:`~.runsetup.open_run_directory`); the level
        configuration becomes the run's."""
        if self.restart is None or self.rundir is not None:
            return
        from ..restart import RunDirectory

        rundir = RunDirectory(self.restart.run_dir, self.comm)
        self._lock = rundir.lock  # released however the session ends, an opening refused included
        opened = open_run_directory(rundir, self.restart, self.model, self.controls, self._config, self._on_message)
        self._config, self._fresh = opened.config, opened.fresh
        self.notes += opened.notes
        self.rundir = rundir

    def _release(self, refused: bool = False) -> None:
        """Give the run directory's lock up (any way the session ends); a refused fresh start also
        withdraws what it wrote there, so the same command can simply run again."""
        if refused and self.rundir is not None and not self.resuming:
            self.rundir.withdraw()
        if self._lock is not None:
            self._lock.release()

    def _open_log(self, planned: PlannedRun) -> None:
        record = log_record(self.record, self.model, self.checkpointing, planned, self.resuming)
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
            outcome = self._execute(self.set_up(), pause=True)
        except BaseException as exc:
            self._abort_log(exc)
            self._release()
            raise
        if outcome.status != "paused":
            self._release()
            self._close_log(outcome)
        return outcome

    def solve(self) -> Outcome:
        """Run the gradient (resumed where asked; after forward(), its reverse sweep); the levels are
        closed when it returns."""
        try:
            outcome = self._execute(self.set_up())
        except BaseException as exc:
            self._abort_log(exc)
            raise
        finally:
            self._release()
        if outcome.status != "complete":
            self._close_log(outcome)
            return outcome
        self._finish(outcome)
        return outcome

    def _abort_log(self, exc: BaseException) -> None:
        if self.log is not None and not self.log.closed:
            self.log.abort(f"{type(exc).__name__}: {exc}")

    def _close_log(self, outcome: Outcome) -> None:
        """A run that did not complete: its log closed with its status."""
        if self.log is not None:
            self.log.close({"status": outcome.status})

    def _execute(self, planned: PlannedRun, pause: bool = False) -> Outcome:
        from ..restart import resume_point

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
                                          online=schedule if getattr(schedule, "online", False) else None,
                                          mixed=schedule if getattr(schedule, "stores_data", False)
                                          and not getattr(schedule, "online", False) else None)
            schedule = resumed or schedule
        durability = open_durability(self.rundir, self.restart, model, levels)
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
        model, comm, levels, ck = self.model, self.comm, self.levels, self.checkpointing
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
            return Outcome("stopped", message=stop_message(driver, self.restart, self.resume_hint))
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
        info = completed_info(model, comm, result, wall_s, planned, ck, levels, driver=driver,
                              faults=self.faults, durability=durability,
                              restartable=self.rundir is not None, resumed=self.resuming)
        return Outcome("complete", result=result, info=info)

    def _report_recovered(self) -> None:
        """What a resume found unusable: a ``fault`` log event each, in ``faults`` and to ``on_message``."""
        for fault in recovered_faults(self.rundir, self.levels):
            self.faults.append(fault)
            self.telemetry.record("fault", t0=time.time(), seconds=0.0, detail=fault)
            self._on_message("fault", fault)

    def _finish(self, outcome: Outcome) -> None:
        """Phase totals, peak memory, the gradient file and the log's summary."""
        info = outcome.info
        finish_info(info, self.comm, self.telemetry.phase_seconds(), self.notes)
        if self.gradient_out:
            self.write_gradient(self.gradient_out, outcome.result)
        if self.log is not None:
            summary_out = self.log.close({**info, "levels": {lv["name"]: lv for lv in info["levels"]}})
            if "energy" in summary_out:
                info["energy"] = summary_out["energy"].get("total")

    def write_gradient(self, path: str, result) -> None:
        """The gradients as global natural-ordered datasets ``grad_<control>`` (parallel HDF5)."""
        write_gradient(path, self.comm, self.model, result, self.planned)

    def close(self) -> None:
        """Close the levels of a session that was set up but not solved (solve closes them itself),
        discarding what forward() kept, and give the run directory up."""
        self._release()
        for level in self.levels:
            level.close()
        if self._paused is not None:
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


def compute_gradient_checkpointed(model, checkpointing: Checkpointing | None = None, **kwargs):
    """J and dJ/d(controls) under ``checkpointing`` in one call; raises on a stopped or failed run."""
    outcome = GradientSession(model, checkpointing, **kwargs).solve()
    if outcome.status != "complete":
        raise RuntimeError(outcome.message)
    return outcome.result
