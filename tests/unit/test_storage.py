"""Storage levels in one process: node-local files (async and not), RAM checksums, the factory,
capacity, async ordering, bounded buffers, prefetch, error propagation and stale-file rejection."""

import os
import shutil
import time
import zlib

import numpy as np
import pytest

from hpcadj.checkpoint.storage import (CorruptSnapshot, LevelError, LocalLevel, RamLevel,
                                       make_level, resolve_local_dir)
from hpcadj.checkpoint.storage.checksum import block_checksum
from hpcadj.checkpoint.storage.pfs import contiguous_in_file
from hpcadj.snapshot import FieldLayout


LAYOUT = {"u": FieldLayout((5, 4), (0, 0), (5, 4)),
          "q": FieldLayout((2, 3, 4), (0, 0, 0), (2, 3, 4), "float32")}


def snap(step):
    """Random bits per step (NaN payloads included): bitwise comparisons mean something."""
    rng = np.random.default_rng(step)
    return {k: rng.integers(0, 256, lay.local_nbytes, dtype=np.uint8).view(lay.dtype)
            .reshape(lay.shape) for k, lay in LAYOUT.items()}


def same(a, b):
    return set(a) == set(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        and a[k].tobytes() == b[k].tobytes() for k in a)


def local(tmp_path, **kw):
    return LocalLevel(kw.pop("capacity", 3), LAYOUT, local_dir=str(tmp_path), **kw)


