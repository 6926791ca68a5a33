"""Per-rank JSON-lines logs of a run, its run record and the summary rank 0 writes at the end.

Layout of a log directory (schema ``hpcadj-telemetry/1``)::

    DIR/run.json          rank 0, at open: the run record (what was run, where, with which versions)
    DIR/rank00000.jsonl   one file per rank: a "header" line, one "event" line per phase, an "end" line
    DIR/summary.json      rank 0, at close: phase totals over ranks, wall time, peak memory, energy

A log opened with ``overwrite`` over an earlier run (``hpcadj run --resume`` does this) moves the
earlier run's files into ``DIR/attempts/NN-<run id>/`` (``hpcadj analyze DIR/attempts`` reads them:
a requeued job keeps the seconds and joules of every attempt) and records what it replaced in
``run.json`` under ``"overwrote"`` (run id, start, finished, status, ``kept_in``); a resumed run's
record carries ``"resumed": true`` and its ``steps``, so a fragment (fewer adjoint steps logged than
``steps``) can be told from a whole run. Keys may be added; none is removed or renamed.

An event line is one finished phase (see :class:`RunLog` for the fields). A rank file without its
"end" line belongs to a rank that stopped early; ``hpcadj analyze`` says so.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import resource
import socket
import sys
import threading
import time
import uuid
import warnings

from .energy import DEFAULT_POWERCAP_ROOT, EnergyMeter
from .energy_model import EnergyModel, best_energy, level_kind_map, load_model, model_run_energy
from .. import __version__

SCHEMA = "hpcadj-telemetry/1"
RUN_FILE = "run.json"
SUMMARY_FILE = "summary.json"
#: where a log opened over an earlier run keeps that run's files
ATTEMPTS_DIR = "attempts"
RANK_FILE = "rank{rank:05d}.jsonl"


class LogDirError(Exception):
    """The log directory cannot be used (not creatable, not writable, holds another run)."""


def rank_file(rank: int) -> str:
    """Name of rank ``rank``'s event file inside a log directory."""
    return RANK_FILE.format(rank=rank)


def iso_time(t: float) -> str:
    """ISO-8601 UTC time with microseconds for a ``time.time()`` value."""
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="microseconds")


def job_info() -> dict:
    """SLURM job and step ids of this process (None outside SLURM)."""
    return {"job_id": os.environ.get("SLURM_JOB_ID") or None,
            "step_id": os.environ.get("SLURM_STEP_ID") or None}


def stack_versions() -> dict:
    """Versions of hpcadj, Python, numpy and of the PETSc/MPI/HDF5 modules already loaded."""
    versions = {"hpcadj": __version__, "python": sys.version.split()[0]}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        versions["numpy"] = numpy.__version__
    petsc = sys.modules.get("petsc4py.PETSc")
    if petsc is not None:
        versions["petsc"] = "%d.%d.%d" % tuple(petsc.Sys.getVersion())
        versions["petsc4py"] = sys.modules["petsc4py"].__version__
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None:
        versions["mpi"] = mpi.Get_library_version().splitlines()[0].strip()
        versions["mpi4py"] = sys.modules["mpi4py"].__version__
    h5py = sys.modules.get("h5py")
    if h5py is not None:
        versions["h5py"] = h5py.__version__
        versions["hdf5"] = h5py.version.hdf5_version
    return versions


