"""Asynchronous parallel-HDF5 level: raw data on an I/O thread, HDF5 metadata at collective points.

Why split the phases. h5py and petsc4py both hold the GIL inside blocking MPI calls. A collective
HDF5 write on a background thread of rank 0 therefore waits for rank 1 while holding rank 0's GIL,
and rank 1's solver thread, inside an MPI_Allreduce that needs rank 0's solver thread, never
returns: the run deadlocks. So no HDF5 call and no MPI call ever runs on this level's I/O thread.

How it works (same file format as :class:`~.pfs.PfsLevel`, which also serves the synchronous mode):

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

import os
import time as _time

import numpy as np

from ...snapshot import Snapshot, snapshot_nbytes
from ...collective import agree_or_raise
from .aio import IOThread
from .base import CorruptSnapshot, LevelError, WriteFailed
from .checksum import block_checksum
from .pfs import PfsLevel
from .rawio import file_runs, read_runs, write_runs

ALL = object()  # _commit(wait_for=ALL): wait for every queued write first


class AsyncPfsLevel(PfsLevel):
    """The parallel-HDF5 level with asynchronous, deadlock-free raw I/O (see the module docstring)."""

    def __init__(self, capacity, layout, comm=None, path=None, *, queue_depth: int = 2,
                 prefetch_depth: int = 1, **kwargs):
        kwargs.pop("async_io", None)
        super().__init__(capacity, layout, comm, path, queue_depth=queue_depth,
                         prefetch_depth=prefetch_depth, **kwargs)
        self.async_io = True
        self._pending: dict[int, tuple] = {}  # step -> (slot, time, future), queue order
        self._runs_of: dict[tuple[int, str], list] = {}
        try:
            self._fd = os.open(self.path, os.O_RDWR)
            problem = None
        except OSError as exc:
            self._fd, problem = None, f"{exc.strerror}"
        agree_or_raise(self.comm, problem, LevelError,
                       f"{self.name}: cannot open {self.path} for raw I/O ({{detail}})",
                       cleanup=lambda: PfsLevel.close(self))
        self._raw = IOThread(f"hpcadj-io-{self.name}")

    # -- where a block lives in the file -------------------------------------------------------

    def _runs(self, slot: int, field: str) -> list:
        runs = self._runs_of.get((slot, field))
        if runs is None:
            dset = self._group(slot)[field]
            offset = dset.id.get_offset()
            if offset is None:
                raise LevelError(f"{self.name}: {dset.name} has no storage allocated in {self.path}")
            lay = self.layout[field]
            runs = file_runs(lay.global_shape, lay.start, lay.shape, np.dtype(lay.dtype).itemsize,
                             int(offset))
            self._runs_of[(slot, field)] = runs
        return runs

    # -- caller side ---------------------------------------------------------------------------

    def _write(self, step: int, snapshot: Snapshot, donate: bool = False) -> None:
        self._commit()
        self._check()
        self._validate(snapshot)
        slot = self._take_slot(step)
        error, runs = None, None
        try:
            self._prepare_slot(slot)  # a free slot's step attribute is already -1 (created or freed so)
            runs = {field: self._runs(slot, field) for field in self.fields}
        except Exception as exc:  # noqa: BLE001 - agreed next, so no rank is left in a collective
            error = exc
        self._agree_write(step, slot, error, "metadata", 0)
        staged = self._take_buffer(snapshot, donate)
        future = self._raw.submit(lambda: self._raw_write(staged, runs))
        if donate:  # held and released on this thread, as on every asynchronous level
            self._lent.append((future, staged))
        self._pending[step] = (slot, self.times.get(step), future)

    def _read(self, step: int) -> Snapshot:
        if self._closed:
            raise LevelError(f"{self.name}: level is closed")
        if step in self._pending:
            self._commit(wait_for=step)
        if step not in self._slot_of:
            self._prefetched.pop(step, None)
            raise LevelError(f"{self.name}: step {step} was not written ({self.failure})")
        future = self._prefetched.pop(step, None)
        if future is not None:
            self.stats.prefetch_hits += 1
        else:
            future = self._submit_read(step)
        return self._agreed(step, self._wait(future))

    def prefetch(self, step: int) -> None:
        """Queue a raw read of ``step`` (at most ``prefetch_depth`` held; never raises for I/O).

        A step still being written is read back behind its write on the same FIFO thread; the
        read it serves commits the write first, so an unwritten snapshot is never handed out.
        """
        if (self._closed or step not in self._held or step in self._bad
                or step in self._prefetched or len(self._prefetched) >= self.prefetch_depth):
            return
        self._prefetched[step] = self._submit_read(step)
        self.stats.prefetches += 1
        with self._cond:
            self._note_buffers()

    def _submit_read(self, step: int):
        if step in self._pending:  # the CRCs come from the write, which runs first
            slot, _t, write = self._pending[step]
            expected = None
        else:
            slot, write, expected = self._slot_of[step], None, list(self._crc[step])
        runs = {field: self._runs(slot, field) for field in self.fields}
        return self._raw.submit(lambda: self._raw_read(step, runs, expected, write))

    def _free(self, step: int) -> None:
        if step in self._pending:
            self._commit(wait_for=step)
        super()._free(step)

    def discard(self, step: int) -> None:
        """Forget ``step`` in any state; a write still queued is awaited here (no MPI) and dropped."""
        pending = self._pending.pop(step, None)
        if pending is not None:
            slot, _t, future = pending
            future.exception()
            self._return_slot(slot)
        super().discard(step)

    def valid_steps(self) -> set[int]:
        if not self._closed:
            self._commit(wait_for=ALL)
        return {s for s in self._held if s not in self._bad}

    def flush(self) -> None:
        if self._closed:
            raise LevelError(f"{self.name}: level is closed")
        self._commit(wait_for=ALL)
        super().flush()

    def locate(self, step: int, field: str) -> tuple[str, int, int]:
        """(file, byte offset, item size) of ``field``'s data for ``step`` (not collective)."""
        if step in self._pending:
            slot, _t, future = self._pending[step]
            future.exception()
        else:
            slot = self._slot_of[step]
        dset = self._group(slot)[field]
        return self.path, int(dset.id.get_offset()), int(dset.dtype.itemsize)

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._commit(wait_for=ALL)
        finally:
            self._raw.stop()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            super().close()

    # -- the collective commit -------------------------------------------------------------------

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
                self._wait(self._pending[step][2])
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
            if failed or self.failure is not None:
                self._fail(step, slot, failed)
                continue
            table = np.array([o[1] for o in outcomes], dtype=np.uint32).reshape(self.size, -1)
            self._link(step, slot, table, t)
        if wait_for is ALL:
            self._reclaim()

    def _fail(self, step: int, slot: int, failed: list) -> None:
        """A write failed on some rank (or the level is poisoned): every rank drops it alike."""
        self._bad.add(step)
        self._return_slot(slot)
        if self.failure is None:
            detail = "; ".join(f"rank {rank}: {why}" for rank, why in failed)
            self.failure = WriteFailed(self.name, step,
                                       f"{self.name}: writing step {step} to {self.path} failed ({detail})")
            self.failure_step = step
            self._poisoned = True

    def _link(self, step: int, slot: int, table: np.ndarray, t) -> None:
        """Publish as the synchronous level does; a failed publication fails the step alike."""
        try:
            super()._link(step, slot, table, t)
        except LevelError as exc:
            self._fail(step, slot, [(self.rank, str(exc))])

    # -- on the I/O thread (no HDF5, no MPI) -----------------------------------------------------

    def _write_raw(self, block: np.ndarray, runs) -> None:
        """Write this rank's block of one field (a hook fault-injection tests replace)."""
        write_runs(self._fd, block, runs)

    def _raw_write(self, staged: Snapshot, runs: dict):
        t0 = _time.perf_counter()
        try:
            crcs = []
            for field in self.fields:
                block = np.ascontiguousarray(staged[field])  # a donated strided view: copied here
                crcs.append(block_checksum(block))
                self._write_raw(block, runs[field])
            if self.fsync or self.keep:
                os.fdatasync(self._fd)
            outcome = ("ok", crcs)
        except Exception as exc:  # noqa: BLE001 - reported at the next commit, on every rank
            outcome = ("failed", f"{type(exc).__name__}: {exc}")
        finally:
            self._release(staged)
        self._account(written=snapshot_nbytes(staged) if outcome[0] == "ok" else 0,
                      write_s=_time.perf_counter() - t0)
        return outcome

    def _raw_read(self, step: int, runs: dict, expected: list | None, write=None):
        t0 = _time.perf_counter()
        snapshot, exc = {}, None
        try:
            if expected is None:
                status, expected = write.result()
                if status != "ok":
                    raise LevelError(f"step {step} was not written: {expected}")
            bad = []
            for i, field in enumerate(self.fields):
                lay = self.layout[field]
                block = np.empty(tuple(lay.shape), dtype=np.dtype(lay.dtype))
                read_runs(self._fd, block, runs[field])
                if block_checksum(block) != expected[i]:
                    bad.append(field)
                snapshot[field] = block
            if bad:
                exc = CorruptSnapshot(self.name, step, [self.rank],
                                      f"checksum mismatch in {', '.join(bad)} of {self.path}")
        except Exception as e:  # noqa: BLE001 - an unreadable block is a lost snapshot too
            exc = CorruptSnapshot(self.name, step, [self.rank], f"{type(e).__name__}: {e}")
        self._account(read=snapshot_nbytes(snapshot) if exc is None else 0,
                      read_s=_time.perf_counter() - t0)
        return (None, exc) if exc is not None else (snapshot, None)