class HookedLocal(LocalLevel):
    """A node-local level whose transport's writes go through ``self.before(step)`` first (runs
    where the write runs: on the I/O thread when asynchronous)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        real = self.transport.store

        def store(step, snapshot, t, token=None):
            self.before(step)
            return real(step, snapshot, t, token)
        self.transport.store = store

    def before(self, step):
        pass


def test_checksum_is_zlib_crc32_of_c_order_bytes():
    a = np.arange(12.0).reshape(3, 4)
    assert block_checksum(a) == zlib.crc32(a.tobytes())
    assert block_checksum(a.T) == zlib.crc32(np.ascontiguousarray(a.T).tobytes())


def test_local_dir_precedence(monkeypatch):
    for var in ("HPCADJ_LOCAL_DIR", "SLURM_TMPDIR", "TMPDIR"):
        monkeypatch.delenv(var, raising=False)
    assert resolve_local_dir() == "/tmp"
    monkeypatch.setenv("TMPDIR", "/t")
    assert resolve_local_dir() == "/t"
    monkeypatch.setenv("SLURM_TMPDIR", "/s")
    assert resolve_local_dir() == "/s"
    monkeypatch.setenv("HPCADJ_LOCAL_DIR", "/h")
    assert resolve_local_dir() == "/h"
    assert resolve_local_dir("/explicit") == "/explicit"


@pytest.mark.parametrize("async_io", [True, False])
def test_local_round_trip_bitwise_and_stats(tmp_path, async_io):
    level = local(tmp_path, async_io=async_io)
    for step in (0, 3, 7):
        level.write(step, snap(step), time=step * 0.1)
    assert same(level.read(3), snap(3)) and same(level.read(0), snap(0))
    level.free(3)
    level.write(8, snap(8))
    assert same(level.read(8), snap(8))
    level.flush()
    nbytes = sum(lay.local_nbytes for lay in LAYOUT.values())
    s = level.stats
    assert (s.writes, s.reads, s.peak_slots) == (4, 3, 3)
    assert (s.bytes_written, s.bytes_read) == (4 * nbytes, 3 * nbytes)
    level.close()


def test_capacity_and_duplicates_enforced(tmp_path):
    level = local(tmp_path, capacity=2)
    level.write(0, snap(0))
    level.write(1, snap(1))
    with pytest.raises(LevelError, match="full"):
        level.write(2, snap(2))
    with pytest.raises(LevelError, match="already stored"):
        level.write(1, snap(1))
    with pytest.raises(LevelError, match="not stored"):
        level.read(5)
    level.free(0)
    level.write(2, snap(2))
    assert same(level.read(2), snap(2))
    level.close()


def test_layout_mismatch_rejected(tmp_path):
    level = local(tmp_path)
    bad = snap(0)
    bad["u"] = bad["u"][:4]
    with pytest.raises(LevelError, match="layout"):
        level.write(0, bad)
    level.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "grow"])
@pytest.mark.parametrize("async_io", [True, False])
def test_local_damage_detected(tmp_path, damage, async_io):
    level = local(tmp_path, async_io=async_io)
    level.write(4, snap(4))
    level.flush()
    path = level.path(4)
    if damage == "delete":
        os.remove(path)
    elif damage == "truncate":
        os.truncate(path, os.path.getsize(path) - 1)
    elif damage == "grow":
        with open(path, "ab") as f:
            f.write(b"\0")
    else:
        with open(path, "r+b") as f:
            f.seek(-40, os.SEEK_END)
            b = f.read(1)
            f.seek(-40, os.SEEK_END)
            f.write(bytes([b[0] ^ 0x10]))
    with pytest.raises(CorruptSnapshot) as info:
        level.read(4)
    assert (info.value.level, info.value.step, info.value.ranks) == ("local", 4, (0,))
    level.close()


def test_stale_file_of_another_run_never_read(tmp_path):
    old = local(tmp_path, run_id="old-run", keep=True)
    old.write(3, snap(3))
    old.close()
    new = local(tmp_path, run_id="new-run")
    assert new.directory != old.directory
    new.write(3, snap(30))
    assert same(new.read(3), snap(30))
    shutil.copyfile(old.path(3), new.path(3))
    with pytest.raises(CorruptSnapshot, match="another run"):
        new.read(3)
    new.close()
    reused = local(tmp_path, run_id="old-run")
    assert os.path.exists(reused.path(3))
    reused.write(3, snap(31))
    assert same(reused.read(3), snap(31))
    reused.close()


def test_files_removed_at_close_unless_kept(tmp_path):
    level = local(tmp_path)
    level.write(1, snap(1))
    level.write(2, snap(2))
    level.close()
    assert os.listdir(tmp_path) == []
    kept = local(tmp_path, keep=True, run_id="keepme")
    kept.write(1, snap(1))
    kept.close()
    assert sorted(os.listdir(os.path.join(tmp_path, "hpcadj-keepme", "rank0"))) == [
        "LAYOUT.json", "step_00000001.snap"]


def test_unwritable_directory_raises_at_construction(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"x")
    with pytest.raises(LevelError, match="not usable"):
        LocalLevel(1, LAYOUT, local_dir=str(blocker))


def test_failed_atomic_write_leaves_no_snapshot(tmp_path, monkeypatch):
    level = local(tmp_path, async_io=False, fsync=True)

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(LevelError, match="No space left"):
        level.write(5, snap(5))
    monkeypatch.undo()
    assert os.listdir(level.directory) == ["LAYOUT.json"]
    level.close()


class SlowLocal(HookedLocal):
    """A node-local level whose writes take ``delay`` seconds on the I/O thread."""

    delay = 0.15

    def before(self, step):
        time.sleep(self.delay)


def test_async_write_returns_early_then_read_waits_for_it(tmp_path):
    level = SlowLocal(3, LAYOUT, local_dir=str(tmp_path))
    buffer = snap(1)
    t0 = time.perf_counter()
    level.write(1, buffer)
    assert time.perf_counter() - t0 < SlowLocal.delay / 2
    for a in buffer.values():
        a[...] = 0
    assert same(level.read(1), snap(1))
    assert level.stats.wait_s > SlowLocal.delay / 2
    assert level.stats.write_s >= SlowLocal.delay
    level.close()


def test_in_flight_copies_are_bounded(tmp_path):
    level = SlowLocal(6, LAYOUT, local_dir=str(tmp_path), queue_depth=2, prefetch_depth=1)
    t0 = time.perf_counter()
    for step in range(4):
        level.write(step, snap(step))
    assert time.perf_counter() - t0 >= SlowLocal.delay
    assert level.stats.wait_s > 0
    level.prefetch(0)
    level.prefetch(1)
    assert level.stats.prefetches == 1
    assert same(level.read(0), snap(0))
    level.flush()
    assert 2 <= level.stats.peak_buffers <= 3
    level.close()


def test_prefetch_reads_ahead(tmp_path):
    level = local(tmp_path)
    level.write(2, snap(2))
    level.prefetch(2)
    level.flush()
    read_s = level.stats.read_s
    assert read_s > 0 and level.stats.bytes_read > 0
    assert same(level.read(2), snap(2))
    assert level.stats.read_s == read_s and level.stats.prefetch_hits == 1
    level.prefetch(9)
    assert level.stats.prefetches == 1
    level.close()


class FailingLocal(HookedLocal):
    """Writes of step 13 fail on the I/O thread."""

    def before(self, step):
        if step == 13:
            raise OSError(5, "Input/output error (injected)")


def test_io_thread_error_raised_at_next_call(tmp_path):
    level = FailingLocal(3, LAYOUT, local_dir=str(tmp_path))
    level.write(13, snap(13))
    deadline = time.monotonic() + 5
    while level.failure is None and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(LevelError, match="injected") as info:
        level.write(14, snap(14))
    assert isinstance(info.value.__cause__, OSError)
    level.close()
    assert os.listdir(tmp_path) == []
    assert not level.io.worker.alive


def test_io_thread_error_not_lost_at_close(tmp_path):
    level = FailingLocal(3, LAYOUT, local_dir=str(tmp_path))
    level.write(12, snap(12))
    level.write(13, snap(13))
    with pytest.raises(LevelError, match="injected"):
        level.close()
    assert os.listdir(tmp_path) == []
    assert not level.io.worker.alive


def test_ram_copies_views_and_reuses_freed_slots():
    """A write keeps a private copy (a later change to the caller's view does not reach it); a freed
    slot's arrays take the next write, and the step still stored is never overwritten."""
    level = RamLevel(2, LAYOUT)
    source = {k: v.copy() for k, v in snap(1).items()}
    strided = {k: v[...] for k, v in source.items()}
    level.write(1, strided)
    level.write(2, snap(2))
    for v in source.values():
        v.view(np.uint8)[...] = 0
    assert same(level.read(1), snap(1))
    freed = level.read(1)["u"]
    level.free(1)
    level.write(3, snap(3))
    assert level.read(3)["u"] is freed, "the freed slot's array was not reused"
    assert same(level.read(3), snap(3)) and same(level.read(2), snap(2))
    assert not level.read(3)["u"].flags.writeable
    column = {"u": np.asfortranarray(snap(4)["u"]), "q": snap(4)["q"][:, ::-1, :]}
    level.free(3)
    level.write(4, column)
    assert same(level.read(4), {k: np.ascontiguousarray(v) for k, v in column.items()})


def test_ram_holds_donated_snapshots_by_reference():
    """A donated snapshot is held as it is (no copy; read-only to readers, the donor's arrays keep
    their flags); freeing it hands nothing to the copy spares, so a later copy never lands in it."""
    level = RamLevel(2, LAYOUT, verify=True)
    donor = {k: v.copy() for k, v in snap(1).items()}
    level.write(1, donor, donate=True)
    held = level.read(1)
    assert all(np.shares_memory(held[k], donor[k]) for k in donor)
    assert not held["u"].flags.writeable and donor["u"].flags.writeable
    assert level.stats.zero_copy == 1
    level.write(2, snap(2))
    assert not np.shares_memory(level.read(2)["u"], snap(2)["u"])
    level.free(1)
    level.write(3, snap(3))
    assert not any(np.shares_memory(level.read(3)[k], donor[k]) for k in donor)
    assert same(level.read(3), snap(3)) and same(donor, snap(1))


def test_ram_verify_detects_corruption():
    level = RamLevel(2, LAYOUT, verify=True)
    level.write(0, snap(0))
    assert same(level.read(0), snap(0))
    stored = level.read(0)["u"]
    stored.flags.writeable = True
    stored.view(np.uint8)[0, 0] ^= 1
    with pytest.raises(CorruptSnapshot):
        level.read(0)


def test_factory_kinds(tmp_path):
    ram = make_level("ram", 2, LAYOUT)
    assert isinstance(ram, RamLevel) and ram.capacity == 2
    loc = make_level("local", 2, LAYOUT, local_dir=str(tmp_path), run_id="f1", async_io=False)
    assert isinstance(loc, LocalLevel) and not loc.async_io and loc.run_id == "f1"
    loc.close()
    with pytest.raises(ValueError, match="unknown level kind"):
        make_level("tape", 1, LAYOUT)


@pytest.mark.parametrize("start,shape,expected", [
    ((2, 0, 0), (3, 5, 4), True),     # slowest-axis split: whole planes
    ((1, 2, 0), (1, 2, 4), True),     # part of one plane, whole rows
    ((0, 2, 0), (3, 2, 4), False),    # middle-axis split: strided
    ((0, 0, 1), (1, 1, 2), True),     # part of one row
    ((0, 0, 1), (1, 2, 2), False),
    ((0, 0, 0), (0, 5, 4), True),     # empty
])
def test_contiguous_in_file(start, shape, expected):
    assert contiguous_in_file((6, 5, 4), start, shape) is expected


# -- faults the re-planner relies on, and attach -------------------------------------------------

class FailFrom(HookedLocal):
    """Writes of steps >= ``fail_from`` fail on the I/O thread with ENOSPC."""

    fail_from = 10 ** 9

    def before(self, step):
        if step >= self.fail_from:
            raise OSError(28, "No space left on device (injected)")


@pytest.mark.parametrize("async_io", [True, False], ids=["async", "sync"])
def test_failed_write_keeps_completed_snapshots_and_flush_raises_once(tmp_path, async_io):
    level = FailFrom(6, LAYOUT, local_dir=str(tmp_path), async_io=async_io)
    level.fail_from = 3
    level.write(1, snap(1))
    level.write(2, snap(2))
    raised = []
    for step in (3, 4):  # async: 3 fails in the background, 4 is refused or skipped
        try:
            level.write(step, snap(step))
        except LevelError as exc:
            raised.append(exc)
    if not async_io:
        assert raised and raised[0].step == 3 and raised[0].writing is True
    with pytest.raises(LevelError, match="No space left") as info:
        level.flush()
    assert info.value.step == 3 and info.value.writing is True
    level.flush()  # once
    assert level.valid_steps() == {1, 2}
    assert level.occupied == 2
    assert same(level.read(1), snap(1)) and same(level.read(2), snap(2))
    assert sorted(os.listdir(level.directory)) == ["LAYOUT.json", "step_00000001.snap",
                                                   "step_00000002.snap"]
    try:  # the device is still full: raised here (sync) or in the background (async)
        level.write(5, snap(5))
    except LevelError:
        pass
    with pytest.raises(LevelError):
        level.flush()
    level.flush()
    assert level.valid_steps() == {1, 2}
    level.free(1)
    level.close()
    assert os.listdir(tmp_path) == []


def test_discard_never_raises_in_any_state(tmp_path):
    level = FailFrom(6, LAYOUT, local_dir=str(tmp_path))
    level.fail_from = 5
    for step in range(1, 6):
        level.write(step, snap(step))
    level.prefetch(1)
    os.remove(level.path(2))
    level.discard(1)   # prefetched
    level.discard(2)   # file missing
    level.discard(5)   # failed write (possibly still pending)
    level.discard(3)
    level.discard(99)  # never stored
    with pytest.raises(LevelError):
        level.flush()
    assert level.valid_steps() == {4}
    assert same(level.read(4), snap(4))
    level.close()
    level.discard(4)   # closed


@pytest.mark.parametrize("damage", ["corrupt", "truncate", "delete"])
def test_corrupt_snapshot_leaves_valid_steps_and_level_usable(tmp_path, damage):
    level = local(tmp_path)
    level.write(1, snap(1))
    level.write(2, snap(2))
    level.flush()
    path = level.path(2)
    if damage == "corrupt":
        with open(path, "r+b") as f:
            f.seek(-3, os.SEEK_END)
            b = f.read(1)
            f.seek(-3, os.SEEK_END)
            f.write(bytes([b[0] ^ 0x40]))
    elif damage == "truncate":
        os.truncate(path, os.path.getsize(path) - 5)
    else:
        os.remove(path)
    with pytest.raises(CorruptSnapshot):
        level.read(2)
    assert level.valid_steps() == {1}
    level.flush()
    assert level.occupied == 1 and not os.path.exists(path)
    level.write(2, snap(2))
    assert same(level.read(2), snap(2)) and same(level.read(1), snap(1))
    level.close()


def test_attach_holds_valid_files_and_removes_the_rest(tmp_path):
    first = local(tmp_path, capacity=6, keep=True, run_id="r1")
    for step in (0, 3, 5, 7):
        first.write(step, snap(step), time=step * 0.5)
    first.flush()
    d = first.directory
    first.close()  # keep: files stay (a killed process leaves the same)
    with open(os.path.join(d, "step_00000005.snap"), "r+b") as f:  # damage 5, truncate 7
        f.seek(-1, os.SEEK_END)
        last = f.read(1)[0]
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last ^ 0x01]))
    os.truncate(os.path.join(d, "step_00000007.snap"), 100)
    open(os.path.join(d, ".step_00000009.snap.tmp"), "wb").write(b"partial")
    shutil.copy(os.path.join(d, "step_00000003.snap"), os.path.join(d, "step_00000004.snap"))
    again = make_level("local", 6, LAYOUT, local_dir=str(tmp_path), run_id="r1", attach=True)
    expected = {0, 3}  # 4 is a copy of 3: its header names step 3
    assert again.valid_steps() == expected
    assert same(again.read(0), snap(0)) and same(again.read(3), snap(3))
    assert again.times[3] == 1.5
    assert sorted(os.listdir(d)) == ["LAYOUT.json"] + [f"step_{s:08d}.snap" for s in sorted(expected)]
    again.write(4, snap(4))
    assert same(again.read(4), snap(4))
    again.keep = True  # set after construction: honoured by close
    again.close()
    assert "step_00000004.snap" in os.listdir(d)
    third = make_level("local", 6, LAYOUT, local_dir=str(tmp_path), run_id="r1", attach=True)
    assert third.valid_steps() == expected | {4}
    third.close()
    assert not os.path.exists(d)


