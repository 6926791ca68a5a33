"""The level interface: store and return this rank's snapshot blocks by step number."""

from __future__ import annotations

import abc
import threading
from dataclasses import asdict, dataclass

from ...snapshot import Snapshot, SnapshotLayout


class LevelError(RuntimeError):
    """A level cannot do what was asked (full, missing snapshot, failed checksum, I/O error).

    The typed subclasses set what a caller re-planning around the failure needs in their
    constructors: ``level`` (its name), ``step``, ``writing`` (a write failed), ``reason``.
    """

    level: str | None = None
    step: int | None = None
    writing: bool = False
    reason: str | None = None


class LevelFault(LevelError):
    """An operation of level ``level`` on step ``step`` failed (``writing``: it was a write).

    What the driver raises on every rank when a level operation failed on any of them, and the
    base of the typed level failures.
    """

    def __init__(self, level: str, step: int | None, message: str, *, writing: bool = False):
        self.level = level
        self.step = None if step is None else int(step)
        self.writing = bool(writing)
        super().__init__(message)


class WriteFailed(LevelFault):
    """Writing the snapshot of ``step`` to level ``level`` failed (on this or another rank)."""

    def __init__(self, level: str, step: int | None, message: str):
        super().__init__(level, step, message, writing=True)


class CorruptSnapshot(LevelError):
    """A stored block failed its checksum, was truncated, is missing or belongs to another run.

    Raised on every rank of the level's communicator (levels agree on it), naming the ranks whose
    blocks failed, so a caller can treat the snapshot as missing on all ranks alike.
    """

    def __init__(self, level: str, step: int, ranks, reason: str = "checksum mismatch"):
        self.level = level
        self.step = int(step)
        self.ranks = tuple(int(r) for r in ranks)
        self.reason = reason
        where = f"rank(s) {', '.join(map(str, self.ranks))}" if self.ranks else "this rank"
        super().__init__(f"{level}: snapshot of step {self.step} is corrupt on {where}: {reason}")


