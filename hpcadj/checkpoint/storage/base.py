"""The level interface: store and return this rank's snapshot blocks by step number."""

from __future__ import annotations

import abc
from dataclasses import asdict, dataclass

from ...snapshot import Snapshot, SnapshotLayout


class LevelError(RuntimeError):
    """A level cannot do what was asked (full, missing snapshot, failed checksum, I/O error)."""


@dataclass
class LevelStats:
    """What a level moved, for telemetry and ``run --json``."""

    writes: int = 0
    reads: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    write_s: float = 0.0
    read_s: float = 0.0
    peak_slots: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class Level(abc.ABC):
    """One storage level with ``capacity`` snapshot slots.

    ``layout`` describes the snapshot fields (global shape and this rank's block), so file-backed
    levels can lay out datasets; every rank calls every method in the same order (collective levels
    rely on it).
    """

    kind: str = "abstract"

    def __init__(self, name: str, capacity: int, layout: SnapshotLayout):
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.name = name
        self.capacity = int(capacity)
        self.layout = layout
        self.stats = LevelStats()
        self._held: set[int] = set()

    def __contains__(self, step: int) -> bool:
        return step in self._held

    @property
    def occupied(self) -> int:
        return len(self._held)

    def write(self, step: int, snapshot: Snapshot) -> None:
        """Store a copy of ``snapshot`` as step ``step`` in a free slot."""
        if step in self._held:
            raise LevelError(f"{self.name}: step {step} is already stored")
        if len(self._held) >= self.capacity:
            raise LevelError(f"{self.name}: all {self.capacity} slots are full")
        self._write(step, snapshot)
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

    def close(self) -> None:
        """Release every resource (files are removed unless the level was asked to keep them)."""

    @abc.abstractmethod
    def _write(self, step: int, snapshot: Snapshot) -> None: ...

    @abc.abstractmethod
    def _read(self, step: int) -> Snapshot: ...

    @abc.abstractmethod
    def _free(self, step: int) -> None: ...
