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

import ctypes
import mmap
import struct
import time

import numpy as np

from ...snapshot import FieldLayout, Snapshot, SnapshotLayout, mapped_empty
from ...collective import any_rank
from .base import CorruptSnapshot, Level, LevelError, kept_by
from .codec import Codec, CodecError, EncodedBlock, encode_snapshot, scratch_bytes
from ...imports import mpi

#: slot frame: magic, <u8 payload length, <u4 field count; then per field <u2 name length, name, <u8 length
_FRAME = struct.Struct("<8sQI")
_FIELD = struct.Struct("<HQ")
FRAME_MAGIC = b"HPCADJS1"
FIELD = "z"


class CompressionOverflow(LevelError):
    """A snapshot compressed to more bytes than its planned slot holds (raised on every rank)."""


def frame_nbytes(encoded: dict[str, EncodedBlock]) -> int:
    """Bytes :func:`frame` takes for ``encoded``."""
    return _FRAME.size + sum(_FIELD.size + len(name.encode()) + enc.container_nbytes()
                             for name, enc in encoded.items())


def frame_into(encoded: dict[str, EncodedBlock], out) -> int:
    """Write :func:`frame` of ``encoded`` at the start of the writable buffer ``out`` (the payload
    is copied once, into ``out``); the number of bytes written."""
    view = memoryview(out).cast("B")
    pos = _FRAME.size
    for name, enc in encoded.items():
        key = name.encode()
        body = enc.container_nbytes()
        _FIELD.pack_into(view, pos, len(key), body)
        pos += _FIELD.size
        view[pos:pos + len(key)] = key
        pos += len(key)
        pos += enc.write_into(view[pos:pos + body])
    _FRAME.pack_into(view, 0, FRAME_MAGIC, pos - _FRAME.size, len(encoded))
    return pos


def frame(encoded: dict[str, EncodedBlock]) -> bytes:
    """The encoded fields as one byte string (field names, then each field's container)."""
    out = bytearray(frame_nbytes(encoded))
    frame_into(encoded, out)
    return bytes(out)


def unframe(buf, copy: bool = True) -> dict[str, EncodedBlock]:
    """Inverse of :func:`frame` (trailing padding ignored); :class:`CodecError` if corrupt.
    ``copy=False``: the blocks' payloads are views of ``buf`` (see :meth:`EncodedBlock.from_bytes`)."""
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
        out[name] = EncodedBlock.from_bytes(view[pos:pos + blen], copy)
        pos += blen
    return out


def framed_nbytes(snapshot: Snapshot, codec: Codec) -> tuple[int, dict[str, EncodedBlock]]:
    """Bytes the framed encoding of ``snapshot`` takes, and the encoding."""
    encoded = encode_snapshot(snapshot, codec)
    return frame_nbytes(encoded), encoded


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

    keep = kept_by("inner")

    def _write(self, step, snapshot, donate=False):
        t0 = time.perf_counter()
        encoded = encode_snapshot(snapshot, self.codec)
        size = frame_nbytes(encoded)
        fits = size <= self.slot_bytes
        self.largest = max(self.largest, size)
        if any_rank(self.comm, not fits):
            self.overflows += 1
            raise CompressionOverflow(
                f"{self.name}: step {step} compressed ({self.codec.spec}) to "
                f"{'%d bytes on this rank' % size if not fits else 'more than its slot on another rank'}, "
                f"more than the planned slot of {self.slot_bytes} bytes: raise the compression margin "
                f"($HPCADJ_COMPRESS_MARGIN) or use a looser codec")
        slot = np.zeros(self.slot_bytes, np.uint8)
        frame_into(encoded, slot)
        dt = time.perf_counter() - t0
        self.encode_s += dt
        self.inner._account(write_s=dt)  # under the wrapped level's lock (its I/O thread adds too)
        self.raw_bytes += sum(a.nbytes for a in snapshot.values())
        self.stored_bytes += size
        self.max_error = max(self.max_error, max((e.max_error for e in encoded.values()), default=0.0))
        self.inner.write(step, {FIELD: slot}, self.times.get(step), donate=True)
        self.inner.stats.writes -= 1  # counted once, by this wrapper's write()

    def _read(self, step):
        stored = self.inner.read(step)[FIELD]
        self.inner.stats.reads -= 1
        t0 = time.perf_counter()
        out = decoded(self, step, lambda: unframe(stored, copy=False).items())  # while ``stored`` is held
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
        return codec_summary(self)


