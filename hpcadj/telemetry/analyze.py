"""Analysis of hpcadj run logs: per-run phase tables, cross-run comparison, Pareto plot; and of
inversion logs (``inversion.jsonl``): the convergence table and misfit against iterate, time, energy.

Works on log directories copied off a cluster: plain files, no MPI, no PETSc. A broken log (a
truncated or corrupt line, a missing rank file, a rank that stopped early, a missing summary) is
analysed as far as it goes, and every such problem is listed in ``RunData.problems``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from dataclasses import dataclass, field

from .energy import sacct_energy
from .energy_model import PHASES, EnergyModel, level_kind_map, load_model, model_run_energy
from .jsonlog import RUN_FILE, SCHEMA, SUMMARY_FILE

_RANK_RE = re.compile(r"^rank(\d+)\.jsonl$")
MIB = 1024.0 * 1024.0


class AnalyzeError(Exception):
    """Nothing to analyse: the path is missing, unreadable, or holds no hpcadj log."""


@dataclass
class RunData:
    """What was read from one log directory, and what was wrong with it."""

    path: str
    run: dict | None = None
    summary: dict | None = None
    events: dict[int, list[dict]] = field(default_factory=dict)
    ends: dict[int, dict] = field(default_factory=dict)
    headers: dict[int, dict] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    #: the shortest path suffix that tells this run from the others analysed with it
    path_label: str | None = None

    @property
    def record(self) -> dict:
        return (self.run or {}).get("record") or {}

    @property
    def run_id(self) -> str | None:
        for source in (self.run, self.summary, *self.headers.values()):
            if source and source.get("run_id"):
                return source["run_id"]
        return None

    @property
    def ranks(self) -> int:
        for source in (self.run, self.summary, *self.headers.values()):
            if source and isinstance(source.get("ranks"), int):
                return source["ranks"]
        return len(self.events)

    @property
    def label(self) -> str:
        return str(self.record.get("label") or self.path_label or os.path.basename(os.path.normpath(self.path)))


def is_run_dir(path: str) -> bool:
    """Whether ``path`` holds an hpcadj log (a run.json or a rank file)."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return RUN_FILE in names or any(_RANK_RE.match(n) for n in names)


def find_run_dirs(paths) -> list[str]:
    """Run directories named by ``paths``: each is a run directory or a directory of them."""
    found: list[str] = []
    for path in paths:
        path = os.fspath(path)
        if not os.path.exists(path):
            raise AnalyzeError(f"{path}: no such directory")
        if not os.path.isdir(path):
            raise AnalyzeError(f"{path}: not a directory")
        if not os.access(path, os.R_OK | os.X_OK):
            raise AnalyzeError(f"{path}: not readable")
        if is_run_dir(path):
            found.append(path)
            continue
        subdirs = sorted(os.path.join(path, n) for n in os.listdir(path))
        runs = [d for d in subdirs if os.path.isdir(d) and is_run_dir(d)]
        if not runs:
            raise AnalyzeError(f"{path}: no hpcadj log ({RUN_FILE} or rank*.jsonl) here or in its subdirectories")
        found.extend(runs)
    return found


def _load_json_file(path: str, problems: list[str], what: str) -> dict | None:
    name = os.path.basename(path)
    if not os.path.exists(path):
        problems.append(what)
        return None
    try:
        with open(path) as fh:
            data = json.load(fh)
    except OSError as exc:
        problems.append(f"{name}: cannot read ({exc.strerror or exc})")
        return None
    except json.JSONDecodeError as exc:
        problems.append(f"{name}: not valid JSON ({exc.msg} at line {exc.lineno}); ignored")
        return None
    if not isinstance(data, dict):
        problems.append(f"{name}: not a JSON object; ignored")
        return None
    if data.get("schema") not in (None, SCHEMA):
        problems.append(f"{name}: schema {data.get('schema')!r}, expected {SCHEMA!r}")
    return data


