"""Inversion logs (``inversion.jsonl``, written by ``hpcadj invert --log-dir``): the convergence
table per inversion, its totals, and misfit against iterate, wall time and energy.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field

from ..energy_model import EnergyModel, load_model
from .logs import MIB, AnalyzeError, distinguishing_suffixes, json_lines
from .report import fmt, save_png


INVERSION_FILE = "inversion.jsonl"
#: the convergence table's columns: (key in a row, header)
INVERSION_COLUMNS = [("iteration", "iterate"), ("J", "J"), ("misfit", "misfit"), ("regularization", "regularisation"),
                     ("grad_norm", "‖g‖"), ("step", "step"), ("forward_steps", "forward steps"),
                     ("adjoint_steps", "adjoint steps"), ("naive_forward_steps", "naive-loop forward steps"),
                     ("seconds", "seconds"), ("wall_seconds", "cumulative s"), ("joules", "joules"),
                     ("cumulative_joules", "cumulative J"), ("max_rss_MiB", "peak RSS MiB")]
_INVERSION_NUMBERS = ("J", "misfit", "regularization", "grad_norm", "step", "seconds", "joules")


def is_inversion_dir(path: str) -> bool:
    """Whether ``path`` holds an inversion's log (``inversion.jsonl``, written by ``hpcadj invert --log-dir``)."""
    return os.path.isfile(os.path.join(path, INVERSION_FILE))


def find_inversion_dirs(paths) -> list[str] | None:
    """The inversion log directories named by ``paths`` (each one or a directory of them); None when
    no path holds an inversion log; AnalyzeError when some do and others hold run logs."""
    found, others = [], []
    for path in map(os.fspath, paths):
        if not os.path.isdir(path):
            return None  # find_run_dirs says what is wrong with it
        if is_inversion_dir(path):
            found.append(path)
            continue
        subdirs = sorted(os.path.join(path, n) for n in os.listdir(path))
        inner = [d for d in subdirs if os.path.isdir(d) and is_inversion_dir(d)]
        (found.extend(inner) if inner else others.append(path))
    if found and others:
        raise AnalyzeError(f"{others[0]}: no {INVERSION_FILE} here while {found[0]} is an inversion's log: "
                           "analyze inversion logs and run logs separately")
    return found or None


@dataclass
class InversionLog:
    """The accepted iterates read from one ``inversion.jsonl``, and what was wrong with it."""

    path: str
    records: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    path_label: str | None = None


