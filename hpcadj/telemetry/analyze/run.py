"""One run's numbers from its log: phase table, wall time, energy with its source, memory,
recomputation, and whether the run is complete enough to be compared.
"""

from __future__ import annotations

from ..energy import sacct_energy
from ..energy_model import PHASES, EnergyModel, level_kind_map, load_model, model_run_energy
from .logs import RunData, distinguishing_suffixes, find_run_dirs, load_run


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
            "checkpoint_peak_bytes": level_peak_bytes({"levels": level_stats}, None),
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


def level_peak_bytes(run: dict, kinds: tuple[str, ...] | None) -> int | None:
    """Peak checkpoint bytes of a run's levels (of ``kinds`` only, if given); None if not logged."""
    levels = run.get("levels")
    if levels is None:
        return None
    total = 0
    for stats in levels.values():
        if kinds is None or stats["kind"] in kinds:
            total += stats["peak_bytes"]
    return total


def analyze(paths, *, model: EnergyModel | None = None, sacct: bool = False) -> list[dict]:
    """Load and analyse every run under ``paths`` (run directories or directories of them)."""
    runs = [load_run(d) for d in find_run_dirs(paths)]
    for run, label in zip(runs, distinguishing_suffixes([r.path for r in runs])):
        run.path_label = label
    return [analyse_run(run, model, sacct=sacct) for run in runs]