def decoded(level, step: int, blocks) -> dict:
    """The snapshot ``blocks()`` (pairs of field name and EncodedBlock) decode to, checked against
    ``level``'s layout: CorruptSnapshot for a block that does not decode or fields not the layout's."""
    try:
        base = Codec()
        out = {name: base.decode(enc, mapped_empty(tuple(enc.shape), np.dtype(enc.dtype))) for name, enc in blocks()}
    except CodecError as exc:
        raise CorruptSnapshot(level.name, step, (), str(exc)) from None
    if out.keys() != level.layout.keys():
        raise CorruptSnapshot(level.name, step, (), f"fields {sorted(out)} are not the layout's")
    return out


def codec_summary(level) -> dict:
    """A compressed level's figures on this rank: its codec, slot size, raw and stored payload
    bytes, seconds encoding and decoding, largest error, overflows and largest encoded snapshot."""
    return {"codec": level.codec.spec, "lossy": level.codec.lossy, "tolerance": level.codec.tolerance,
            "slot_bytes": level.slot_bytes, "raw_bytes": level.raw_bytes, "stored_bytes": level.stored_bytes,
            "encode_s": level.encode_s, "decode_s": level.decode_s, "max_error": level.max_error,
            "overflows": level.overflows, "largest_bytes": level.largest}




