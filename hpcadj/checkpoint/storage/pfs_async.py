"""Asynchronous parallel-HDF5 level: raw data on an I/O thread, HDF5 metadata at collective points.

Why split the phases. h5py and petsc4py both hold the GIL inside blocking MPI calls. A collective
HDF5 write on a background thread of rank 0 therefore waits for rank 1 while holding rank 0's GIL,
and rank 1's solver thread, inside an MPI_Allreduce that needs rank 0's solver thread, never
returns: the run deadlocks. So no HDF5 call and no MPI call ever runs on this level's I/O thread.

How it works (same file format as :class:`~.pfs.PfsLevel`, which also serves the synchronous mode).
The level is the same composition as every file level: :class:`CommittedRaw` is its transport (the
HDF5 file of :class:`~.pfs.H5File` for metadata, a :class:`~.rawio.RawFile` for the bytes), the
asynchronous I/O queue runs its ``store`` and ``load``:

- The solver thread makes every HDF5 call, collectively and in plan order: it picks the slot,
  creates its datasets on first use (contiguous, allocated at creation, so each has a fixed byte
  offset in the file), and marks the slot as being written.
- The I/O thread copies nothing and talks to no one: it checksums the staged copy of this rank's
  block (zlib releases the GIL) and writes it with ``os.pwrite`` at the dataset's offset, one call
  per contiguous run of the block (the GIL is released there too); with ``keep``/``fsync`` it
  ``fdatasync``s before reporting. Prefetches and reads are ``os.preadv`` plus a CRC check.
- Writes are *committed* at the next collective point of the level (any later write, read, free,
  flush, valid_steps, close): every rank reports how many of its queued writes have finished and
  their CRCs (one ``allgather``), and the writes finished on every rank get their CRC table, step
  attribute and ``/snapshots/step_<n>`` link, collectively. A snapshot is readable by anyone only
  once committed, so a crash never leaves a link to data that was not written.
- A write that failed on any rank fails on every rank at the same commit; as on the node-local
  level the level is then poisoned until ``flush`` (later writes raise, queued ones fail too).
- Buffers stay bounded as on every asynchronous level: at most ``queue_depth`` staged copies in
  flight and ``prefetch_depth`` prefetched snapshots.

It needs no MPI_THREAD_MULTIPLE: only the solver thread calls MPI.
"""

from __future__ import annotations

import numpy as np

from ...collective import agree_or_raise
from ...snapshot import Snapshot, snapshot_nbytes
from .aio import ALL, QueuedLevel, Transport
from .base import LevelError, WriteFailed, kept_by
from .checksum import block_checksum
from .pfs import H5File, open_h5, read_checked
from .rawio import RawFile, file_runs
from ...imports import mpi


