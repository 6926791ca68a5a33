"""Asynchronous file-backed levels: one FIFO I/O thread per level, bounded write buffers, prefetch.

Design (the same for node-local files and parallel HDF5):

- Every storage operation (write, read, prefetch, free, close) of a level becomes a task on that
  level's single FIFO I/O thread, enqueued by the caller in plan order. Plans are identical on all
  ranks and every queueing decision below depends only on caller-side state, so each rank's
  thread issues the same operations in the same order: collective HDF5/MPI-IO calls match across
  ranks. Only that thread touches the level's file(s); in synchronous mode the same tasks run inline.
- ``write`` copies the snapshot (the caller reuses its buffers) and returns; at most
  ``queue_depth`` copies are in flight, a further ``write`` blocks until one has drained. Drained
  copies are reused as staging buffers (no fresh allocation and page faults per write). A caller
  that donates its arrays (``write(..., donate=True)``: it never modifies them; the driver does,
  since states are immutable) skips the copy on the caller's thread (a strided view is made
  contiguous by the I/O thread); donated snapshots count against the same
  ``queue_depth``. The caller's thread keeps a reference to each until its write has finished and
  drops it itself: the last reference to a view of a PETSc Vec may destroy the Vec, and PETSc is
  called from the caller's thread only. When it drops one depends on the plan alone, never on how
  fast the I/O thread is: the oldest donated snapshot goes when ``queue_depth`` of them are held
  and a new one comes (its write awaited first), all of them at ``flush``, ``valid_steps`` and
  ``close``. So every rank drops the same Vecs at the same point of the plan, and petsc4py's
  garbage lists, which ``PETSc.garbage_cleanup`` intersects collectively, stay alike on all ranks
  (a rank-dependent release left them different and hung PetscFinalize).
- ``prefetch(step)`` queues a read whose result waits in memory for ``read(step)``; at most
  ``prefetch_depth`` prefetched snapshots are held, extra hints are ignored (deterministically).
  Memory beyond the slots is therefore bounded by ``queue_depth + prefetch_depth`` snapshots.
- ``read`` waits for its prefetch, or queues a read behind everything already queued (so a
  pending write of the same step lands first). Time blocked goes to ``stats.wait_s``.
- A failed write poisons the level until the next ``flush``: queued tasks behind it are skipped
  (writes skipped so are failed too), the next ``write`` raises :class:`LevelError` chained to the
  original error as a :class:`WriteFailed` (``.step``: the failing step; ``.writing``), and ``flush`` raises it
  once, purges the failed steps and un-poisons the level. Completed snapshots stay readable
  (``valid_steps()`` lists them). ``free``, ``discard`` and ``prefetch`` never raise for I/O
  failures, and their queueing never depends on failure state, so on a collective level every rank
  queues the same tasks; on the parallel-HDF5 level write failures are agreed inside the task, so
  every rank poisons at the same task and skips the same ones. A failed read is that read's error
  only; a snapshot found corrupt (agreed on every rank) leaves ``valid_steps()``.
  ``close`` drains the queue, closes, joins the thread.
- Read failures are agreed over the level's duplicated communicator, so every rank raises the same
  :class:`CorruptSnapshot` (or :class:`LevelError`) naming the failing ranks.
"""

from __future__ import annotations

import queue
import threading
import time as _time
from concurrent.futures import Future

import numpy as np

from ...collective import detail, problems
from ...snapshot import Snapshot, SnapshotLayout, copy_snapshot, snapshot_nbytes
from .base import CorruptSnapshot, Level, LevelError, WriteFailed


class IOThread:
    """A daemon thread running submitted callables one at a time, in submission order.

    Failures are handed to the caller through each task's future; skipping tasks after a failure
    is the level's business (several levels may share one thread).
    """

    def __init__(self, name: str):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn) -> Future:
        """Queue ``fn``; its outcome lands in the returned future."""
        future: Future = Future()
        self._queue.put((fn, future))
        return future

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, future = item
            item = None
            future.set_running_or_notify_cancel()
            try:
                result = fn()
            except BaseException as exc:  # handed to the caller's thread through the future
                fn = None
                future.set_exception(exc)
            else:
                # drop the task (and what it captured) before the caller can see it done: the
                # caller then holds the last reference to a donated snapshot, whose release may
                # destroy a PETSc Vec, and PETSc must only ever be called from the caller's thread
                fn = None
                future.set_result(result)
            result = None

    def stop(self) -> None:
        """Let queued tasks finish, then end and join the thread."""
        self._queue.put(None)
        self._thread.join()


