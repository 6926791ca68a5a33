"""Asynchronous file-backed levels: one FIFO I/O thread per level, bounded write buffers, prefetch.

Design (the same for node-local files and parallel HDF5):

- Every storage operation (write, read, prefetch, free, close) of a level becomes a task on that
  level's single FIFO I/O thread, enqueued by the caller in plan order. Plans are identical on all
  ranks and every queueing decision below depends only on caller-side state, so each rank's
  thread issues the same operations in the same order: collective HDF5/MPI-IO calls match across
  ranks. Only that thread touches the level's file(s); in synchronous mode the same tasks run inline.
- ``write`` copies the snapshot (the caller reuses its buffers) and returns; at most
  ``queue_depth`` copies are in flight, a further ``write`` blocks until one has drained. Drained
  copies are reused as staging buffers (no fresh allocation and page faults per write).
- ``prefetch(step)`` queues a read whose result waits in memory for ``read(step)``; at most
  ``prefetch_depth`` prefetched snapshots are held, extra hints are ignored (deterministically).
  Memory beyond the slots is therefore bounded by ``queue_depth + prefetch_depth`` snapshots.
- ``read`` waits for its prefetch, or queues a read behind everything already queued (so a
  pending write of the same step lands first). Time blocked goes to ``stats.wait_s``.
- A failed write/free poisons the level: later queued tasks are skipped and the next call on the
  caller's thread (or ``flush``/``close``) raises :class:`LevelError` chained to the original error.
  A failed read is that read's error only. ``close`` drains the queue, closes, joins the thread.
- Read failures are agreed over the level's duplicated communicator, so every rank raises the same
  :class:`CorruptSnapshot` (or :class:`LevelError`) naming the failing ranks.
"""

from __future__ import annotations

import queue
import threading
import time as _time
from concurrent.futures import Future

import numpy as np

from ...snapshot import Snapshot, SnapshotLayout, snapshot_nbytes
from .base import CorruptSnapshot, Level, LevelError


class IOThread:
    """A daemon thread running submitted callables one at a time, in submission order."""

    def __init__(self, name: str):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn, *, poison: bool = True, always: bool = False) -> Future:
        """Queue ``fn``; its exception poisons the thread if ``poison``; ``always`` runs it anyway."""
        future: Future = Future()
        self._queue.put((fn, future, poison, always))
        return future

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, future, poison, always = item
            future.set_running_or_notify_cancel()
            if self.failure is not None and not always:
                future.set_exception(LevelError("skipped after an earlier background I/O failure"))
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller's thread through the future
                if poison and self.failure is None:
                    self.failure = exc
                future.set_exception(exc)

    def stop(self) -> None:
        """Let queued tasks finish, then end and join the thread."""
        self._queue.put(None)
        self._thread.join()


def _completed(fn) -> Future:
    """Run ``fn`` now and wrap its outcome in a finished future (the synchronous path)."""
    future: Future = Future()
    try:
        future.set_result(fn())
    except BaseException as exc:
        future.set_exception(exc)
    return future