def test_attach_refuses_another_rank_layout(tmp_path):
    first = local(tmp_path, keep=True, run_id="r2")
    first.write(1, snap(1))
    first.close()
    os.makedirs(os.path.join(tmp_path, "hpcadj-r2", "rank1"))  # as if 2 ranks had written
    with pytest.raises(LevelError, match="more ranks"):
        make_level("local", 3, LAYOUT, local_dir=str(tmp_path), run_id="r2", attach=True)
    os.rmdir(os.path.join(tmp_path, "hpcadj-r2", "rank1"))
    other = {"u": FieldLayout((5, 4), (0, 0), (5, 4)), "q": FieldLayout((2, 3, 4), (0, 0, 0), (2, 3, 4))}
    with pytest.raises(LevelError, match="blocks differ"):
        make_level("local", 3, other, local_dir=str(tmp_path), run_id="r2", attach=True)
    ok = make_level("local", 3, LAYOUT, local_dir=str(tmp_path), run_id="r2", attach=True)
    assert ok.valid_steps() == {1}
    ok.close()


@pytest.mark.parametrize("global_shape", [(7,), (5, 6), (4, 5, 6)])
def test_raw_runs_place_any_block_exactly_in_its_global_array(tmp_path, global_shape):
    """file_runs + write_runs put a block where h5py's natural-order slice is, touching nothing else;
    read_runs brings it back (every start/shape, empty blocks and whole arrays included)."""
    from hpcadj.checkpoint.storage.rawio import file_runs, read_runs, write_runs

    rng = np.random.default_rng(len(global_shape))
    header = 100
    for trial in range(40):
        start = tuple(int(rng.integers(0, g)) for g in global_shape)
        shape = tuple(int(rng.integers(0, g - s + 1)) for g, s in zip(global_shape, start))
        if trial == 0:
            start, shape = (0,) * len(global_shape), global_shape
        block = rng.random(shape)
        path = tmp_path / f"raw{trial}"
        path.write_bytes(b"\0" * (header + 8 * int(np.prod(global_shape))))
        fd = os.open(path, os.O_RDWR)
        try:
            runs = file_runs(global_shape, start, shape, 8, header)
            write_runs(fd, block, runs)
            back = np.empty(shape)
            read_runs(fd, back, runs)
        finally:
            os.close(fd)
        data = np.frombuffer(path.read_bytes()[header:], dtype=np.float64).reshape(global_shape)
        window = tuple(slice(s, s + n) for s, n in zip(start, shape))
        assert np.array_equal(data[window], block) and np.array_equal(back, block)
        outside = np.ones(global_shape, bool)
        outside[window] = False
        assert not data[outside].any()
        assert len(runs) <= max(1, int(np.prod(shape[:-1])))