def _read_rank_file(run: RunData, rank: int, path: str) -> None:
    name = os.path.basename(path)
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError as exc:
        run.problems.append(f"{name}: cannot read ({exc.strerror or exc})")
        return
    lines = text.split("\n")
    complete_end = text.endswith("\n")
    if complete_end:
        lines.pop()
    events: list[dict] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines) and not complete_end:
                run.problems.append(f"{name}: line {number} is truncated (the file ends mid-line: "
                                    f"rank {rank} stopped while writing); {len(events)} events read")
            else:
                run.problems.append(f"{name}: line {number} is not valid JSON; skipped")
            continue
        if not isinstance(rec, dict):
            run.problems.append(f"{name}: line {number} is not a JSON object; skipped")
            continue
        kind = rec.get("type")
        if kind == "header":
            run.headers[rank] = rec
        elif kind == "end":
            run.ends[rank] = rec
        elif kind == "event":
            if not isinstance(rec.get("phase"), str) or not isinstance(rec.get("seconds"), (int, float)):
                run.problems.append(f"{name}: line {number} is an event without phase or seconds; skipped")
                continue
            events.append(rec)
        else:
            run.problems.append(f"{name}: line {number} has unknown type {kind!r}; skipped")
    run.events[rank] = events
    if rank not in run.headers:
        run.problems.append(f"{name}: no header line")
    if rank not in run.ends:
        run.problems.append(f"{name}: no end record: rank {rank} stopped early "
                            f"(killed or crashed) after {len(events)} events")
    elif run.ends[rank].get("error"):
        run.problems.append(f"{name}: rank {rank} aborted after {len(events)} events: {run.ends[rank]['error']}")
    elif run.ends[rank].get("events") != len(events):
        run.problems.append(f"{name}: end record counts {run.ends[rank].get('events')} events, "
                            f"{len(events)} read")


def load_run(path) -> RunData:
    """Read one run directory; problems are collected, not raised (see :class:`RunData`)."""
    path = os.fspath(path)
    run = RunData(path=path)
    if not os.path.isdir(path):
        raise AnalyzeError(f"{path}: no such directory")
    run.run = _load_json_file(os.path.join(path, RUN_FILE), run.problems,
                              f"{RUN_FILE} missing: run record (command, schedule, ranks) unknown")
    rank_files = {}
    for name in sorted(os.listdir(path)):
        match = _RANK_RE.match(name)
        if match:
            rank_files[int(match.group(1))] = os.path.join(path, name)
    if run.run is None and not rank_files:
        raise AnalyzeError(f"{path}: no hpcadj log ({RUN_FILE} or rank*.jsonl)")
    for rank, file in rank_files.items():
        _read_rank_file(run, rank, file)
    run.summary = _load_json_file(os.path.join(path, SUMMARY_FILE), run.problems,
                                  f"{SUMMARY_FILE} missing: the run did not finish (rank 0 never closed "
                                  "the log); totals come from the rank logs, measured energy is unknown")
    ids = {h.get("run_id") for h in run.headers.values()} | {e.get("run_id") for e in run.ends.values()}
    if run.run:
        ids.add(run.run.get("run_id"))
    ids.discard(None)
    if len(ids) > 1:
        run.problems.append(f"files from different runs mixed in one directory: run ids {', '.join(sorted(ids))}")
    expected = run.ranks
    missing = [r for r in range(expected) if r not in rank_files]
    if missing:
        shown = ", ".join(str(r) for r in missing[:10]) + (" ..." if len(missing) > 10 else "")
        run.problems.append(f"{len(missing)} of {expected} rank logs missing (rank {shown}): "
                            "their phases are not in the totals")
    return run


def _phase_order(key) -> tuple:
    phase, level = key
    return (PHASES.index(phase) if phase in PHASES else len(PHASES), phase, str(level))


