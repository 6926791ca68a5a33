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
Failures: a write's success is agreed over the level's communicator inside the write task (after
the raw data, again after the metadata), so when one rank's write fails every rank fails the same
step, poisons at the same task and skips the same ones: no rank is left in a collective call.
A full file system: before each write the file is flushed and the blocks the write and its
metadata will touch are allocated on rank 0 (:mod:`.space`), the outcome agreed; so ENOSPC fails
that write on every rank before any HDF5 call can fail on one rank only (which would leave the
others in a collective call for ever), and the level takes no more writes. Closing (and removing a
file not kept) is agreed too, and so is freeing a snapshot (its link and step attribute: collective
metadata changes): a failure on any rank fails the free on every rank as a write failure of the level,
which then takes no new snapshots, and the run re-plans. A snapshot whose free failed is revoked:
``(step, slot)`` goes into the root attribute ``revoked``, and attach drops such a link (where even
that attribute cannot be written to a kept file, the file is removed), so no resume trusts it.
With ``keep`` (restartable runs) the file is flushed (``H5Fflush``) after every write, so a killed
run leaves a file whose step links and CRC tables describe complete snapshots.

Attach (a restart with the same run id and path) is :mod:`.pfs_attach`.

:class:`H5File` is the transport: every operation is an HDF5 call, so none runs on an I/O thread.
:class:`PfsLevel` composes it with a synchronous I/O queue: every call on the caller's thread, in
plan order. The asynchronous mode (:class:`~.pfs_async.AsyncPfsLevel`, what
``make_level(..., async_io=True)`` builds) keeps all HDF5 calls there too and moves only the raw
bytes to an I/O thread.
"""

from __future__ import annotations

import math
import os
from contextlib import nullcontext

import numpy as np

from ...snapshot import Snapshot, SnapshotLayout
from ...imports import h5py, mpi
from .aio import QueuedLevel, Transport
from ...collective import agree_or_raise, detail, first_problem, problems
from .base import CorruptSnapshot, LevelError, LevelFault, WriteFailed, agree_run_id
from .checksum import ALGORITHM, block_checksum
from .pfs_attach import FORMAT, attach_file
from .space import METADATA_MARGIN, reserve


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


def read_checked(name, step, rank, layout, fields, expected, read, path) -> Snapshot:
    """This rank's blocks of ``step`` read by ``read(field, block)`` into fresh arrays, each checked
    against its CRC in ``expected`` (fields' order); a mismatch is a :class:`CorruptSnapshot`."""
    snapshot: Snapshot = {}
    bad = []
    for crc, field in zip(expected, fields):
        lay = layout[field]
        block = np.empty(tuple(lay.shape), dtype=np.dtype(lay.dtype))
        read(field, block)
        if block_checksum(block) != crc:
            bad.append(field)
        snapshot[field] = block
    if bad:
        raise CorruptSnapshot(name, step, [rank], f"checksum mismatch in {', '.join(bad)} of {path}")
    return snapshot


def _transfer(dset, block: np.ndarray, slices, *, write: bool, collective: bool) -> None:
    """Write ``block`` to (or read it from) ``dset[slices]``, collectively or independently.

    In collective mode an empty block still takes part in the call, with empty selections (h5py's
    high-level selections cannot express it); independently it is simply skipped.
    """
    if block.size:
        with dset.collective if collective else nullcontext():
            if write:
                dset.write_direct(block, dest_sel=slices)
            else:
                dset.read_direct(block, source_sel=slices)
        return
    if not collective:
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


class H5File(Transport):
    """The snapshots as global datasets in one parallel-HDF5 file (``driver="mpio"``; the layout
    above). Every operation is collective or an HDF5 call: all run on the caller's thread."""

    threaded = frozenset()
    agrees_reads = True
    agrees_writes = True
    agrees_drops = True

    def __init__(self, name: str, comm, layout: SnapshotLayout, path: str | None = None, *,
                 run_id: str | None = None, keep: bool = False, fsync: bool = False,
                 collective: str = "auto"):
        self.name = name
        self.comm = comm
        self.rank, self.size = comm.rank, comm.size
        self.layout = layout
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
                raise LevelError(f"{name}: ranks disagree on the global shape/dtype of {f!r}")
            self._ranks[f] = (np.array([s for _, _, s, _ in everyone], dtype=np.int64),
                              np.array([n for _, _, _, n in everyone], dtype=np.int64))
        if collective not in ("auto", "always", "never"):
            raise ValueError(f"collective must be auto, always or never, not {collective!r}")
        self._collective = {f: collective == "always" or (collective == "auto" and not all(
            contiguous_in_file(lay.global_shape, s, n) for s, n in zip(*self._ranks[f])))
            for f, lay in ((f, layout[f]) for f in self.fields)}
        self._file = None
        self._unflushed = 0  # writes since the file's end was last re-measured (make_room)
        self._roomy: set[int] = set()  # slots whose blocks this process has allocated
        self._created = False  # only a file this run created (or attached as its own) is removed
        self.groups: dict[int, object] = {}
        self._free_slots: list[int] = []
        self.slot_of: dict[int, int] = {}
        self.crc: dict[int, list[int]] = {}
        self._foreign: set[int] = set()  # attached slots whose rank tables are another layout's
        self._next_slot = 0
        self.attach_note: str | None = None
        self.attach_dropped: list[str] = []  # why snapshots found on attach were not taken
        self.attached: dict[int, float | None] = {}  # held after attach: {step: model time}
        self.revoked: list[tuple[int, int]] = []  # (step, slot) whose free failed: never to be trusted

    def start(self, attach: bool) -> str | None:
        """Create (or attach) the file; this rank's problem, or None (the caller agrees on it)."""
        try:
            attach_file(self) if attach else self.create()
        except Exception as exc:  # noqa: BLE001 - agreed by the caller
            return f"{type(exc).__name__}: {exc}" if not isinstance(exc, LevelError) else str(exc)
        return None

    def create(self, replace: bool = False) -> None:
        """Create the file; an existing path is refused unless it is this run's own (``replace``)."""
        h5 = h5py()
        self.groups.clear()
        self._free_slots.clear()
        self._next_slot = 0
        taken = os.path.lexists(self.path) if self.rank == 0 else None
        if self.comm.bcast(taken, root=0) and not replace:
            raise LevelError(f"{self.path} already exists and is not this run's checkpoint file; "
                             f"remove it or choose another path (hpcadj never overwrites a file "
                             f"it did not create)")
        f = h5.File(self.path, "w", driver="mpio", comm=self.comm)
        self._created = True
        self._file = f
        self.reserve_margin()
        f.attrs["format"] = FORMAT
        f.attrs["run_id"] = self.run_id
        f.attrs["nranks"] = self.size
        f.attrs["checksum"] = ALGORITHM
        f.attrs["fields"] = np.array(self.fields, dtype=h5.string_dtype())
        f.create_group("slots")
        f.create_group("snapshots")
        if self.keep:  # a run killed before its first write still leaves a file that opens
            f.flush()

    def group(self, slot: int):
        g = self.groups.get(slot)
        if g is not None:
            return g
        name = f"slot_{slot:04d}"
        if name in self._file["slots"]:  # created by a write that failed later
            g = self.groups[slot] = self._file["slots"][name]
            return g
        g = self._file["slots"].create_group(name)
        h5 = h5py()
        dcpl = h5.h5p.create(h5.h5p.DATASET_CREATE)
        dcpl.set_fill_time(h5.h5d.FILL_TIME_NEVER)  # every write covers the whole dataset
        dcpl.set_alloc_time(h5.h5d.ALLOC_TIME_EARLY)  # fixed offsets (raw I/O, reservations)
        for field in self.fields:
            lay = self.layout[field]
            d = g.create_dataset(field, shape=tuple(lay.global_shape), dtype=np.dtype(lay.dtype), dcpl=dcpl)
            starts, shapes = self._ranks[field]
            d.attrs["rank_starts"] = starts
            d.attrs["rank_shapes"] = shapes
        g.attrs["step"] = -1
        g.attrs["time"] = math.nan
        self.groups[slot] = g
        return g

    def write_block(self, dset, block: np.ndarray, slices, collective: bool) -> None:
        """Write this rank's block of one field (a hook fault-injection tests replace)."""
        _transfer(dset, block, slices, write=True, collective=collective)

    def agree_write(self, step: int, slot: int, error, stage: str, value=None):
        """Every rank's ``value``, or the same LevelError on every rank if any rank failed."""
        mine = value if error is None else ("failed", f"{type(error).__name__}: {error}")
        states = self.comm.allgather(mine)
        bad = [r for r, v in enumerate(states) if isinstance(v, tuple)]
        if not bad:
            return states
        self.return_slot(slot)
        detail = "; ".join(f"rank {r}: {states[r][1]}" for r in bad)
        raise WriteFailed(self.name, step, f"{self.name}: writing step {step} ({stage}) to {self.path} "
                          f"failed on rank(s) {', '.join(map(str, bad))}: {detail}") from error

    def reserve_margin(self) -> None:
        """Collective: allocate the metadata margin past the end of the file (see :mod:`.space`);
        the same LevelError on every rank if the file system has no room for it."""
        why = reserve(self.path, [], at_end=METADATA_MARGIN) if self.rank == 0 else None
        agree_or_raise(self.comm, why, LevelError, f"{self.name}: no room for {self.path} ({{detail}})")

    #: writes between the flushes that re-measure the file's end (a flush syncs the file: costly)
    FLUSH_EVERY = 16

    def make_room(self, step: int, slot: int) -> None:
        """Collective, before ``step`` is written to ``slot``: allocate the blocks the write and
        its metadata may touch. For a new slot, and every FLUSH_EVERY writes, the file is flushed
        first (it then ends where HDF5's allocations do) and room for the slot plus a metadata
        margin is allocated past its end; otherwise the slot's datasets, once per process (the
        margin taken at the last flush covers the metadata of the writes in between). Raises the same WriteFailed on
        every rank if anything fails, before any other HDF5 call."""
        new = slot not in self.groups
        flush = new or self._unflushed >= self.FLUSH_EVERY
        self._unflushed += 1
        if not flush and slot in self._roomy:  # its blocks are allocated, the margin stands
            return
        error = None
        if flush:
            try:
                self._file.flush()
            except Exception as exc:  # noqa: BLE001 - agreed next
                error = exc
            self.agree_write(step, slot, error, "flush", 0)
            self._unflushed = 1
        if self.rank != 0:
            self.agree_write(step, slot, None, "room", 0)
            self._roomy.add(slot)
            return
        name = f"slot_{slot:04d}"
        ranges, extra = [], 0
        try:
            g = self.groups.get(slot)
            if g is None and name in self._file["slots"]:
                g = self._file["slots"][name]
            if g is None:
                extra = sum(int(np.prod(self.layout[f].global_shape)) * np.dtype(self.layout[f].dtype).itemsize
                            + 4096 for f in self.fields)
            else:
                ranges = [(g[f].id.get_offset() or 0, int(g[f].id.get_storage_size())) for f in self.fields]
            why = reserve(self.path, ranges, at_end=extra + METADATA_MARGIN if flush else 0)
            error = None if why is None else OSError(why)
        except Exception as exc:  # noqa: BLE001 - agreed next
            error = exc
        self.agree_write(step, slot, error, "room", 0)
        self._roomy.add(slot)

    def take_slot(self, step: int) -> int:
        """A free slot for ``step`` (the lowest freed one, else a new one); collective bookkeeping."""
        if step in self.slot_of:  # a stale record of the same step (never after a clean free)
            self.drop(step)
        if self._free_slots:
            return self._free_slots.pop(0)
        self._next_slot += 1
        return self._next_slot - 1

    def return_slot(self, slot: int) -> None:
        """Put ``slot`` back among the free ones (lowest first), once."""
        if slot not in self._free_slots:
            self._free_slots.append(slot)
            self._free_slots.sort()

    def prepare_slot(self, slot: int):
        """The slot's group, created on first use; an attached slot gets this run's rank tables."""
        g = self.group(slot)
        if slot in self._foreign:  # an attached slot laid out by another rank count
            for field in self.fields:
                g[field].attrs["rank_starts"], g[field].attrs["rank_shapes"] = self._ranks[field]
            self._foreign.discard(slot)
        return g

    def link(self, step: int, slot: int, table: np.ndarray, t) -> None:
        """Collective: publish a snapshot whose data every rank wrote (CRC table, step, time,
        link; flushed if kept). Raises the same LevelError on every rank if any rank failed."""
        g = self.groups[slot]
        link = f"step_{step}"
        error = None
        try:
            for i, field in enumerate(self.fields):
                g[field].attrs["crc32"] = table[:, i]
            g.attrs["step"] = int(step)
            g.attrs["time"] = math.nan if t is None else float(t)
            if link in self._file["snapshots"]:
                del self._file["snapshots"][link]
            self._file["snapshots"][link] = g
            if self.fsync or self.keep:
                self._file.flush()  # the file now ends where HDF5's allocations do: a new margin
                self._unflushed = 0
                why = reserve(self.path, [], at_end=METADATA_MARGIN) if self.rank == 0 else None
                if why is not None:
                    raise OSError(why)
        except Exception as exc:  # noqa: BLE001 - agreed below
            error = exc
        try:
            self.agree_write(step, slot, error, "metadata", 0)
        except LevelError:
            try:
                if link in self._file["snapshots"]:
                    del self._file["snapshots"][link]
            except Exception:  # noqa: BLE001 - the file is failing; the agreed error says so
                pass
            raise
        self.slot_of[step] = slot
        self.crc[step] = [int(c) for c in table[self.rank]]

    def store(self, step: int, snapshot: Snapshot, t, token=None) -> tuple[int, None]:
        slot = self.take_slot(step)
        self.make_room(step, slot)
        crcs, error, g = [], None, None
        try:
            g = self.prepare_slot(slot)
            g.attrs["step"] = -1
        except Exception as exc:  # noqa: BLE001 - agreed below, so no rank waits on a failed one
            error = exc
        for field in self.fields if error is None or g is not None else ():
            if error is None:
                block = np.ascontiguousarray(snapshot[field])
                crcs.append(block_checksum(block))
                try:
                    self.write_block(g[field], block, self.layout[field].slices,
                                      self._collective[field])
                except Exception as exc:  # noqa: BLE001 - agreed below
                    error = exc
            elif self._collective[field]:  # failed before: still join the collective call, empty
                try:
                    empty = np.empty((0,) * len(self.layout[field].shape),
                                     dtype=np.dtype(self.layout[field].dtype))
                    _transfer(g[field], empty, None, write=True, collective=True)
                except Exception:  # noqa: BLE001 - the first error is the one reported
                    pass
        table = self.agree_write(step, slot, error, "data", crcs)
        self.link(step, slot, np.array(table, dtype=np.uint32).reshape(self.size, -1), t)
        return sum(snapshot[f].nbytes for f in self.fields), None

    def locate(self, step: int, field: str) -> tuple[str, int, int]:
        """(file, byte offset, item size) of ``field``'s data for ``step``: where a test damages it.

        Not collective. The dataset is contiguous and C-ordered.
        """
        d = self.groups[self.slot_of[step]][field]
        return self.path, int(d.id.get_offset()), int(d.dtype.itemsize)

    def load(self, step: int, token=None) -> Snapshot:
        g = self.groups[self.slot_of[step]]
        expected = self.crc[step]
        def read(field, block):
            lay = self.layout[field]
            _transfer(g[field], block, lay.slices, write=False, collective=self._collective[field])

        return read_checked(self.name, step, self.rank, self.layout, self.fields, expected, read, self.path)

    def drop(self, step: int) -> None:
        """Collective: unlink ``step`` and mark its slot free, every rank making both calls. A
        failure on any rank is the same write failure of the level on every rank (its metadata may
        now differ from what the ranks agreed: it takes no new snapshots, the run re-plans) and the
        slot is not reused; the step is gone from the level all the same."""
        slot = self.slot_of.pop(step, None)
        self.crc.pop(step, None)
        if slot is None:  # the write never landed
            return
        link = f"step_{step}"

        def unlink():
            if link in self._file["snapshots"]:
                del self._file["snapshots"][link]

        def mark_free():
            self.groups[slot].attrs["step"] = -1

        errors = []
        for change in (unlink, mark_free):
            try:
                change()
            except Exception as exc:  # noqa: BLE001 - agreed next; the other call is still made
                errors.append(f"{type(exc).__name__}: {exc}")
        failed = problems(self.comm, "; ".join(errors) or None)
        if failed:
            raise LevelFault(self.name, step, f"{self.name}: freeing step {step} in {self.path} failed "
                                              f"({detail(failed)}); {self.revoke(step, slot)}", writing=True)
        self.return_slot(slot)

    def revoke(self, step: int, slot: int) -> str:
        """After a free that failed: leave no snapshot of ``step`` a resume would trust (collective).
        The pair is recorded in the file's ``revoked`` attribute, which attach reads; where even that
        fails on a rank and the file is kept, rank 0 removes the file (this run reads on through its
        open handle; a resume finds none). What was done, the same on every rank."""
        self.revoked.append((step, slot))
        why = None
        try:
            self._file.attrs["revoked"] = np.array(self.revoked, dtype=np.int64).reshape(-1, 2)
        except Exception as exc:  # noqa: BLE001 - agreed next
            why = f"{type(exc).__name__}: {exc}"
        if self.keep:  # collective: every rank flushes
            try:
                self._file.flush()
            except Exception as exc:  # noqa: BLE001 - agreed next
                why = why or f"{type(exc).__name__}: {exc}"
        failed = first_problem(self.comm, why)
        if failed is None:
            return f"step {step} marked revoked in the file"
        if not self.keep:
            return f"marking it revoked failed too ({failed}); the file is not kept"
        gone = None
        if self.rank == 0:
            try:
                os.remove(self.path)
            except OSError as exc:
                gone = exc.strerror or str(exc)
        gone = first_problem(self.comm, gone)
        return (f"marking it revoked failed too ({failed}); " +
                (f"removing the file failed too ({gone})" if gone else "the file was removed: no resume reads it"))

    def shutdown(self, problem: str | None = None) -> None:
        """Close the file, agreed: a failure on any rank (or ``problem``, this rank's failure to
        close what else it had open on the file) is the same LevelError on every rank (a file not
        kept is removed next all the same, so then it is not an error)."""
        if self._file is not None:
            try:
                self._file.close()
            except Exception as exc:  # noqa: BLE001 - agreed next
                problem = problem or f"{type(exc).__name__}: {exc}"
            self._file = None
        elif problem is None:
            return
        if self.keep:
            agree_or_raise(self.comm, problem, LevelError, f"{self.name}: closing {self.path} failed ({{detail}})")

    def after_shutdown(self) -> None:
        """Remove a file not kept (rank 0, once every rank closed it); a failure is the same
        LevelError on every rank."""
        if self.keep or self.comm is None or not self._created:
            return
        self.comm.Barrier()
        problem = None
        if self.rank == 0:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                problem = exc.strerror or str(exc)
        agree_or_raise(self.comm, problem, LevelError, f"{self.name}: cannot remove {self.path} ({{detail}})")


class PfsLevel(QueuedLevel):
    """Snapshots as global datasets in one parallel-HDF5 file (:class:`H5File`), synchronously."""

    kind = "pfs"
    _from_transport = ("fsync", "run_id", "path", "fields", "attach_note", "attach_dropped")

    def __init__(self, capacity: int, layout: SnapshotLayout, comm=None, path: str | None = None,
                 *, run_id: str | None = None, keep: bool = False, fsync: bool = False,
                 queue_depth: int = 2, prefetch_depth: int = 1,
                 collective: str = "auto", name: str = "pfs", attach: bool = False):
        if comm is None:
            comm = mpi().COMM_WORLD
        if not layout:
            raise LevelError(f"{name}: the parallel-HDF5 level needs a snapshot layout")
        super().__init__(name, capacity, layout, comm, async_io=False,
                         queue_depth=queue_depth, prefetch_depth=prefetch_depth)
        self.transport = open_h5(self, layout, path, run_id=run_id, keep=keep, fsync=fsync,
                                 collective=collective, attach=attach)
        self._adopt(self.transport.attached)

    def locate(self, step: int, field: str) -> tuple[str, int, int]:
        """(file, byte offset, item size) of ``field``'s data for ``step``: where a test damages it."""
        return self.transport.locate(step, field)


def open_h5(level: QueuedLevel, layout: SnapshotLayout, path, *, run_id, keep, fsync, collective,
            attach) -> H5File:
    """The :class:`H5File` of ``level`` (collective), created or attached; on a failure on any rank
    the same LevelError on every rank, with the file closed and the level given up."""
    try:
        h5 = H5File(level.name, level.comm, layout, path, run_id=run_id, keep=keep, fsync=fsync,
                    collective=collective)
    except (LevelError, ValueError):
        level._abandon()
        raise

    def give_up():
        if h5._file is not None:
            try:
                h5.shutdown()
            except Exception:  # noqa: BLE001 - the agreed error says what failed
                pass
        level._abandon()

    what = "attach" if attach else "create"
    agree_or_raise(level.comm, h5.start(attach), LevelError,
                   f"{level.name}: cannot {what} the parallel-HDF5 file {h5.path} ({{detail}})",
                   cleanup=give_up)
    return h5