class _Tracked(np.ndarray):
    """An array type that weak references can follow (plain ndarrays allow them too; a subclass
    keeps the test independent of that)."""


@pytest.mark.parametrize("delay", [0.0, 0.05])
def test_donated_snapshots_are_released_at_the_same_plan_point_however_fast_the_io(tmp_path, delay):
    """Releasing a donated snapshot as soon as its write happened to finish made ranks destroy
    their Vecs at different points (their petsc4py garbage lists differed: PetscFinalize hung).
    With ``queue_depth`` 2 the donated snapshot of write k goes exactly at write k + 2 or flush,
    whether the I/O thread is instantaneous or slow."""
    import weakref

    SlowLocal.delay, old = delay, SlowLocal.delay
    try:
        level = SlowLocal(6, LAYOUT, local_dir=str(tmp_path), queue_depth=2)
        alive = []
        for step in range(4):
            snapshot = {k: v.view(_Tracked) for k, v in snap(step).items()}
            alive.append(weakref.ref(snapshot["u"]))
            level.write(step, snapshot, donate=True)
            del snapshot
            time.sleep(2 * delay + 0.02)  # every write queued so far has finished
            assert [ref() is not None for ref in alive] == [s >= step - 1 for s in range(step + 1)], step
        level.flush()
        assert all(ref() is None for ref in alive)
        assert all(same(level.read(s), snap(s)) for s in range(4))
        level.close()
    finally:
        SlowLocal.delay = old