def phase_table(run: RunData) -> list[dict]:
    """Rows per (phase, level): count, steps, seconds summed over ranks and of the slowest rank, bytes."""
    rows: dict[tuple, dict] = {}
    for rank, events in run.events.items():
        per_rank: dict[tuple, float] = {}
        for ev in events:
            key = (ev["phase"], ev.get("level"))
            row = rows.setdefault(key, {"phase": key[0], "level": key[1], "count": 0, "steps": 0,
                                        "seconds_sum": 0.0, "seconds_max": 0.0, "bytes": 0})
            row["count"] += 1
            row["steps"] += int(ev.get("steps") or 0)
            row["seconds_sum"] += float(ev["seconds"])
            row["bytes"] += int(ev.get("bytes") or 0)
            per_rank[key] = per_rank.get(key, 0.0) + float(ev["seconds"])
        for key, seconds in per_rank.items():
            rows[key]["seconds_max"] = max(rows[key]["seconds_max"], seconds)
    return [rows[k] for k in sorted(rows, key=_phase_order)]


def _rank_steps(run: RunData, phase: str) -> int | None:
    """Steps of ``phase`` on the lowest rank with events (every rank runs the same plan)."""
    for rank in sorted(run.events):
        if run.events[rank]:
            return sum(int(e.get("steps") or 0) for e in run.events[rank] if e["phase"] == phase)
    return None


def _wall_seconds(run: RunData) -> tuple[float | None, str]:
    if run.summary and isinstance(run.summary.get("wall_seconds"), (int, float)):
        return float(run.summary["wall_seconds"]), "summary"
    walls = [e["wall_seconds"] for e in run.ends.values() if isinstance(e.get("wall_seconds"), (int, float))]
    if walls:
        return max(walls), "end records"
    monos = [e["mono"] for evs in run.events.values() for e in evs if isinstance(e.get("mono"), (int, float))]
    if monos:
        return max(monos), "last event (lower bound)"
    return None, "unknown"


def _level_stats(run: RunData) -> dict | None:
    """``{level: {"kind", "peak_bytes"}}`` from the summary's level statistics (``peak_bytes``, or
    ``peak_slots`` x the run record's ``snapshot_bytes``), None when incomplete."""
    levels = ((run.summary or {}).get("result") or {}).get("levels")
    if not isinstance(levels, dict) or not levels:
        return None
    kinds = level_kind_map(run.record.get("levels"))
    kinds.update(level_kind_map(levels))
    snap = run.record.get("snapshot_bytes")
    out = {}
    for name, stats in levels.items():
        if not isinstance(stats, dict):
            return None
        if isinstance(stats.get("peak_bytes"), (int, float)):
            peak = int(stats["peak_bytes"])
        elif isinstance(stats.get("peak_slots"), int) and isinstance(snap, (int, float)):
            peak = int(stats["peak_slots"] * snap)
        else:
            return None
        out[name] = {"kind": kinds.get(name, "unknown"), "peak_bytes": peak}
    return out


def _peak_rss(run: RunData) -> dict | None:
    if run.summary and isinstance(run.summary.get("peak_rss_bytes"), dict):
        return run.summary["peak_rss_bytes"]
    rss = [e["max_rss_bytes"] for e in run.ends.values() if isinstance(e.get("max_rss_bytes"), int)]
    return {"max": max(rss), "sum": sum(rss)} if rss else None


