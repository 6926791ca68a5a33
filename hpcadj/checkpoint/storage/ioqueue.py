"""The queue/failure component every file level is composed with (see :mod:`.aio` for the design).

:class:`IOQueue` owns one FIFO I/O thread (none when synchronous: tasks run inline), the bounded
staging buffers of writes in flight, the donated snapshots held until written, the prefetched
reads, and the failure state (poisoned from a failed write until ``flush``). It knows nothing of
files: a level hands it callables from its transport.
"""

from __future__ import annotations

import queue
import threading
import time as _time
from concurrent.futures import Future

from ...snapshot import Snapshot, copy_snapshot
from .base import LevelError, WriteFailed


class IOThread:
    """A daemon thread running submitted callables one at a time, in submission order.

    Failures are handed to the caller through each task's future; skipping tasks after a failure
    is the queue's business.
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
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread through the future
                fn = None
                future.set_exception(exc)
            else:
                # drop the task (and what it captured) before the caller can see it done: the
                # caller then holds the last reference to a donated snapshot, whose release may
                # destroy a PETSc Vec, and PETSc must only ever be called from the caller's thread
                fn = None
                future.set_result(result)
            result = None

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Let queued tasks finish, then end and join the thread."""
        self._queue.put(None)
        self._thread.join()


class Skipped(LevelError):
    """A queued task not run because an earlier write of the level failed (until ``flush``)."""


class Donated(dict):
    """A snapshot written as the caller handed it over (no staging copy; never pooled)."""


def completed(fn) -> Future:
    """Run ``fn`` now and wrap its outcome in a finished future (the synchronous path)."""
    future: Future = Future()
    try:
        future.set_result(fn())
    except BaseException as exc:  # noqa: BLE001 - the future carries it
        future.set_exception(exc)
    return future