def _jsonable(value):
    """JSON fallback for numpy scalars/arrays and paths in records and events."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def dumps(obj) -> str:
    return json.dumps(obj, default=_jsonable, allow_nan=False)


def write_json_atomic(path: str, obj) -> None:
    """Write ``obj`` as JSON to ``path`` via a temporary file and a rename: never a partial file."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            json.dump(obj, fh, default=_jsonable, indent=1, allow_nan=False)
            fh.write("\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def peak_rss_bytes() -> int:
    """This process's peak resident set size: VmHWM, which starts afresh at exec; ``ru_maxrss``
    (KiB) only where /proc is missing, as Linux carries it over exec from the process that forked
    (a run started from a 1 GiB Python process reported 1 GiB whatever it used)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class RunLog:
    """A telemetry sink writing this rank's events as JSON lines; :meth:`close` writes the summary.

    Each event line holds: ``type: "event"``, ``run_id``, ``rank``, ``host``, ``job_id``, ``time``
    (ISO-8601 UTC start of the phase), ``mono`` (monotonic seconds since the log was opened on this
    rank, when the event was logged, i.e. the end of the phase), ``phase``, ``step``, ``steps``,
    ``seconds``, ``bytes``, ``level``, plus any other keys the event carried. Thread-safe: an I/O
    thread may log too. Use via :func:`open_run_log`.
    """

    def __init__(self, directory: str, comm, fh, *, run_id: str, host: str, job: dict,
                 meter: EnergyMeter | None, model: EnergyModel, record: dict):
        self.directory = directory
        self.comm = comm
        self.rank = comm.rank if comm is not None else 0
        self.size = comm.size if comm is not None else 1
        self.run_id = run_id
        self.host = host
        self.job_id = job["job_id"]
        self.record = record
        self.meter = meter
        self.model = model
        self.events = 0
        self.dropped = 0
        self.closed = False
        self.summary: dict | None = None
        self._fh = fh
        self._lock = threading.Lock()
        self._totals: dict[tuple, list] = {}
        self._mono0 = time.monotonic()

    def __call__(self, event: dict) -> None:
        """Log one finished phase (a Telemetry event dict)."""
        event = dict(event)
        t0 = event.pop("t0", None)
        line = {"type": "event", "run_id": self.run_id, "rank": self.rank, "host": self.host,
                "job_id": self.job_id, "time": iso_time(t0 if t0 is not None else time.time()),
                "mono": time.monotonic() - self._mono0}
        line.update({"phase": event.pop("phase"), "step": event.pop("step", None),
                     "steps": int(event.pop("steps", 0) or 0), "seconds": float(event.pop("seconds")),
                     "bytes": int(event.pop("bytes", 0) or 0), "level": event.pop("level", None)})
        line.update(event)
        text = dumps(line) + "\n"
        with self._lock:
            if self.closed:
                self.dropped += 1
                if self.dropped == 1:
                    warnings.warn(f"hpcadj: {line['phase']} event after the run log was closed is not "
                                  "logged (close storage levels before the log)", RuntimeWarning, stacklevel=2)
                return
            self._fh.write(text)
            self.events += 1
            total = self._totals.setdefault((line["phase"], line["level"]), [0, 0, 0.0, 0])
            total[0] += 1
            total[1] += line["steps"]
            total[2] += line["seconds"]
            total[3] += line["bytes"]

    def close(self, summary: dict | None = None) -> dict:
        """Collective: end every rank's file, stop the energy meter, rank 0 writes ``summary.json``.

        ``summary`` is the caller's result (gradient norms, level statistics...), stored under
        ``"result"``. Returns the summary dict written (the same on every rank).
        """
        wall = time.monotonic() - self._mono0
        rss = peak_rss_bytes()
        with self._lock:
            self.closed = True
            self._fh.write(dumps({"type": "end", "run_id": self.run_id, "rank": self.rank,
                                  "events": self.events, "wall_seconds": wall,
                                  "max_rss_bytes": rss, "time": iso_time(time.time())}) + "\n")
            self._fh.close()
        measured = self.meter.stop() if self.meter is not None else None
        mine = {"wall": wall, "rss": rss, "totals": [[k[0], k[1], *v] for k, v in self._totals.items()]}
        ranks = [mine] if self.comm is None else self.comm.gather(mine, root=0)
        out, error = None, None
        if self.rank == 0:
            out = self._summary(ranks, measured, summary)
            try:
                write_json_atomic(os.path.join(self.directory, SUMMARY_FILE), out)
            except OSError as exc:
                error = f"cannot write {SUMMARY_FILE} in {self.directory}: {exc.strerror or exc}"
        if self.comm is not None:
            out, error = self.comm.bcast((out, error), root=0)
        if error:
            raise LogDirError(error)
        self.summary = out
        return out

    def abort(self, error: str) -> None:
        """Not collective: end this rank's file with ``error`` (no summary), e.g. from an ``except``.

        ``hpcadj analyze`` reports the rank as aborted with this message.
        """
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._fh.write(dumps({"type": "end", "run_id": self.run_id, "rank": self.rank,
                                  "events": self.events, "wall_seconds": time.monotonic() - self._mono0,
                                  "max_rss_bytes": peak_rss_bytes(), "time": iso_time(time.time()),
                                  "error": str(error)}) + "\n")
            self._fh.close()

    def _summary(self, ranks: list[dict], measured: dict | None, result: dict | None) -> dict:
        phases: dict[tuple, dict] = {}
        for r in ranks:
            for phase, level, count, steps, seconds, nbytes in r["totals"]:
                row = phases.setdefault((phase, level), {"phase": phase, "level": level, "count": 0,
                                                         "steps": 0, "seconds_sum": 0.0,
                                                         "seconds_max": 0.0, "bytes": 0})
                row["count"] += count
                row["steps"] += steps
                row["seconds_sum"] += seconds
                row["seconds_max"] = max(row["seconds_max"], seconds)
                row["bytes"] += nbytes
        other = sum(max(r["wall"] - sum(t[4] for t in r["totals"]), 0.0) for r in ranks)
        kinds = level_kind_map(self.record.get("levels"))
        if isinstance(result, dict) and isinstance(result.get("levels"), dict):
            kinds.update(level_kind_map(result["levels"]))
        modeled = model_run_energy(list(phases.values()), other, kinds, self.model)
        energy = {"measured": measured if measured is not None else {}, "model": modeled,
                  "total": best_energy(measured, modeled)}
        return {"type": "summary", "schema": SCHEMA, "run_id": self.run_id, "job_id": self.job_id,
                "finished": iso_time(time.time()), "ranks": self.size,
                "wall_seconds": max(r["wall"] for r in ranks),
                "peak_rss_bytes": {"max": max(r["rss"] for r in ranks), "sum": sum(r["rss"] for r in ranks)},
                "phases": list(phases.values()), "energy": energy, "result": result or {}}


def _previous_run(log_dir: str) -> dict:
    """What an overwritten log directory held: run id, start, whether it finished and its status.

    Recorded in the new ``run.json`` as ``"overwrote"`` (e.g. the fragment before a ``--resume``),
    so the analysis can say that the earlier part's numbers are gone."""
    out: dict = {"run_id": None, "started": None, "finished": False, "status": None}
    for name, keys in ((RUN_FILE, ("run_id", "started")), (SUMMARY_FILE, ("finished",))):
        try:
            with open(os.path.join(log_dir, name)) as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        for key in keys:
            if data.get(key) is not None:
                out[key] = data[key] if key != "finished" else True
        if name == SUMMARY_FILE and isinstance(data.get("result"), dict):
            out["status"] = data["result"].get("status")
    return out


def _keep_attempt(log_dir: str, names: list[str], run_id) -> str:
    """Move an earlier run's log files into ``attempts/NN-<run id>`` (numbered in order); its path."""
    attempts = os.path.join(log_dir, ATTEMPTS_DIR)
    os.makedirs(attempts, exist_ok=True)
    number = len([n for n in os.listdir(attempts) if os.path.isdir(os.path.join(attempts, n))])
    dest = os.path.join(attempts, f"{number:02d}-{run_id or 'unknown'}")
    os.makedirs(dest, exist_ok=True)
    for name in names:
        os.replace(os.path.join(log_dir, name), os.path.join(dest, name))
    return dest


def _rank0_prepare(log_dir: str, run: dict, overwrite: bool) -> str | None:
    """Create the directory, refuse (or clear, with ``overwrite``) an earlier run, write run.json."""
    if os.path.exists(log_dir) and not os.path.isdir(log_dir):
        return f"log directory {log_dir} is not a directory"
    try:
        os.makedirs(log_dir, exist_ok=True)
        ours = [n for n in os.listdir(log_dir)
                if n in (RUN_FILE, SUMMARY_FILE) or (n.startswith("rank") and n.endswith(".jsonl"))]
        if ours and not overwrite:
            return f"log directory {log_dir} already holds a run ({', '.join(sorted(ours)[:3])}...)"
        if ours:
            previous = _previous_run(log_dir)
            kept = _keep_attempt(log_dir, ours, previous["run_id"])
            run["overwrote"] = {**previous, "kept_in": os.path.relpath(kept, log_dir)}
        write_json_atomic(os.path.join(log_dir, RUN_FILE), run)
    except OSError as exc:
        return f"log directory {log_dir} is not writable: {exc.strerror or exc}"
    return None


def open_run_log(log_dir, comm=None, run_record: dict | None = None, *, meter="auto",
                 powercap_root: str = DEFAULT_POWERCAP_ROOT, energy_model: EnergyModel | str | None = None,
                 overwrite: bool = False) -> RunLog:
    """Open the run's log on every rank (collective over ``comm``; None for a single process).

    Rank 0 creates ``log_dir`` and writes ``run.json`` (``run_record`` under ``"record"``); each
    rank opens its own ``rankNNNNN.jsonl``. Any failure on any rank raises :class:`LogDirError` on
    every rank before the run starts. ``meter``: ``"auto"`` measures energy with an
    :class:`EnergyMeter` on ``powercap_root``, None measures nothing (the model still costs the
    run), or an :class:`EnergyMeter` to use. ``energy_model``: an EnergyModel, a TOML path, or None
    for the defaults (or ``$HPCADJ_ENERGY_MODEL``).
    """
    log_dir = os.path.abspath(os.fspath(log_dir))
    record = dict(run_record or {})
    model = energy_model if isinstance(energy_model, EnergyModel) else load_model(energy_model)
    host = socket.gethostname()
    rank = comm.rank if comm is not None else 0
    size = comm.size if comm is not None else 1
    hosts = [host] if comm is None else comm.allgather(host)
    job = job_info()
    error = None
    run_id = None
    if rank == 0:
        run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
        run = {"type": "run", "schema": SCHEMA, "run_id": run_id, "started": iso_time(time.time()),
               **job, "ranks": size, "hosts": {h: [r for r, x in enumerate(hosts) if x == h]
                                                for h in dict.fromkeys(hosts)},
               "versions": stack_versions(), "energy_model": model.as_dict(), "record": record}
        error = _rank0_prepare(log_dir, run, overwrite)
    if comm is not None:
        run_id, error = comm.bcast((run_id, error), root=0)
    if error:
        raise LogDirError(error)
    fh = None
    try:
        os.makedirs(log_dir, exist_ok=True)
        fh = open(os.path.join(log_dir, rank_file(rank)), "w", buffering=1)
        fh.write(dumps({"type": "header", "schema": SCHEMA, "run_id": run_id, "rank": rank, "ranks": size,
                        "host": host, "pid": os.getpid(), **job, "time": iso_time(time.time())}) + "\n")
    except OSError as exc:
        error = f"rank {rank}: cannot write {rank_file(rank)} in {log_dir}: {exc.strerror or exc}"
    errors = [error] if comm is None else comm.allgather(error)
    errors = [e for e in errors if e]
    if errors:
        if fh is not None:
            fh.close()
        raise LogDirError("; ".join(errors))
    if meter == "auto":
        meter = EnergyMeter(comm, powercap_root)
    if meter is not None:
        meter.start()
    return RunLog(log_dir, comm, fh, run_id=run_id, host=host, job=job, meter=meter, model=model,
                  record=record)
