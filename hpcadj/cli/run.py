"""``hpcadj run``: J and its gradient for a model, with a checkpoint plan over storage levels."""

from __future__ import annotations

import json
import resource
import signal
import sys
import time

from . import CliError
from .common import (add_model_arguments, agreed, build_model, check_can_create, check_usable_directory,
                     world)

PHASES = ("forward", "recompute", "adjoint", "io_wait")
EXIT_FAILED = 1
EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped on request, state durable, resume with --resume


def add_parser(subparsers) -> None:
    from ..checkpoint.schedules import SCHEDULES

    p = subparsers.add_parser("run", help="compute J and its gradient",
                              description="Compute the objective J and dJ/d(controls) with an exact "
                                          "discrete adjoint, checkpointing within the given budgets. "
                                          "Unknown single-dash options go to PETSc.")
    add_model_arguments(p)
    add_checkpoint_arguments(p, SCHEDULES)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    p.add_argument("--gradient-out", metavar="FILE.h5", default=None,
                   help="write the gradients as global datasets grad_<control> (parallel HDF5)")
    p.add_argument("--log-dir", metavar="DIR", default=None,
                   help="write JSON-lines telemetry (one file per rank, run.json, summary.json)")
    p.add_argument("--energy-model", metavar="FILE.toml", default=None,
                   help="override the energy model's constants ($HPCADJ_ENERGY_MODEL)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    r = p.add_argument_group("restart")
    r.add_argument("--run-dir", default=None, metavar="DIR",
                   help="keep a manifest and durable adjoint states here, so the run can be resumed")
    r.add_argument("--resume", action="store_true",
                   help="continue the run recorded in --run-dir (same arguments) from its newest durable point")
    r.add_argument("--durable-every", type=int, default=10, metavar="K",
                   help="make progress durable every K durable stores / adjoint steps (default 10)")
    r.add_argument("--durable-interval", default="auto", metavar="SECONDS",
                   help="also make progress durable (the frontier state itself in the forward sweep) "
                        "once SECONDS have passed; 'auto' (default): Young's interval sqrt(2 C M) from "
                        "the measured cost C of a durable point and --mtbf M")
    r.add_argument("--mtbf", type=float, default=None, metavar="SECONDS",
                   help="mean time between failures that --durable-interval auto assumes "
                        "(default 14400: 4 hours)")
    p.set_defaults(func=main)


def add_checkpoint_arguments(p, schedules) -> None:
    """Budgets, levels and the plan: shared by run and calibrate."""
    g = p.add_argument_group("checkpointing")
    g.add_argument("--schedule", default=None, choices=schedules,
                   help="checkpoint plan (default: store-all without budgets, else auto)")
    g.add_argument("--ram", default=None, metavar="B",
                   help="RAM budget per rank: slots (8) or bytes (2GiB)")
    g.add_argument("--disk", default=None, metavar="B",
                   help="node-local disk budget per rank: slots or bytes")
    g.add_argument("--pfs", default=None, metavar="B",
                   help="parallel HDF5 file budget (whole file): slots or bytes")
    g.add_argument("--local-dir", default=None, metavar="DIR",
                   help="node-local directory (default: $HPCADJ_LOCAL_DIR, $SLURM_TMPDIR, $TMPDIR, /tmp)")
    g.add_argument("--pfs-file", default=None, metavar="PATH.h5", help="the parallel HDF5 checkpoint file")
    io = g.add_mutually_exclusive_group()  # default None, so that giving both is seen and refused
    io.add_argument("--async", dest="async_io", action="store_const", const=True, default=None,
                    help="asynchronous writes and read-ahead on file levels (default)")
    io.add_argument("--no-async", dest="async_io", action="store_const", const=False,
                    help="synchronous file I/O")
    g.add_argument("--keep-checkpoints", action="store_true", help="keep checkpoint files after the run")
    g.add_argument("--costs", default=None, metavar="PROFILE.json",
                   help="cost profile from 'hpcadj calibrate' (else a brief calibration when needed)")
    g.add_argument("--minimize", default="time", choices=("time", "energy"),
                   help="what the planner minimises (default: time)")


def check_level_arguments(args) -> None:
    """Refuse level options that contradict each other (a file for a level without a budget)."""
    if args.pfs_file and args.pfs is None:
        raise CliError(f"--pfs-file {args.pfs_file} names the HDF5 level's file, but no --pfs budget "
                       "is given: add --pfs SLOTS|BYTES or drop --pfs-file")


def checkpoint_config(args):
    from ..adjoint.manager import CheckpointConfig

    return CheckpointConfig(budgets={"ram": args.ram, "disk": args.disk, "pfs": args.pfs},
                            local_dir=args.local_dir, pfs_file=args.pfs_file, async_io=args.async_io is not False,
                            keep=args.keep_checkpoints)


def load_costs(args):
    from ..checkpoint.schedules import CostProfile

    if args.costs is None:
        return None
    try:
        return CostProfile.load(args.costs)
    except (ValueError, UnicodeDecodeError) as exc:
        message = str(exc)
        raise CliError(message if args.costs in message else f"{args.costs}: {message}") from None


def load_energy_model(args):
    """The --energy-model constants, checked before anything runs (None: defaults)."""
    from ..telemetry import load_model

    if args.energy_model is None:
        return None
    try:
        return load_model(args.energy_model)
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise CliError(f"--energy-model {args.energy_model}: {exc}") from None


#: schedules that keep every snapshot on one level: a second budget given with them is never used
ONE_LEVEL_SCHEDULES = ("store-all", "revolve", "online")
#: forward evaluations per step above which a run is warned about (store-all makes 1, revolve with
#: 2 slots on 100 steps 8.5, one slot on 100 steps 49.5)
SLOW_RECOMPUTE_FACTOR = 10.0


def plan_for(args, model, controls, comm, config, note):
    """Levels in use, the schedule and the cost profile it was chosen with.

    Refuses a budget the chosen schedule can never use, notes a level the planner left empty, and
    warns once on stderr when the budget makes the run recompute absurdly often. The plan's
    simulated summary is kept as ``args.plan_summary``.
    """
    from ..adjoint.calibrate import calibrate
    from ..adjoint.manager import level_slots, make_plan, profile_for
    from ..checkpoint.storage.base import LevelError

    try:
        plans = level_slots(config, model.snapshot_layout(), comm, model.n_steps)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    name = args.schedule or ("store-all" if all(b is None for b in config.budgets.values()) else "auto")
    profile = load_costs(args)
    if profile is None and name in ("auto", "multilevel") and len(plans) > 1:
        try:
            profile = calibrate(model, controls, comm, plans, config, repeats=2)
        except (OSError, LevelError) as exc:  # an unusable --local-dir or --pfs-file
            raise CliError(f"cannot measure the levels' costs (give --costs PROFILE.json to skip it): "
                           f"{exc}") from None
        profile.source = "calibrated"
        note("no --costs profile given: calibrated step and level costs briefly")
    profile = profile_for(plans, profile)
    try:
        schedule = make_plan(name, model.n_steps, plans, profile, args.minimize)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    args.plan_summary = check_plan(args, name, schedule, plans, profile, comm, note)
    return plans, schedule, profile


def check_plan(args, name, schedule, plans, profile, comm, note):
    """Simulate the plan; refuse or note levels it never writes, warn about extreme recomputation."""
    from ..checkpoint.schedules import simulate

    summary = simulate(schedule.actions(), schedule.n_steps, [p.slots for p in plans],
                       profile.vector("time"))
    unused = [p for p, writes in zip(plans, summary.writes) if writes == 0]
    if unused and name in ONE_LEVEL_SCHEDULES:
        used = [p.name for p, writes in zip(plans, summary.writes) if writes] or [plans[0].name]
        flags = ", ".join(f"--{p.name} {getattr(args, p.name)}" for p in unused)
        raise CliError(f"--schedule {name} keeps its snapshots on one level ({used[0]}), so {flags} "
                       f"would never be used: drop it, or use --schedule auto or multilevel")
    for p in unused if not args.resume else ():  # a resume re-plans: this plan is not the one run
        note(f"level {p.name} (--{p.name} {getattr(args, p.name)}) holds no snapshot in this plan: "
             f"the planner found it not worth its cost")
    factor = summary.forward_steps / max(schedule.n_steps, 1)
    if factor > SLOW_RECOMPUTE_FACTOR and comm.rank == 0:
        print(f"hpcadj: warning: this plan evaluates {summary.forward_steps} forward steps for "
              f"{schedule.n_steps} (recompute factor {factor:.1f}): the run will take about "
              f"{factor:.0f} times as long as one with room for every state; raise --ram/--disk/--pfs",
              file=sys.stderr, flush=True)
    return summary


def gradient_norms(result) -> dict:
    """2-norms of every control's gradient."""
    return {name: result.gradient[name].norm() for name in sorted(result.gradient)}


def summary(model, comm, result, wall_s: float) -> dict:
    """The run's facts as the ``--json`` object (``grid`` null for a model whose describe() has none)."""
    norms = gradient_norms(result)
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
    from ..stack import mpi

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


def print_human(info: dict) -> None:
    grid = info.get("grid") or "(no grid: the model's describe() reports none)"
    print(f"hpcadj run: {info['model']} {grid}, {info['steps']} steps, {info['ranks']} rank(s), "
          f"schedule {info['schedule']}")
    print(f"  J = {info['J']:.12e}")
    for name, value in info["grad_norms"].items():
        print(f"  |dJ/d{name}| = {value:.12e}")
    print(f"  forward steps {info['forward_steps']} ({info['recomputed_steps']} recomputed, "
          f"factor {info['forward_steps'] / info['steps']:.3f}), adjoint steps {info['adjoint_steps']}, "
          f"wall {info['wall_s']:.3f} s")
    unit = "relative units: default costs" if info["costs_source"] == "model" else "s"
    print(f"  predicted makespan {info['predicted_s']:.3f} ({unit}, minimising {info['minimize']})")
    for lv in info["levels"]:
        print(f"  level {lv['name']:<4} ({lv['kind']:<5}) slots {lv['slots']:>6}  peak {lv['peak_slots']:>6}  "
              f"writes {lv['writes']:>6}  reads {lv['reads']:>6}  "
              f"{(lv['bytes_written'] + lv['bytes_read']) / 2**20:10.2f} MiB  "
              f"write {lv['write_s']:.3f} s  read {lv['read_s']:.3f} s")
    phases = ", ".join(f"{k} {v:.3f} s" for k, v in info["phase_s"].items())
    print(f"  phases: {phases}; peak RSS {info['peak_rss_bytes'] / 2**20:.1f} MiB")


def main(args) -> int:
    from ..adjoint.manager import build_levels
    from ..telemetry import LogDirError, Telemetry, open_run_log

    stop = StopFlag()
    stop.install()  # from the start: a SIGUSR1 during set-up must not kill the run either
    comm = world(args)
    if args.gradient_out:
        agreed(comm, check_can_create, args.gradient_out, "--gradient-out")
    if args.resume and not args.run_dir:
        raise CliError("--resume needs --run-dir DIR (the directory of the run to continue)")
    check_level_arguments(args)
    if args.local_dir and args.disk is not None:
        agreed(comm, check_usable_directory, args.local_dir, "--local-dir")
    if args.pfs_file and not args.resume:
        agreed(comm, check_can_create, args.pfs_file, "--pfs-file")
    if args.durable_every < 1:
        raise CliError(f"--durable-every must be >= 1, got {args.durable_every}")
    args.durable_interval_s = durable_interval(args)
    energy_model = load_energy_model(args)
    model = build_model(args, comm)
    controls = model.default_controls()
    notes = []
    config = checkpoint_config(args)
    rundir = open_run_directory(args, model, controls, comm, config)
    plans, schedule, profile = plan_for(args, model, controls, comm, config, notes.append)
    predicted = _predicted(schedule, plans, profile, args.plan_summary)
    predicted_durable = 0.0
    if rundir is not None:
        from ..adjoint.restart import predicted_durable_seconds

        predicted_durable = predicted_durable_seconds(
            schedule, plans, profile, args.durable_every, args.durable_interval_s, predicted,
            **({"mtbf_s": args.mtbf} if args.mtbf else {}))
        predicted += predicted_durable

    log = None
    if args.log_dir:
        record = {"argv": sys.argv, **model.describe(), "schedule": schedule.name, "minimize": args.minimize,
                  "levels": [{"name": p.name, "kind": p.kind, "capacity": p.slots} for p in plans],
                  "snapshot_bytes": model.snapshot_bytes(), "budgets": config.budgets,
                  "async_io": config.async_io, "resumed": args.resume}
        try:
            log = open_run_log(args.log_dir, comm, record, energy_model=energy_model,
                               overwrite=args.resume)
        except LogDirError as exc:
            raise CliError(str(exc)) from None
    telemetry = Telemetry(sinks=[log] if log is not None else [])
    try:
        levels = build_levels(plans, model.snapshot_layout(), comm, config,
                              attach=attach_kinds(args, rundir, comm))
    except Exception as exc:
        if log is not None:
            log.abort(str(exc))
        raise CliError(str(exc)) from None
    try:
        outcome = execute(args, model, controls, comm, levels, schedule, profile, rundir, telemetry, stop)
    except BaseException as exc:
        if log is not None:
            log.abort(f"{type(exc).__name__}: {exc}")
        raise
    if isinstance(outcome, int):
        if log is not None:
            log.close({"status": "stopped" if outcome == EXIT_STOPPED else "failed"})
        return outcome
    result, wall_s, driver = outcome
    info = summary(model, comm, result, wall_s)
    info.update(actions=driver.actions_done, faults=driver.faults)
    if driver.durability is not None:
        d = driver.durability
        info["durable"] = {"points": d.points, "seconds": comm.allreduce(d.seconds, op=_mpi_max()),
                           "interval_s": d.interval}
    if rundir is not None:
        info["predicted_durable_s"] = predicted_durable
    info.update(schedule=schedule.name, minimize=args.minimize, predicted_s=predicted,
                costs_source=profile.source, levels=level_summary(comm, plans, levels),
                resumed=args.resume)
    finish(args, model, comm, result, info, telemetry, notes, log)
    return 0


def attach_kinds(args, rundir, comm) -> frozenset:
    """Levels a resumed run reopens: node-local files only on the same rank count, HDF5 always."""
    if not args.resume:
        return frozenset()
    return frozenset({"local", "pfs"} if rundir.manifest["ranks"] == comm.size else {"pfs"})


def open_run_directory(args, model, controls, comm, config):
    """The run directory (None without --run-dir); on --resume, the level set-up it recorded."""
    from ..adjoint.restart import RunDirectory, RunDirError, controls_fingerprint
    from ..checkpoint.storage.base import agree_run_id

    if not args.run_dir:
        return None
    identity = {**model.describe(), "controls": controls_fingerprint(model, controls, comm)}
    rundir = RunDirectory(args.run_dir, comm)
    try:
        if args.resume:
            setup = rundir.open(identity)["setup"]
            config.run_id = setup["run_id"]
            config.local_dir = config.local_dir or setup.get("local_dir")
            config.pfs_file = config.pfs_file or setup.get("pfs_file")
        else:
            config.run_id = agree_run_id(comm)
            rundir.create(identity, {"run_id": config.run_id, "local_dir": config.local_dir,
                                     "pfs_file": config.pfs_file})
    except RunDirError as exc:
        raise CliError(str(exc)) from None
    config.keep = True  # snapshots must outlive a crash; removed when the run completes
    return rundir


def execute(args, model, controls, comm, levels, schedule, profile, rundir, telemetry, stop):
    """Run the gradient (resumed where asked). Returns (result, wall_s, driver), or an exit status."""
    from ..adjoint import Driver
    from ..adjoint.driver import StopRequested, Unrecoverable
    from ..adjoint.restart import Durability, resume_point
    from ..models.base import SolverError
    from ..stack import mpi
    from ..telemetry import SweepProgress

    costs = profile.vector(args.minimize)
    point = None
    if args.resume:
        resumed, point = resume_point(rundir, model, controls, levels, costs)
        schedule = resumed or schedule
    durability = Durability(rundir, model, levels, args.durable_every, interval=args.durable_interval_s,
                            **({"mtbf_s": args.mtbf} if args.mtbf else {})) if rundir else None
    progress = SweepProgress(model.n_steps, rank=comm.rank, ranks=comm.size, quiet=args.quiet or args.json,
                             levels=levels, plan=schedule, costs=profile.vector("time"))
    driver = Driver(model, levels, telemetry, progress=progress, costs=costs, durability=durability,
                    should_stop=stop)
    report_recovered(comm, telemetry, driver, rundir, levels)
    comm.Barrier()
    t0 = time.perf_counter()
    stopped = False
    try:
        result = driver.run(schedule, controls, resume=point)
        for level in levels:
            level.flush()
        wall_s = comm.allreduce(time.perf_counter() - t0, op=mpi().MAX)
    except StopRequested as exc:
        stopped = True
        if comm.rank == 0:
            print(f"hpcadj: {exc}; state is durable in {args.run_dir or 'memory only (no --run-dir)'}; "
                  f"continue with --resume", file=sys.stderr, flush=True)
        return EXIT_STOPPED
    except Unrecoverable as exc:
        if comm.rank == 0:
            print(f"hpcadj: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    except SolverError as exc:  # e.g. Newton diverging for an enormous time step
        raise CliError(str(exc)) from None
    finally:
        for level in levels:
            if stopped:
                level.keep = True
            elif rundir is not None:
                level.keep = args.keep_checkpoints
            level.close()
        progress.close()
    if durability is not None:
        durability.finished()
    return result, wall_s, driver


def _mpi_max():
    from ..stack import mpi

    return mpi().MAX


def durable_interval(args) -> float | None:
    """--durable-interval in seconds (None: auto), checked with --mtbf and --run-dir."""
    import math

    if args.mtbf is not None and not (math.isfinite(args.mtbf) and args.mtbf > 0):
        raise CliError(f"--mtbf must be a positive number of seconds, got {args.mtbf}")
    if args.durable_interval == "auto":
        return None
    try:
        seconds = float(args.durable_interval)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise CliError(f"--durable-interval must be 'auto' or a positive number of seconds, "
                       f"got {args.durable_interval!r}")
    if args.mtbf is not None:
        raise CliError("--mtbf only informs --durable-interval auto; give one or the other")
    return seconds


def report_recovered(comm, telemetry, driver, rundir, levels) -> None:
    """Say what a resume found unusable (corrupt durable files, snapshots dropped on attach):
    one stderr line each on rank 0, a ``fault`` log event, and the JSON ``faults`` list."""
    found = list(rundir.faults) if rundir is not None else []
    for level in levels:
        found += [f"{level.name}: dropped on attach: {why}" for why in getattr(level, "attach_dropped", [])]
        note = getattr(level, "attach_note", None)
        if note and note.startswith("removed"):
            found.append(f"{level.name}: {note}")
    for fault in found:
        driver.faults.append(fault)
        telemetry.record("fault", t0=time.time(), seconds=0.0, detail=fault)
        if comm.rank == 0:
            print(f"hpcadj: {fault}", file=sys.stderr, flush=True)


def finish(args, model, comm, result, info, telemetry, notes, log) -> None:
    """Gradient file, log summary and the printed summary."""
    from ..fieldio import write_fields
    from ..stack import mpi

    phase_s = telemetry.phase_seconds()
    info["phase_s"] = {k: comm.allreduce(phase_s.get(k, 0.0), op=mpi().MAX) for k in PHASES}
    info["peak_rss_bytes"] = comm.allreduce(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                                            op=mpi().MAX)
    if notes:
        info["notes"] = notes
    if args.gradient_out:
        layouts = {f"grad_{k}": v for k, v in model.control_layout().items()}
        arrays = {f"grad_{k}": v for k, v in model.control_arrays(result.gradient).items()}
        write_fields(args.gradient_out, comm, layouts, arrays,
                     attrs={"J": result.J, "model": model.name, "steps": model.n_steps})
    if log is not None:
        summary_out = log.close({**info, "levels": {lv["name"]: lv for lv in info["levels"]}})
        if "energy" in summary_out:
            info["energy"] = summary_out["energy"].get("total")
    if comm.rank == 0:
        if args.json:
            print(json.dumps(info))
        else:
            for note in notes:
                print(f"hpcadj: {note}")
            print_human(info)


class StopFlag:
    """Set by SIGTERM or SIGUSR1 (SLURM's --signal): the driver stops after the current action."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.requested = False

    def __call__(self) -> bool:
        return self.requested

    def _handle(self, signum, frame):
        self.requested = True

    def install(self) -> None:
        for sig in self.SIGNALS:
            signal.signal(sig, self._handle)


def _predicted(schedule, plans, profile, summary=None) -> float:
    """Predicted makespan (seconds) of the plan under the profile (from its simulated summary)."""
    from ..checkpoint.schedules import simulate

    costs = profile.vector("time")
    if summary is None:
        summary = simulate(schedule.actions(), schedule.n_steps, [p.slots for p in plans], costs)
    return summary.cost(costs)
