"""Storage faults injected into real gradient runs, as SCR/VeloC/FTI test them.

The heat model runs through the real :class:`Driver` on levels from the checkpoint manager; a
fault is injected mid-run and the gradient must still be bitwise identical to the uninterrupted
reference (``driver.faults`` records what happened), or the run must stop with
:class:`Unrecoverable` on every rank when nothing fits:

- the newest snapshot corrupted (one byte), truncated or deleted, on one rank or on all ranks, on the
  node-local and the parallel-HDF5 level, asynchronous and synchronous (the test wraps the level's
  ``write``: right after step k lands it damages that step's data);
- a full level: a size-limited tmpfs mounted by the test as the node-local directory, filled with
  ballast after two writes so a real ENOSPC hits mid-run (an injected ENOSPC only where mounting is impossible: the
  run prints which);
- an unwritable directory mid-run: the tmpfs remounted read-only after two writes (real EROFS);
- nothing fits: the only level full from its first write;
- a flush or close failing on one rank only (EIO/EROFS after HDF5's collective part, a write
  failure found only at flush or close): every rank fails alike, or the run re-plans, never a hang;
- freeing an HDF5 snapshot failing on one rank (its link's removal): every rank fails the free alike
  and the run re-plans.
"""

import errno
import os
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI  # noqa: F401 - initialise MPI (THREAD_MULTIPLE) before the comm fixture starts PETSc

from hpcadj.adjoint import Driver
from hpcadj.adjoint.driver import Unrecoverable
from hpcadj.checkpoint.manager import CheckpointConfig, build_levels, level_slots, make_plan, profile_for
from hpcadj.checkpoint.storage import LevelError, make_level
from hpcadj.checkpoint.storage.base import WriteFailed
from hpcadj.models.heat import HeatModel
from model_checks import store_all_reference

PAGE = 4096


@pytest.fixture(scope="module")
def reference(comm):
    return store_all_reference(HeatModel(comm, (12, 10), n_steps=16, dt=1e-3))


def run(reference, comm, budgets, schedule, local_dir, pfs_file=None, async_io=True, hook=None, keep=False):
    """Run the gradient with the levels of ``budgets``; ``hook(levels)`` may wrap them first."""
    model, controls, _, _ = reference
    config = CheckpointConfig(budgets=budgets, local_dir=local_dir, pfs_file=pfs_file,
                              async_io=async_io, keep=keep)
    plans = level_slots(config, model.snapshot_layout(), comm, model.n_steps)
    plan = make_plan(schedule, model.n_steps, plans, profile_for(plans, None))
    levels = build_levels(plans, model.snapshot_layout(), comm, config)
    driver = Driver(model, levels)
    try:
        if hook is not None:
            hook(levels)
        return driver, driver.run(plan, controls)
    finally:
        for level in levels:
            try:
                level.close()
            except Exception:  # noqa: BLE001 - a level on a read-only mount may fail to clean up
                pass


def assert_identical(reference, driver, result):
    _, _, J, grad = reference
    assert driver.faults, "no fault was seen: the injection did not happen"
    assert result.J == J
    for name, ref in grad.items():
        assert np.array_equal(result.gradient[name].getArray(), ref), name


def after_write(level, comm, nth, action):
    """Wrap ``level.write``: after its ``nth`` write lands, run ``action(step)`` (all ranks)."""
    real = level.write
    count = [0]

    def write(step, snapshot, time=None, **kw):
        real(step, snapshot, time=time, **kw)
        count[0] += 1
        if count[0] == nth:
            level.flush()
            comm.Barrier()
            action(step)
            comm.Barrier()
    level.write = write


# -- damaged snapshots ------------------------------------------------------------------------

