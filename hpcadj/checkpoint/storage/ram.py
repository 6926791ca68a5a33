"""RAM level: numpy copies in process memory."""

from __future__ import annotations

import time

from ...snapshot import Snapshot, snapshot_nbytes
from .base import Level


class RamLevel(Level):
    """Snapshots held as private read-only numpy copies; reads hand out those read-only arrays."""

    kind = "ram"

    def __init__(self, capacity: int, layout, name: str = "ram"):
        super().__init__(name, capacity, layout)
        self._data: dict[int, Snapshot] = {}

    def _write(self, step, snapshot):
        t0 = time.perf_counter()
        copies = {k: v.copy() for k, v in snapshot.items()}
        for a in copies.values():
            a.flags.writeable = False
        self._data[step] = copies
        self.stats.write_s += time.perf_counter() - t0
        self.stats.bytes_written += snapshot_nbytes(snapshot)

    def _read(self, step):
        t0 = time.perf_counter()
        snapshot = self._data[step]
        self.stats.read_s += time.perf_counter() - t0
        self.stats.bytes_read += snapshot_nbytes(snapshot)
        return snapshot

    def _free(self, step):
        del self._data[step]

    def close(self):
        self._data.clear()
        self._held.clear()
