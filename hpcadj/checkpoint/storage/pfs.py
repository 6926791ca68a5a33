"""Parallel-HDF5 level: one shared file, each snapshot written collectively in natural ordering.

Layout of the file (``format = "hpcadj-checkpoints-1"``)::

    /                         attrs: format, run_id, nranks, checksum ("crc32"), fields
    /slots/slot_<k>           one group per slot, created the first time the slot is used and
                              reused after its snapshot is freed; attrs: step (-1 when free), time
    /slots/slot_<k>/<field>   global dataset, natural (C) order, contiguous; attrs: crc32 (one per
                              rank), rank_starts and rank_shapes (nranks x ndim)
    /snapshots/step_<n>       hard link to the slot group holding step n (removed when freed)

Raw data moves with collective MPI-IO (``with dset.collective:``) for fields whose rank blocks are
strided in the file (2-D/3-D decompositions: two-phase I/O turns many small pieces into large
writes); where every rank's block is one contiguous run (slowest-axis decompositions) each rank
writes its run independently, which measured faster here (``collective="auto"``; "always"/"never"
force one mode). Metadata calls are always made by every rank in the same order.
Reusing slot datasets keeps the file at capacity x snapshot size, and a write costs no dataset
creation (a collective metadata operation); the step links keep it readable by step number.
Every HDF5 call of every PfsLevel of the process runs on one shared FIFO I/O thread (HDF5 is not
thread-safe and h5py serialises calls on a global lock, so two threads doing collective HDF5 I/O
could deadlock across ranks), on a duplicate of the level's communicator. Asynchronous I/O needs
MPI_THREAD_MULTIPLE (the solver's MPI calls run meanwhile); otherwise the level runs synchronously
and says why in ``async_note``.
"""

from __future__ import annotations

import math
import os
import threading

import numpy as np

from ...snapshot import Snapshot, SnapshotLayout
from ...stack import h5py, mpi
from .aio import AsyncLevel, IOThread
from .base import CorruptSnapshot, LevelError, agree_run_id
from .checksum import ALGORITHM, block_checksum

FORMAT = "hpcadj-checkpoints-1"

_shared_lock = threading.Lock()
_shared: dict = {"worker": None, "users": 0}


def contiguous_in_file(global_shape, start, shape) -> bool:
    """Whether a block is one contiguous run of the C-ordered global array (or empty)."""
    if 0 in shape:
        return True
    axes = [k for k in range(len(shape)) if shape[k] != global_shape[k]]
    if not axes:
        return True
    k = axes[-1]
    return all(n == 1 for n in shape[:k]) and all(
        shape[j] == global_shape[j] for j in range(k + 1, len(shape)))


def _transfer(dset, block: np.ndarray, slices, *, write: bool, collective: bool) -> None:
    """Write ``block`` to (or read it from) ``dset[slices]``, collectively or independently.

    In collective mode an empty block still takes part in the call, with empty selections (h5py's
    high-level selections cannot express it); independently it is simply skipped.
    """
    if not collective:
        if block.size:
            if write:
                dset.write_direct(block, dest_sel=slices)
            else:
                dset.read_direct(block, source_sel=slices)
        return
    if block.size:
        with dset.collective:
            if write:
                dset.write_direct(block, dest_sel=slices)
            else:
                dset.read_direct(block, source_sel=slices)
        return
    h5 = h5py()
    dxpl = h5.h5p.create(h5.h5p.DATASET_XFER)
    dxpl.set_dxpl_mpio(h5.h5fd.MPIO_COLLECTIVE)
    mspace = h5.h5s.create(h5.h5s.SCALAR)
    mspace.select_none()
    fspace = dset.id.get_space()
    fspace.select_none()
    dummy = np.zeros(1, dtype=block.dtype)
    (dset.id.write if write else dset.id.read)(mspace, fspace, dummy, dxpl=dxpl)


