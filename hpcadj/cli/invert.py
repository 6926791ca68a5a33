"""``hpcadj invert``: minimise the model's objective over some of its controls with PETSc TAO, each
gradient a checkpointed session, accepted iterates durable in --run-dir for --resume."""

from __future__ import annotations

import argparse
import json
import math
import sys

from . import CliError
from .common import add_model_arguments, build_model, has_budget, memory_baseline, positive_float, step_count, world
from .options import add_checkpoint_arguments, checkpointing
from .run import EXIT_FAILED, EXIT_STOPPED, StopFlag
from ..imports import mpi
from ..telemetry.jsonlog import peak_rss_bytes


#: TAO's iteration cap is a PetscInt: the largest one of a 32-bit-index build
PETSC_INT_MAX = 2**31 - 1


def iteration_cap(text: str) -> int:
    """An argparse ``type=``: --max-it, a whole number from 0 to PETSc's largest int."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 0 <= value <= PETSC_INT_MAX:
        raise argparse.ArgumentTypeError(f"must be between 0 and {PETSC_INT_MAX} (PETSc's int), got {value}")
    return value


def inverted_controls(text: str) -> list[str]:
    """--invert's names, each once (CliError for a name given twice)."""
    names = [n for n in text.split(",") if n]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise CliError(f"--invert {text}: {', '.join(twice)} {'is' if len(twice) == 1 else 'are'} named twice")
    return names