def load_inversion(path) -> InversionLog:
    """Read ``path/inversion.jsonl``: one record per accepted iterate. A line that is not a JSON
    object with a whole ``iteration`` is skipped with a problem; an iterate logged again (an inversion
    restarted without ``--resume`` in the same log directory, or a resume repeating iterates) keeps its
    last record and says so. AnalyzeError when no iterate is left."""
    path = os.fspath(path)
    log = InversionLog(path=path)
    file = os.path.join(path, INVERSION_FILE)
    try:
        with open(file, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise AnalyzeError(f"{file}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise AnalyzeError(f"{file}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    by_iterate: dict[int, dict] = {}
    for number, rec, bad in json_lines(text):
        if bad:
            log.problems.append(f"{INVERSION_FILE}: line {number} is "
                                + ("truncated (the file ends mid-line)" if bad == "truncated" else "not valid JSON")
                                + "; skipped")
            continue
        iteration = rec.get("iteration") if isinstance(rec, dict) else None
        if not isinstance(iteration, int) or isinstance(iteration, bool) or iteration < 0 \
                or not all(isinstance(rec.get(k), (int, float, type(None))) for k in _INVERSION_NUMBERS):
            log.problems.append(f"{INVERSION_FILE}: line {number} is not an iterate record; skipped")
            continue
        if iteration in by_iterate:
            log.problems.append(f"{INVERSION_FILE}: iterate {iteration} logged again at line {number} (an "
                                "inversion restarted in this log directory?): the later record is kept")
        by_iterate[iteration] = rec
    if not by_iterate:
        raise AnalyzeError(f"{file}: no accepted iterate logged")
    log.records = [by_iterate[k] for k in sorted(by_iterate)]
    gaps = [k for k in range(log.records[0]["iteration"], log.records[-1]["iteration"]) if k not in by_iterate]
    if gaps:
        log.problems.append(f"{INVERSION_FILE}: iterates {', '.join(map(str, gaps[:10]))} missing")
    return log


def analyse_inversion(log: InversionLog, model: EnergyModel | None = None) -> dict:
    """The convergence table of one inversion and its totals: per iterate J, misfit, regularisation,
    ‖g‖, step, forward/adjoint steps (and the naive loop's), seconds and joules, cumulated; joules
    measured when every iterate has them (RAPL), else modeled from seconds × ranks."""
    model = model or load_model()
    measured = all(isinstance(r.get("joules"), (int, float)) for r in log.records)
    source = (log.records[0].get("energy_source") or "measured") if measured else "model"
    rows, wall, energy = [], 0.0, 0.0
    for rec in log.records:
        seconds = float(rec.get("seconds") or 0.0)
        ranks = rec.get("ranks") if isinstance(rec.get("ranks"), int) else 1
        joules = float(rec["joules"]) if measured else model.compute_joules(seconds, ranks)
        wall += seconds
        energy += joules
        rss = rec.get("max_rss_bytes")
        rows.append({"iteration": rec["iteration"], "J": rec.get("J"), "misfit": rec.get("misfit"),
                     "regularization": rec.get("regularization"), "grad_norm": rec.get("grad_norm"),
                     "step": rec.get("step"), "forward_steps": rec.get("forward_steps"),
                     "adjoint_steps": rec.get("adjoint_steps"), "naive_forward_steps": rec.get("naive_forward_steps"),
                     "seconds": seconds, "wall_seconds": wall, "joules": joules, "cumulative_joules": energy,
                     "ranks": ranks, "max_rss_MiB": rss / MIB if isinstance(rss, (int, float)) else None})
    misfits = [r["misfit"] for r in rows if isinstance(r["misfit"], (int, float))]
    Js = [r["J"] for r in rows if isinstance(r["J"], (int, float))]

    def total(key):
        values = [r[key] for r in rows]
        return sum(values) if all(isinstance(v, int) for v in values) else None

    first, last = (misfits[0], misfits[-1]) if misfits else (None, None)
    forward = total("forward_steps")
    # per-iteration figures leave out the start (set-up, first evaluation)
    later = [r["forward_steps"] for r in rows[1:]]
    naive_later = [r["naive_forward_steps"] for r in rows[1:]]
    rss = [r["max_rss_MiB"] for r in rows if r["max_rss_MiB"] is not None]
    return {"label": log.path_label or os.path.basename(os.path.normpath(log.path)), "path": log.path,
            "rows": rows, "iterates": len(rows), "first_iteration": rows[0]["iteration"],
            "last_iteration": rows[-1]["iteration"], "ranks": rows[-1]["ranks"],
            "misfit_first": first, "misfit_last": last,
            "misfit_reduction": first / last if first is not None and last else None,
            "J_monotone": all(b <= a for a, b in zip(Js, Js[1:])),
            "misfit_monotone": all(b <= a for a, b in zip(misfits, misfits[1:])),
            "forward_steps": forward, "adjoint_steps": total("adjoint_steps"),
            "naive_forward_steps": total("naive_forward_steps"),
            "forward_steps_per_iteration": _mean(later),
            "naive_forward_steps_per_iteration": _mean(naive_later),
            "wall_seconds": wall, "seconds_per_iteration": _mean([r["seconds"] for r in rows[1:]]),
            "joules": energy, "energy_source": source, "max_rss_MiB": max(rss) if rss else None,
            "problems": list(log.problems)}


def _mean(values: list) -> float | None:
    """The mean of whole or real numbers, None if there are none or one is missing."""
    if not values or not all(isinstance(v, (int, float)) for v in values):
        return None
    return sum(values) / len(values)


def analyze_inversions(paths, *, model: EnergyModel | None = None) -> list[dict]:
    """Load and analyse every inversion log under ``paths`` (see :func:`find_inversion_dirs`)."""
    dirs = find_inversion_dirs(paths)
    if not dirs:
        raise AnalyzeError(f"{', '.join(map(os.fspath, paths))}: no {INVERSION_FILE}")
    logs = [load_inversion(d) for d in dirs]
    for log, label in zip(logs, distinguishing_suffixes(dirs)):
        log.path_label = label
    return [analyse_inversion(log, model) for log in logs]


def inversion_markdown(results: list[dict]) -> str:
    """Markdown: per inversion, its totals and its convergence table (one row per accepted iterate)."""
    out = ["# hpcadj analyze: inversions", ""]
    digits = {"J": 7, "misfit": 7, "regularization": 7, "grad_norm": 7}
    for r in results:
        out += [f"## Inversion `{r['label']}`", ""]
        out.append(f"- iterates {r['first_iteration']} to {r['last_iteration']} ({r['iterates']} logged), "
                   f"{r['ranks']} rank(s)")
        out.append(f"- misfit {fmt(r['misfit_first'], 7)} → {fmt(r['misfit_last'], 7)} (reduced "
                   f"{fmt(r['misfit_reduction'])}×; {'monotone' if r['misfit_monotone'] else 'NOT monotone'}"
                   f" in accepted iterates; J {'monotone' if r['J_monotone'] else 'NOT monotone'})")
        out.append(f"- forward steps {fmt(r['forward_steps'])}, {fmt(r['forward_steps_per_iteration'])} per "
                   f"iteration after the start (a naive loop, forward + gradient per evaluation: "
                   f"{fmt(r['naive_forward_steps'])}, {fmt(r['naive_forward_steps_per_iteration'])} per "
                   f"iteration); adjoint steps {fmt(r['adjoint_steps'])}")
        out.append(f"- wall {fmt(r['wall_seconds'])} s ({fmt(r['seconds_per_iteration'])} s per iteration "
                   "after the start), "
                   f"energy {fmt(r['joules'])} J (source **{r['energy_source']}**), peak RSS "
                   f"{fmt(r['max_rss_MiB'])} MiB on the largest rank")
        out.append("")
        header = [h for _, h in INVERSION_COLUMNS]
        header[header.index("joules")] = f"joules ({r['energy_source']})"
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        for row in r["rows"]:
            lines.append("| " + " | ".join(fmt(row[k], digits.get(k, 4)) for k, _ in INVERSION_COLUMNS) + " |")
        out += lines + [""]
        if r["problems"]:
            out += ["**Problems in this log:**", ""] + [f"- {p}" for p in r["problems"]] + [""]
    return "\n".join(out)


def inversion_csv(results: list[dict]) -> str:
    """CSV: one row per inversion and accepted iterate, every number at full precision."""
    buf = io.StringIO()
    fields = ["run"] + [k for k, _ in INVERSION_COLUMNS] + ["energy_source", "ranks"]
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for r in results:
        for row in r["rows"]:
            writer.writerow({"run": r["label"], "energy_source": r["energy_source"],
                             **{k: row[k] for k in fields if k in row}})
    return buf.getvalue()


def inversion_plot(results: list[dict], out_path: str) -> None:
    """Three panels, misfit against accepted iterate, wall time and energy (log scale), one line per
    inversion. Written to a temporary file and renamed: a failure leaves no partial PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    sources = sorted({r["energy_source"] for r in results})
    drawn = 0
    for r in results:
        rows = [row for row in r["rows"] if isinstance(row["misfit"], (int, float)) and row["misfit"] > 0]
        if not rows:
            continue
        drawn += 1
        misfit = [row["misfit"] for row in rows]
        for ax, key in zip(axes, ("iteration", "wall_seconds", "cumulative_joules")):
            ax.semilogy([row[key] for row in rows], misfit, marker="o", ms=3, lw=1.2, label=r["label"])
    if not drawn:
        plt.close(fig)
        raise AnalyzeError("no iterate with a positive misfit: nothing to plot")
    for ax, xlabel in zip(axes, ("accepted iterate", "wall time [s]", f"energy [J] ({'/'.join(sources)})")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("misfit")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    axes[0].legend(fontsize=8)
    fig.suptitle("hpcadj inversions: misfit against iterate, time and energy", fontsize=11)
    fig.tight_layout()
    save_png(fig, out_path, dpi=90)
