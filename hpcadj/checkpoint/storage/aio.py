"""File-backed levels by composition: a level = a transport + an I/O queue (sync or async).

- The queue (:class:`~.ioqueue.IOQueue`) is one component for every file level: the FIFO I/O thread
  (none when synchronous), bounded staging buffers, donated snapshots held until written, prefetched
  reads, and the failure state.
- A transport (:class:`Transport`) moves the bytes: per-rank node-local files
  (:class:`~.local.RankFiles`), one HDF5 file written collectively (:class:`~.pfs.H5File`), or raw
  ``pwrite`` into the HDF5 file's datasets with a collective commit (:class:`~.pfs_async.CommittedRaw`).
  It says which of its operations may run on the I/O thread; the others run on the caller's thread.
- :class:`QueuedLevel` is the one Level built from the two; ``LocalLevel``, ``PfsLevel`` and
  ``AsyncPfsLevel`` are its constructors (which transport, which queue).

Design (the same for node-local files and parallel HDF5):

- Every storage operation (write, read, prefetch, free, close) of a level becomes a task, enqueued
  by the caller in plan order: on the level's single FIFO I/O thread where the transport allows
  it, else inline. Plans are identical on all ranks and every queueing decision below depends only
  on caller-side state, so each rank issues the same operations in the same order: collective
  HDF5/MPI-IO calls match across ranks. In synchronous mode every task runs inline.
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
  once, purges the failed steps and un-poisons the level; where the transport does not agree on
  failures itself (per-rank files), ``flush`` and ``close`` agree on them over the communicator, so
  every rank raises the same error and purges the same steps. Completed snapshots stay readable
  (``valid_steps()`` lists them). ``free``, ``discard`` and ``prefetch`` never raise for I/O
  failures, and their queueing never depends on failure state, so on a collective level every rank
  queues the same tasks; on the parallel-HDF5 level write failures are agreed inside the task, so
  every rank poisons at the same task and skips the same ones. A failed read is that read's error
  only; a snapshot found corrupt (agreed on every rank) leaves ``valid_steps()``.
  ``close`` drains the queue, closes, joins the thread. A level still open when the interpreter
  exits is quiesced then (queued tasks run, thread joined, donations dropped; no MPI call), so an
  I/O thread frozen mid-write never keeps a Vec alive on some ranks only.
- Read failures are agreed over the level's duplicated communicator, so every rank raises the same
  :class:`CorruptSnapshot` (or :class:`LevelError`) naming the failing ranks.
"""

from __future__ import annotations

import atexit
import itertools
import time as _time
import weakref
from concurrent.futures import Future

import numpy as np

from ...collective import detail, one_line, problems
from ...snapshot import Snapshot, SnapshotLayout, snapshot_nbytes
from .base import CorruptSnapshot, Level, LevelError, WriteFailed, kept_by
from .ioqueue import IOQueue, IOThread, Skipped

__all__ = ["ALL", "IOThread", "QueuedLevel", "Skipped", "Transport"]

ALL = object()  # settle(wait_for=ALL): every write in flight

_OPEN: weakref.WeakSet = weakref.WeakSet()  # levels not closed yet
_SERIAL = itertools.count()


@atexit.register
def _quiesce_at_exit() -> None:
    """At interpreter exit, for every level left open (in creation order, the same on every rank):
    let its I/O thread run what is queued, end it, and drop the donated snapshots on this thread,
    oldest first. Otherwise a daemon I/O thread frozen mid-write keeps a PETSc Vec alive on some
    ranks only, the ranks' garbage lists differ, and PETSc's finalisation waits forever (runs that
    printed their result then hung at exit). No MPI call is made here."""
    for level in sorted(_OPEN, key=lambda lv: lv._serial):
        level._quiesce()


