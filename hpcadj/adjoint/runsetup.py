"""A session's restart options, the check of its configuration, and the run directory it opens."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..checkpoint.options import Checkpointing, ConfigError, agreed, check_can_create
from ..checkpoint.storage.base import agree_run_id


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


def durable_seconds(restart: Restart):
    """What the durable points of ``restart`` add to a plan's makespan, as provisioning asks it."""
    from ..restart import predicted_durable_seconds

    def seconds(schedule, plans, profile, makespan_s):
        return predicted_durable_seconds(schedule, plans, profile, restart.durable_every, restart.durable_interval,
                                         makespan_s, **restart.durability_options())
    return seconds


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


@dataclass(frozen=True)
class Opened:
    """What opening a run directory decided: the level configuration to use (the recorded run's
    files on resume; snapshots kept), whether a resumed run starts afresh, notes for the caller."""

    config: object
    fresh: bool = False
    notes: tuple[str, ...] = ()


def open_run_directory(rundir, restart: Restart, model, controls, config, on_message) -> Opened:
    """Lock ``rundir``; create the run's manifest, or open the recorded run and check it is this
    configuration (``describe()``, the controls, the trajectory's fingerprint: one forward and one
    adjoint step) and take its level set-up. A recorded run with nothing durable yet starts afresh.
    ConfigError (the same on every rank) when the directory cannot serve this run."""
    from ..restart import RunDirError, controls_fingerprint, trajectory_fingerprint

    comm = model.comm
    shapes = {name: list(f.global_shape) for name, f in sorted(model.snapshot_layout().items())}
    identity = {"shape": shapes, **model.describe(), "controls": controls_fingerprint(model, controls, comm)}
    fresh, notes = False, []
    try:
        rundir.acquire(create=not restart.resume)
        if restart.resume:
            rundir.open(identity)
            rundir.check_trajectory(trajectory_fingerprint(model, controls, comm))
            setup = rundir.recorded_setup()
            if rundir.nothing_durable():
                fresh = True
                rundir.start_afresh()
                notes.append(f"nothing durable in {rundir.path} yet (the run ended before its first "
                             f"durable point): starting afresh")
            config = replace(config, run_id=setup["run_id"], local_dir=config.local_dir or setup.get("local_dir"),
                             pfs_file=config.pfs_file or setup.get("pfs_file"))
        else:
            trajectory = trajectory_fingerprint(model, controls, comm)
            config = replace(config, run_id=agree_run_id(comm))
            rundir.create(identity, {"run_id": config.run_id, "local_dir": config.local_dir,
                                     "pfs_file": config.pfs_file}, trajectory)
    except RunDirError as exc:
        raise ConfigError(str(exc)) from None
    if rundir.lock.taken_over:  # said once the run is accepted (a refusal stays one line)
        on_message("fault", rundir.lock.taken_over)
    return Opened(replace(config, keep=True), fresh, tuple(notes))  # snapshots outlive a crash


def recovered_faults(rundir, levels) -> list[str]:
    """What a resume found unusable: corrupt durable files (``rundir``'s faults), snapshots dropped
    when a level reopened its files, and what a killed run left that was removed."""
    found = list(rundir.faults) if rundir is not None else []
    for level in levels:
        found += [f"{level.name}: dropped on attach: {why}" for why in getattr(level, "attach_dropped", [])]
        note = getattr(level, "attach_note", None)
        if note and note.startswith("removed"):
            found.append(f"{level.name}: {note}")
    return found


def attach_kinds(rundir, comm) -> frozenset:
    """Levels a resumed run reopens: node-local files only on the same rank count, HDF5 always."""
    return frozenset({"local", "pfs"} if rundir.recorded_ranks == comm.size else {"pfs"})


def open_durability(rundir, restart: Restart, model, levels):
    """The driver's observer that makes progress durable in ``rundir`` (None without a run directory)."""
    if rundir is None:
        return None
    from ..restart import Durability

    return Durability(rundir, model, levels, restart.durable_every, interval=restart.durable_interval,
                      **restart.durability_options())