class CommittedRaw(Transport):
    """Raw bytes of each rank's blocks on the I/O thread, published by a collective commit.

    ``h5`` holds the file's metadata (slots, CRC tables, step links); ``raw`` the descriptor the
    I/O thread writes and reads through; ``io`` the level's queue (waits, failure state).
    """

    threaded = frozenset({"store", "load"})
    defers_commit = True
    agrees_writes = True
    agrees_drops = True

    def __init__(self, h5: H5File, raw: RawFile | None, io):
        self.h5, self.raw, self.io = h5, raw, io
        self.name, self.comm, self.rank, self.size = h5.name, h5.comm, h5.rank, h5.size
        self.layout, self.fields = h5.layout, h5.fields
        self._pending: dict[int, tuple] = {}  # step -> (slot, time, future), queue order
        self._runs_of: dict[tuple[int, str], list] = {}

    def __getattr__(self, name):  # run id, path, keep, attach notes: the HDF5 file's
        if name in ("run_id", "path", "fsync", "attach_note", "attach_dropped", "attached"):
            return getattr(self.h5, name)
        raise AttributeError(name)

    keep = kept_by("h5")

    # -- where a block lives in the file -------------------------------------------------------

    def _runs(self, slot: int, field: str) -> list:
        runs = self._runs_of.get((slot, field))
        if runs is None:
            dset = self.h5.group(slot)[field]
            offset = dset.id.get_offset()
            if offset is None:
                raise LevelError(f"{self.name}: {dset.name} has no storage allocated in {self.h5.path}")
            lay = self.layout[field]
            runs = file_runs(lay.global_shape, lay.start, lay.shape, np.dtype(lay.dtype).itemsize,
                             int(offset))
            self._runs_of[(slot, field)] = runs
        return runs

    # -- the caller's thread -------------------------------------------------------------------

    def settle(self, wait_for=None) -> None:
        """Commit: on a write (``wait_for`` None) what has finished; before a read or free of a step
        still being written, that step; at flush, valid_steps and close (ALL), everything."""
        if wait_for is None or wait_for is ALL or wait_for in self._pending:
            self._commit(wait_for)

    def begin_write(self, step: int, t):
        """Take and prepare the slot (collective), agreed on every rank: (slot, time, runs)."""
        h5 = self.h5
        slot = h5.take_slot(step)
        h5.make_room(step, slot)
        error, runs = None, None
        try:
            h5.prepare_slot(slot)  # a free slot's step attribute is already -1 (created or freed so)
            runs = {field: self._runs(slot, field) for field in self.fields}
        except Exception as exc:  # noqa: BLE001 - agreed next, so no rank is left in a collective
            error = exc
        h5.agree_write(step, slot, error, "metadata", 0)
        return slot, t, runs

    def queued(self, step: int, token, future) -> None:
        slot, t, _runs = token
        self._pending[step] = (slot, t, future)

    def begin_read(self, step: int):
        """(runs, expected CRCs, the pending write whose CRCs to use instead, or None)."""
        if step in self._pending:  # the CRCs come from the write, which runs first
            slot, _t, write = self._pending[step]
            expected = None
        elif step not in self.h5.slot_of:
            raise LevelError(f"{self.name}: step {step} was not written ({self.io.failure})")
        else:
            slot, write, expected = self.h5.slot_of[step], None, list(self.h5.crc[step])
        return {field: self._runs(slot, field) for field in self.fields}, expected, write

    def prefetchable(self, step: int) -> bool:
        """A step still being written is read back behind its write on the same FIFO thread; the
        read it serves commits the write first, so an unwritten snapshot is never handed out."""
        return step not in self.io.bad

    def forget(self, step: int) -> None:
        """A write still queued is awaited here (no MPI) and its slot returned."""
        pending = self._pending.pop(step, None)
        if pending is not None:
            slot, _t, future = pending
            future.exception()
            self.h5.return_slot(slot)

    def drop(self, step: int) -> None:
        self.h5.drop(step)

    def locate(self, step: int, field: str) -> tuple[str, int, int]:
        """(file, byte offset, item size) of ``field``'s data for ``step`` (not collective)."""
        if step in self._pending:
            slot, _t, future = self._pending[step]
            future.exception()
        else:
            slot = self.h5.slot_of[step]
        dset = self.h5.group(slot)[field]
        return self.h5.path, int(dset.id.get_offset()), int(dset.dtype.itemsize)

    def shutdown(self) -> None:
        """Close the raw descriptor and the HDF5 file (the I/O thread has ended); a failure of
        either on any rank is agreed as the HDF5 file's closing is."""
        problem = None
        try:
            if self.raw is not None:
                self.raw.close()
        except OSError as exc:
            problem = f"{type(exc).__name__}: {exc}"
        self.h5.shutdown(problem)

    def after_shutdown(self) -> None:
        self.h5.after_shutdown()

    def _commit(self, wait_for=None) -> None:
        """Collective: make the writes finished on every rank readable (CRC tables, step links).

        ``wait_for`` (a step, or ALL) first waits on this rank for that write and those before it.
        Every rank calls this at the same points with the same queue, and the agreed count is the
        minimum over ranks, so every rank commits the same writes in the same order.
        """
        order = list(self._pending)
        if wait_for is not None and order:
            last = len(order) - 1 if wait_for is ALL else order.index(wait_for)
            for step in order[:last + 1]:
                self.io.wait(self._pending[step][2])
        finished = []
        for step in order:
            future = self._pending[step][2]
            if not future.done():
                break
            finished.append(future.result())
        reports = self.comm.allgather(finished) if self.size > 1 else [finished]
        for i in range(min(len(r) for r in reports)):
            step = order[i]
            slot, t, _future = self._pending.pop(step)
            outcomes = [r[i] for r in reports]
            failed = [(rank, o[1]) for rank, o in enumerate(outcomes) if o[0] != "ok"]
            if failed or self.io.failure is not None:
                self._fail(step, slot, failed)
                continue
            table = np.array([o[1] for o in outcomes], dtype=np.uint32).reshape(self.size, -1)
            try:  # a failed publication fails the step alike on every rank
                self.h5.link(step, slot, table, t)
            except LevelError as exc:
                self._fail(step, slot, [(self.rank, str(exc))])
        if wait_for is ALL:
            self.io.reclaim()

    def _fail(self, step: int, slot: int, failed: list) -> None:
        """A write failed on some rank (or the level is poisoned): every rank drops it alike."""
        self.h5.return_slot(slot)
        if self.io.failure is None:
            detail = "; ".join(f"rank {rank}: {why}" for rank, why in failed)
            self.io.poison(step, WriteFailed(self.name, step, f"{self.name}: writing step {step} to "
                                                              f"{self.h5.path} failed ({detail})"))
        else:
            self.io.bad.add(step)

    # -- on the I/O thread (no HDF5, no MPI) -----------------------------------------------------

    def store(self, step: int, staged: Snapshot, t, token):
        """Checksum and write this rank's blocks: (bytes, ("ok", CRCs) or ("failed", why))."""
        _slot, _t, runs = token
        try:
            crcs = []
            for field in self.fields:
                block = np.ascontiguousarray(staged[field])  # a donated strided view: copied here
                crcs.append(block_checksum(block))
                self.raw.write_block(block, runs[field])
            if self.h5.fsync or self.h5.keep:
                self.raw.sync()
            outcome = ("ok", crcs)
        except Exception as exc:  # noqa: BLE001 - reported at the next commit, on every rank
            outcome = ("failed", f"{type(exc).__name__}: {exc}")
        return (snapshot_nbytes(staged) if outcome[0] == "ok" else 0), outcome

    def load(self, step: int, token) -> Snapshot:
        runs, expected, write = token
        if expected is None:
            status, expected = write.result()
            if status != "ok":
                raise LevelError(f"step {step} was not written: {expected}")
        return read_checked(self.name, step, self.rank, self.layout, self.fields, expected,
                            lambda field, block: self.raw.read_block(block, runs[field]), self.h5.path)