@pytest.mark.parametrize("async_io", [True, False], ids=["async", "sync"])
def test_write_failures_are_typed_with_their_fields_set_by_the_constructor(tmp_path, async_io):
    from hpcadj.checkpoint.storage.base import LevelFault, WriteFailed

    level = FailFrom(4, LAYOUT, local_dir=str(tmp_path), async_io=async_io)
    level.fail_from = 2
    level.write(1, snap(1))
    try:
        level.write(2, snap(2))
    except LevelError:
        pass
    with pytest.raises(WriteFailed) as info:
        level.flush()
    assert isinstance(info.value, LevelFault)
    assert (info.value.level, info.value.step, info.value.writing) == ("local", 2, True)
    level.close()


def test_survey_keeps_what_survived_and_discards_the_rest(tmp_path):
    from hpcadj.checkpoint.storage.survey import survey

    ram = RamLevel(4, LAYOUT)
    disk = FailFrom(4, LAYOUT, local_dir=str(tmp_path), async_io=True)
    disk.fail_from = 7
    for step in (0, 3, 5):
        ram.write(step, snap(step))
    for step in (2, 6, 7):
        try:
            disk.write(step, snap(step))
        except LevelError:
            pass
    ram_left, disk_left = survey([ram, disk], None, failed={0}, keep=lambda step: step < 5)
    assert (ram_left.steps, ram_left.failed, ram_left.error) == ({0, 3}, True, None)
    assert ram.valid_steps() == {0, 3}  # 5 is beyond what is wanted: discarded
    assert disk_left.steps == {2} and disk_left.failed and disk_left.error.step == 7
    assert disk.valid_steps() == {2}
    listed, = survey([ram], None, flush=False, listed=[{3}], discard=False)
    assert listed.steps == {3} and not listed.failed and ram.valid_steps() == {0, 3}
    disk.close()