def bound_spec(text: str) -> tuple[str, tuple[float | None, float | None]]:
    """``NAME:LOW:HIGH`` (either side may be empty: unbounded) as (name, (low, high))."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[0]:
        raise ValueError(f"--bounds {text}: expected NAME:LOW:HIGH, e.g. kappa:0.5:3")
    values = []
    for part in parts[1:]:
        try:
            values.append(None if part.strip() in ("", "inf", "-inf", "+inf") else float(part))
        except ValueError:
            raise ValueError(f"--bounds {text}: {part!r} is not a number") from None
    return parts[0], tuple(values)


def add_parser(subparsers) -> None:
    from ..inversion.cache import POLICIES
    from ..inversion.driver import TAO_TYPES

    p = subparsers.add_parser("invert", help="minimise J over controls with TAO (inversion)",
                              description="Minimise J(m) + w/2 |m - m0|^2 over the controls named by "
                                          "--invert with PETSc TAO, every gradient a checkpointed adjoint "
                                          "run; an evaluation at controls equal in every bit to the last "
                                          "one costs nothing. -tao_* options go to TAO.")
    add_model_arguments(p)
    add_checkpoint_arguments(p)
    o = p.add_argument_group("inversion")
    o.add_argument("--invert", required=True, metavar="NAME[,NAME]",
                   help="the controls to optimise (e.g. kappa); the others stay at their defaults")
    o.add_argument("--tao", default=None, choices=TAO_TYPES,
                   help="TAO method (default: blmvm with --bounds, else lmvm; -tao_type overrides)")
    o.add_argument("--bounds", action="append", default=[], metavar="NAME:LOW:HIGH",
                   help="bounds on an inverted control, e.g. kappa:0.5:3 (a side left empty: unbounded)")
    o.add_argument("--regularization", type=float, default=0.0, metavar="W",
                   help="Tikhonov weight w >= 0 of w/2 |m - m0|^2, m0 the starting controls (default 0)")
    o.add_argument("--max-it", type=iteration_cap, default=20, metavar="K",
                   help="cap on accepted iterates, resumes included (default 20)")
    for name in ("gatol", "grtol", "gttol"):
        o.add_argument(f"--{name}", type=float, default=None, help=f"TAO's {name} (default TAO's)")
    o.add_argument("--policy", default="keep", choices=POLICIES,
                   help="what an objective-only request at a new control (a line search's trial) runs: "
                        "keep (default): the gradient's first sweep, its checkpoint levels held until the "
                        "next evaluation, so a gradient at that control costs only the reverse sweep; "
                        "gradient: the whole gradient session, a reverse sweep wasted on every rejected "
                        "trial; forward: one forward sweep without snapshots, a gradient there then pays a "
                        "whole session. Every policy gives the same iterates, bit for bit")
    o.add_argument("--controls-out", metavar="FILE.h5", default=None,
                   help="write the final controls as global datasets (parallel HDF5)")
    o.add_argument("--gradient-out", metavar="FILE.h5", default=None,
                   help="with --shots: write the summed gradient of J at the final controls as global "
                        "datasets grad_<control> (parallel HDF5)")
    o.add_argument("--log-dir", metavar="DIR", default=None,
                   help="append one JSON line per accepted iterate to DIR/inversion.jsonl")
    o.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    r = p.add_argument_group("restart")
    r.add_argument("--run-dir", default=None, metavar="DIR",
                   help="make every accepted iterate durable here (controls and state, checksummed)")
    r.add_argument("--resume", action="store_true",
                   help="continue the inversion in --run-dir (same options) from its last accepted iterate")
    r.add_argument("--time-limit", type=positive_float, default=None, metavar="SECONDS",
                   help="stop (exit 75) at the end of the first evaluation after SECONDS")
    s = p.add_argument_group("shots (wave)")
    s.add_argument("--shots", type=step_count, default=None, metavar="K",
                   help="J summed over K shots, sources spread along the receivers' line, run in parallel")
    s.add_argument("--ranks-per-shot", type=step_count, default=None, metavar="R",
                   help="ranks of one shot (default 1); must divide the job's ranks")
    p.set_defaults(func=main)


def check_shot_options(args) -> None:
    """CliError for shot options no run can use, before MPI work (the rank count is checked later)."""
    if args.shots is None:
        if args.ranks_per_shot is not None:
            raise CliError("--ranks-per-shot needs --shots K")
        return
    if args.shots < 1:
        raise CliError(f"--shots must be >= 1, got {args.shots}")
    if args.ranks_per_shot is not None and args.ranks_per_shot < 1:
        raise CliError(f"--ranks-per-shot must be >= 1, got {args.ranks_per_shot}")
    if args.model != "wave":
        raise CliError(f"--shots: model {args.model} has no shots (sources); --model wave has")
    if args.source_x is not None:
        raise CliError("--shots places the sources along the receivers' line itself: drop --source-x")
    if args.observed:
        raise CliError("--observed holds one shot's traces: with --shots the observations come from the "
                       "true model (--observed-from-model)")


def shot_inversion(args, comm, invert, options, settings):
    """The shot-parallel inversion of the command line: shot k's model is --model wave with its source
    at shot_positions(K)[k]."""
    import argparse

    from ..inversion.shots import ShotInversion, shot_positions

    positions = shot_positions(args.shots)

    def factory(shot_comm, shot):
        shot_args = argparse.Namespace(**vars(args))
        shot_args.source_x = positions[shot]
        try:
            return build_model(shot_args, shot_comm)
        except CliError as exc:
            raise ValueError(str(exc)) from None

    return ShotInversion(comm, factory, args.shots, invert, options, ranks_per_shot=args.ranks_per_shot or 1,
                         **settings)


def write_gradient(path: str, inversion, result, invert, writes: bool) -> None:
    """The shots' summed gradient at the final controls as datasets grad_<control> (group 0 writes)."""
    from ..fieldio import write_fields

    problem = inversion.problem
    packed = inversion.gradient(result.controls)
    fields = inversion.evaluations.space.unpack(packed)
    arrays = problem.control_arrays(fields)
    layouts = problem.control_layout()
    if writes:
        write_fields(path, problem.comm, {f"grad_{n}": layouts[n] for n in invert},
                     {f"grad_{n}": arrays[n] for n in invert}, attrs={"J": result.misfit})
    for vec in list(fields.values()) + [packed]:
        vec.destroy()