def analyse_run(run: RunData, model: EnergyModel | None = None, *, sacct: bool = False,
                sacct_runner=None) -> dict:
    """The numbers of one run: phase rows with joules, wall time, energy with source, memory, recompute."""
    model = model or load_model()
    rows = phase_table(run)
    wall, wall_from = _wall_seconds(run)
    other = sum(max(float(end.get("wall_seconds", 0.0))
                    - sum(float(e["seconds"]) for e in run.events.get(rank, [])), 0.0)
                for rank, end in run.ends.items())
    kinds = level_kind_map(run.record.get("levels"))
    levels = ((run.summary or {}).get("result") or {}).get("levels")
    if isinstance(levels, dict):
        kinds.update(level_kind_map(levels))
    modeled = model_run_energy(rows, other, kinds, model)
    for row, energy in zip(rows, modeled["by_phase"]):
        row["joules_model"] = energy["joules"]
    other_row = modeled["by_phase"][-1]
    measured = dict(((run.summary or {}).get("energy") or {}).get("measured") or {})
    job = (run.run or run.summary or {}).get("job_id")
    if sacct and job:
        step = (run.run or {}).get("step_id")
        measured["slurm"] = (sacct_energy(job, step) if sacct_runner is None
                             else sacct_energy(job, step, runner=sacct_runner))
    energy = _choose_energy(measured, modeled)
    if energy["source"] != "model" and modeled["joules"] > 0:
        scale = energy["joules"] / modeled["joules"]
        for row in rows:
            row["joules_measured_share"] = row["joules_model"] * scale
    forward = _rank_steps(run, "forward")
    recompute = _rank_steps(run, "recompute")
    nsteps = run.record.get("steps") if isinstance(run.record.get("steps"), int) else forward
    factor = (forward + recompute) / nsteps if nsteps and forward is not None else None
    level_stats = _level_stats(run)
    flags, details = run_status(run, forward, _rank_steps(run, "adjoint"), nsteps)
    return {"label": run.label, "path": run.path, "run_id": run.run_id, "ranks": run.ranks,
            "status": ", ".join(flags), "status_flags": flags, "status_detail": details,
            "complete": flags == ["complete"], "adjoint_steps": _rank_steps(run, "adjoint"),
            "ranks_logged": len(run.events), "job_id": job, "record": run.record,
            "phases": rows, "other_joules_model": other_row["joules"], "other_core_seconds": other,
            "wall_seconds": wall, "wall_from": wall_from, "energy": energy, "energy_measured": measured,
            "energy_model": {k: v for k, v in modeled.items() if k != "by_phase"},
            "forward_steps": forward, "recompute_steps": recompute, "steps": nsteps,
            "recompute_factor": factor, "levels": level_stats,
            "checkpoint_peak_bytes": _level_peak_bytes({"levels": level_stats}, None),
            "peak_rss_bytes": _peak_rss(run),
            "bytes_written": sum(r["bytes"] for r in rows if r["phase"] == "store"),
            "bytes_read": sum(r["bytes"] for r in rows if r["phase"] == "restore"),
            "problems": list(run.problems)}


STATUSES = {
    "complete": "every rank logged, finished, every forward and adjoint step in this log",
    "resumed-fragment": "a run resumed with --resume: this log holds only the part done after the resume",
    "missing-rank-logs": "some ranks' logs are missing: their phases and energy are not in the totals",
    "failed": "the run failed (a rank aborted with an error)",
    "stopped": "the run was stopped on request (continue it with --resume)",
    "unfinished": "the run did not finish (killed or crashed): no summary or no end record",
    "incomplete": "fewer steps logged than the run has",
    "no-run-record": "run.json missing: what was run (and how many steps) is unknown",
    "mixed-logs": "files of different runs in one directory",
}