class AsyncLevel(Level):
    """A level whose storage operations run on a FIFO I/O thread (or inline when not ``async_io``).

    Subclasses implement ``_store(step, snapshot, time) -> bytes``, ``_load(step) -> snapshot``
    (raising :class:`CorruptSnapshot` for this rank's bad block), ``_drop(step)`` and
    ``_shutdown()``; all run on the I/O thread. ``_agree_on_thread`` says whether read failures
    are agreed on the I/O thread (levels doing collective I/O there) or on the caller's thread.
    """

    _agree_on_thread = False

    def __init__(self, name: str, capacity: int, layout: SnapshotLayout | None, comm=None, *,
                 async_io: bool = True, queue_depth: int = 2, prefetch_depth: int = 1):
        super().__init__(name, capacity, layout)
        if queue_depth < 1 or prefetch_depth < 0:
            raise ValueError("queue_depth must be >= 1 and prefetch_depth >= 0")
        self.comm = comm.Dup() if comm is not None else None
        self.rank = self.comm.rank if self.comm is not None else 0
        self.size = self.comm.size if self.comm is not None else 1
        self.async_io = bool(async_io)
        self.queue_depth = int(queue_depth)
        self.prefetch_depth = int(prefetch_depth)
        self._worker = self._acquire_worker() if self.async_io else None
        self._inflight = 0
        self._cond = threading.Condition()
        self._prefetched: dict[int, Future] = {}
        self._pool: list[Snapshot] = []
        self._closed = False
        self._failure_reported = False

    # -- caller-side API ---------------------------------------------------------------------

    def _write(self, step: int, snapshot: Snapshot) -> None:
        self._check()
        self._validate(snapshot)
        t = self.times.get(step)
        if not self.async_io:
            self._submit(lambda: self._write_task(step, snapshot, t, staged=False)).result()
            return
        t0 = _time.perf_counter()
        with self._cond:
            blocked = self._inflight >= self.queue_depth
            while self._inflight >= self.queue_depth:
                self._cond.wait()
            self._inflight += 1
            self._note_buffers()
            spare = self._pool.pop() if self._pool else None
        if blocked:
            self._account(wait_s=_time.perf_counter() - t0)
        t0 = _time.perf_counter()
        copy = self._stage(snapshot, spare)
        self.stats.stage_s += _time.perf_counter() - t0
        self._submit(lambda: self._write_task(step, copy, t, staged=True))

    def _read(self, step: int) -> Snapshot:
        self._check()
        future = self._prefetched.pop(step, None)
        if future is not None:
            self.stats.prefetch_hits += 1
        else:
            future = self._submit(lambda: self._read_task(step), poison=False)
        outcome = self._wait(future)
        if self._agree_on_thread:
            return outcome
        return self._agreed(step, outcome)

    def _free(self, step: int) -> None:
        self._check()
        self._prefetched.pop(step, None)
        future = self._submit(lambda: self._drop(step))
        if not self.async_io:
            future.result()

    def prefetch(self, step: int) -> None:
        """Queue a read of ``step`` now (asynchronous levels; at most ``prefetch_depth`` held)."""
        self._check()
        if (not self.async_io or step not in self._held or step in self._prefetched
                or len(self._prefetched) >= self.prefetch_depth):
            return
        self._prefetched[step] = self._submit(lambda: self._read_task(step), poison=False)
        self.stats.prefetches += 1
        with self._cond:
            self._note_buffers()

    def flush(self) -> None:
        """Block until every queued operation has run; raise a background failure if one occurred."""
        self._check()
        if self._worker is not None:
            try:
                self._wait(self._worker.submit(lambda: None, poison=False))
            except LevelError:
                pass
        self._check()

    def close(self) -> None:
        """Drain the queue, release files (removing them unless kept), join the I/O thread.

        Raises a background failure not reported before, after cleaning up.
        """
        if self._closed:
            return
        self._prefetched.clear()
        self._pool.clear()
        shutdown = self._submit(self._shutdown, always=True)
        if self._worker is not None:
            self._release_worker()
            shutdown.exception()
        self._closed = True
        try:
            self._after_shutdown()
        finally:
            self._held.clear()
            if self.comm is not None:
                self.comm.Free()
                self.comm = None
        failure = self._worker.failure if self._worker is not None else None
        if failure is not None and not self._failure_reported:
            self._failure_reported = True
            raise LevelError(f"{self.name}: background I/O failed on rank {self.rank}: "
                             f"{failure}") from failure
        exc = shutdown.exception()
        if exc is not None and failure is None:
            raise LevelError(f"{self.name}: closing failed on rank {self.rank}: {exc}") from exc

    # -- helpers -----------------------------------------------------------------------------

    def _acquire_worker(self) -> IOThread:
        """This level's I/O thread (its own; levels sharing one override this and the release)."""
        return IOThread(f"hpcadj-io-{self.name}")

    def _release_worker(self) -> None:
        """Called by ``close`` after the shutdown task is queued: end and join the I/O thread."""
        self._worker.stop()

    def _check(self) -> None:
        if self._closed:
            raise LevelError(f"{self.name}: level is closed")
        failure = self._worker.failure if self._worker is not None else None
        if failure is not None:
            self._failure_reported = True
            raise LevelError(f"{self.name}: background I/O failed on rank {self.rank}: "
                             f"{failure}") from failure

    def _submit(self, fn, *, poison: bool = True, always: bool = False) -> Future:
        if self._worker is None:
            return _completed(fn)
        return self._worker.submit(fn, poison=poison, always=always)

    def _wait(self, future: Future):
        """The future's result; seconds blocked go to ``stats.wait_s``."""
        if not future.done():
            t0 = _time.perf_counter()
            try:
                return future.result()
            finally:
                self._account(wait_s=_time.perf_counter() - t0)
        return future.result()

    @staticmethod
    def _stage(snapshot: Snapshot, spare: Snapshot | None) -> Snapshot:
        """Copy ``snapshot`` into ``spare`` (a drained write buffer, already paged in) if it fits."""
        if spare is None or set(spare) != set(snapshot) or any(
                spare[k].shape != v.shape or spare[k].dtype != v.dtype for k, v in snapshot.items()):
            return {k: np.array(v, order="C", copy=True) for k, v in snapshot.items()}
        for k, v in snapshot.items():
            np.copyto(spare[k], v)
        return spare

    def _note_buffers(self) -> None:
        held = self._inflight + len(self._prefetched)
        self.stats.peak_buffers = max(self.stats.peak_buffers, held)

    def _validate(self, snapshot: Snapshot) -> None:
        if self.layout is None:
            return
        if set(snapshot) != set(self.layout):
            raise LevelError(f"{self.name}: snapshot fields {sorted(snapshot)} differ from the "
                             f"layout's {sorted(self.layout)}")
        for key, lay in self.layout.items():
            a = snapshot[key]
            if tuple(a.shape) != tuple(lay.shape) or a.dtype != np.dtype(lay.dtype):
                raise LevelError(f"{self.name}: field {key!r} is {a.dtype}{tuple(a.shape)}, "
                                 f"layout says {lay.dtype}{tuple(lay.shape)}")

    def _write_task(self, step: int, snapshot: Snapshot, t, *, staged: bool) -> None:
        t0 = _time.perf_counter()
        try:
            nbytes = self._store(step, snapshot, t)
        finally:
            if staged:
                with self._cond:
                    self._inflight -= 1
                    self._pool.append(snapshot)
                    self._cond.notify_all()
        self._account(written=nbytes, write_s=_time.perf_counter() - t0)

    def _read_task(self, step: int):
        t0 = _time.perf_counter()
        snapshot, exc = None, None
        try:
            snapshot = self._load(step)
        except Exception as e:  # agreed with the other ranks before it is raised
            exc = e
        self._account(read=snapshot_nbytes(snapshot) if snapshot else 0,
                      read_s=_time.perf_counter() - t0)
        if self._agree_on_thread:
            return self._agreed(step, (snapshot, exc))
        return snapshot, exc

    def _agreed(self, step: int, outcome) -> Snapshot:
        """Return the snapshot if every rank read its block, else raise the same error on all."""
        snapshot, exc = outcome
        code = 0 if exc is None else (1 if isinstance(exc, CorruptSnapshot) else 2)
        mine = (code, "" if exc is None else getattr(exc, "reason", None) or str(exc))
        states = self.comm.allgather(mine) if self.comm is not None and self.size > 1 else [mine]
        bad = [r for r, (c, _) in enumerate(states) if c]
        if not bad:
            return snapshot
        reasons = "; ".join(f"rank {r}: {states[r][1]}" for r in bad)
        if all(states[r][0] == 1 for r in bad):
            raise CorruptSnapshot(self.name, step, bad, reasons) from exc
        raise LevelError(f"{self.name}: reading step {step} failed ({reasons})") from exc

    def _after_shutdown(self) -> None:
        """Caller-side cleanup once the I/O thread has ended (e.g. removing a shared file)."""

    def _store(self, step: int, snapshot: Snapshot, t) -> int:
        raise NotImplementedError

    def _load(self, step: int) -> Snapshot:
        raise NotImplementedError

    def _drop(self, step: int) -> None:
        raise NotImplementedError

    def _shutdown(self) -> None:
        raise NotImplementedError