class Arena:
    """A fixed buffer of ``nbytes`` holding variable-sized blobs by key (first fit from the low end;
    packed towards it when no gap fits a blob the free bytes would hold).

    One anonymous mapping made once: the blobs never come from the heap, where hundreds of them of
    varying sizes between the solver's states left holes the process kept (the pool's resident
    bytes stay within ``nbytes``; pages are touched as blobs first reach them).
    """

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        if self.nbytes > 0:  # pages are resident once written, so only a used pool's bytes count
            self._map = mmap.mmap(-1, self.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            self.buf = np.frombuffer(self._map, np.uint8)
        else:
            self._map, self.buf = None, np.empty(0, np.uint8)
        self.where: dict = {}
        self.used = 0
        self.compactions = 0

    def alloc(self, key, n: int) -> memoryview | None:
        """A writable view of ``n`` bytes for blob ``key``, or None when the free bytes are fewer."""
        if self.used + n > self.nbytes:
            return None
        offset = self._gap(n)
        if offset is None:
            self._compact()
            offset = self.used
        self.where[key] = (offset, n)
        self.used += n
        return memoryview(self.buf)[offset:offset + n]

    def view(self, key) -> memoryview:
        """The bytes of blob ``key`` (valid until the next :meth:`alloc` or :meth:`free`)."""
        offset, n = self.where[key]
        return memoryview(self.buf)[offset:offset + n]

    def free(self, key) -> None:
        self.used -= self.where.pop(key)[1]

    def _gap(self, n: int) -> int | None:
        pos = 0
        for offset, m in sorted(self.where.values()):
            if offset - pos >= n:
                return pos
            pos = offset + m
        return pos if self.nbytes - pos >= n else None

    def _compact(self) -> None:
        """Slide every blob down to the lowest free byte, in address order (memmove: no copy)."""
        base, pos = self.buf.ctypes.data, 0
        for key, (offset, m) in sorted(self.where.items(), key=lambda kv: kv[1][0]):
            if offset != pos:
                ctypes.memmove(base + pos, base + offset, m)
                self.where[key] = (pos, m)
            pos += m
        self.compactions += 1

    def close(self) -> None:
        self.where.clear()
        self.used = 0
        self.buf = np.empty(0, np.uint8)
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view of it is still alive: the mapping goes with the last one
                pass
            self._map = None


class PooledLevel(Level):
    """RAM level holding ``codec``-encoded snapshots at their own sizes within ``pool_bytes`` per rank.

    ``capacity`` slots are what the plan may use; the pool (an :class:`Arena`) is the hard bound.
    Each field is encoded and copied into the pool before the next is encoded; a lossless Blosc
    codec encodes into one scratch buffer of the largest field's bytes, made once
    (:meth:`~.codec.Lossless.encode_into`), the others hold one field's codec buffers at a time
    (:func:`~.codec.transient_bytes`): no encoding goes through the heap and its holes. A write that would take
    this rank's stored bytes above ``pool_bytes`` (on any rank) stores nothing and raises
    :class:`CompressionOverflow` on every rank; the level then lowers its ``capacity`` to the
    snapshots it holds plus the room left for snapshots of the largest size seen times ``margin``,
    first dropping every other held snapshot (the lowest kept) until that room is at least half of
    what the whole pool would hold, so a re-plan has slots to work with
    (:meth:`_shrink`). Collective (every write agrees across ranks).
    """

    kind = "ram"
    async_io = False
    #: an overflow lowers ``capacity`` (see :meth:`_shrink`) instead of failing the level: a
    #: re-plan may go on writing to it
    shrinks_on_overflow = True

    def __init__(self, codec: Codec, layout: SnapshotLayout, capacity: int, pool_bytes: int,
                 comm=None, name: str = "ram", margin: float = 1.15):
        super().__init__(name, capacity, layout)
        self.codec, self.pool_bytes, self.comm = codec, int(pool_bytes), comm
        self.margin = float(margin)
        self._arena = Arena(self.pool_bytes)
        self._scratch = None
        if hasattr(codec, "encode_into"):
            largest = max((f.local_nbytes for f in layout.values()), default=0)
            self._scratch = Arena(scratch_bytes(largest))
        self._fields: dict[int, list[str]] = {}
        self.peak_bytes = 0
        self.raw_bytes = self.stored_bytes = 0
        self.max_error = self.encode_s = self.decode_s = 0.0
        self.overflows = self.largest = 0
        self.dropped: list[int] = []
        self.keep = False

    @property
    def used(self) -> int:
        """Bytes of the pool the held snapshots take on this rank."""
        return self._arena.used

    @property
    def slot_bytes(self) -> int:
        """The pool's bytes per planned slot (what one slot costs the budget on average)."""
        return self.pool_bytes // max(1, self.capacity)

    def _write(self, step, snapshot, donate=False):
        t0 = time.perf_counter()
        placed, size, full, error = [], 0, False, 0.0
        for name, block in snapshot.items():
            enc = (self.codec.encode(block) if self._scratch is None
                   else self.codec.encode_into(block, self._scratch.buf))
            n = enc.container_nbytes()
            size += n
            out = None if full else self._arena.alloc((step, name), n)
            if out is None:
                full = True  # go on encoding: the snapshot's whole size sizes the re-plan
            else:
                enc.write_into(out)
                placed.append(name)
                error = max(error, enc.max_error)
            del enc, out
        self.largest = max(self.largest, size)
        if any_rank(self.comm, full):
            for name in placed:
                self._arena.free((step, name))
            self.overflows += 1
            where = (f"to {size} bytes with {self.used} of the pool's {self.pool_bytes} in use on this rank"
                     if full else f"beyond the pool of {self.pool_bytes} bytes on another rank")
            dropped = self._shrink()
            raise CompressionOverflow(
                f"{self.name}: step {step} compressed ({self.codec.spec}) {where}: the snapshots compress "
                f"worse than planned (raise --compress-probe K to probe later states, or the compression "
                f"margin $HPCADJ_COMPRESS_MARGIN, or use a looser codec); the pool now plans "
                f"{self.capacity} slots" + (f", {dropped} held snapshot(s) dropped" if dropped else ""))
        self._fields[step] = placed
        self.peak_bytes = max(self.peak_bytes, self.used)
        dt = time.perf_counter() - t0
        self.encode_s += dt
        self.stats.write_s += dt
        self.stats.bytes_written += size
        self.raw_bytes += sum(a.nbytes for a in snapshot.values())
        self.stored_bytes += size
        self.max_error = max(self.max_error, error)

    def _shrink(self) -> int:
        """After an overflow: capacity = held snapshots + the room left for snapshots of the largest
        size seen on any rank times ``margin``; while that room is under half of what the whole
        pool holds at that size, every other held snapshot is dropped first (collective). Returns
        how many were dropped."""
        before = len(self.dropped)

        largest = self.largest if self.comm is None else self.comm.allreduce(self.largest, op=mpi().MAX)
        each = max(1, int(largest * self.margin))
        wanted = max(1, self.pool_bytes // each // 2)
        while True:
            room = (self.pool_bytes - self.used) // each
            if self.comm is not None:
                room = self.comm.allreduce(room, op=mpi().MIN)
            held = sorted(self._held)
            if room >= wanted or len(held) <= 1:
                break
            for step in held[1::2]:
                self.discard(step)
                self.dropped.append(step)
        self.capacity = len(self._held) + max(0, room)
        return len(self.dropped) - before

    def _read(self, step):
        t0 = time.perf_counter()
        views = [(name, self._arena.view((step, name))) for name in self._fields[step]]  # decoded at once
        out = decoded(self, step, lambda: ((name, EncodedBlock.from_bytes(view, copy=False)) for name, view in views))
        nbytes = sum(len(view) for _, view in views)
        dt = time.perf_counter() - t0
        self.decode_s += dt
        self.stats.read_s += dt
        self.stats.bytes_read += nbytes
        return out

    def _free(self, step):
        for name in self._fields.pop(step):
            self._arena.free((step, name))

    def close(self):
        self._arena.close()
        if self._scratch is not None:
            self._scratch.close()
        self._fields.clear()
        self._held.clear()

    def summary(self) -> dict:
        """This rank's compression figures, as :meth:`CompressedLevel.summary`, plus the pool's."""
        return {**codec_summary(self), "pool_bytes": self.pool_bytes, "peak_pool_bytes": self.peak_bytes,
                "capacity": self.capacity, "dropped_after_overflow": len(self.dropped)}