def run_status(run: RunData, forward: int | None, adjoint: int | None, nsteps: int | None) -> tuple[list[str], list[str]]:
    """``(flags, details)``: why a run is not ``complete`` (``["complete"]`` when nothing is wrong).

    A run is complete only when its run record, every rank's log (each with an end record and no
    error) and the summary are there, the summary does not say stopped/failed, the run was not a
    resumed fragment, and the log counts every one of its ``steps`` forward and adjoint steps.
    """
    flags, details = [], []

    def flag(name: str, detail: str) -> None:
        if name not in flags:
            flags.append(name)
        details.append(detail)

    result = (run.summary or {}).get("result") or {}
    status = result.get("status") if isinstance(result, dict) else None
    errors = {r: e["error"] for r, e in run.ends.items() if e.get("error")}
    if errors:
        rank, error = min(errors.items())
        flag("failed", f"rank {rank} aborted: {error}")
    if status == "failed":
        flag("failed", "the summary records status 'failed'")
    if status == "stopped":
        flag("stopped", "stopped on request before the gradient was complete")
    unended = sorted(r for r in run.events if r not in run.ends)
    if unended:
        flag("unfinished", f"no end record on rank {', '.join(map(str, unended[:10]))}"
             + (" ..." if len(unended) > 10 else "") + " (killed or crashed)")
    elif run.summary is None and not errors:
        flag("unfinished", "no summary.json (rank 0 never closed the log)")
    expected = run.ranks
    missing = [r for r in range(expected) if r not in run.events]
    if missing:
        flag("missing-rank-logs", f"{len(missing)} of {expected} rank logs missing")
    if run.run is None:
        flag("no-run-record", "run.json missing")
    ids = {h.get("run_id") for h in run.headers.values()} | {e.get("run_id") for e in run.ends.values()}
    ids.add((run.run or {}).get("run_id"))
    ids.discard(None)
    if len(ids) > 1:
        flag("mixed-logs", f"run ids {', '.join(sorted(ids))}")
    resumed = bool(run.record.get("resumed"))
    short = []
    if nsteps:
        if (adjoint or 0) < nsteps:
            short.append(f"{adjoint or 0} of {nsteps} adjoint steps")
        if (forward or 0) < nsteps:
            short.append(f"{forward or 0} of {nsteps} first-sweep forward steps")
    if resumed and (short or not nsteps):
        over = (run.run or {}).get("overwrote")
        earlier = ""
        if isinstance(over, dict) and over.get("run_id"):
            kept = over.get("kept_in")
            earlier = (f"; the log of the part before (run {over.get('run_id')}) is in {kept}" if kept else
                       f"; the log of the part before (run {over.get('run_id')}) was overwritten")
        flag("resumed-fragment", "resumed with --resume: this log holds "
             + (", ".join(short) if short else "an unknown share of the steps") + earlier)
    elif short and not flags:
        flag("incomplete", "this log holds " + ", ".join(short))
    return (flags or ["complete"]), details


def _choose_energy(measured: dict, modeled: dict) -> dict:
    """The figure to report: RAPL(+NVML) measured in the run, else SLURM's, else the model."""
    rapl, nvml, slurm = measured.get("rapl"), measured.get("nvml"), measured.get("slurm")
    if rapl and rapl.get("source") == "rapl":
        if nvml and nvml.get("source") == "nvml":
            return {"source": "rapl+nvml", "joules": rapl["joules"] + nvml["joules"]}
        return {"source": "rapl", "joules": rapl["joules"]}
    if slurm and slurm.get("source") == "slurm":
        return {"source": "slurm", "joules": slurm["joules"]}
    return {"source": "model", "joules": modeled["joules"]}


def _pareto(points: list[tuple]) -> list[bool]:
    """For each point (all coordinates to minimise), whether no other point dominates it."""
    flags = []
    for i, p in enumerate(points):
        dominated = any(all(q[k] <= p[k] for k in range(len(p))) and any(q[k] < p[k] for k in range(len(p)))
                        for j, q in enumerate(points) if j != i)
        flags.append(not dominated)
    return flags


def _level_peak_bytes(run: dict, kinds: tuple[str, ...] | None) -> int | None:
    """Peak checkpoint bytes of a run's levels (of ``kinds`` only, if given); None if not logged."""
    levels = run.get("levels")
    if levels is None:
        return None
    total = 0
    for stats in levels.values():
        if kinds is None or stats["kind"] in kinds:
            total += stats["peak_bytes"]
    return total


MEMORY_METRICS = {"checkpoint": "checkpoint peak, all levels", "ram": "checkpoint peak in RAM",
                  "rss": "peak RSS, all ranks"}


