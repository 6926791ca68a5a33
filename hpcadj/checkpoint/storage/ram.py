"""RAM level: numpy copies in process memory."""

from __future__ import annotations

import time

from ...snapshot import Snapshot, copy_snapshot, snapshot_nbytes
from .base import CorruptSnapshot, Level
from .checksum import block_checksum


class RamLevel(Level):
    """Snapshots held as private read-only numpy copies; reads hand out those read-only arrays.

    A freed slot's arrays are kept and reused by the next write, so a plan that stores and frees
    repeatedly copies into memory already paged in; slots in use plus kept ones never exceed the
    peak number of slots used. With ``verify=True`` each block's CRC-32 is recorded on write and
    checked on read (off by default: process memory is trusted and the check costs a pass).
    """

    kind = "ram"

    def __init__(self, capacity: int, layout, name: str = "ram", *, verify: bool = False):
        super().__init__(name, capacity, layout)
        self.verify = bool(verify)
        self._data: dict[int, Snapshot] = {}
        self._crc: dict[int, dict[str, int]] = {}
        self._spare: list[Snapshot] = []

    @property
    def failures_need_agreement(self) -> bool:
        """Only a verified RAM level can fail on one rank (a checksum); otherwise an operation
        fails alike on every rank (a plan error) or not at all."""
        return self.verify

    def _write(self, step, snapshot, donate=False):  # RAM always keeps its own copy
        t0 = time.perf_counter()
        copies = self._copy(snapshot)
        self._data[step] = copies
        if self.verify:
            self._crc[step] = {k: block_checksum(a) for k, a in copies.items()}
        self.stats.write_s += time.perf_counter() - t0
        self.stats.bytes_written += snapshot_nbytes(snapshot)

    def _copy(self, snapshot: Snapshot) -> Snapshot:
        """Read-only C-order copies of ``snapshot``, in a freed slot's arrays where they fit."""
        copies = copy_snapshot(snapshot, self._spare.pop() if self._spare else None)
        for a in copies.values():
            a.flags.writeable = False
        return copies

    def _read(self, step):
        t0 = time.perf_counter()
        snapshot = self._data[step]
        if self.verify:
            bad = [k for k, a in snapshot.items() if block_checksum(a) != self._crc[step][k]]
            if bad:
                raise CorruptSnapshot(self.name, step, (), f"checksum mismatch in {', '.join(bad)}")
        self.stats.read_s += time.perf_counter() - t0
        self.stats.bytes_read += snapshot_nbytes(snapshot)
        return snapshot

    def _free(self, step):
        self._spare.append(self._data.pop(step))
        self._crc.pop(step, None)

    def close(self):
        self._data.clear()
        self._crc.clear()
        self._spare.clear()
        self._held.clear()
