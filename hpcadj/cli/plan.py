"""``hpcadj plan``: what a checkpoint plan costs, without running any physics.

Budgets per level are slots (``--ram 8``) or bytes (``--ram 2GiB``, with ``--snapshot-bytes``). The
plan runs through the simulator, which checks it and counts forward evaluations, writes, reads and
peak slots per level; the predicted makespan uses ``--costs PROFILE.json`` or the default costs
documented in ``hpcadj.checkpoint.schedules.costs``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

from . import CliError, together
from .common import add_model_arguments, build_model, byte_count, memory_baseline, step_count, world
from .options import add_checkpoint_options

def add_parser(subparsers) -> None:
    p = subparsers.add_parser("plan", help="summarise a checkpoint plan (no physics)",
                              description="Plan the checkpoints of an n-step adjoint and print its "
                                          "forward evaluations, I/O per level and predicted makespan. "
                                          "With --model the model is built (no step taken) for its "
                                          "snapshot size, working set and default n; PETSc options are "
                                          "then accepted.")
    p.add_argument("--steps", type=step_count, default=None, metavar="N",
                   help="number of time steps n (needed unless --model gives its own)")
    add_checkpoint_options(p, "plan", "--ram", "--disk", "--pfs")
    p.add_argument("--snapshot-bytes", type=byte_count, default=None, metavar="BYTES",
                   help="bytes of one snapshot, to turn byte budgets into slots")
    add_checkpoint_options(p, "plan", "--memory")
    p.add_argument("--model-states", type=float, default=None, metavar="S",
                   help="the model's working set in snapshot-equivalents (default 32; `hpcadj run "
                        "--memory` uses the model's own count)")
    p.add_argument("--baseline", default=None, metavar="BYTES",
                   help="the process's memory before the model is built (default: measured as hpcadj run "
                        "measures it with --model; without, this process's resident set, a lower bound)")
    add_checkpoint_options(p, "plan", "--compress")
    p.add_argument("--compressed-bytes", type=byte_count, default=None, metavar="BYTES",
                   help="bytes one compressed snapshot takes on one rank (e.g. `hpcadj calibrate --compress "
                        "SPEC --json`'s compression.probed_bytes); needed with --compress")
    add_checkpoint_options(p, "plan", "--schedule", "--costs", "--minimize")
    add_model_arguments(p, default=None, steps=False)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--actions", action="store_true", help="stream the action list first, one per line")
    p.set_defaults(func=main)


def declared(args, comm):
    """The run to plan: the --model's layouts, working set and n (built on this command's ranks as
    ``hpcadj run`` builds it; no step taken), or the sizes the command line declares."""
    from ..checkpoint.provision import Declared

    states = args.model_states
    if states is not None and not (states >= 0 and states < float("inf")):
        raise CliError(f"--model-states must be a number >= 0, got {states}")
    if args.compressed_bytes is not None and args.compress is None:
        raise CliError("--compressed-bytes needs --compress SPEC")
    extra = {"compressed_bytes": args.compressed_bytes}
    if args.model is None:
        if args.schedule == "mixed":
            raise CliError("--schedule mixed needs --model (the bytes of a step's adjoint data)")
        if args.steps is None:
            raise CliError("give --steps N (the number of time steps), or a --model that has its own")
        if args.memory is not None and args.snapshot_bytes is None:
            raise CliError("--memory needs --snapshot-bytes (one snapshot's bytes on one rank)")
        for name in ("ram", "disk", "pfs") if args.snapshot_bytes is None else ():
            if _in_bytes(getattr(args, name)):
                raise CliError(f"--{name} {getattr(args, name)} is in bytes: give --snapshot-bytes")
        run = Declared.of_bytes(comm, args.steps, args.snapshot_bytes, **extra,
                                **({} if states is None else {"states": states}))
        args.baseline_bytes = _baseline(args, comm, False)
        return run
    args.baseline_bytes = _baseline(args, comm, True)  # before the model, as run measures it
    model = build_model(args, comm)
    if args.steps is None and model.n_steps is None:
        raise CliError(f"model {args.model} has no fixed number of steps (--adaptive): give --steps N")
    if args.snapshot_bytes is not None:
        raise CliError("--snapshot-bytes describes a run without --model: the model's own layout sizes its "
                       "snapshots (drop it)")
    run = Declared.of_model(model, args.steps, states, **extra)
    args.model_info = {"model": args.model, "snapshot_bytes": _largest(run.layout, comm), "ranks": comm.size}
    return run


def _in_bytes(text) -> bool:
    """Whether the budget ``text`` is in bytes (a bad one is left to provisioning to refuse)."""
    from ..checkpoint.budget import parse_budget

    try:
        return text is not None and parse_budget(text).nbytes is not None
    except ValueError:
        return False


def _largest(layout, comm) -> int:
    from ..imports import mpi
    from ..snapshot import layout_bytes

    return comm.allreduce(layout_bytes(layout), op=mpi().MAX)


def _baseline(args, comm, model: bool) -> int:
    """The resident set the memory plan counts from: --baseline, else measured as ``hpcadj run``
    measures it (with --model, after a warm-up gradient of the model on a tiny grid), else this
    process's resident set now."""
    from ..checkpoint.memory import process_rss_bytes
    from ..checkpoint.options import ConfigError, memory_bytes

    if args.baseline is not None:
        try:
            return 0 if args.baseline.strip() in ("0", "0B") else memory_bytes(args.baseline, "--baseline")
        except ConfigError as exc:
            raise CliError(str(exc)) from None
    if not model:
        return process_rss_bytes() or 0
    return memory_baseline(args, comm) or 0


