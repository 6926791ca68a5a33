"""``hpcadj run``: J and its gradient for a model, with a checkpoint plan over storage levels."""

from __future__ import annotations

import json
import signal
import sys
from dataclasses import replace

from . import CliError, together
from .common import add_model_arguments, build_model, memory_baseline, world
from .options import add_checkpoint_arguments, checkpointing

EXIT_FAILED = 1
EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped on request, state durable, resume with --resume


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("run", help="compute J and its gradient",
                              description="Compute the objective J and dJ/d(controls) with an exact "
                                          "discrete adjoint, checkpointing within the given budgets. "
                                          "Unknown single-dash options go to PETSc.")
    add_model_arguments(p)
    add_checkpoint_arguments(p)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    p.add_argument("--gradient-out", metavar="FILE.h5", default=None,
                   help="write the gradients as global datasets grad_<control> (parallel HDF5)")
    p.add_argument("--log-dir", metavar="DIR", default=None,
                   help="write JSON-lines telemetry (one file per rank, run.json, summary.json)")
    p.add_argument("--energy-model", metavar="FILE.toml", default=None,
                   help="override the energy model's constants ($HPCADJ_ENERGY_MODEL)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    p.add_argument("--check-compression", action="store_true",
                   help="also compute one uncompressed (store-all) reference gradient and report the "
                        "compressed gradient's relative error (compression.gradient_rel_error)")
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


def restart(args):
    """The restart options as the library's :class:`Restart` (checked even without --run-dir)."""
    from ..adjoint.session import Restart

    if args.resume and not args.run_dir:
        raise CliError("--resume needs --run-dir DIR (the directory of the run to continue)")
    options = Restart(args.run_dir or "", resume=args.resume, durable_every=args.durable_every,
                      durable_interval=durable_interval(args.durable_interval), mtbf=args.mtbf)
    options.check()
    return options if args.run_dir else None


def durable_interval(text: str) -> float | None:
    """--durable-interval in seconds (None: auto)."""
    import math

    if text == "auto":
        return None
    try:
        return float(text)
    except ValueError:
        return math.nan  # refused by Restart.check with the flag's own message


def load_energy_model(args):
    """The --energy-model constants, checked before anything runs (None: defaults)."""
    from ..telemetry import load_model

    if args.energy_model is None:
        return None
    try:
        return load_model(args.energy_model)
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise CliError(f"--energy-model {args.energy_model}: {exc}") from None


def main(args) -> int:
    from ..adjoint.session import ConfigError, check_configuration

    stop = StopFlag()
    stop.install()  # from the start: a SIGUSR1 during set-up must not kill the run either
    comm = world(args)
    try:
        options, resumable = checkpointing(args), restart(args)
        check_configuration(comm, options, resumable, args.gradient_out)  # before any gradient
        with together():
            energy_model = load_energy_model(args)
        # before the model (its working set is predicted on top), after the checks (it runs a gradient)
        options = replace(options, memory_baseline=memory_baseline(args, comm))
        model = build_model(args, comm)
        return solve(args, comm, model, options, resumable, energy_model, stop)
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def solve(args, comm, model, options, resumable, energy_model, stop) -> int:
    """Plan, run and report one gradient; the exit status."""
    from ..adjoint.session import GradientSession
    from ..models.base import SolverError

    def message(kind: str, text: str) -> None:
        if comm.rank == 0:
            print(f"hpcadj: {'warning: ' if kind == 'warning' else ''}{text}", file=sys.stderr, flush=True)

    session = GradientSession(model, options, restart=resumable, log_dir=args.log_dir,
                              energy_model=energy_model, gradient_out=args.gradient_out,
                              record={"argv": sys.argv}, progress=not (args.quiet or args.json),
                              should_stop=stop, on_message=message, resume_hint="--resume", checked=True)
    try:
        outcome = session.solve()
    except SolverError as exc:  # e.g. Newton diverging for an enormous time step
        raise CliError(str(exc)) from None
    if outcome.status == "stopped":
        message("stop", outcome.message)
        return EXIT_STOPPED
    if outcome.status == "failed":
        message("error", f"error: {outcome.message}")
        return EXIT_FAILED
    info = outcome.info
    if getattr(args, "check_compression", False):
        check_compression(model, session, outcome)
    if comm.rank == 0:
        if args.json:
            print(json.dumps(info))
        else:
            for note in session.notes:
                print(f"hpcadj: {note}")
            print_human(info)
    return 0