def main(args) -> int:
    import os

    from ..adjoint.session import ConfigError, check_configuration
    from ..inversion import Inversion, InversionError
    from ..models.base import SolverError

    stop = StopFlag()
    stop.install()
    try:
        bounds = dict(bound_spec(text) for text in args.bounds)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.resume and not args.run_dir:
        raise CliError("--resume needs --run-dir DIR (the inversion to continue)")
    check_shot_options(args)
    invert = inverted_controls(args.invert)
    if args.gradient_out and args.shots is None:
        raise CliError("--gradient-out needs --shots K (hpcadj run writes a single run's gradient)")
    comm = world(args)
    try:
        # held for the whole inversion (None without a budget: each session measures its own); a
        # Newton type's products warmed too
        newton = (args.tao or "") in ("nls", "bntr") and args.shots is None
        args.memory_baseline = memory_baseline(args, comm, second_order=newton) if has_budget(args) else None
        options = checkpointing(args)
        check_configuration(comm, options, None, args.controls_out)
        settings = dict(bounds=bounds, regularization=args.regularization,
                        tao_type=args.tao or ("blmvm" if bounds else "lmvm"), max_it=args.max_it,
                        gatol=args.gatol, grtol=args.grtol, gttol=args.gttol, run_dir=args.run_dir,
                        resume=args.resume, should_stop=stop, time_limit=args.time_limit,
                        log=os.path.join(args.log_dir, "inversion.jsonl") if args.log_dir else None,
                        policy=args.policy, tao_options=args.petsc_options)
        writes = True
        if args.shots is None:
            model = build_model(args, comm)
            inversion = Inversion(model, invert, options, **settings)
        else:
            inversion = shot_inversion(args, comm, invert, options, settings)
        result = inversion.solve()
        if args.shots is not None:
            model, writes = inversion.problem, inversion.layout.group == 0
        from ..fieldio import write_fields

        if args.controls_out and result.status != "stopped" and writes:
            write_fields(args.controls_out, model.comm, model.control_layout(),
                         model.control_arrays(result.controls), attrs={"J": result.J, "iterations": result.iterations})
        if args.gradient_out and result.status != "stopped":
            write_gradient(args.gradient_out, inversion, result, invert, writes)
    except (ConfigError, InversionError) as exc:
        raise CliError(str(exc)) from None
    except SolverError as exc:
        raise CliError(f"{exc}; a smaller --dt may help") from None
    info = {**model.describe(), "ranks": comm.size, "status": result.status, "reason": result.reason,
            "iterations": result.iterations, "J": result.J, "misfit": result.misfit,
            "regularization": result.regularization, "grad_norm": result.grad_norm,
            "resumed_from": result.resumed_from, "removed": result.removed, **result.counts,
            "peak_rss_bytes": comm.allreduce(peak_rss_bytes(), op=mpi().MAX)}
    if comm.rank == 0:
        if result.removed:  # what a killed process of this inversion left, gone before any evaluation
            print(f"hpcadj: resume: {'; '.join(result.removed)}", file=sys.stderr, flush=True)
        if args.json:
            print(json.dumps(info, default=lambda v: None))
        else:
            print_human(info)
        if result.status == "stopped":
            where = (f"state is durable in {args.run_dir}; continue with --resume" if args.run_dir
                     else "nothing durable (no --run-dir): a new run starts over")
            print(f"hpcadj: stopped at iterate {result.iterations}; {where}", file=sys.stderr, flush=True)
    if result.status == "stopped":
        return EXIT_STOPPED
    return EXIT_FAILED if result.status == "diverged" else 0


def print_human(info: dict) -> None:
    def num(v):
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.6e}"

    print(f"hpcadj invert: {info['model']} {info.get('grid')}, {info['steps']} steps, {info['ranks']} rank(s): "
          f"{info['status']} (TAO reason {info['reason']}) after {info['iterations']} iterate(s)")
    print(f"  J = {num(info['J'])} (misfit {num(info['misfit'])}, regularisation {num(info['regularization'])}), "
          f"|g| = {num(info['grad_norm'])}")
    print(f"  forward steps {info['forward_steps']}, adjoint steps {info['adjoint_steps']}, gradient sessions "
          f"{info['sessions']}, forward-only sweeps {info['forward_sweeps']}, cache hits {info['hits']}, "
          f"{info['seconds']:.3f} s")
    if info.get("shots"):
        print(f"  {info['shots']} shots, {info['ranks_per_shot']} rank(s) each, {info['shot_groups']} at a time "
              f"on {info['nodes']} node(s)")