class Transport:
    """Where a file level's snapshots live. The level calls it in plan order on every rank.

    ``threaded``: the operations (``store``, ``load``, ``drop``, ``shutdown``) an asynchronous level
    may run on its I/O thread: plain file I/O and checksums only, never an MPI or HDF5 call (see
    docs/architecture.md, "Threads"); the others run on the caller's thread. ``agrees_reads``:
    ``load`` agrees its outcome over the communicator itself (a collective read). ``agrees_writes``:
    a failed ``store`` or ``shutdown`` fails on every rank alike (else the level agrees on what
    ``flush`` and ``close`` find). ``agrees_drops``: ``drop`` changes shared metadata collectively
    on the caller's thread and fails on every rank alike; ``free`` then raises it (else a failed
    ``drop`` only leaves a file behind and is ignored). ``defers_commit``:
    ``store`` never raises; it returns an outcome that ``settle`` publishes collectively on the
    caller's thread, failing the step on every rank alike, so its queued operations are never
    skipped after a failure.
    """

    threaded = frozenset({"store", "load", "drop", "shutdown"})
    agrees_reads = False
    agrees_writes = False
    agrees_drops = False
    defers_commit = False
    keep = False

    def settle(self, wait_for=None) -> None:
        """Caller-side point where writes in flight may be published (``wait_for``: a step or ALL)."""

    def begin_write(self, step: int, t):
        """Caller-side preparation of a write of ``step`` at model time ``t``; its token."""
        return None

    def queued(self, step: int, token, future: Future) -> None:
        """The write of ``step`` is queued as ``future``."""

    def begin_read(self, step: int):
        """Caller-side preparation of a read of ``step``; its token. LevelError if it cannot be read."""
        return None

    def prefetchable(self, step: int) -> bool:
        """Whether a prefetch of a held ``step`` may be queued."""
        return True

    def forget(self, step: int) -> None:
        """Caller-side part of discarding ``step``; never raises."""

    def store(self, step: int, snapshot: Snapshot, t, token) -> tuple[int, object]:
        """Write ``snapshot``: (bytes written, outcome handed to the write's future)."""
        raise NotImplementedError

    def load(self, step: int, token) -> Snapshot:
        """This rank's verified blocks of ``step``; CorruptSnapshot for a bad block."""
        raise NotImplementedError

    def drop(self, step: int) -> None:
        """Release what ``step`` used (tolerating a step that never landed)."""
        raise NotImplementedError

    def shutdown(self) -> None:
        """Close files; remove them unless kept (where ``threaded`` says it runs)."""

    def after_shutdown(self) -> None:
        """Caller-side cleanup once the I/O thread has ended (e.g. removing a shared file)."""