class AsyncPfsLevel(QueuedLevel):
    """The parallel-HDF5 level with asynchronous, deadlock-free raw I/O (see the module docstring)."""

    kind = "pfs"
    _from_transport = ("fsync", "run_id", "path", "fields", "attach_note", "attach_dropped")

    def __init__(self, capacity, layout, comm=None, path=None, *, queue_depth: int = 2,
                 prefetch_depth: int = 1, run_id: str | None = None, keep: bool = False,
                 fsync: bool = False, collective: str = "auto", name: str = "pfs",
                 attach: bool = False, async_io: bool = True):
        if comm is None:
            comm = mpi().COMM_WORLD
        if not layout:
            raise LevelError(f"{name}: the parallel-HDF5 level needs a snapshot layout")
        super().__init__(name, capacity, layout, comm, async_io=True, queue_depth=queue_depth,
                         prefetch_depth=prefetch_depth)
        h5 = open_h5(self, layout, path, run_id=run_id, keep=keep, fsync=fsync,
                     collective=collective, attach=attach)
        try:
            raw, problem = RawFile(h5.path), None
        except OSError as exc:
            raw, problem = None, f"{exc.strerror}"
        self.transport = CommittedRaw(h5, raw, self.io)
        agree_or_raise(self.comm, problem, LevelError,
                       f"{self.name}: cannot open {h5.path} for raw I/O ({{detail}})", cleanup=self.close)
        self._adopt(h5.attached)

    def locate(self, step: int, field: str) -> tuple[str, int, int]:
        """(file, byte offset, item size) of ``field``'s data for ``step`` (not collective)."""
        return self.transport.locate(step, field)
