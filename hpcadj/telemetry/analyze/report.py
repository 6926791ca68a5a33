"""What ``hpcadj analyze`` prints and draws for runs: Markdown, CSV and the Pareto plot."""

from __future__ import annotations

import csv
import io
import os

from .compare import MEMORY_METRICS, compare, pareto
from .logs import MIB, AnalyzeError


def fmt(value, digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def md_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_report(results: list[dict], memory: str = "checkpoint") -> str:
    """Markdown: a section per run (phase table, problems) and a comparison table."""
    out = ["# hpcadj analyze", ""]
    for r in results:
        rec = r["record"]
        out.append(f"## Run `{r['label']}`")
        out.append("")
        facts = [f"run id {r['run_id'] or 'unknown'}", f"{r['ranks']} ranks ({r['ranks_logged']} logged)"]
        if r["job_id"]:
            facts.append(f"SLURM job {r['job_id']}")
        for key in ("model", "grid", "schedule", "steps"):
            if rec.get(key) is not None:
                facts.append(f"{key} {rec[key]}")
        out.append("; ".join(facts) + ".")
        out.append("")
        if r["complete"]:
            out.append("- status: **complete**")
        else:
            out.append(f"- status: **{r['status']}** (not compared with complete runs: "
                       + "; ".join(r["status_detail"]) + ")")
        energy = r["energy"]
        model_j = r["energy_model"]["joules"]
        out.append(f"- wall time: {fmt(r['wall_seconds'])} s (from {r['wall_from']})")
        out.append(f"- energy: {fmt(energy['joules'])} J, source **{energy['source']}**"
                   + (f" (model: {fmt(model_j)} J)" if energy["source"] != "model" else ""))
        for name, fig in sorted(r["energy_measured"].items()):
            if fig.get("source") == "unavailable":
                out.append(f"- {name}: unavailable ({fig.get('reason', '')})")
        out.append(f"- recomputation factor: {fmt(r['recompute_factor'])} "
                   f"(forward evaluations {fmt(r['forward_steps'])} + {fmt(r['recompute_steps'])} "
                   f"over {fmt(r['steps'])} steps)")
        ckpt = r["checkpoint_peak_bytes"]
        rss = r["peak_rss_bytes"]
        out.append(f"- peak memory: checkpoints {fmt(ckpt / MIB if ckpt is not None else None)} MiB; "
                   f"RSS {fmt(rss['max'] / MIB if rss else None)} MiB on the largest rank, "
                   f"{fmt(rss['sum'] / MIB if rss else None)} MiB over all ranks")
        out.append("")
        measured_col = energy["source"] != "model"
        header = ["phase", "level", "count", "steps", "seconds (all ranks)", "seconds (slowest rank)",
                  "% of wall", "MiB", "J (model)"] + ([f"J ({energy['source']}, model shares)"]
                                                     if measured_col else [])
        rows = []
        for row in r["phases"]:
            share = 100.0 * row["seconds_max"] / r["wall_seconds"] if r["wall_seconds"] else None
            rows.append([row["phase"], row["level"] if row["level"] is not None else "", row["count"],
                         row["steps"], row["seconds_sum"], row["seconds_max"], share,
                         row["bytes"] / MIB, row["joules_model"]]
                        + ([row["joules_measured_share"]] if measured_col else []))
        rows.append(["other (outside phases)", "", "", "", r["other_core_seconds"], "", "", "",
                     r["other_joules_model"]] + ([""] if measured_col else []))
        out.append(md_table(header, rows))
        out.append("")
        if r["problems"]:
            out.append("**Problems in this log:**")
            out.append("")
            out.extend(f"- {p}" for p in r["problems"])
            out.append("")
    rows = compare(results, memory)
    out.append("## Comparison")
    out.append("")
    mem_name = MEMORY_METRICS[memory]
    out.append(md_table(["run", "status", "ranks", "schedule", "wall s", "energy J", "source", "recompute",
                          f"memory MiB ({mem_name})", "written MiB", "read MiB", "optimal", "problems"],
                         [[c["run"], c["status"], c["ranks"], c["schedule"], c["wall_s"], c["energy_J"],
                           c["energy_source"], c["recompute_factor"], c["memory_MiB"], c["written_MiB"],
                           c["read_MiB"], _optimal_cell(c), c["problems"]] for c in rows]))
    notes = []
    unranked = [c["run"] for c in rows if not c["ranked"]]
    if unranked:
        notes.append(f"Not ranked (incomplete or partial logs, numbers cover only what was logged): "
                     f"{', '.join(unranked)}.")
    no_mem = [c["run"] for c in rows if c["memory_MiB"] is None]
    if no_mem:
        notes.append(f"Memory n/a ({mem_name} not logged) for {', '.join(no_mem)}: left out of the Pareto "
                     "front" + ("" if memory == "rss" else "; `--memory rss` compares peak resident memory") + ".")
    sources = sorted({c["energy_source"] for c in rows})
    if len(sources) > 1:
        notes.append(f"Energy sources differ between runs ({', '.join(sources)}): compare energies with care.")
    for note in notes:
        out.append("")
        out.append(note)
    return "\n".join(out) + "\n"


def _optimal_cell(c: dict) -> str:
    if not c["ranked"]:
        return "not ranked"
    return ", ".join(k for k, f in (("time", c["time_optimal"]), ("energy", c["energy_optimal"]),
                                    ("pareto", c["pareto"])) if f) or "-"


COMPARE_FIELDS = ["run", "status", "ranks", "schedule", "steps", "wall_s", "wall_from", "energy_J",
                  "energy_source", "recompute_factor", "memory_MiB", "memory_metric", "peak_rss_MiB",
                  "written_MiB", "read_MiB", "ranked", "time_optimal", "energy_optimal", "pareto", "problems"]
PHASE_FIELDS = ["run", "phase", "level", "count", "steps", "seconds_sum", "seconds_max", "bytes",
                "joules_model", "joules_measured_share", "measured_source"]


def csv_report(results: list[dict], by_phase: bool = False, memory: str = "checkpoint") -> str:
    """CSV: one row per run (the comparison), or with ``by_phase`` one row per run, phase and level."""
    buf = io.StringIO()
    if by_phase:
        writer = csv.DictWriter(buf, fieldnames=PHASE_FIELDS, lineterminator="\n")
        writer.writeheader()
        for r in results:
            source = r["energy"]["source"] if r["energy"]["source"] != "model" else ""
            for row in r["phases"]:
                writer.writerow({"run": r["label"], "measured_source": source,
                                 **{k: row.get(k) for k in PHASE_FIELDS if k in row}})
    else:
        writer = csv.DictWriter(buf, fieldnames=COMPARE_FIELDS, lineterminator="\n")
        writer.writeheader()
        for row in compare(results, memory):
            writer.writerow({k: row[k] for k in COMPARE_FIELDS})
    return buf.getvalue()


def check_output_path(path: str) -> None:
    """Raise AnalyzeError now if ``path`` cannot be written (before any analysis or partial file)."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(directory):
        raise AnalyzeError(f"{path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK):
        raise AnalyzeError(f"{path}: directory {directory} is not writable")
    if os.path.isdir(path):
        raise AnalyzeError(f"{path}: is a directory")


def pareto_plot(results: list[dict], out_path: str, memory: str = "checkpoint") -> None:
    """Two panels, wall time and energy against memory; time-, energy- and Pareto-optimal runs marked.

    Written to a temporary file and renamed, so a failure leaves no partial PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    every = [c for c in compare(results, memory) if c["memory_MiB"] is not None and c["wall_s"] is not None]
    rows = [c for c in every if c["ranked"]]
    partial = [c for c in every if not c["ranked"]]
    if not every:
        raise AnalyzeError(f"no run has both a memory figure ({MEMORY_METRICS[memory]}) and a wall time: "
                           "nothing to plot" + ("" if memory == "rss" else
                                                " (a run without summary.json logs no level statistics; "
                                                "--memory rss plots peak resident memory)"))
    mem_name = every[0]["memory_metric"]
    sources = sorted({c["energy_source"] for c in every})
    fig, axes = plt.subplots(1, 2, figsize=(11, 5.4))
    for ax, key, ylabel in ((axes[0], "wall_s", "wall time [s]"),
                            (axes[1], "energy_J", f"energy [J] ({'/'.join(sources)})")):
        if partial:
            ax.scatter([c["memory_MiB"] for c in partial], [c[key] for c in partial], marker="x", s=40,
                       color="0.5", zorder=2, label="incomplete run (partial numbers, not ranked)")
            for c in partial:
                ax.annotate(f"{c['run']} ({c['status']})", (c["memory_MiB"], c[key]), textcoords="offset points",
                            xytext=(6, 5), fontsize=7, color="0.4")
        xs = [c["memory_MiB"] for c in rows]
        ys = [c[key] for c in rows]
        front = sorted((x, y) for x, y, f in zip(xs, ys, pareto(list(zip(xs, ys)))) if f)
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="0.6", lw=1.2,
                zorder=1, label="Pareto front of the panel's two axes")
        ax.scatter([x for x, c in zip(xs, rows) if not c["pareto"]], [y for y, c in zip(ys, rows) if not c["pareto"]],
                   s=40, facecolors="none", edgecolors="tab:blue", zorder=2, label="run (dominated)")
        ax.scatter([x for x, c in zip(xs, rows) if c["pareto"]], [y for y, c in zip(ys, rows) if c["pareto"]],
                   s=40, color="tab:blue", zorder=2, label="run (Pareto-optimal in memory, time, energy)")
        for c, x, y in zip(rows, xs, ys):
            if c["time_optimal"]:
                ax.scatter([x], [y], marker="*", s=260, color="tab:red", zorder=3, label="time-optimal")
            if c["energy_optimal"]:
                ax.scatter([x], [y], marker="D", s=110, facecolors="none", edgecolors="tab:green",
                           linewidths=2, zorder=4, label="energy-optimal")
            ax.annotate(c["run"], (x, y), textcoords="offset points", xytext=(6, 5), fontsize=8)
        ax.set_xlabel(f"memory [MiB] ({mem_name})")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.margins(0.15)
    legend = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=3, fontsize=8)
    fig.suptitle(f"hpcadj runs: wall time and energy against memory ({len(rows)} complete runs"
                 + (f", {len(partial)} incomplete not ranked)" if partial else ")"))
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    save_png(fig, out_path, dpi=130)


def save_png(fig, out_path: str, dpi: int) -> None:
    """Write ``fig`` to ``out_path`` atomically (a temporary name, then renamed) and close it: an
    interrupted plot never leaves a partial PNG looking like a result."""
    import matplotlib.pyplot as plt

    tmp = f"{out_path}.tmp{os.getpid()}.png"
    try:
        fig.savefig(tmp, dpi=dpi)
        os.replace(tmp, out_path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