def refuse_model_options(args) -> None:
    """Without --model, the model options (--grid, --dt, a model's own) would be ignored: refused."""
    given = [flag for dest, flag, default in getattr(args, "common_model_options", ())
             if getattr(args, dest, default) != default]
    given += [flag for (dest, flag, default) in getattr(args, "model_options", {})
              if getattr(args, dest, default) != default]
    if given:
        raise CliError(f"{', '.join(given)} describe{'s' if len(given) == 1 else ''} a model: add --model NAME "
                       f"(or drop {'it' if len(given) == 1 else 'them'})")


def action_record(action) -> dict:
    return {"action": type(action).__name__, **dataclasses.asdict(action)}


def main(args) -> int:
    from ..checkpoint.options import load_costs
    from ..checkpoint.provision import ConfigError, provision
    from ..checkpoint.schedules import PlanError, ScheduleError
    from ..imports import mpi
    from .options import checkpointing

    if args.model is not None:
        comm = world(args)
    elif args.petsc_options:
        raise CliError(f"plan runs no PETSc solver without --model, so it takes no PETSc option "
                       f"(got {' '.join(args.petsc_options)})")
    else:
        refuse_model_options(args)
        comm = mpi().COMM_WORLD
    if args.steps is not None and args.steps < 1:
        raise CliError(f"--steps must be >= 1, got {args.steps}")
    if all(getattr(args, name) is None for name in ("ram", "disk", "pfs", "memory")):
        raise CliError("give a budget for at least one level: --ram, --disk or --pfs (or --memory)")
    run = declared(args, comm)
    options = checkpointing(args)
    with together(errors=(CliError, ConfigError)):  # a profile some ranks cannot read: one agreed line
        options = dataclasses.replace(options, costs=load_costs(options.costs))
    config = dataclasses.replace(options.config(), pfs_file=options.pfs_file or "plan.h5")  # named only
    start = time.perf_counter()
    try:
        planned = provision(run, None, options, config=config, baseline_bytes=args.baseline_bytes)
        out = sys.stdout if comm.rank == 0 and args.actions else None
        for action in planned.schedule.actions() if out is not None else ():
            out.write((json.dumps(action_record(action)) if args.json else str(action)) + "\n")
    except (ConfigError, ScheduleError, ValueError) as exc:
        raise CliError(str(exc)) from None
    except PlanError as exc:  # a wrong plan is a bug, not bad input: let it show
        raise RuntimeError(f"plan {options.schedule or 'auto'} failed its simulation: {exc}") from exc
    info = summary(args, run, planned, time.perf_counter() - start)
    if comm.rank == 0:
        if args.json:
            print(json.dumps(info))
        else:
            for note in info["notes"]:
                print(f"hpcadj: {note}")
            print_human(info)
    return 0


