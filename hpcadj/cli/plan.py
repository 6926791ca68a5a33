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
from .common import add_model_arguments, build_model, byte_count, step_count, world
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
    p.add_argument("--baseline", default="0B", metavar="BYTES",
                   help="the process's memory before the model is built (default 0)")
    add_checkpoint_options(p, "plan", "--compress")
    p.add_argument("--compressed-bytes", type=byte_count, default=None, metavar="BYTES",
                   help="bytes one compressed snapshot takes on one rank (e.g. `hpcadj calibrate --compress "
                        "SPEC --json`'s compression.probed_bytes); needed with --compress")
    add_checkpoint_options(p, "plan", "--schedule", "--costs", "--minimize")
    add_model_arguments(p, default=None, steps=False)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--actions", action="store_true", help="stream the action list first, one per line")
    p.set_defaults(func=main)


class _Declared:
    """A stand-in stepper for the memory plan: only its declared working set is known."""

    def __init__(self, states: float):
        self.states = states

    def working_set_states(self) -> float:
        return self.states


def compressed_slot(args) -> int | None:
    """Bytes of one compressed slot (as ``run`` sizes it: probed bytes x margin, at most a raw
    snapshot), or None without --compress (or with ``--compress none``)."""
    from ..checkpoint.compression import margin
    from ..checkpoint.storage.codec import parse_codec

    if args.compress is None:
        if args.compressed_bytes is not None:
            raise CliError("--compressed-bytes needs --compress SPEC")
        return None
    try:
        codec = parse_codec(args.compress)
        factor = margin(codec)
    except ImportError as exc:
        raise CliError(f"--compress {args.compress}: codec library missing ({exc})") from None
    except ValueError as exc:
        raise CliError(f"--compress: {exc}") from None
    if codec.spec == "none":
        return None
    if args.compressed_bytes is None or args.snapshot_bytes is None:
        raise CliError("--compress needs --compressed-bytes (one compressed snapshot's bytes on one rank) "
                       "and --snapshot-bytes")
    args.codec = codec
    return min(int(args.compressed_bytes * factor) + 64, args.snapshot_bytes)


def memory_plan(args, given):
    """The --memory breakdown and the RAM slots it leaves (``given``: the --ram/--disk/--pfs slots)."""
    from ..checkpoint.memory import DEFAULT_MODEL_STATES, LevelSpec, least_budget, plan_memory
    from ..checkpoint.options import ConfigError, memory_bytes
    from ..checkpoint.provision import CODEC_STATES

    if args.snapshot_bytes is None:
        raise CliError("--memory needs --snapshot-bytes (one snapshot's bytes on one rank)")
    try:
        budget = memory_bytes(args.memory, "--memory")
        baseline = 0 if args.baseline in ("0", "0B") else memory_bytes(args.baseline, "--baseline")
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    states = DEFAULT_MODEL_STATES if args.model_states is None else args.model_states
    if not (states >= 0 and states < float("inf")):
        raise CliError(f"--model-states must be a number >= 0, got {args.model_states}")
    files = [LevelSpec(name, "local" if name == "disk" else "pfs", slots) for name, slots in given.items()
             if name != "ram" and slots]
    codec = {} if args.slot_bytes is None else {"ram_slot_bytes": args.slot_bytes,
                                                "codec_bytes": CODEC_STATES * args.snapshot_bytes}
    plan = plan_memory(_Declared(states), files, budget_bytes=budget, baseline_bytes=baseline,
                       snapshot_bytes=args.snapshot_bytes, control_bytes=args.snapshot_bytes, **codec)
    ram = min(plan.ram_slots_fit, given["ram"]) if given.get("ram") is not None else plan.ram_slots_fit
    ram = min(ram, max(1, args.steps - 1))
    if plan.fixed_bytes > budget or (ram < 1 and not files):
        raise CliError(f"--memory {args.memory} per rank cannot hold this gradient: the least budget that "
                       f"would do is {least_budget(plan, 0 if files else 1)} bytes")
    final = plan_memory(_Declared(states), [LevelSpec("ram", "ram", ram), *files], budget_bytes=budget,
                        baseline_bytes=baseline, snapshot_bytes=args.snapshot_bytes,
                        control_bytes=args.snapshot_bytes, **codec)
    return ram, final


def capacities_from(args) -> tuple[list[str], list[int]]:
    """Level names and slots from --ram/--disk/--pfs (levels up to the slowest one given), the RAM
    level's slots from --memory when it is given."""
    from ..checkpoint.budget import parse_budget
    from ..levelkinds import LEVEL_NAMES

    given = [(name, getattr(args, name)) for name in LEVEL_NAMES]
    args.slot_bytes = compressed_slot(args)
    slot = args.snapshot_bytes if args.slot_bytes is None else args.slot_bytes
    if args.memory is not None:
        slots = {}
        for name, value in given:
            try:
                slots[name] = None if value is None else parse_budget(value).to_slots(slot)
            except ValueError as exc:
                raise CliError(f"--{name}: {exc}") from None
        ram, args.memory_plan = memory_plan(args, slots)
        given = [("ram", str(ram))] + [(n, v) for n, v in given if n != "ram"]
    last = max((i for i, (_, value) in enumerate(given) if value is not None), default=-1)
    if last < 0:
        raise CliError("give a budget for at least one level: --ram, --disk or --pfs")
    names, slots = [], []
    for name, value in given[:last + 1]:
        names.append(name)
        if value is None:
            slots.append(0)
            continue
        try:
            budget = parse_budget(value)
            if budget.nbytes is not None and args.snapshot_bytes is None:
                raise ValueError(f"--{name} {value} is in bytes: give --snapshot-bytes")
            slots.append(budget.to_slots(slot))
        except ValueError as exc:
            raise CliError(f"--{name}: {exc}") from None
    if sum(slots) < 1:
        raise CliError(f"no slot on any level ({', '.join(f'{n} {s}' for n, s in zip(names, slots))}): "
                       "the budgets cannot hold u_0")
    return names, slots