def damage_local(level, comm, damage, ranks):
    def action(step):
        if comm.rank not in ranks:
            return
        path = level.path(step)
        if damage == "delete":
            os.remove(path)
        elif damage == "truncate":
            os.truncate(path, os.path.getsize(path) // 2)
        else:
            with open(path, "r+b") as f:
                f.seek(-5, os.SEEK_END)
                b = f.read(1)
                f.seek(-5, os.SEEK_END)
                f.write(bytes([b[0] ^ 0x10]))
    return action


def damage_pfs(level, comm, damage, ranks):
    def action(step):
        field = sorted(level.layout)[0]
        lay = level.layout[field]
        blocks = comm.allgather((tuple(lay.start), tuple(lay.shape)))
        path, offset, item = level.locate(step, field)
        if comm.rank != 0:
            return
        if damage == "truncate":  # the newest snapshot's data and everything after it is cut off
            os.truncate(path, offset + item)
            return
        with open(path, "r+b") as f:
            for r in ranks:
                start, shape = blocks[r]
                if 0 in shape:
                    continue
                first = offset + int(np.ravel_multi_index(start, lay.global_shape)) * item
                f.seek(first)
                if damage == "delete":  # the block's bytes are gone (zeros)
                    f.write(b"\0" * item * int(shape[-1]))
                else:
                    b = f.read(1)
                    f.seek(first)
                    f.write(bytes([b[0] ^ 0x10]))
    return action


#: truncating the shared HDF5 file cuts every rank's block at once: no one-rank case for it
DAMAGES = [(kind, damage, who) for kind in ("local", "pfs") for damage in ("corrupt", "truncate", "delete")
           for who in ("one", "all") if not (kind == "pfs" and damage == "truncate" and who == "one")]


@pytest.mark.parametrize("async_io", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("kind,damage,who", DAMAGES, ids=["-".join(d) for d in DAMAGES])
def test_damaged_newest_snapshot(reference, comm, shared_tmp, kind, damage, who, async_io):
    budget = {"local": "disk", "pfs": "pfs"}[kind]
    ranks = [comm.size - 1] if who == "one" else list(range(comm.size))

    def hook(levels):
        level = levels[-1]
        maker = damage_local if kind == "local" else damage_pfs
        after_write(level, comm, 2, maker(level, comm, damage, ranks))

    driver, result = run(reference, comm, {budget: "3"}, "revolve", shared_tmp,
                         pfs_file=f"{shared_tmp}/ck-{damage}-{who}-{async_io}.h5",
                         async_io=async_io, hook=hook)
    assert_identical(reference, driver, result)
    assert any("corrupt" in f or "reading" in f for f in driver.faults), driver.faults


# -- full and unwritable node-local directories ---------------------------------------------------

class Tmpfs:
    """A size-limited tmpfs mounted by rank 0 under the shared directory (or None if impossible)."""

    def __init__(self, comm, base, size="1m"):
        self.comm = comm
        self.path = os.path.join(base, "tmpfs")
        ok = None
        if comm.rank == 0:
            os.makedirs(self.path, exist_ok=True)
            proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", self.path],
                                  capture_output=True, text=True)
            ok = proc.returncode == 0
        self.mounted = comm.bcast(ok, root=0)
        self.how = "tmpfs" if self.mounted else "injected"
        if comm.rank == 0:
            print(f"\n[test_faults] full/unwritable level faults use: {self.how}",
                  file=sys.__stderr__, flush=True)

    def fill(self, free_pages):
        """Ballast so that only ``free_pages`` pages stay free (rank 0), then every rank goes on."""
        if self.comm.rank == 0 and self.mounted:
            st = os.statvfs(self.path)
            ballast = st.f_bavail * st.f_frsize - free_pages * PAGE
            with open(os.path.join(self.path, "ballast"), "wb") as f:
                f.write(b"\0" * ballast)
        self.comm.Barrier()

    def read_only(self):
        self.comm.Barrier()
        if self.comm.rank == 0 and self.mounted:
            subprocess.run(["mount", "-o", "remount,ro", self.path], check=True)
        self.comm.Barrier()

    def close(self):
        self.comm.Barrier()
        if self.comm.rank == 0 and self.mounted:
            subprocess.run(["umount", "-l", self.path], check=True)
        self.comm.Barrier()


def inject(level, after, err):
    """Where no tmpfs can be mounted: the level's writes fail with ``err`` after ``after`` writes."""
    real = level.transport.store
    count = [0]

    def store(step, snapshot, t, token=None):
        count[0] += 1
        if count[0] > after:
            raise OSError(err, os.strerror(err) + " (injected)")
        return real(step, snapshot, t, token)
    level.transport.store = store


@pytest.mark.parametrize("async_io", [True, False], ids=["async", "sync"])
def test_full_node_local_level_mid_run(reference, comm, shared_tmp, async_io):
    fs = Tmpfs(comm, shared_tmp)
    try:
        def hook(levels):
            if fs.mounted:  # after two writes landed on every rank, the file system is full
                after_write(levels[-1], comm, 2, lambda step: fs.fill(free_pages=0))
            else:
                inject(levels[-1], 2, errno.ENOSPC)

        driver, result = run(reference, comm, {"disk": "5"}, "revolve", fs.path,
                             async_io=async_io, hook=hook)
        assert_identical(reference, driver, result)
        assert any("No space left" in f for f in driver.faults), (fs.how, driver.faults)
    finally:
        fs.close()


@pytest.mark.parametrize("async_io", [True, False], ids=["async", "sync"])
def test_directory_turns_read_only_mid_run(reference, comm, shared_tmp, async_io):
    fs = Tmpfs(comm, shared_tmp)
    try:
        def hook(levels):
            if fs.mounted:
                after_write(levels[-1], comm, 2, lambda step: fs.read_only())
            else:
                inject(levels[-1], 2, errno.EROFS)

        driver, result = run(reference, comm, {"ram": "1", "disk": "4"}, "multilevel", fs.path,
                             async_io=async_io, hook=hook)
        assert_identical(reference, driver, result)
        assert any("Read-only" in f for f in driver.faults), (fs.how, driver.faults)
    finally:
        fs.close()


def test_nothing_fits_is_unrecoverable_on_every_rank(reference, comm, shared_tmp):
    fs = Tmpfs(comm, shared_tmp)
    try:
        def hook(levels):
            fs.fill(free_pages=0)
            if not fs.mounted:
                inject(levels[-1], 0, errno.ENOSPC)

        with pytest.raises(Unrecoverable, match="nothing fits|no plan fits"):
            run(reference, comm, {"disk": "3"}, "revolve", fs.path, hook=hook)
    finally:
        fs.close()


# -- a flush or close failing on one rank only ----------------------------------------------------

def fail_on_last_rank(comm, obj, name, err, after=0):
    """On the last rank only, ``obj.<name>(...)`` fails with ``err`` from its ``after + 1``-th call
    on, after doing its work (HDF5's collective part included), as a flush or close reporting EIO."""
    if comm.rank != comm.size - 1:
        return
    real, count = getattr(obj, name), [0]

    def failing(*args, **kwargs):
        result = real(*args, **kwargs)
        count[0] += 1
        if count[0] > after:
            raise OSError(err, os.strerror(err) + " (injected)")
        return result
    setattr(obj, name, failing)


def h5_file(level):
    """The HDF5 transport of a parallel-HDF5 level, synchronous or asynchronous."""
    return getattr(level.transport, "h5", level.transport)


FLUSHES = [("h5", True), ("h5", False), ("raw", True)]


@pytest.mark.parametrize("what,async_io", FLUSHES, ids=["h5-async", "h5-sync", "raw-async"])
def test_hdf5_flush_failing_on_one_rank_mid_run(reference, comm, shared_tmp, what, async_io):
    """Kept, the file is flushed (``H5Fflush``) at its creation, before a new slot's first write
    and after each write, and the asynchronous raw writes are synced (``fdatasync``) on the I/O
    thread: from the third write on, every one fails on the last rank; the run re-plans."""
    def hook(levels):
        if what == "h5":
            fail_on_last_rank(comm, h5_file(levels[-1])._file, "flush", errno.EIO, after=5)
        else:
            fail_on_last_rank(comm, levels[-1].transport.raw, "sync", errno.EIO, after=2)

    driver, result = run(reference, comm, {"pfs": "4"}, "revolve", shared_tmp, async_io=async_io,
                         pfs_file=f"{shared_tmp}/ck-flush-{what}-{async_io}.h5", keep=True, hook=hook)
    assert_identical(reference, driver, result)
    assert any("Input/output error" in f for f in driver.faults), driver.faults


def stored_level(comm, shared_tmp, kind, async_io, keep, tag):
    """A level of ``kind`` holding two snapshots of the heat layout."""
    layout = HeatModel(comm, (12, 10), n_steps=4, dt=1e-3).snapshot_layout()
    level = make_level(kind, 3, layout, comm, local_dir=shared_tmp, async_io=async_io, keep=keep,
                       path=f"{shared_tmp}/ck-{tag}-{async_io}-{keep}.h5")
    snapshot = {f: np.full(tuple(lay.shape), 1.0 + comm.rank, dtype=lay.dtype) for f, lay in layout.items()}
    return level, snapshot


CLOSES = [("pfs", True, True, "raw"), ("pfs", False, True, "h5"), ("pfs", True, False, "remove"),
          ("pfs", False, False, "remove")]


@pytest.mark.parametrize("kind,async_io,keep,what", CLOSES, ids=["-".join(map(str, c)) for c in CLOSES])
def test_pfs_close_failing_on_one_rank_fails_on_every_rank(comm, shared_tmp, kind, async_io, keep, what,
                                                           monkeypatch):
    level, snapshot = stored_level(comm, shared_tmp, kind, async_io, keep, f"close-{what}")
    for step in (1, 2):
        level.write(step, snapshot)
    level.flush()
    if what == "raw":  # the descriptor of the raw writes (close(2) may report a late EIO)
        fail_on_last_rank(comm, level.transport.raw, "close", errno.EIO)
    elif what == "h5":
        fail_on_last_rank(comm, level.transport._file, "close", errno.EIO)
    elif comm.rank == 0:  # rank 0 alone removes a file not kept
        monkeypatch.setattr(os, "remove", lambda path: (_ for _ in ()).throw(
            OSError(errno.EROFS, os.strerror(errno.EROFS) + " (injected)")))
    with pytest.raises(LevelError, match="(injected)") as caught:
        level.close()
    monkeypatch.undo()
    assert len(set(comm.allgather(str(caught.value)))) == 1, str(caught.value)
    if comm.rank == 0 and os.path.exists(level.path) and not keep:
        os.remove(level.path)


@pytest.mark.parametrize("found_by,async_io", [("flush", True), ("flush", False), ("close", True)],
                         ids=["flush-async", "flush-sync", "close-async"])
def test_node_local_write_failing_on_one_rank_fails_flush_and_close_on_every_rank(
        comm, shared_tmp, async_io, found_by):
    """A write that failed on one rank, found only by the next flush, or by close (asynchronous: no
    later write or read of the level saw it): every rank raises the same failure and drops the
    same steps."""
    level, snapshot = stored_level(comm, shared_tmp, "local", async_io, False, "local")
    if comm.rank == comm.size - 1:
        inject(level, 1, errno.EIO)
    level.write(1, snapshot)
    try:
        level.write(2, snapshot)
    except LevelError:  # synchronous: the write itself fails on the last rank
        assert not async_io and comm.rank == comm.size - 1
    try:
        if found_by == "flush":
            with pytest.raises(WriteFailed, match=f"step 2 failed on rank {comm.size - 1}") as caught:
                level.flush()
            assert len(set(comm.allgather((str(caught.value), caught.value.step)))) == 1, str(caught.value)
            assert comm.allgather(sorted(level.valid_steps())) == [[1]] * comm.size
    finally:
        if found_by == "close":
            with pytest.raises(WriteFailed, match=f"step 2 failed on rank {comm.size - 1}") as caught:
                level.close()
            assert len(set(comm.allgather((str(caught.value), caught.value.step)))) == 1, str(caught.value)
        else:
            level.close()


# -- freeing a snapshot failing on one rank -------------------------------------------------------

def failing_unlink(comm, after=0):
    """On the last rank only, removing an HDF5 link fails (EIO) from the ``after + 1``-th removal on,
    after HDF5 removed it (a group's ``__delitem__``: the class, since h5py makes a new group object
    on every lookup). Returns what restores it."""
    import h5py

    real = h5py.Group.__delitem__
    fail_on_last_rank(comm, h5py.Group, "__delitem__", errno.EIO, after=after)
    return lambda: setattr(h5py.Group, "__delitem__", real)


@pytest.mark.parametrize("async_io", [True, False], ids=["async", "sync"])
def test_pfs_free_failing_on_one_rank_fails_on_every_rank(comm, shared_tmp, async_io):
    """Unlinking a freed snapshot fails on the last rank: every rank raises the same write failure,
    holds the same steps, and the level (its slot not reused) still writes and reads alike."""
    level, snapshot = stored_level(comm, shared_tmp, "pfs", async_io, False, "free")
    try:
        for step in (1, 2):
            level.write(step, snapshot)
        level.flush()
        restore = failing_unlink(comm)
        try:
            with pytest.raises(LevelError, match=r"freeing step 1 .*\(injected\)") as caught:
                level.free(1)
        finally:
            restore()
        assert caught.value.writing and caught.value.step == 1
        assert len(set(comm.allgather((str(caught.value), caught.value.step)))) == 1, str(caught.value)
        assert comm.allgather(sorted(level.valid_steps())) == [[2]] * comm.size
        level.write(3, snapshot)
        for step in (2, 3):
            assert all(np.array_equal(level.read(step)[f], snapshot[f]) for f in snapshot)
    finally:
        level.close()


@pytest.mark.parametrize("async_io", [True, False], ids=["async", "sync"])
def test_pfs_free_failing_on_one_rank_mid_run(reference, comm, shared_tmp, async_io):
    """In a real run the first free of the HDF5 level fails on the last rank: the run re-plans
    around the level on every rank and the gradient is bitwise the same."""
    restore = []
    try:
        driver, result = run(reference, comm, {"pfs": "4"}, "revolve", shared_tmp, async_io=async_io,
                             pfs_file=f"{shared_tmp}/ck-free-{async_io}.h5",
                             hook=lambda levels: restore.append(failing_unlink(comm)))
    finally:
        for undo in restore:
            undo()
    assert_identical(reference, driver, result)
    assert any("freeing step" in f and "(injected)" in f for f in driver.faults), driver.faults
    assert len(set(comm.allgather(tuple(driver.faults)))) == 1, driver.faults


def failing_on_every_rank(cls, name, err, when=lambda *args: True):
    """``cls.<name>(...)`` fails with ``err`` on every rank, before doing anything, where ``when``
    holds for its arguments (a metadata change that really failed). Returns what restores it."""
    real = getattr(cls, name)

    def failing(self, *args, **kwargs):
        if when(*args):
            raise OSError(err, os.strerror(err) + " (injected)")
        return real(self, *args, **kwargs)
    setattr(cls, name, failing)
    return lambda: setattr(cls, name, real)


REVOKES = {"link": ("step",), "link+slot": ("step",), "all": ("step", "revoked")}


@pytest.mark.parametrize("failing", list(REVOKES))
@pytest.mark.parametrize("async_io", [True, False], ids=["async", "sync"])
def test_pfs_snapshot_whose_free_really_failed_is_not_trusted_on_attach(comm, shared_tmp, async_io, failing):
    """The link's removal really fails on every rank (EIO, nothing removed; with "link+slot" marking
    its slot free too, with "all" also every later attribute write): a resume attaching the kept
    file holds no snapshot of the freed step, whose checksums would still match, and the same steps
    on every rank."""
    import h5py

    path = f"{shared_tmp}/ck-revoke-{failing}-{async_io}.h5"
    layout = HeatModel(comm, (12, 10), n_steps=4, dt=1e-3).snapshot_layout()
    level = make_level("pfs", 3, layout, comm, async_io=async_io, keep=True, path=path, run_id="revoke")
    snapshot = {f: np.full(tuple(lay.shape), 1.0 + comm.rank, dtype=lay.dtype) for f, lay in layout.items()}
    for step in (1, 2):
        level.write(step, snapshot)
    level.flush()
    names = REVOKES[failing]
    restore = [failing_on_every_rank(h5py.Group, "__delitem__", errno.EIO, lambda link: link == "step_1")]
    if failing != "link":
        restore.append(failing_on_every_rank(h5py.AttributeManager, "__setitem__", errno.EIO,
                                             lambda name, value: name in names))
    try:
        with pytest.raises(LevelError, match=r"freeing step 1 .*\(injected\)") as caught:
            level.free(1)
    finally:
        for undo in restore:
            undo()
    assert len(set(comm.allgather(str(caught.value)))) == 1, str(caught.value)
    level.close()
    again = make_level("pfs", 3, layout, comm, async_io=async_io, keep=True, path=path, run_id="revoke",
                       attach=True)
    try:
        held = sorted(again.valid_steps())
        assert 1 not in held, (held, again.attach_note, str(caught.value))
        assert comm.allgather(held) == [held] * comm.size
        assert held == ([] if failing == "all" else [2]), (held, again.attach_note)
        for step in held:
            assert all(np.array_equal(again.read(step)[f], snapshot[f]) for f in snapshot)
    finally:
        again.close()
    if comm.rank == 0 and os.path.exists(path):
        os.remove(path)