class PfsLevel(AsyncLevel):
    """Snapshots as global datasets in one parallel-HDF5 file (``driver="mpio"``)."""

    kind = "pfs"
    _agree_on_thread = True

    def __init__(self, capacity: int, layout: SnapshotLayout, comm=None, path: str | None = None,
                 *, run_id: str | None = None, keep: bool = False, fsync: bool = False,
                 async_io: bool = True, queue_depth: int = 2, prefetch_depth: int = 1,
                 collective: str = "auto", name: str = "pfs"):
        MPI = mpi()
        if comm is None:
            comm = MPI.COMM_WORLD
        self.async_note = None
        if async_io and MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            async_io = False
            self.async_note = "MPI is not THREAD_MULTIPLE: parallel-HDF5 level runs synchronously"
        if not layout:
            raise LevelError(f"{name}: the parallel-HDF5 level needs a snapshot layout")
        super().__init__(name, capacity, layout, comm, async_io=async_io,
                         queue_depth=queue_depth, prefetch_depth=prefetch_depth)
        self.keep = bool(keep)
        self.fsync = bool(fsync)
        self.run_id = agree_run_id(self.comm, run_id)
        if path is None:
            path = os.path.abspath(f"hpcadj-{self.run_id}.h5") if self.rank == 0 else None
            path = self.comm.bcast(path, root=0)
        self.path = str(path)
        self.fields = sorted(layout)
        self._ranks = {}
        for f in self.fields:
            lay = layout[f]
            everyone = self.comm.allgather((tuple(lay.global_shape), str(np.dtype(lay.dtype)),
                                            tuple(lay.start), tuple(lay.shape)))
            if len({(g, d) for g, d, _, _ in everyone}) != 1:
                self._abandon()
                raise LevelError(f"{name}: ranks disagree on the global shape/dtype of {f!r}")
            self._ranks[f] = (np.array([s for _, _, s, _ in everyone], dtype=np.int64),
                              np.array([n for _, _, _, n in everyone], dtype=np.int64))
        if collective not in ("auto", "always", "never"):
            raise ValueError(f"collective must be auto, always or never, not {collective!r}")
        self._collective = {f: collective == "always" or (collective == "auto" and not all(
            contiguous_in_file(lay.global_shape, s, n) for s, n in zip(*self._ranks[f])))
            for f, lay in ((f, layout[f]) for f in self.fields)}
        self._file = None
        self._groups: dict[int, object] = {}
        self._free_slots: list[int] = []
        self._slot_of: dict[int, int] = {}
        self._crc: dict[int, list[int]] = {}
        opened = self._submit(self._open, poison=False)
        problem = None
        try:
            opened.result()
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
        problems = self.comm.allgather(problem)
        failed = [(r, p) for r, p in enumerate(problems) if p]
        if failed:
            self._abandon()
            detail = "; ".join(f"rank {r}: {p}" for r, p in failed)
            raise LevelError(f"{name}: cannot create the parallel-HDF5 file {self.path} ({detail})")

    def _abandon(self) -> None:
        """Give up during construction: release the I/O thread, mark closed."""
        if self._worker is not None:
            self._release_worker()
        self._closed = True

    def _acquire_worker(self) -> IOThread:
        with _shared_lock:
            if _shared["worker"] is None:
                _shared["worker"] = IOThread("hpcadj-io-hdf5")
            _shared["users"] += 1
            return _shared["worker"]

    def _release_worker(self) -> None:
        with _shared_lock:
            _shared["users"] -= 1
            if _shared["users"]:
                return
            worker, _shared["worker"] = _shared["worker"], None
        worker.stop()

    # -- on the I/O thread -------------------------------------------------------------------

    def _open(self) -> None:
        h5 = h5py()
        f = h5.File(self.path, "w", driver="mpio", comm=self.comm)
        self._file = f
        f.attrs["format"] = FORMAT
        f.attrs["run_id"] = self.run_id
        f.attrs["nranks"] = self.size
        f.attrs["checksum"] = ALGORITHM
        f.attrs["fields"] = np.array(self.fields, dtype=h5.string_dtype())
        f.create_group("slots")
        f.create_group("snapshots")

    def _group(self, slot: int):
        g = self._groups.get(slot)
        if g is not None:
            return g
        g = self._file["slots"].create_group(f"slot_{slot:04d}")
        for field in self.fields:
            lay = self.layout[field]
            d = g.create_dataset(field, shape=tuple(lay.global_shape), dtype=np.dtype(lay.dtype))
            starts, shapes = self._ranks[field]
            d.attrs["rank_starts"] = starts
            d.attrs["rank_shapes"] = shapes
        g.attrs["step"] = -1
        g.attrs["time"] = math.nan
        self._groups[slot] = g
        return g

    def _store(self, step: int, snapshot: Snapshot, t) -> int:
        if self._free_slots:
            slot = self._free_slots.pop(0)
        else:
            slot = len(self._groups)
        g = self._group(slot)
        crcs = []
        for field in self.fields:
            block = np.ascontiguousarray(snapshot[field])
            crcs.append(block_checksum(block))
            _transfer(g[field], block, self.layout[field].slices, write=True,
                      collective=self._collective[field])
        table = np.array(self.comm.allgather(crcs), dtype=np.uint32).reshape(self.size, -1)
        for i, field in enumerate(self.fields):
            g[field].attrs["crc32"] = table[:, i]
        g.attrs["step"] = int(step)
        g.attrs["time"] = math.nan if t is None else float(t)
        self._file["snapshots"][f"step_{step}"] = g
        if self.fsync:
            self._file.flush()
        self._slot_of[step] = slot
        self._crc[step] = crcs
        return sum(snapshot[f].nbytes for f in self.fields)

    def _load(self, step: int) -> Snapshot:
        g = self._groups[self._slot_of[step]]
        expected = self._crc[step]
        snapshot: Snapshot = {}
        bad = []
        for i, field in enumerate(self.fields):
            lay = self.layout[field]
            arr = np.empty(tuple(lay.shape), dtype=np.dtype(lay.dtype))
            _transfer(g[field], arr, lay.slices, write=False, collective=self._collective[field])
            if block_checksum(arr) != expected[i]:
                bad.append(field)
            snapshot[field] = arr
        if bad:
            raise CorruptSnapshot(self.name, step, [self.rank],
                                  f"checksum mismatch in {', '.join(bad)} of {self.path}")
        return snapshot

    def _drop(self, step: int) -> None:
        slot = self._slot_of.pop(step)
        self._crc.pop(step, None)
        del self._file["snapshots"][f"step_{step}"]
        self._groups[slot].attrs["step"] = -1
        self._free_slots.append(slot)
        self._free_slots.sort()

    def _shutdown(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _after_shutdown(self) -> None:
        if self.keep or self.comm is None:
            return
        self.comm.Barrier()
        if self.rank == 0:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
        self.comm.Barrier()