def load_costs(args, n_levels: int):
    from ..checkpoint.schedules import CostProfile

    if args.costs is None:
        return CostProfile.default(n_levels)
    try:
        profile = CostProfile.load(args.costs)
    except ValueError as exc:
        message = str(exc)
        raise CliError(message if args.costs in message else f"cost profile {args.costs}: {message}") from None
    if len(profile.levels) < n_levels:
        raise CliError(f"cost profile {args.costs} has {len(profile.levels)} levels, the plan uses {n_levels}")
    return profile


def from_model(args) -> None:
    """Fill --steps, --snapshot-bytes and --model-states from the --model's own (given ones stay):
    the model is built on this command's ranks, as ``hpcadj run`` would build it."""
    from ..imports import mpi
    from ..snapshot import layout_bytes

    comm = world(args)
    model = build_model(args, comm)
    if args.steps is None:
        if model.n_steps is None:
            raise CliError(f"model {args.model} has no fixed number of steps (--adaptive): give --steps N")
        args.steps = model.n_steps
    local = layout_bytes(model.snapshot_layout())
    if args.snapshot_bytes is None:
        args.snapshot_bytes = comm.allreduce(local, op=mpi().MAX)
    if args.model_states is None:
        args.model_states = float(model.working_set_states())
    args.model_info = {"model": args.model, "snapshot_bytes": args.snapshot_bytes, "ranks": comm.size}


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
    from ..checkpoint.schedules import PlanError, ScheduleError, Simulator, make_schedule

    if args.model is not None:
        from_model(args)
    elif args.petsc_options:
        raise CliError(f"plan runs no PETSc solver without --model, so it takes no PETSc option "
                       f"(got {' '.join(args.petsc_options)})")
    else:
        refuse_model_options(args)
    if args.steps is None:
        raise CliError("give --steps N (the number of time steps), or a --model that has its own")
    if args.steps < 1:
        raise CliError(f"--steps must be >= 1, got {args.steps}")
    names, slots = capacities_from(args)
    with together():  # with --model on several ranks: a profile some of them cannot read
        profile = load_costs(args, len(names))
    costs = profile.vector(args.minimize).for_levels(len(names))
    time_costs = profile.vector("time").for_levels(len(names))
    schedule_name = args.schedule or "auto"  # the library's default once a budget is given
    start = time.perf_counter()
    try:
        schedule = make_schedule(schedule_name, args.steps, slots, costs=costs)
        sim = Simulator(args.steps, slots)
        out = sys.stdout
        for action in schedule.actions():
            sim.execute(action)
            if args.actions:
                out.write((json.dumps(action_record(action)) if args.json else str(action)) + "\n")
        summary = sim.result(time_costs)
    except (ScheduleError, ValueError) as exc:
        raise CliError(str(exc)) from None
    except PlanError as exc:  # a wrong plan is a bug, not bad input: let it show
        raise RuntimeError(f"plan {schedule_name} failed its simulation: {exc}") from exc
    planning_s = time.perf_counter() - start
    info = {
        "schedule": schedule.name, "steps": args.steps, "forward_steps": summary.forward_steps,
        "recompute_factor": summary.recompute_factor, "adjoint_steps": summary.adjoint_steps,
        "levels": [{"name": name, "slots": s, "writes": w, "reads": r, "peak": p}
                   for name, s, w, r, p in zip(names, slots, summary.writes, summary.reads, summary.peak)],
        **profile.predicted(profile.predicted_seconds(summary)), "minimize": args.minimize,
        "costs_source": profile.source,
        "costs_file": args.costs, "planning_s": planning_s,
        "predicted_unit": "s" if args.costs else "relative",
    }
    if args.minimize == "energy":
        info["predicted_j"] = summary.cost(costs)
    if getattr(args, "model_info", None):
        info["model"] = args.model_info
    if args.memory is not None:
        info["memory"] = args.memory_plan.as_dict()
    if args.slot_bytes is not None:
        info["compression"] = {"codec": args.codec.spec, "lossy": args.codec.lossy, "slot_bytes": args.slot_bytes,
                               "slot_ratio": args.snapshot_bytes / args.slot_bytes}
    if args.json:
        print(json.dumps(info))
    else:
        print_human(info)
    return 0


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
    if "memory" in info:
        m = info["memory"]
        print(f"  memory per rank, budget {m['budget'] / 2**20:.1f} MiB: baseline {m['baseline'] / 2**20:.1f} + "
              f"model {m['model'] / 2**20:.1f} + working states {m['working states'] / 2**20:.1f} + staging "
              f"{m['staging'] / 2**20:.1f} + RAM slots {m['ram slots'] / 2**20:.1f} "
              f"({m['ram_slots_fit']} fit) = peak {m['peak'] / 2**20:.1f} MiB")
    if "compression" in info:
        c = info["compression"]
        print(f"  compression {c['codec']}{' (LOSSY)' if c['lossy'] else ''}: slot {c['slot_bytes']} B, "
              f"{c['slot_ratio']:.2f}x smaller than a raw snapshot")
    print(f"  planned in {info['planning_s']:.3f} s")


def _makespan(info: dict) -> float:
    """The predicted makespan, in seconds or (default costs) relative units."""
    return info["predicted_relative"] if info["predicted_s"] is None else info["predicted_s"]
