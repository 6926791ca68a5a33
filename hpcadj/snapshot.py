"""What a checkpoint holds, as plain data both models and storage levels understand.

A snapshot is ``{field name: this rank's owned block as a numpy array}``; its :class:`FieldLayout`
says where that block sits in the field's global, natural-ordered array (C order, slowest axis first:
(ny, nx) or (nz, ny, nx), plus trailing component axes). Models produce snapshots; levels store them.
"""

from __future__ import annotations

import errno
import mmap
from dataclasses import dataclass

import numpy as np

Snapshot = dict[str, np.ndarray]


@dataclass(frozen=True)
class FieldLayout:
    """Where this rank's block of one field sits in the global natural-ordered array."""

    global_shape: tuple[int, ...]
    start: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str = "float64"

    def __post_init__(self):
        if not len(self.global_shape) == len(self.start) == len(self.shape):
            raise ValueError("global_shape, start and shape must have the same rank")

    @property
    def slices(self) -> tuple[slice, ...]:
        return tuple(slice(s, s + n) for s, n in zip(self.start, self.shape))

    @property
    def local_nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def global_nbytes(self) -> int:
        return int(np.prod(self.global_shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


SnapshotLayout = dict[str, FieldLayout]


#: arrays at least this large are mapped on their own (see :func:`mapped_empty`)
MAPPED_MIN_BYTES = 128 * 1024


def mapped_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-order array in its own anonymous memory mapping (small ones: ``np.empty``).

    Checkpoint copies live long, while the solver allocates and frees states around them every
    step. Allocated from the heap, they left the freed states' memory in holes between them that the
    process never gave back once MPI and PETSc had started (wave 64^3 on one rank, 120 RAM slots:
    peak RSS 5.5 MiB per 4 MiB slot). In a mapping of their own, they are returned whole on free.
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < MAPPED_MIN_BYTES:
        return np.empty(shape, dtype)
    # MAP_POPULATE faults the pages in at once (6 ms per fresh 16 MiB on this VM, 10 ms touched one
    # by one): the array is about to be written whole anyway
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    try:
        mapping = mmap.mmap(-1, nbytes, flags=flags)
    except OSError as exc:
        if exc.errno != errno.ENOMEM:
            raise
        # what numpy raises for a heap array, so callers report both alike ("out of memory")
        raise MemoryError(f"Unable to allocate {nbytes / 2 ** 20:.3g} MiB for an array with shape "
                          f"{shape} and data type {dtype}") from None
    # over the mapping itself, not a reshaped view of a flat array: a view of the result then refers
    # to the result (numpy's base chain stops there), so a pool counting its references sees it held
    return np.ndarray(shape, dtype=dtype, buffer=mapping)


def copy_snapshot(snapshot: Snapshot, spare: Snapshot | None = None) -> Snapshot:
    """C-order copies of ``snapshot``, written into ``spare``'s arrays (memory already paged in)
    when it has the same fields, shapes and dtypes, else freshly allocated (:func:`mapped_empty`)."""
    if spare is None or spare.keys() != snapshot.keys() or any(
            spare[k].shape != v.shape or spare[k].dtype != v.dtype for k, v in snapshot.items()):
        copies = {}
        for k, v in snapshot.items():
            copies[k] = mapped_empty(v.shape, v.dtype)
            np.copyto(copies[k], v)
        return copies
    for k, v in snapshot.items():
        spare[k].flags.writeable = True
        np.copyto(spare[k], v)
    return spare


def layout_bytes(layout: SnapshotLayout) -> int:
    """Bytes of one snapshot (or set of fields) of ``layout`` on this rank: its blocks."""
    return int(sum(f.local_nbytes for f in layout.values()))


def layout_global_bytes(layout: SnapshotLayout) -> int:
    """Bytes of one snapshot (or set of fields) of ``layout`` over all ranks: the global arrays."""
    return int(sum(f.global_nbytes for f in layout.values()))


def snapshot_nbytes(snapshot: Snapshot) -> int:
    """Bytes of this rank's blocks."""
    return sum(a.nbytes for a in snapshot.values())
