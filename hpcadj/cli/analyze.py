"""``hpcadj analyze``: tables and a Pareto plot from the logs of one or more runs (no MPI needed)."""

from __future__ import annotations

import json
import sys

from . import CliError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "analyze", help="tables and a Pareto plot from run logs",
        description="Analyse the logs written by 'hpcadj run --log-dir': seconds, bytes and joules by "
                    "phase and level, recomputation factor and peak memory per run; a comparison of "
                    "runs with the time- and energy-optimal ones marked. Each LOG_DIR is a run's log "
                    "directory or a directory of them. Every run has a status (complete, "
                    "resumed-fragment, missing-rank-logs, failed, stopped, unfinished, incomplete); "
                    "only complete runs are ranked, the others are shown with their partial numbers. "
                    "Problems in a log (truncated line, missing rank) are reported on stderr and in "
                    "the output. A directory written by 'hpcadj invert --log-dir' (inversion.jsonl) "
                    "gets the inversion's convergence table instead (per accepted iterate J, misfit, "
                    "regularisation, |g|, step, forward and adjoint steps, seconds, joules); its --plot "
                    "draws misfit against iterate, time and energy.")
    p.add_argument("log_dirs", nargs="+", metavar="LOG_DIR")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true", help="markdown tables (the default)")
    fmt.add_argument("--csv", action="store_true",
                     help="CSV on stdout: one row per run (with --by-phase: per run, phase and level)")
    fmt.add_argument("--json", action="store_true", help="every number as one JSON object on stdout")
    p.add_argument("--by-phase", action="store_true", help="with --csv: one row per run, phase and level")
    p.add_argument("--plot", metavar="OUT.png", default=None,
                   help="write a Pareto plot: wall time and energy against memory")
    p.add_argument("--memory", choices=["checkpoint", "ram", "rss"], default="checkpoint",
                   help="memory axis of the comparison: peak checkpoint bytes on all levels (default), "
                        "on RAM levels only, or peak resident memory summed over ranks; a run that "
                        "did not log the chosen figure shows n/a (no other metric is substituted)")
    p.add_argument("--energy-model", metavar="FILE.toml", default=None,
                   help="energy model constants overriding the defaults (also $HPCADJ_ENERGY_MODEL)")
    p.add_argument("--sacct", action="store_true",
                   help="ask SLURM accounting (sacct) for each run's job energy")
    p.set_defaults(func=main)


def main(args) -> int:
    from ..telemetry import analyze as an
    from ..telemetry.energy_model import EnergyModelError, load_model

    if args.petsc_options:
        raise CliError(f"unrecognized argument: {args.petsc_options[0]}")
    if args.by_phase and not args.csv:
        raise CliError("--by-phase goes with --csv")
    try:
        if an.find_inversion_dirs(args.log_dirs):
            return inversion_main(args, an)
        if args.plot:
            an.check_output_path(args.plot)
        model = load_model(args.energy_model)
        results = an.analyze(args.log_dirs, model=model, sacct=args.sacct)
        if args.plot:  # before the warnings: a plot that cannot be drawn is the one line printed
            an.pareto_plot(results, args.plot, args.memory)
        for r in results:
            for problem in r["problems"]:
                print(f"hpcadj analyze: warning: {r['path']}: {problem}", file=sys.stderr)
            if not r["complete"]:
                print(f"hpcadj analyze: warning: {r['path']}: status {r['status']}, not ranked: "
                      + "; ".join(r["status_detail"]), file=sys.stderr)
    except (an.AnalyzeError, EnergyModelError) as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"{exc.filename or ''}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        # a binary run.json or --energy-model file: telemetry reads them as UTF-8 text
        raise CliError(f"a log or energy-model file is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if args.csv:
        sys.stdout.write(an.csv_report(results, by_phase=args.by_phase, memory=args.memory))
    elif args.json:
        print(json.dumps({"runs": results, "comparison": an.compare(results, args.memory)}, default=str))
    else:
        sys.stdout.write(an.markdown_report(results, args.memory))
    return 0


def inversion_main(args, an) -> int:
    """``hpcadj analyze`` on ``hpcadj invert --log-dir`` directories: the convergence table per
    inversion and, with --plot, misfit against iterate, wall time and energy."""
    from ..telemetry.energy_model import load_model

    if args.by_phase or args.sacct:
        raise CliError(f"{'--by-phase' if args.by_phase else '--sacct'}: not for an inversion's log "
                       "(its joules per iterate are RAPL's or the model's)")
    if args.plot:
        an.check_output_path(args.plot)
    results = an.analyze_inversions(args.log_dirs, model=load_model(args.energy_model))
    if args.plot:
        an.inversion_plot(results, args.plot)
    for r in results:
        for problem in r["problems"]:
            print(f"hpcadj analyze: warning: {r['path']}: {problem}", file=sys.stderr)
    if args.csv:
        sys.stdout.write(an.inversion_csv(results))
    elif args.json:
        print(json.dumps({"inversions": results}, default=str))
    else:
        sys.stdout.write(an.inversion_markdown(results))
    return 0
