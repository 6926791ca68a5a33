"""Runs side by side: one row per run, the time-, energy- and Pareto-optimal complete runs flagged."""

from __future__ import annotations

from .logs import MIB, AnalyzeError
from .run import level_peak_bytes


def pareto(points: list[tuple]) -> list[bool]:
    """For each point (all coordinates to minimise), whether no other point dominates it."""
    flags = []
    for i, p in enumerate(points):
        dominated = any(all(q[k] <= p[k] for k in range(len(p))) and any(q[k] < p[k] for k in range(len(p)))
                        for j, q in enumerate(points) if j != i)
        flags.append(not dominated)
    return flags


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
    values = [level_peak_bytes(r, kinds) for r in results]
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
    flags = pareto([(rows[i]["memory_MiB"], rows[i]["wall_s"], rows[i]["energy_J"]) for i in front])
    for i, flag in zip(front, flags):
        rows[i]["pareto"] = flag
    return rows