class QueuedLevel(Level):
    """A level composed of a :class:`Transport` (``self.transport``, set by the constructor of the
    concrete level) and an :class:`~.ioqueue.IOQueue` (``self.io``: asynchronous or inline)."""

    #: attributes read from the transport (run id, paths, attach notes)
    _from_transport: tuple = ()

    def __init__(self, name: str, capacity: int, layout: SnapshotLayout | None, comm=None, *,
                 async_io: bool = True, queue_depth: int = 2, prefetch_depth: int = 1):
        super().__init__(name, capacity, layout)
        self.io = IOQueue(name, self.stats, self._account, async_io=async_io, queue_depth=queue_depth,
                          prefetch_depth=prefetch_depth)
        self.comm = comm.Dup() if comm is not None else None
        self.rank = self.comm.rank if self.comm is not None else 0
        self.size = self.comm.size if self.comm is not None else 1
        self.io.rank = self.rank
        self.async_io = bool(async_io)
        self.queue_depth = int(queue_depth)
        self.prefetch_depth = int(prefetch_depth)
        self._closed = False
        self.transport: Transport = Transport()
        self._serial = next(_SERIAL)
        _OPEN.add(self)

    def __getattr__(self, name):
        if name in type(self)._from_transport and "transport" in self.__dict__:
            return getattr(self.__dict__["transport"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    keep = kept_by("transport")

    @property
    def failure(self) -> BaseException | None:
        """The first write failure since the last flush (None when healthy)."""
        return self.io.failure

    @property
    def failure_step(self) -> int | None:
        return self.io.failure_step

    def _adopt(self, found: dict) -> None:
        """Hold the snapshots the transport found on attach ({step: model time})."""
        for step, t in sorted(found.items()):
            self._held.add(step)
            self.times[step] = t

    def _abandon(self) -> None:
        """Give up during construction: end the I/O thread, mark closed."""
        self.io.stop()
        self._closed = True
        _OPEN.discard(self)

    def _quiesce(self) -> None:
        """Run what is queued, end the I/O thread (later tasks run inline), drop held donations."""
        if not self._closed:
            self.io.stop()
            self.io.worker = None
            self.io.reclaim()

    def _run(self, op: str, fn, **kwargs) -> Future:
        """Queue transport operation ``op``: on the I/O thread where the transport allows it."""
        return self.io.submit(fn, inline=op not in self.transport.threaded, **kwargs)

    # -- the Level interface -------------------------------------------------------------------

    def _write(self, step: int, snapshot: Snapshot, donate: bool = False) -> None:
        transport, io = self.transport, self.io
        transport.settle()
        self._check()
        self._validate(snapshot)
        t = self.times.get(step)
        token = transport.begin_write(step, t)
        if not self.async_io:
            future = self._run("store", lambda: self._write_task(step, snapshot, t, token, staged=False),
                               write=step)
            if future.exception() is not None:
                io.failure_reported = True
                raise io.write_error(future.exception())
            transport.queued(step, token, future)
            return
        staged = io.take_buffer(snapshot, donate)
        future = self._run("store", lambda: self._write_task(step, staged, t, token, staged=True),
                           write=step, staged=staged, always=transport.defers_commit)
        if donate:  # released on this thread once written (see IOQueue.reclaim)
            io.lend(future, staged)
        transport.queued(step, token, future)

    def _read(self, step: int) -> Snapshot:
        if self._closed:
            raise LevelError(f"{self.name}: level is closed")
        transport, io = self.transport, self.io
        transport.settle(wait_for=step)
        future = io.prefetched.pop(step, None)
        token = transport.begin_read(step)
        if future is not None:
            self.stats.prefetch_hits += 1
        else:
            future = self._run("load", lambda: self._read_task(step, token), read=step,
                               always=transport.defers_commit)
        try:
            outcome = io.wait(future)
        except Skipped as exc:  # not read: a write failed before it; not this snapshot's fault
            if transport.agrees_reads:
                raise io.write_error(exc) from exc
            outcome = (None, exc)
        if transport.agrees_reads:
            return outcome
        return self._agreed(step, outcome)

    def _free(self, step: int) -> None:
        if self._closed:
            raise LevelError(f"{self.name}: level is closed")
        self.transport.settle(wait_for=step)
        self.io.prefetched.pop(step, None)
        self.io.bad.discard(step)
        dropped = self._run("drop", lambda: self.transport.drop(step), always=True)
        if self.transport.agrees_drops and dropped.exception() is not None:  # inline: done
            self._held.discard(step)  # gone on every rank alike: its slot is not reused
            self.times.pop(step, None)
            raise dropped.exception()

    def discard(self, step: int) -> None:
        """Forget ``step`` in any state (pending, prefetched, failed, corrupt); never raises."""
        try:
            self.transport.forget(step)
            self.io.prefetched.pop(step, None)
            held = step in self._held
            self._held.discard(step)
            self.io.bad.discard(step)
            self.times.pop(step, None)
            if held and not self._closed:
                self._run("drop", lambda: self.transport.drop(step), always=True)
        except Exception:  # noqa: BLE001 - discarding after a fault must not fault again
            pass

    def valid_steps(self) -> set[int]:
        """Steps held whose writes completed and whose snapshots were not found corrupt."""
        if not self._closed:
            self.transport.settle(wait_for=ALL)
            self.io.drain()
        return {s for s in self._held if s not in self.io.bad}

    def prefetch(self, step: int) -> None:
        """Queue a read of ``step`` now (asynchronous levels; at most ``prefetch_depth`` held).

        Never raises for I/O failures (a failed prefetch is the later read's error).
        """
        io, transport = self.io, self.transport
        if (self._closed or not self.async_io or step not in self._held or step in io.prefetched
                or len(io.prefetched) >= self.prefetch_depth or not transport.prefetchable(step)):
            return
        token = transport.begin_read(step)
        io.prefetched[step] = self._run("load", lambda: self._read_task(step, token), read=step,
                                        always=transport.defers_commit)
        self.stats.prefetches += 1
        with io._cond:
            io.note_buffers()

    def flush(self) -> None:
        """Block until every queued operation has run; then, once, raise a write failure.

        After a failure the failed and skipped steps leave the level (``valid_steps`` no longer
        lists them, their files are removed) and the level takes tasks again.
        """
        if self._closed:
            raise LevelError(f"{self.name}: level is closed")
        io = self.io
        self.transport.settle(wait_for=ALL)
        io.drain()
        failure, step, bad = io.take_failure()
        failed: list = []
        if self._agrees_here():  # a write failed on some ranks only: every rank fails it alike
            mine = None if failure is None else str(io.write_error(failure, step))
            reports = self.comm.allgather((step, mine, sorted(bad)))
            failed = [(rank, why) for rank, (_, why, _) in enumerate(reports) if why]
            bad = set().union(*(set(b) for _, _, b in reports))
            step = next((s for s, why, _ in reports if why), step)
        purge = sorted(s for s in bad if s in self._held)
        for gone in purge:  # failed writes: never readable; corrupt: unusable
            self._held.discard(gone)
            self.times.pop(gone, None)
            io.prefetched.pop(gone, None)
            self._run("drop", lambda gone=gone: self.transport.drop(gone), always=True)
        if purge:
            io.drain()
        if failed:
            raise WriteFailed(self.name, step, one_line(failed, self.size)) from failure
        if failure is not None:
            raise io.write_error(failure, step)

    def _agrees_here(self) -> bool:
        """Whether this level agrees on failures at flush and close itself (collective levels whose
        transport does not: per-rank files, which fail on one rank while the others go on)."""
        return (self.comm is not None and self.size > 1 and self.failures_need_agreement
                and not self.transport.agrees_writes)

    def close(self) -> None:
        """Drain the queue, release files (removing them unless kept), join the I/O thread.

        Raises a write failure not reported before, after cleaning up.
        """
        if self._closed:
            return
        transport, io = self.transport, self.io
        try:
            transport.settle(wait_for=ALL)
        finally:
            io.prefetched.clear()
            if "shutdown" in transport.threaded:
                shutdown = self._run("shutdown", transport.shutdown, always=True)
                io.stop()
            else:  # the I/O thread ends first: nothing of it may touch what shutdown closes
                io.stop()
                shutdown = io.submit(transport.shutdown, always=True, inline=True)
            shutdown.exception()
            io.clear()
            self._closed = True
            _OPEN.discard(self)
            try:
                transport.after_shutdown()
                error = self._closing_error(shutdown.exception())
            finally:
                self._held.clear()
                if self.comm is not None:
                    self.comm.Free()
                    self.comm = None
        if error is not None:
            raise error

    def _closing_error(self, exc: BaseException | None) -> LevelError | None:
        """What ``close`` raises: a write failure not reported before, else the shutdown's failure;
        the same on every rank where the transport does not agree on them itself (collective)."""
        io = self.io
        failure = io.failure if not io.failure_reported else None
        if failure is not None:
            io.failure_reported = True
            error, cause = io.write_error(failure), failure
        elif exc is not None:  # a LevelError is the transport's own report, agreed and naming ranks
            text = str(exc) if isinstance(exc, LevelError) else f"{self.name}: closing failed on rank {self.rank}: {exc}"
            error, cause = LevelError(text), exc
        else:
            error = cause = None
        if not self._agrees_here():
            return error
        writing = isinstance(error, WriteFailed)
        failed = problems(self.comm, None if error is None else (writing, error.step, str(error)))
        if not failed:
            return None
        text = one_line([(rank, why) for rank, (_, _, why) in failed], self.size)
        steps = [step for _, (write, step, _) in failed if write]
        agreed = WriteFailed(self.name, steps[0], text) if steps else LevelError(text)
        agreed.__cause__ = cause
        return agreed

    # -- helpers ---------------------------------------------------------------------------------

    def _check(self) -> None:
        """Raise if closed, or if a write failed since the last flush (the level is poisoned)."""
        if self._closed:
            raise LevelError(f"{self.name}: level is closed")
        self.io.check()

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

    def _write_task(self, step: int, snapshot: Snapshot, t, token, *, staged: bool):
        t0 = _time.perf_counter()
        try:
            nbytes, outcome = self.transport.store(step, snapshot, t, token)
        finally:
            if staged:
                self.io.release(snapshot)
        self._account(written=nbytes, write_s=_time.perf_counter() - t0)
        return outcome

    def _read_task(self, step: int, token):
        t0 = _time.perf_counter()
        snapshot, exc = None, None
        try:
            snapshot = self.transport.load(step, token)
        except CorruptSnapshot as e:  # agreed with the other ranks before it is raised
            exc = e
        except Exception as e:  # noqa: BLE001 - an unreadable block is a lost snapshot too
            exc = CorruptSnapshot(self.name, step, [self.rank], f"{type(e).__name__}: {e}")
            exc.__cause__ = e
        self._account(read=snapshot_nbytes(snapshot) if snapshot else 0,
                      read_s=_time.perf_counter() - t0)
        if self.transport.agrees_reads:
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
            self.io.bad.add(step)
        if all(c == 1 for _, (c, _) in failed):
            raise CorruptSnapshot(self.name, step, bad, reasons) from exc
        raise LevelError(f"{self.name}: reading step {step} failed ({reasons})") from exc