def summary(args, run, planned, planning_s: float) -> dict:
    """The plan as ``plan --json`` prints it."""
    from ..checkpoint.mixed_plan import plan_summary

    result, plans = planned.summary, planned.plans
    mixed = plan_summary(run, planned) if planned.schedule.name == "mixed" else None
    peaks = result.peak if mixed is None else [mixed["restart_slots"]]  # a level's slots hold restart states
    info = {
        "schedule": planned.schedule.name, "steps": run.n_steps, "forward_steps": result.forward_steps,
        "recompute_factor": result.recompute_factor, "adjoint_steps": result.adjoint_steps,
        "levels": [{"name": p.name, "slots": p.slots, "writes": w, "reads": r, "peak": k}
                   for p, w, r, k in zip(plans, result.writes, result.reads, peaks)],
        **planned.profile.predicted(planned.predicted_s), "minimize": args.minimize,
        "costs_source": planned.costs.source, "costs_file": args.costs, "planning_s": planning_s,
        "predicted_unit": "s" if args.costs else "relative", "notes": list(planned.notes),
        "warnings": list(planned.warnings),
    }
    if args.minimize == "energy":
        info["predicted_j"] = result.cost(planned.profile.vector("energy"))
    advance = planned.profile.advance_seconds(result)
    if advance is not None:
        info["advance_s"] = advance
    if getattr(args, "model_info", None):
        info["model"] = args.model_info
    if planned.memory is not None:
        info["memory"] = planned.memory.as_dict()
    if mixed is not None:
        info["mixed"] = mixed
    ram = [p for p in plans if p.codec is not None]
    if ram:
        c, raw = ram[0], _largest(run.layout, run.comm)
        info["compression"] = {"codec": c.codec.spec, "lossy": c.codec.lossy, "slot_bytes": c.slot_bytes,
                               "slot_ratio": raw / c.slot_bytes}
    return info


def print_human(info: dict) -> None:
    print(f"schedule {info['schedule']}, {info['steps']} steps")
    print(f"  forward evaluations {info['forward_steps']} ({info['recompute_factor']:.3f} per step), "
          f"adjoint steps {info['adjoint_steps']}")
    print(f"  {'level':<6} {'slots':>8} {'writes':>9} {'reads':>9} {'peak':>8}")
    for lv in info["levels"]:
        print(f"  {lv['name']:<6} {lv['slots']:>8} {lv['writes']:>9} {lv['reads']:>9} {lv['peak']:>8}")
    if info["costs_file"]:
        time_unit, energy_unit, source = "s", "J", info["costs_file"]
    else:  # the documented default profile: forward step 1, adjoint step 2, ... (no unit)
        time_unit = energy_unit = "relative units"
        source = "default costs: forward step 1, give --costs PROFILE.json for seconds"
    print(f"  predicted makespan {_makespan(info):.6g} {time_unit} ({source})")
    if "predicted_j" in info:
        print(f"  predicted energy {info['predicted_j']:.6g} {energy_unit}")
    if "advance_s" in info:
        a = info["advance_s"]
        print(f"  advances: {a['runs']} runs of {a['steps']} steps, predicted {a['predicted']:.6g} {time_unit} "
              f"({a['as_single_steps']:.6g} as single steps)")
    if "memory" in info:
        m = info["memory"]
        print(f"  memory per rank, budget {m['budget'] / 2**20:.1f} MiB: baseline {m['baseline'] / 2**20:.1f} + "
              f"model {m['model'] / 2**20:.1f} + working states {m['working states'] / 2**20:.1f} + staging "
              f"{m['staging'] / 2**20:.1f} + RAM slots {m['ram slots'] / 2**20:.1f} "
              f"({m['ram_slots_fit']} fit) = peak {m['peak'] / 2**20:.1f} MiB")
    for line in mixed_lines(info.get("mixed")):
        print(line)
    if "compression" in info:
        c = info["compression"]
        print(f"  compression {c['codec']}{' (LOSSY)' if c['lossy'] else ''}: slot {c['slot_bytes']} B, "
              f"{c['slot_ratio']:.2f}x smaller than a raw snapshot")
    print(f"  planned in {info['planning_s']:.3f} s")


def mixed_lines(m: dict | None) -> list[str]:
    """A mixed plan's ``mixed`` object (``plan`` and ``run``) for people: its RAM's restart and data
    slots, their bytes, the peak, and the forward steps saved (none without one)."""
    if not m:
        return []
    return [f"  mixed slots per rank: {m['restart_slots']} restart of {m['restart_bytes']} B, {m['data_slots']} "
            f"data of {m['data_bytes']} B (writes {m['restart_writes']} / {m['data_writes']}); peak "
            f"{m['peak_bytes']} B of {m['budget_bytes']} B",
            f"  forward evaluations {m['forward_steps']} against {m['forward_steps_states_only']} with restart "
            f"states alone in the same bytes: {m['forward_steps_saved']} saved"]


def _makespan(info: dict) -> float:
    """The predicted makespan, in seconds or (default costs) relative units."""
    return info["predicted_relative"] if info["predicted_s"] is None else info["predicted_s"]