class IOQueue:
    """Tasks of one level in plan order, on an I/O thread (``async_io``) or inline; its buffers and
    its failure state. ``stats`` and ``account`` are the level's (``account`` is thread-safe)."""

    def __init__(self, name: str, stats, account, *, async_io: bool, queue_depth: int = 2,
                 prefetch_depth: int = 1, rank: int = 0):
        if queue_depth < 1 or prefetch_depth < 0:
            raise ValueError("queue_depth must be >= 1 and prefetch_depth >= 0")
        self.name = name
        self.rank = int(rank)
        self.stats = stats
        self._account = account
        self.async_io = bool(async_io)
        self.queue_depth = int(queue_depth)
        self.prefetch_depth = int(prefetch_depth)
        self.worker = IOThread(f"hpcadj-io-{name}") if self.async_io else None
        self._inflight = 0
        self._cond = threading.Condition()
        self.prefetched: dict[int, Future] = {}
        self._pool: list[Snapshot] = []
        self._lent: list[tuple[Future, Snapshot]] = []  # donated snapshots of writes in flight
        # failure state: set where the failing write ran, cleared by take_failure() on the caller's thread
        self.poisoned = False
        self.failure: BaseException | None = None   # first write failure since the last flush
        self.failure_step: int | None = None
        self.failure_reported = False
        self.bad: set[int] = set()                  # steps written but not valid (failed, skipped, corrupt)

    # -- running tasks -------------------------------------------------------------------------

    def submit(self, fn, *, write: int | None = None, read: int | None = None,
               always: bool = False, staged: Snapshot | None = None, inline: bool = False) -> Future:
        """Queue ``fn`` (run it now when synchronous or ``inline``), skipping it while poisoned.

        A failing write poisons the queue: until ``take_failure`` every later task but ``always``
        ones (free, discard, shutdown) is skipped with :class:`Skipped`; skipped writes count as failed.
        """
        def task():
            if self.poisoned and not always:
                if write is not None:
                    self.bad.add(write)
                    if staged is not None:
                        self.release(staged)
                raise Skipped(f"{self.name}: step {write if write is not None else read} skipped "
                              f"after a failed write of step {self.failure_step} ({self.failure})")
            try:
                return fn()
            except BaseException as exc:
                if write is not None:
                    self.poison(write, exc)
                raise

        if self.worker is None or inline:
            return completed(task)
        return self.worker.submit(task)

    def poison(self, step: int, exc: BaseException) -> None:
        """Record a failed write of ``step``: later tasks are skipped until ``take_failure``."""
        self.bad.add(step)
        if self.failure is None:
            self.failure, self.failure_step = exc, step
        self.poisoned = True

    def wait(self, future: Future):
        """The future's result; seconds blocked go to ``stats.wait_s``."""
        if not future.done():
            t0 = _time.perf_counter()
            try:
                return future.result()
            finally:
                self._account(wait_s=_time.perf_counter() - t0)
        return future.result()

    def drain(self) -> None:
        """Wait until every task queued so far has run (never raises); drop held donations."""
        if self.worker is not None:
            self.wait(self.worker.submit(lambda: None))
        self.reclaim()

    def stop(self) -> None:
        """End and join the I/O thread once the queued tasks have run."""
        if self.worker is not None:
            self.worker.stop()

    # -- failures --------------------------------------------------------------------------------

    def write_error(self, failure: BaseException, step: int | None = None) -> LevelError:
        """The :class:`WriteFailed` reporting a failed write (chained to ``failure``)."""
        if step is None:
            step = self.failure_step
            if step is None and isinstance(failure, LevelError):
                step = failure.step
        if isinstance(failure, Skipped) and self.failure is not None:
            failure = self.failure
        if isinstance(failure, LevelError) and failure.level == self.name:  # the level's own report,
            text = str(failure)  # agreed by a collective transport and naming the failing ranks
        else:
            text = f"{self.name}: writing step {step} failed on rank {self.rank}: {failure}"
        exc = WriteFailed(self.name, step, text)
        exc.__cause__ = failure
        return exc

    def check(self) -> None:
        """Raise the write failure recorded since the last flush, if any (the queue is poisoned)."""
        if self.failure is not None:
            self.failure_reported = True
            raise self.write_error(self.failure)

    def take_failure(self):
        """Un-poison: (failure, its step, the steps that failed or were found bad), all cleared."""
        failure, step = self.failure, self.failure_step
        self.poisoned = False
        self.failure, self.failure_step = None, None
        self.failure_reported = False
        bad, self.bad = self.bad, set()
        return failure, step, bad

    # -- buffers ---------------------------------------------------------------------------------

    def take_buffer(self, snapshot: Snapshot, donate: bool) -> Snapshot:
        """Wait until fewer than ``queue_depth`` writes are in flight; return what the I/O thread
        will write: donated arrays as they are (a strided one is made contiguous there, where numpy
        copies without the GIL), else a copy in a drained buffer."""
        t0 = _time.perf_counter()
        if donate:
            self.reclaim(keep=self.queue_depth - 1)
        with self._cond:
            blocked = self._inflight >= self.queue_depth
            while self._inflight >= self.queue_depth:
                self._cond.wait()
            self._inflight += 1
            self.note_buffers()
            spare = self._pool.pop() if self._pool and not donate else None
        if blocked:
            self._account(wait_s=_time.perf_counter() - t0)
        if donate:
            self.stats.zero_copy += 1
            return Donated(snapshot)
        t0 = _time.perf_counter()
        copy = copy_snapshot(snapshot, spare)
        self.stats.stage_s += _time.perf_counter() - t0
        return copy

    def lend(self, future: Future, staged: Snapshot) -> None:
        """Hold a donated snapshot on the caller's thread until its write has finished."""
        if isinstance(staged, Donated):
            self._lent.append((future, staged))

    def release(self, snapshot: Snapshot) -> None:
        """A write has drained: its staging buffer back to the pool (not donated arrays), wake a writer."""
        with self._cond:
            self._inflight -= 1
            if not isinstance(snapshot, Donated):
                self._pool.append(snapshot)
            self._cond.notify_all()

    def reclaim(self, keep: int = 0) -> None:
        """Drop, on the caller's thread and oldest first, donated snapshots until ``keep`` are held.

        Each one's write is awaited before it is dropped, so how many go depends on ``keep`` alone
        (the plan), not on which writes the I/O thread happens to have finished.
        """
        while len(self._lent) > keep:
            future, _snapshot = self._lent.pop(0)
            future.exception()

    def note_buffers(self) -> None:
        held = self._inflight + len(self.prefetched)
        self.stats.peak_buffers = max(self.stats.peak_buffers, held)

    def clear(self) -> None:
        """Forget buffers, prefetches and held donations (closing)."""
        self.prefetched.clear()
        self._pool.clear()
        self._lent.clear()
