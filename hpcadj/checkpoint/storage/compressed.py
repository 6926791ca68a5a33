"""Compressed snapshots: fixed-size uint8 slots on any level, or a byte pool in RAM.

:class:`PooledLevel` (RAM) keeps each encoded snapshot at its own size inside a per-rank byte
budget, so small snapshots leave room for large ones and the planner's slot count can follow the
expected sizes rather than the largest; a write that would exceed the pool raises
:class:`CompressionOverflow` on every rank. :class:`CompressedLevel` wraps a level built for :func:`slot_layout` (a single uint8 field ``z``
whose global shape is the sum of the ranks' slot bytes, this rank's block at its offset), so file
levels keep their fixed layouts and collective writes. A write encodes the snapshot with a
:mod:`codec` (CRC-32 of stored bytes and decoded block), frames it and pads it to the slot; a
snapshot whose encoding does not fit makes :class:`CompressionOverflow` on every rank (agreed
before the wrapped level is touched, so a collective level never waits on a rank that gave up).
"""

from __future__ import annotations

import struct
import time

import numpy as np

from ...snapshot import FieldLayout, Snapshot, SnapshotLayout, mapped_empty
from ...collective import any_rank
from .base import CorruptSnapshot, Level, LevelError
from .codec import Codec, CodecError, EncodedBlock, encode_snapshot

#: slot frame: magic, <u8 payload length, <u4 field count; then per field <u2 name length, name, <u8 length
_FRAME = struct.Struct("<8sQI")
_FIELD = struct.Struct("<HQ")
FRAME_MAGIC = b"HPCADJS1"
FIELD = "z"


class CompressionOverflow(LevelError):
    """A snapshot compressed to more bytes than its planned slot holds (raised on every rank)."""


def frame(encoded: dict[str, EncodedBlock]) -> bytes:
    """The encoded fields as one byte string (field names, then each field's container)."""
    parts = []
    for name, enc in encoded.items():
        key, body = name.encode(), enc.to_bytes()
        parts += [_FIELD.pack(len(key), len(body)), key, body]
    payload = b"".join(parts)
    return _FRAME.pack(FRAME_MAGIC, len(payload), len(encoded)) + payload


def unframe(buf) -> dict[str, EncodedBlock]:
    """Inverse of :func:`frame` (trailing padding ignored); :class:`CodecError` if corrupt."""
    view = memoryview(buf).cast("B")
    if len(view) < _FRAME.size:
        raise CodecError("compressed slot truncated")
    magic, length, count = _FRAME.unpack_from(view)
    if magic != FRAME_MAGIC or _FRAME.size + length > len(view):
        raise CodecError("compressed slot has no valid frame (bad magic or length)")
    out, pos = {}, _FRAME.size
    for _ in range(count):
        klen, blen = _FIELD.unpack_from(view, pos)
        pos += _FIELD.size
        name = bytes(view[pos:pos + klen]).decode()
        pos += klen
        out[name] = EncodedBlock.from_bytes(view[pos:pos + blen])
        pos += blen
    return out


def framed_nbytes(snapshot: Snapshot, codec: Codec) -> tuple[int, dict[str, EncodedBlock]]:
    """Bytes the framed encoding of ``snapshot`` takes, and the encoding."""
    encoded = encode_snapshot(snapshot, codec)
    return len(frame(encoded)), encoded


def slot_layout(slot_bytes: int, comm=None) -> SnapshotLayout:
    """The wrapped level's layout: one uint8 field, ``slot_bytes`` per rank at this rank's offset."""
    rank, size = (comm.rank, comm.size) if comm is not None else (0, 1)
    return {FIELD: FieldLayout((slot_bytes * size,), (slot_bytes * rank,), (slot_bytes,), "uint8")}