def memory_metric(results: list[dict], which: str = "checkpoint") -> tuple[str, list[float | None]]:
    """The memory axis of a comparison, in MiB: ``checkpoint`` (peak bytes held on all levels),
    ``ram`` (on RAM levels only) or ``rss`` (peak resident memory summed over ranks). The metric
    is the one asked for, for every run: a run that did not log what it needs gets None (it is
    never replaced by another metric; ``peak_rss_MiB`` is a column of its own)."""
    if which not in MEMORY_METRICS:
        raise AnalyzeError(f"unknown memory metric {which!r} (known: {', '.join(MEMORY_METRICS)})")
    if which == "rss":
        return MEMORY_METRICS["rss"], [r["peak_rss_bytes"]["sum"] / MIB if r["peak_rss_bytes"] else None
                                       for r in results]
    kinds = ("ram",) if which == "ram" else None
    values = [_level_peak_bytes(r, kinds) for r in results]
    return MEMORY_METRICS[which], [v / MIB if v is not None else None for v in values]


def compare(results: list[dict], memory: str = "checkpoint") -> list[dict]:
    """One row per run, with the time-optimal, energy-optimal and Pareto-optimal runs flagged.

    Only complete runs (``status`` "complete") are ranked: a resumed fragment, a run missing rank
    logs, a failed, stopped or unfinished run is listed with its status and ``ranked`` False, never
    marked optimal and left out of the Pareto front. The Pareto front needs the memory figure too.
    """
    mem_name, memory = memory_metric(results, memory)
    rows = []
    for r, mem in zip(results, memory):
        rows.append({"run": r["label"], "status": r["status"], "ranks": r["ranks"],
                     "schedule": r["record"].get("schedule"),
                     "steps": r["steps"], "wall_s": r["wall_seconds"], "wall_from": r["wall_from"],
                     "energy_J": r["energy"]["joules"],
                     "energy_source": r["energy"]["source"], "recompute_factor": r["recompute_factor"],
                     "memory_MiB": mem, "memory_metric": mem_name,
                     "peak_rss_MiB": r["peak_rss_bytes"]["max"] / MIB if r["peak_rss_bytes"] else None,
                     "written_MiB": r["bytes_written"] / MIB, "read_MiB": r["bytes_read"] / MIB,
                     "problems": len(r["problems"]), "ranked": bool(r["complete"] and r["wall_seconds"] is not None),
                     "time_optimal": False, "energy_optimal": False, "pareto": False})
    ranked = [i for i, row in enumerate(rows) if row["ranked"]]
    if ranked:
        best_t = min(ranked, key=lambda i: rows[i]["wall_s"])
        best_e = min(ranked, key=lambda i: rows[i]["energy_J"])
        rows[best_t]["time_optimal"] = True
        rows[best_e]["energy_optimal"] = True
    front = [i for i in ranked if rows[i]["memory_MiB"] is not None]
    flags = _pareto([(rows[i]["memory_MiB"], rows[i]["wall_s"], rows[i]["energy_J"]) for i in front])
    for i, flag in zip(front, flags):
        rows[i]["pareto"] = flag
    return rows