@dataclass
class LevelStats:
    """What a level moved, for telemetry and ``run --json``.

    ``write_s``/``read_s`` are the seconds the transfers took wherever they ran (the I/O thread for
    asynchronous levels); ``wait_s`` is what the caller's thread spent blocked on the level (the
    driver's ``io_wait``); ``stage_s`` is the caller's time copying snapshots into write buffers;
    ``zero_copy`` counts writes of donated arrays that needed no such copy.
    ``bytes_read`` counts bytes moved from storage, including prefetches later dropped unread.
    """

    writes: int = 0
    reads: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    write_s: float = 0.0
    read_s: float = 0.0
    peak_slots: int = 0
    wait_s: float = 0.0
    stage_s: float = 0.0
    zero_copy: int = 0
    prefetches: int = 0
    prefetch_hits: int = 0
    peak_buffers: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class Level(abc.ABC):
    """One storage level with ``capacity`` snapshot slots.

    ``layout`` describes the snapshot fields (global shape and this rank's block), so file-backed
    levels can lay out datasets; every rank calls every method in the same order (collective levels
    rely on it). Asynchronous levels also honour :meth:`prefetch` and :meth:`flush`; for the others
    both are no-ops, so a driver may call them on any level.
    """

    kind: str = "abstract"
    async_io: bool = False

    def __init__(self, name: str, capacity: int, layout: SnapshotLayout):
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.name = name
        self.capacity = int(capacity)
        self.layout = layout
        self.stats = LevelStats()
        self.times: dict[int, float | None] = {}
        self._held: set[int] = set()
        self._stats_lock = threading.Lock()

    def __contains__(self, step: int) -> bool:
        return step in self._held

    @property
    def failures_need_agreement(self) -> bool:
        """Whether an operation may fail on some ranks and not others, so a caller must agree on
        its outcome across ranks before acting on it. True unless a level knows better."""
        return True

    @property
    def occupied(self) -> int:
        return len(self._held)

    def write(self, step: int, snapshot: Snapshot, time: float | None = None, *,
              donate: bool = False) -> None:
        """Store ``snapshot`` as step ``step`` (model time ``time``) in a free slot.

        The level keeps a copy, unless the caller ``donate``s the arrays: it promises never to modify
        them, so an asynchronous level may write them from its I/O thread as they are, holding them
        (and, for views of a PETSc Vec, the Vec's memory) until written, instead of copying first.
        """
        if step in self._held:
            raise LevelError(f"{self.name}: step {step} is already stored")
        if len(self._held) >= self.capacity:
            raise LevelError(f"{self.name}: all {self.capacity} slots are full")
        self.times[step] = time
        self._write(step, snapshot, donate)
        self._held.add(step)
        self.stats.writes += 1
        self.stats.peak_slots = max(self.stats.peak_slots, len(self._held))

    def read(self, step: int) -> Snapshot:
        """Return the snapshot of step ``step`` (verified); the slot stays occupied."""
        if step not in self._held:
            raise LevelError(f"{self.name}: step {step} is not stored")
        snapshot = self._read(step)
        self.stats.reads += 1
        return snapshot

    def free(self, step: int) -> None:
        """Release the slot of step ``step``."""
        if step not in self._held:
            raise LevelError(f"{self.name}: step {step} is not stored")
        self._free(step)
        self._held.discard(step)
        self.times.pop(step, None)

    def valid_steps(self) -> set[int]:
        """Steps whose snapshots are stored and complete: after a fault, what can still be read."""
        return set(self._held)

    def discard(self, step: int) -> None:
        """Forget ``step`` after a fault, releasing what it used if possible; never raises."""
        if step in self._held:
            try:
                self._free(step)
            except (LevelError, OSError):
                pass
            self._held.discard(step)
            self.times.pop(step, None)

    def prefetch(self, step: int) -> None:
        """Hint that ``read(step)`` comes soon, so an asynchronous level can start reading it now."""

    def flush(self) -> None:
        """Wait until every queued operation has finished (stats are then complete)."""

    def close(self) -> None:
        """Release every resource (files are removed unless the level was asked to keep them)."""

    def _account(self, *, written: int = 0, read: int = 0, write_s: float = 0.0,
                 read_s: float = 0.0, wait_s: float = 0.0) -> None:
        """Add to the stats; safe to call from an I/O thread."""
        with self._stats_lock:
            s = self.stats
            s.bytes_written += written
            s.bytes_read += read
            s.write_s += write_s
            s.read_s += read_s
            s.wait_s += wait_s

    @abc.abstractmethod
    def _write(self, step: int, snapshot: Snapshot, donate: bool = False) -> None: ...

    @abc.abstractmethod
    def _read(self, step: int) -> Snapshot: ...

    @abc.abstractmethod
    def _free(self, step: int) -> None: ...


def kept_by(part: str) -> property:
    """A ``keep`` property (whether closing leaves the files in place; settable until close) that
    is the attribute ``part``'s, the object holding the files (False where that part keeps none)."""

    def get(self) -> bool:
        return getattr(getattr(self, part), "keep", False)

    def put(self, value) -> None:
        holder = getattr(self, part)
        if hasattr(holder, "keep"):
            holder.keep = bool(value)

    return property(get, put, doc=f"Whether closing leaves the files in place: the {part}'s.")


def agree_run_id(comm=None, run_id: str | None = None) -> str:
    """The run id every rank uses: ``run_id`` if given, else a fresh one made on rank 0 and broadcast.

    Fresh ids are a UTC time stamp plus 8 random hex digits, so two runs never share file names.
    """
    if run_id is None:
        import time
        import uuid

        run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]
        if comm is not None:
            run_id = comm.bcast(run_id, root=0)
    if not run_id or "/" in run_id or run_id.startswith("."):
        raise ValueError(f"run id {run_id!r} is not a plain file-name component")
    return run_id