class CompressedLevel(Level):
    """``inner`` (built with :func:`slot_layout`) holding ``codec``-encoded snapshots of ``layout``.

    ``stats`` are the wrapped level's (bytes as stored) plus the codec's seconds in ``write_s`` /
    ``read_s``; ``raw_bytes`` and ``stored_bytes`` give the ratio, ``max_error`` the largest
    measured pointwise error (lossy codecs). Collective like the wrapped level: every rank calls
    every method in the same order.
    """

    def __init__(self, inner: Level, codec: Codec, layout: SnapshotLayout, slot_bytes: int, comm=None):
        super().__init__(inner.name, inner.capacity, layout)
        self.inner, self.codec, self.slot_bytes, self.comm = inner, codec, int(slot_bytes), comm
        self.kind, self.async_io = inner.kind, inner.async_io
        self.stats = inner.stats
        self.raw_bytes = 0
        self.stored_bytes = 0
        self.max_error = 0.0
        self.encode_s = 0.0
        self.decode_s = 0.0
        self.overflows = 0
        self.largest = 0
        self._held = set(inner.valid_steps())  # an attached level's snapshots (a resumed run)
        self.times = {step: inner.times.get(step) for step in self._held}

    @property
    def attach_note(self):
        return getattr(self.inner, "attach_note", None)

    @property
    def attach_dropped(self):
        return getattr(self.inner, "attach_dropped", [])

    @property
    def keep(self):
        return getattr(self.inner, "keep", False)

    @keep.setter
    def keep(self, value):
        if hasattr(self.inner, "keep"):
            self.inner.keep = value

    def _write(self, step, snapshot, donate=False):
        t0 = time.perf_counter()
        encoded = encode_snapshot(snapshot, self.codec)
        data = frame(encoded)
        fits = len(data) <= self.slot_bytes
        self.largest = max(self.largest, len(data))
        if any_rank(self.comm, not fits):
            self.overflows += 1
            raise CompressionOverflow(
                f"{self.name}: step {step} compressed ({self.codec.spec}) to "
                f"{'%d bytes on this rank' % len(data) if not fits else 'more than its slot on another rank'}, "
                f"more than the planned slot of {self.slot_bytes} bytes: raise the compression margin "
                f"($HPCADJ_COMPRESS_MARGIN) or use a looser codec")
        slot = np.zeros(self.slot_bytes, np.uint8)
        slot[:len(data)] = np.frombuffer(data, np.uint8)
        dt = time.perf_counter() - t0
        self.encode_s += dt
        self.inner._account(write_s=dt)  # under the wrapped level's lock (its I/O thread adds too)
        self.raw_bytes += sum(a.nbytes for a in snapshot.values())
        self.stored_bytes += len(data)
        self.max_error = max(self.max_error, max((e.max_error for e in encoded.values()), default=0.0))
        self.inner.write(step, {FIELD: slot}, self.times.get(step), donate=True)
        self.inner.stats.writes -= 1  # counted once, by this wrapper's write()

    def _read(self, step):
        stored = self.inner.read(step)[FIELD]
        self.inner.stats.reads -= 1
        t0 = time.perf_counter()
        try:
            encoded = unframe(stored)
            out = {}
            base = Codec()
            for name, enc in encoded.items():
                out[name] = base.decode(enc, mapped_empty(tuple(enc.shape), np.dtype(enc.dtype)))
        except CodecError as exc:
            raise CorruptSnapshot(self.name, step, (), str(exc)) from None
        if out.keys() != self.layout.keys():
            raise CorruptSnapshot(self.name, step, (), f"fields {sorted(out)} are not the layout's")
        dt = time.perf_counter() - t0
        self.decode_s += dt
        self.inner._account(read_s=dt)
        return out

    def _free(self, step):
        self.inner.free(step)

    def valid_steps(self):
        return self.inner.valid_steps() & self._held

    def discard(self, step):
        self.inner.discard(step)
        self._held.discard(step)
        self.times.pop(step, None)

    def prefetch(self, step):
        self.inner.prefetch(step)

    def flush(self):
        self.inner.flush()

    def close(self):
        self.inner.close()
        self._held.clear()

    def summary(self) -> dict:
        """This rank's compression figures (ratio of raw to stored payload bytes)."""
        return {"codec": self.codec.spec, "lossy": self.codec.lossy, "tolerance": self.codec.tolerance,
                "slot_bytes": self.slot_bytes, "raw_bytes": self.raw_bytes, "stored_bytes": self.stored_bytes,
                "encode_s": self.encode_s, "decode_s": self.decode_s, "max_error": self.max_error,
                "overflows": self.overflows, "largest_bytes": self.largest}