def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _md_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
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
        out.append(f"- wall time: {_fmt(r['wall_seconds'])} s (from {r['wall_from']})")
        out.append(f"- energy: {_fmt(energy['joules'])} J, source **{energy['source']}**"
                   + (f" (model: {_fmt(model_j)} J)" if energy["source"] != "model" else ""))
        for name, fig in sorted(r["energy_measured"].items()):
            if fig.get("source") == "unavailable":
                out.append(f"- {name}: unavailable ({fig.get('reason', '')})")
        out.append(f"- recomputation factor: {_fmt(r['recompute_factor'])} "
                   f"(forward evaluations {_fmt(r['forward_steps'])} + {_fmt(r['recompute_steps'])} "
                   f"over {_fmt(r['steps'])} steps)")
        ckpt = r["checkpoint_peak_bytes"]
        rss = r["peak_rss_bytes"]
        out.append(f"- peak memory: checkpoints {_fmt(ckpt / MIB if ckpt is not None else None)} MiB; "
                   f"RSS {_fmt(rss['max'] / MIB if rss else None)} MiB on the largest rank, "
                   f"{_fmt(rss['sum'] / MIB if rss else None)} MiB over all ranks")
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
        out.append(_md_table(header, rows))
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
    out.append(_md_table(["run", "status", "ranks", "schedule", "wall s", "energy J", "source", "recompute",
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
        front = sorted((x, y) for x, y, f in zip(xs, ys, _pareto(list(zip(xs, ys)))) if f)
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
    _save_png(fig, out_path, dpi=130)


def _save_png(fig, out_path: str, dpi: int) -> None:
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


def analyze(paths, *, model: EnergyModel | None = None, sacct: bool = False) -> list[dict]:
    """Load and analyse every run under ``paths`` (run directories or directories of them)."""
    runs = [load_run(d) for d in find_run_dirs(paths)]
    for run, label in zip(runs, distinguishing_suffixes([r.path for r in runs])):
        run.path_label = label
    return [analyse_run(run, model, sacct=sacct) for run in runs]


def distinguishing_suffixes(paths: list[str]) -> list[str]:
    """Each path's shortest trailing run of components that no other path ends with
    (``a/logs`` and ``b/logs``, not ``logs`` twice); the whole path when none is shorter."""
    parts = [os.path.normpath(p).split(os.sep) for p in paths]
    labels = []
    for i, mine in enumerate(parts):
        for k in range(1, len(mine) + 1):
            tail = mine[-k:]
            if not any(other[-k:] == tail for j, other in enumerate(parts) if j != i and other != mine):
                break
        labels.append(os.sep.join(tail) or os.sep)
    return labels



# -- inversions ---------------------------------------------------------------------------------
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
    lines = text.split("\n")
    whole = text.endswith("\n")
    if whole:
        lines.pop()
    by_iterate: dict[int, dict] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            log.problems.append(f"{INVERSION_FILE}: line {number} is "
                                + ("truncated (the file ends mid-line)" if number == len(lines) and not whole
                                   else "not valid JSON") + "; skipped")
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
        out.append(f"- misfit {_fmt(r['misfit_first'], 7)} → {_fmt(r['misfit_last'], 7)} (reduced "
                   f"{_fmt(r['misfit_reduction'])}×; {'monotone' if r['misfit_monotone'] else 'NOT monotone'}"
                   f" in accepted iterates; J {'monotone' if r['J_monotone'] else 'NOT monotone'})")
        out.append(f"- forward steps {_fmt(r['forward_steps'])}, {_fmt(r['forward_steps_per_iteration'])} per "
                   f"iteration after the start (a naive loop, forward + gradient per evaluation: "
                   f"{_fmt(r['naive_forward_steps'])}, {_fmt(r['naive_forward_steps_per_iteration'])} per "
                   f"iteration); adjoint steps {_fmt(r['adjoint_steps'])}")
        out.append(f"- wall {_fmt(r['wall_seconds'])} s ({_fmt(r['seconds_per_iteration'])} s per iteration "
                   "after the start), "
                   f"energy {_fmt(r['joules'])} J (source **{r['energy_source']}**), peak RSS "
                   f"{_fmt(r['max_rss_MiB'])} MiB on the largest rank")
        out.append("")
        header = [h for _, h in INVERSION_COLUMNS]
        header[header.index("joules")] = f"joules ({r['energy_source']})"
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        for row in r["rows"]:
            lines.append("| " + " | ".join(_fmt(row[k], digits.get(k, 4)) for k, _ in INVERSION_COLUMNS) + " |")
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
    _save_png(fig, out_path, dpi=90)
