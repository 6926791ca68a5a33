"""Reading run logs: a run directory's ``run.json``, rank files and ``summary.json`` into a
:class:`RunData`, every problem of a broken log listed rather than raised.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from ..jsonlog import RUN_FILE, SCHEMA, SUMMARY_FILE


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


def json_lines(text: str):
    """``(line number, record, problem)`` for every non-blank line of JSON-lines ``text``: problem
    None and the parsed record, or ``"truncated"`` (the text ends mid-line there: its writer stopped
    while writing) or ``"invalid"`` and no record."""
    lines = text.split("\n")
    whole = text.endswith("\n")
    if whole:
        lines.pop()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec, bad = json.loads(line), None
        except json.JSONDecodeError:
            rec, bad = None, "truncated" if number == len(lines) and not whole else "invalid"
        yield number, rec, bad


def _read_rank_file(run: RunData, rank: int, path: str) -> None:
    name = os.path.basename(path)
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError as exc:
        run.problems.append(f"{name}: cannot read ({exc.strerror or exc})")
        return
    events: list[dict] = []
    for number, rec, bad in json_lines(text):
        if bad == "truncated":
            run.problems.append(f"{name}: line {number} is truncated (the file ends mid-line: "
                                f"rank {rank} stopped while writing); {len(events)} events read")
            continue
        if bad:
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