class PooledLevel(Level):
    """RAM level holding ``codec``-encoded snapshots at their own sizes within ``pool_bytes`` per rank.

    ``capacity`` slots are what the plan may use; the pool is the hard bound: a write that would
    take this rank's stored bytes above ``pool_bytes`` (on any rank) raises
    :class:`CompressionOverflow` on every rank, before anything is stored. Collective (every write
    agrees across ranks).
    """

    kind = "ram"
    async_io = False

    def __init__(self, codec: Codec, layout: SnapshotLayout, capacity: int, pool_bytes: int,
                 comm=None, name: str = "ram"):
        super().__init__(name, capacity, layout)
        self.codec, self.pool_bytes, self.comm = codec, int(pool_bytes), comm
        self._data: dict[int, np.ndarray] = {}
        self.used = self.peak_bytes = 0
        self.raw_bytes = self.stored_bytes = 0
        self.max_error = self.encode_s = self.decode_s = 0.0
        self.overflows = self.largest = 0
        self.keep = False

    @property
    def slot_bytes(self) -> int:
        """The pool's bytes per planned slot (what one slot costs the budget on average)."""
        return self.pool_bytes // max(1, self.capacity)

    def _write(self, step, snapshot, donate=False):
        t0 = time.perf_counter()
        encoded = encode_snapshot(snapshot, self.codec)
        data = frame(encoded)
        fits = self.used + len(data) <= self.pool_bytes
        self.largest = max(self.largest, len(data))
        if any_rank(self.comm, not fits):
            self.overflows += 1
            where = (f"to {len(data)} bytes with {self.used} of the pool's {self.pool_bytes} in use on this rank"
                     if not fits else f"beyond the pool of {self.pool_bytes} bytes on another rank")
            raise CompressionOverflow(
                f"{self.name}: step {step} compressed ({self.codec.spec}) {where}: the snapshots compress "
                f"worse than planned; raise --compress-probe K (probe later states), the compression "
                f"margin ($HPCADJ_COMPRESS_MARGIN) or use a looser codec")
        stored = np.frombuffer(data, np.uint8)
        self._data[step] = stored
        self.used += len(data)
        self.peak_bytes = max(self.peak_bytes, self.used)
        dt = time.perf_counter() - t0
        self.encode_s += dt
        self.stats.write_s += dt
        self.stats.bytes_written += len(data)
        self.raw_bytes += sum(a.nbytes for a in snapshot.values())
        self.stored_bytes += len(data)
        self.max_error = max(self.max_error, max((e.max_error for e in encoded.values()), default=0.0))

    def _read(self, step):
        t0 = time.perf_counter()
        stored = self._data[step]
        try:
            encoded = unframe(stored)
            base = Codec()
            out = {name: base.decode(enc, mapped_empty(tuple(enc.shape), np.dtype(enc.dtype)))
                   for name, enc in encoded.items()}
        except CodecError as exc:
            raise CorruptSnapshot(self.name, step, (), str(exc)) from None
        if out.keys() != self.layout.keys():
            raise CorruptSnapshot(self.name, step, (), f"fields {sorted(out)} are not the layout's")
        dt = time.perf_counter() - t0
        self.decode_s += dt
        self.stats.read_s += dt
        self.stats.bytes_read += len(stored)
        return out

    def _free(self, step):
        self.used -= len(self._data.pop(step))

    def close(self):
        self._data.clear()
        self._held.clear()
        self.used = 0

    def summary(self) -> dict:
        """This rank's compression figures, as :meth:`CompressedLevel.summary`, plus the pool's."""
        return {"codec": self.codec.spec, "lossy": self.codec.lossy, "tolerance": self.codec.tolerance,
                "slot_bytes": self.slot_bytes, "raw_bytes": self.raw_bytes, "stored_bytes": self.stored_bytes,
                "encode_s": self.encode_s, "decode_s": self.decode_s, "max_error": self.max_error,
                "overflows": self.overflows, "largest_bytes": self.largest, "pool_bytes": self.pool_bytes,
                "peak_pool_bytes": self.peak_bytes}