class Skipped(LevelError):
    """A queued task not run because an earlier write of the level failed (until ``flush``)."""


def _completed(fn) -> Future:
    """Run ``fn`` now and wrap its outcome in a finished future (the synchronous path)."""
    future: Future = Future()
    try:
        future.set_result(fn())
    except BaseException as exc:
        future.set_exception(exc)
    return future


class _Donated(dict):
    """A snapshot written as the caller handed it over (no staging copy; never pooled)."""


class AsyncLevel(Level):
    """A level whose storage operations run on a FIFO I/O thread (or inline when not ``async_io``).

    Subclasses implement ``_store(step, snapshot, time) -> bytes``, ``_load(step) -> snapshot``
    (raising :class:`CorruptSnapshot` for this rank's bad block), ``_drop(step)`` (tolerating a
    step that never landed) and ``_shutdown()``; all run on the I/O thread. ``_agree_on_thread``
    says whether read failures are agreed on the I/O thread (levels doing collective I/O there) or
    on the caller's thread.
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
        self._lent: list[tuple[Future, Snapshot]] = []  # donated snapshots of writes in flight
        self._closed = False
        # failure state: set on the I/O thread, cleared by flush() on the caller's thread
        self._poisoned = False
        self.failure: BaseException | None = None   # first write failure since the last flush
        self.failure_step: int | None = None
        self._failure_reported = False
        self._bad: set[int] = set()                 # steps written but not valid (failed, skipped, corrupt)

    # -- caller-side API ---------------------------------------------------------------------

    def _write(self, step: int, snapshot: Snapshot, donate: bool = False) -> None:
        self._check()
        self._validate(snapshot)
        t = self.times.get(step)
        if not self.async_io:
            future = self._submit(lambda: self._write_task(step, snapshot, t, staged=False),
                                  write=step)
            if future.exception() is not None:
                self._failure_reported = True
                raise self._write_error(future.exception())
            return
        staged = self._take_buffer(snapshot, donate)
        future = self._submit(lambda: self._write_task(step, staged, t, staged=True), write=step,
                              staged=staged)
        if donate:  # released on this thread once written (see _reclaim)
            self._lent.append((future, staged))

    def _take_buffer(self, snapshot: Snapshot, donate: bool) -> Snapshot:
        """Wait until fewer than ``queue_depth`` writes are in flight; return what the I/O thread
        will write: donated arrays as they are (a strided one is made contiguous there, where numpy
        copies without the GIL), else a copy in a drained buffer."""
        t0 = _time.perf_counter()
        if donate:
            self._reclaim(keep=self.queue_depth - 1)
        with self._cond:
            blocked = self._inflight >= self.queue_depth
            while self._inflight >= self.queue_depth:
                self._cond.wait()
            self._inflight += 1
            self._note_buffers()
            spare = self._pool.pop() if self._pool and not donate else None
        if blocked:
            self._account(wait_s=_time.perf_counter() - t0)
        if donate:
            self.stats.zero_copy += 1
            return _Donated(snapshot)
        t0 = _time.perf_counter()
        copy = copy_snapshot(snapshot, spare)
        self.stats.stage_s += _time.perf_counter() - t0
        return copy

    def _read(self, step: int) -> Snapshot:
        if self._closed:
            raise LevelError(f"{self.name}: level is closed")
        future = self._prefetched.pop(step, None)
        if future is not None:
            self.stats.prefetch_hits += 1
        else:
            future = self._submit(lambda: self._read_task(step), read=step)
        try:
            outcome = self._wait(future)
        except Skipped as exc:  # not read: a write failed before it; not this snapshot's fault
            if self._agree_on_thread:
                raise self._write_error(exc) from exc
            outcome = (None, exc)
        if self._agree_on_thread:
            return outcome
        return self._agreed(step, outcome)

    def _free(self, step: int) -> None:
        if self._closed:
            raise LevelError(f"{self.name}: level is closed")
        self._prefetched.pop(step, None)
        self._bad.discard(step)
        self._submit(lambda: self._drop(step), always=True)

    def discard(self, step: int) -> None:
        """Forget ``step`` in any state (pending, prefetched, failed, corrupt); never raises."""
        try:
            self._prefetched.pop(step, None)
            held = step in self._held
            self._held.discard(step)
            self._bad.discard(step)
            self.times.pop(step, None)
            if held and not self._closed:
                self._submit(lambda: self._drop(step), always=True)
        except Exception:  # noqa: BLE001 - discarding after a fault must not fault again
            pass

    def valid_steps(self) -> set[int]:
        """Steps held whose writes completed and whose snapshots were not found corrupt."""
        if not self._closed:
            self._drain()
        return {s for s in self._held if s not in self._bad}

    def prefetch(self, step: int) -> None:
        """Queue a read of ``step`` now (asynchronous levels; at most ``prefetch_depth`` held).

        Never raises for I/O failures (a failed prefetch is the later read's error).
        """
        if (self._closed or not self.async_io or step not in self._held
                or step in self._prefetched or len(self._prefetched) >= self.prefetch_depth):
            return
        self._prefetched[step] = self._submit(lambda: self._read_task(step), read=step)
        self.stats.prefetches += 1
        with self._cond:
            self._note_buffers()

    def flush(self) -> None:
        """Block until every queued operation has run; then, once, raise a write failure.

        After a failure the failed and skipped steps leave the level (``valid_steps`` no longer
        lists them, their files are removed) and the level takes tasks again.
        """
        if self._closed:
            raise LevelError(f"{self.name}: level is closed")
        self._drain()
        failure, step = self.failure, self.failure_step
        self._poisoned = False
        self.failure, self.failure_step = None, None
        self._failure_reported = False
        purge = sorted(s for s in self._bad if s in self._held)
        self._bad.clear()
        for bad in purge:  # failed writes: never readable; corrupt: unusable
            self._held.discard(bad)
            self.times.pop(bad, None)
            self._prefetched.pop(bad, None)
            self._submit(lambda bad=bad: self._drop(bad), always=True)
        if purge:
            self._drain()
        if failure is not None:
            raise self._write_error(failure, step)

    def close(self) -> None:
        """Drain the queue, release files (removing them unless kept), join the I/O thread.

        Raises a write failure not reported before, after cleaning up.
        """
        if self._closed:
            return
        self._prefetched.clear()
        self._pool.clear()
        shutdown = self._submit(self._shutdown, always=True)
        if self._worker is not None:
            self._release_worker()
            shutdown.exception()
        self._lent.clear()
        self._closed = True
        try:
            self._after_shutdown()
        finally:
            self._held.clear()
            if self.comm is not None:
                self.comm.Free()
                self.comm = None
        failure = self.failure
        if failure is not None and not self._failure_reported:
            self._failure_reported = True
            raise self._write_error(failure)
        exc = shutdown.exception()
        if exc is not None:
            raise LevelError(f"{self.name}: closing failed on rank {self.rank}: {exc}") from exc

    # -- helpers -----------------------------------------------------------------------------

    def _acquire_worker(self) -> IOThread:
        """This level's I/O thread (its own; levels sharing one override this and the release)."""
        return IOThread(f"hpcadj-io-{self.name}")

    def _release_worker(self) -> None:
        """Called by ``close`` after the shutdown task is queued: end and join the I/O thread."""
        self._worker.stop()

    def _write_error(self, failure: BaseException, step: int | None = None) -> LevelError:
        """The :class:`WriteFailed` reporting a failed write (chained to ``failure``)."""
        if step is None:
            step = self.failure_step
            if step is None and isinstance(failure, LevelError):
                step = failure.step
        if isinstance(failure, Skipped) and self.failure is not None:
            failure = self.failure
        exc = WriteFailed(self.name, step,
                          f"{self.name}: writing step {step} failed on rank {self.rank}: {failure}")
        exc.__cause__ = failure
        return exc

    def _check(self) -> None:
        """Raise if closed, or if a write failed since the last flush (the level is poisoned)."""
        if self._closed:
            raise LevelError(f"{self.name}: level is closed")
        failure = self.failure
        if failure is not None:
            self._failure_reported = True
            raise self._write_error(failure)

    def _drain(self) -> None:
        """Wait until every task queued so far has run (never raises)."""
        if self._worker is not None:
            self._wait(self._worker.submit(lambda: None))
        self._reclaim()

    def _submit(self, fn, *, write: int | None = None, read: int | None = None,
                always: bool = False, staged: Snapshot | None = None) -> Future:
        """Queue ``fn`` (or run it now when synchronous), skipping it while the level is poisoned.

        A failing write poisons the level: until ``flush`` every later task but ``always`` ones
        (free, discard, shutdown) is skipped with :class:`Skipped`, skipped writes count as failed.
        """
        def task():
            if self._poisoned and not always:
                if write is not None:
                    self._bad.add(write)
                    if staged is not None:
                        self._release(staged)
                raise Skipped(f"{self.name}: step {write if write is not None else read} skipped "
                              f"after a failed write of step {self.failure_step}")
            try:
                return fn()
            except BaseException as exc:
                if write is not None:
                    self._bad.add(write)
                    if self.failure is None:
                        self.failure, self.failure_step = exc, write
                    self._poisoned = True
                raise

        if self._worker is None:
            return _completed(task)
        return self._worker.submit(task)

    def _wait(self, future: Future):
        """The future's result; seconds blocked go to ``stats.wait_s``."""
        if not future.done():
            t0 = _time.perf_counter()
            try:
                return future.result()
            finally:
                self._account(wait_s=_time.perf_counter() - t0)
        return future.result()

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

    def _reclaim(self, keep: int = 0) -> None:
        """Drop, on the caller's thread and oldest first, donated snapshots until ``keep`` are held.

        Each one's write is awaited before it is dropped, so how many go depends on ``keep`` alone
        (the plan), not on which writes the I/O thread happens to have finished.
        """
        while len(self._lent) > keep:
            future, _snapshot = self._lent.pop(0)
            future.exception()

    def _release(self, snapshot: Snapshot) -> None:
        """A write has drained: its staging buffer back to the pool (not donated arrays), wake a writer."""
        with self._cond:
            self._inflight -= 1
            if not isinstance(snapshot, _Donated):
                self._pool.append(snapshot)
            self._cond.notify_all()

    def _write_task(self, step: int, snapshot: Snapshot, t, *, staged: bool) -> None:
        t0 = _time.perf_counter()
        try:
            nbytes = self._store(step, snapshot, t)
        finally:
            if staged:
                self._release(snapshot)
        self._account(written=nbytes, write_s=_time.perf_counter() - t0)

    def _read_task(self, step: int):
        t0 = _time.perf_counter()
        snapshot, exc = None, None
        try:
            snapshot = self._load(step)
        except CorruptSnapshot as e:  # agreed with the other ranks before it is raised
            exc = e
        except Exception as e:  # an unreadable block is a lost snapshot too
            exc = CorruptSnapshot(self.name, step, [self.rank], f"{type(e).__name__}: {e}")
            exc.__cause__ = e
        self._account(read=snapshot_nbytes(snapshot) if snapshot else 0,
                      read_s=_time.perf_counter() - t0)
        if self._agree_on_thread:
            return self._agreed(step, (snapshot, exc))
        return snapshot, exc

    def _agreed(self, step: int, outcome) -> Snapshot:
        """Return the snapshot if every rank read its block, else raise the same error on all.

        A snapshot corrupt on any rank is marked invalid on every rank (``valid_steps``).
        """
        snapshot, exc = outcome
        code = 0 if exc is None else (1 if isinstance(exc, CorruptSnapshot) else 2)
        mine = None if exc is None else (code, exc.reason or str(exc))
        failed = problems(self.comm if self.size > 1 else None, mine)
        if not failed:
            return snapshot
        bad = [r for r, _ in failed]
        reasons = detail([(r, why) for r, (_, why) in failed])
        if any(c == 1 for _, (c, _) in failed):
            self._bad.add(step)
        if all(c == 1 for _, (c, _) in failed):
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