def check_compression(model, session, outcome) -> None:
    """The compressed gradient's relative 2-norm error against one uncompressed store-all gradient
    (per control and over all), into ``info["compression"]``."""
    import math

    from ..adjoint.verify import compute_gradient

    info = outcome.info
    if "compression" not in info:
        raise CliError("--check-compression needs --compress (or --compress-ram/-disk/-pfs)")
    ref = compute_gradient(model, session.controls)
    errors, num, den = {}, 0.0, 0.0
    for name, vec in outcome.result.gradient.items():
        diff = vec.copy()
        diff.axpy(-1.0, ref.gradient[name])
        d, r = diff.norm(), ref.gradient[name].norm()
        diff.destroy()
        errors[name] = d / r if r else d
        num, den = num + d * d, den + r * r
    info["compression"]["gradient_rel_error"] = math.sqrt(num / den) if den else math.sqrt(num)
    info["compression"]["gradient_rel_error_per_control"] = errors
    info["compression"]["reference_J"] = ref.J


def print_human(info: dict) -> None:
    from .plan import mixed_lines

    grid = info.get("grid") or "(no grid: the model's describe() reports none)"
    print(f"hpcadj run: {info['model']} {grid}, {info['steps']} steps, {info['ranks']} rank(s), "
          f"schedule {info['schedule']}")
    print(f"  J = {info['J']:.12e}")
    for name, value in info["grad_norms"].items():
        print(f"  |dJ/d{name}| = {value:.12e}")
    print(f"  forward steps {info['forward_steps']} ({info['recomputed_steps']} recomputed, "
          f"factor {info['forward_steps'] / info['steps']:.3f}), adjoint steps {info['adjoint_steps']}, "
          f"wall {info['wall_s']:.3f} s")
    unit = "s" if info["predicted_s"] is not None else "relative units: default costs"
    print(f"  predicted makespan {_makespan(info):.3f} ({unit}, "
          f"minimising {info['minimize']})")
    for lv in info["levels"]:
        print(f"  level {lv['name']:<4} ({lv['kind']:<5}) slots {lv['slots']:>6}  peak {lv['peak_slots']:>6}  "
              f"writes {lv['writes']:>6}  reads {lv['reads']:>6}  "
              f"{(lv['bytes_written'] + lv['bytes_read']) / 2**20:10.2f} MiB  "
              f"write {lv['write_s']:.3f} s  read {lv['read_s']:.3f} s")
    if "memory" in info:
        m = info["memory"]
        print(f"  memory per rank: budget {m['budget'] / 2**20:.1f} MiB ({m['source']}): baseline "
              f"{m['baseline'] / 2**20:.1f}, model {m['model'] / 2**20:.1f}, working states "
              f"{m['working states'] / 2**20:.1f}, staging {m['staging'] / 2**20:.1f}, RAM slots "
              f"{m['ram slots'] / 2**20:.1f} MiB; predicted peak {m['peak'] / 2**20:.1f} MiB")
    for line in mixed_lines(info.get("mixed")):
        print(line)
    for name, c in info.get("compression", {}).items():
        kind = f"LOSSY (|error| <= {c['tolerance']:g}, measured {c['max_error']:.3g})" if c["lossy"] else "lossless"
        ratio = f"{c['ratio']:.2f}x" if c["ratio"] else "n/a"
        print(f"  compression {name:<4} {c['codec']}: {kind}, ratio {ratio}, slot {c['slot_bytes']} B "
              f"({c['slot_ratio']:.2f}x smaller than raw)")
        if c["overflows"]:
            print(f"  compression {name:<4}: {c['overflows']} snapshot(s) compressed to more than the slot "
                  f"(largest {c['largest_bytes']} B): the planner re-planned around them; raise --compress-probe "
                  f"or $HPCADJ_COMPRESS_MARGIN")
    if "gradient_rel_error" in info.get("compression", {}):
        print(f"  gradient relative error vs uncompressed: {info['compression']['gradient_rel_error']:.3e}")
    phases = ", ".join(f"{k} {v:.3f} s" for k, v in info["phase_s"].items())
    print(f"  phases: {phases}; peak RSS {info['peak_rss_bytes'] / 2**20:.1f} MiB")


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


def _makespan(info: dict) -> float:
    """The predicted makespan, in seconds or (default costs) relative units."""
    return info["predicted_relative"] if info["predicted_s"] is None else info["predicted_s"]
