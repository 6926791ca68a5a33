"""Node-local and parallel-HDF5 levels on every rank: bitwise round trips, agreed corruption
detection, the HDF5 file as a plain h5py user sees it, and clean-up."""

import os
import zlib

import numpy as np
import pytest
from mpi4py import MPI  # initialise MPI (THREAD_MULTIPLE) before the comm fixture starts PETSc

from hpcadj.checkpoint.storage import CorruptSnapshot, LevelError, make_level
from hpcadj.snapshot import FieldLayout


def _split(n, size, rank, weights=None):
    """Uneven split of n items: rank r gets a share growing with r (some may get none)."""
    w = weights or [r + 1 for r in range(size)]
    edges = np.floor(np.cumsum([0] + w) / sum(w) * n).astype(int)
    return int(edges[rank]), int(edges[rank + 1] - edges[rank])


def _layout(comm):
    """Three fields: 2-D split on the slow axis, 3-D split on the middle axis, a tiny 2-D field
    with fewer rows than ranks at 3 ranks (an empty block), each with its own dtype."""
    r, p = comm.rank, comm.size
    s0, n0 = _split(7, p, r)
    s1, n1 = _split(5, p, r)
    s2, n2 = _split(2, p, r, weights=[1] * p)
    return {
        "u": FieldLayout((7, 6), (s0, 0), (n0, 6), "float64"),
        "w": FieldLayout((3, 5, 4), (0, s1, 0), (3, n1, 4), "float32"),
        "c": FieldLayout((2, 3), (s2, 0), (n2, 3), "int64"),
    }


def _global(step, name, lay):
    """The global field at ``step``: random bits (NaN payloads included), same on every rank."""
    rng = np.random.default_rng(1000 * step + sum(map(ord, name)))
    dt = np.dtype(lay.dtype)
    bits = rng.integers(0, 256, size=int(np.prod(lay.global_shape)) * dt.itemsize, dtype=np.uint8)
    return bits.view(dt).reshape(lay.global_shape)


def _snapshot(step, layout):
    return {k: _global(step, k, lay)[lay.slices].copy() for k, lay in layout.items()}


def _same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


def _make(kind, comm, tmp, layout, **kw):
    return make_level(kind, kw.pop("capacity", 3), layout, comm, local_dir=tmp,
                      path=os.path.join(tmp, "ck.h5"), **kw)


@pytest.mark.parametrize("kind,collective", [("local", None), ("pfs", "auto"), ("pfs", "always")])
@pytest.mark.parametrize("async_io", [True, False])
def test_round_trip_bitwise_with_reuse_and_prefetch(comm, shared_tmp, kind, collective, async_io):
    layout = _layout(comm)
    extra = {"collective": collective} if collective else {}
    level = _make(kind, comm, shared_tmp, layout, async_io=async_io, **extra)
    assert level.async_io == async_io and MPI.Query_thread() == MPI.THREAD_MULTIPLE
    for step in (0, 4, 9):
        level.write(step, _snapshot(step, layout), time=0.5 * step)
    level.prefetch(9)
    for step in (9, 4):
        got = level.read(step)
        assert set(got) == set(layout)
        for k in layout:
            assert _same_bits(got[k], _snapshot(step, layout)[k]), (kind, step, k)
    level.free(4)
    level.write(12, _snapshot(12, layout))
    level.prefetch(12)
    for step in (12, 0):
        got = level.read(step)
        assert all(_same_bits(got[k], _snapshot(step, layout)[k]) for k in layout)
    level.flush()
    nbytes = sum(lay.local_nbytes for lay in layout.values())
    st = level.stats
    assert (st.writes, st.reads, st.peak_slots) == (4, 4, 3)
    assert st.bytes_written == 4 * nbytes and st.bytes_read == 4 * nbytes
    assert st.write_s > 0 and st.read_s > 0
    assert st.prefetch_hits == (2 if async_io else 0)
    level.close()


def test_pfs_file_readable_with_plain_h5py(comm, shared_tmp):
    layout = _layout(comm)
    path = os.path.join(shared_tmp, "kept.h5")
    level = make_level("pfs", 2, layout, comm, path=path, keep=True, run_id="kept-run")
    level.write(3, _snapshot(3, layout), time=1.25)
    level.write(5, _snapshot(5, layout))
    level.free(5)
    level.write(8, _snapshot(8, layout), time=2.0)
    level.close()
    everyone = comm.allgather({k: (lay.start, lay.shape) for k, lay in layout.items()})
    comm.Barrier()
    if comm.rank == 0:
        import h5py

        with h5py.File(path, "r") as f:
            assert f.attrs["format"] == "hpcadj-checkpoints-1"
            assert f.attrs["run_id"] == "kept-run" and f.attrs["nranks"] == comm.size
            assert sorted(f["snapshots"]) == ["step_3", "step_8"]
            assert f["snapshots/step_3"].attrs["time"] == 1.25
            assert f["snapshots/step_8"].attrs["step"] == 8
            for step in (3, 8):
                g = f[f"snapshots/step_{step}"]
                for k, lay in layout.items():
                    want = _global(step, k, lay)
                    assert _same_bits(g[k][...], want)
                    starts = [e[k][0] for e in everyone]
                    shapes = [e[k][1] for e in everyone]
                    assert np.array_equal(g[k].attrs["rank_starts"], starts)
                    assert np.array_equal(g[k].attrs["rank_shapes"], shapes)
                    crcs = [zlib.crc32(np.ascontiguousarray(
                        want[tuple(slice(a, a + n) for a, n in zip(s, sh))]).tobytes())
                        for s, sh in zip(starts, shapes)]
                    assert list(g[k].attrs["crc32"]) == crcs
        os.remove(path)


def _flip_pfs_byte(level, comm, step, field, victim):
    """Flip one byte of ``victim``'s block of ``field`` in the HDF5 file (rank 0 edits it)."""
    level.flush()
    lay = level.layout[field]
    _path, offset, _itemsize = level.locate(step, field)
    start = comm.bcast(lay.start if comm.rank == victim else None, root=victim)
    if comm.rank == 0:
        index = int(np.ravel_multi_index(start, lay.global_shape)) * np.dtype(lay.dtype).itemsize
        with open(level.path, "r+b") as f:
            f.seek(offset + index)
            b = f.read(1)
            f.seek(offset + index)
            f.write(bytes([b[0] ^ 0xFF]))
    comm.Barrier()


@pytest.mark.parametrize("async_io", [True, False])
def test_pfs_corruption_detected_on_every_rank(comm, shared_tmp, async_io):
    layout = _layout(comm)
    level = _make("pfs", comm, shared_tmp, layout, async_io=async_io)
    level.write(1, _snapshot(1, layout))
    level.write(2, _snapshot(2, layout))
    victim = comm.size - 1
    _flip_pfs_byte(level, comm, 1, "u", victim)
    with pytest.raises(CorruptSnapshot) as info:
        level.read(1)
    assert info.value.ranks == (victim,) and info.value.step == 1 and info.value.level == "pfs"
    got = level.read(2)
    assert all(_same_bits(got[k], _snapshot(2, layout)[k]) for k in layout)
    level.close()
    assert not os.path.exists(level.path)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_local_damage_on_one_rank_detected_on_every_rank(comm, shared_tmp, damage):
    layout = _layout(comm)
    level = _make("local", comm, shared_tmp, layout)
    level.write(6, _snapshot(6, layout))
    level.flush()
    victim = comm.size - 1
    if comm.rank == victim:
        path = level.path(6)
        if damage == "delete":
            os.remove(path)
        elif damage == "truncate":
            os.truncate(path, os.path.getsize(path) - 3)
        else:
            with open(path, "r+b") as f:
                f.seek(-1, os.SEEK_END)
                b = f.read(1)
                f.seek(-1, os.SEEK_END)
                f.write(bytes([b[0] ^ 0x01]))
    comm.Barrier()
    level.prefetch(6)
    with pytest.raises(CorruptSnapshot) as info:
        level.read(6)
    assert info.value.ranks == (victim,) and info.value.step == 6
    level.close()


@pytest.mark.parametrize("kind", ["local", "pfs"])
def test_no_files_left_after_close(comm, shared_tmp, kind):
    layout = _layout(comm)
    sub = os.path.join(shared_tmp, f"clean-{kind}")
    if comm.rank == 0:
        os.makedirs(sub)
    comm.Barrier()
    level = make_level(kind, 2, layout, comm, local_dir=sub, path=os.path.join(sub, "c.h5"))
    level.write(0, _snapshot(0, layout))
    level.write(1, _snapshot(1, layout))
    level.read(0)
    level.close()
    comm.Barrier()
    assert os.listdir(sub) == []


def test_pfs_unwritable_path_raises_on_every_rank(comm, shared_tmp):
    with pytest.raises(LevelError, match="cannot create"):
        make_level("pfs", 1, _layout(comm), comm, path=os.path.join(shared_tmp, "no", "such", "x.h5"))


def test_two_async_pfs_levels_share_the_collective_order(comm, shared_tmp):
    """Two asynchronous HDF5 levels interleaved in plan order keep their collective calls matched."""
    layout = _layout(comm)
    a = make_level("pfs", 2, layout, comm, path=os.path.join(shared_tmp, "a.h5"), name="pfs-a")
    b = make_level("pfs", 2, layout, comm, path=os.path.join(shared_tmp, "b.h5"), name="pfs-b")
    for step in range(4):
        (a if step % 2 else b).write(step, _snapshot(step, layout))
    a.prefetch(3)
    b.prefetch(2)
    assert _same_bits(b.read(2)["u"], _snapshot(2, layout)["u"])
    assert _same_bits(a.read(3)["w"], _snapshot(3, layout)["w"])
    a.close()
    assert _same_bits(b.read(0)["c"], _snapshot(0, layout)["c"])
    b.close()


@pytest.mark.parametrize("kind", ["local", "pfs"])
def test_donated_vec_views_are_written_after_the_vec_is_dropped(comm, shared_tmp, kind):
    """A donated view of a PETSc Vec is written without a copy, and correctly even when the Vec
    itself was dropped and garbage-collected (and its memory could be reused) before the write ran."""
    from hpcadj.imports import petsc

    PETSc = petsc()
    lay = {"u": FieldLayout((6 * comm.size, 5000), (6 * comm.rank, 0), (6, 5000), "float64")}
    level = _make(kind, comm, shared_tmp, lay, capacity=4, queue_depth=2)
    expected = {}
    for step in range(4):
        vec = PETSc.Vec().createMPI((6 * 5000, None), comm=comm)
        values = np.random.default_rng(10 * step + comm.rank).random(6 * 5000)
        vec.getArray()[...] = values
        expected[step] = values.reshape(6, 5000)
        level.write(step, {"u": vec.getArray(readonly=True).reshape(6, 5000)}, donate=True)
        del vec
        PETSc.garbage_cleanup(comm)
        noise = [PETSc.Vec().createMPI((6 * 5000, None), comm=comm) for _ in range(3)]
        for other in noise:
            other.set(-1.0)
    level.flush()
    assert level.stats.zero_copy == 4 and level.stats.stage_s == 0.0
    for step in range(4):
        assert np.array_equal(level.read(step)["u"], expected[step]), step
    level.close()


def test_undonated_snapshots_are_copied_and_donated_strided_views_written_as_given(comm, shared_tmp):
    """Without ``donate`` the level copies at once (the caller may reuse its buffer); a donated
    strided view (a component of an interleaved state) is taken as it is and lands in C order."""
    layout = _layout(comm)
    level = _make("pfs", comm, shared_tmp, layout, capacity=3)
    buffer = _snapshot(0, layout)
    level.write(0, buffer)
    for a in buffer.values():
        a[...] = 0
    assert level.stats.zero_copy == 0
    wide = {k: np.stack([v, v], axis=-1) for k, v in _snapshot(1, layout).items()}
    level.write(1, {k: v[..., 0] for k, v in wide.items()}, donate=True)
    level.flush()
    assert level.stats.zero_copy == 1
    for step in (0, 1):
        got = level.read(step)
        assert all(_same_bits(got[k], _snapshot(step, layout)[k]) for k in layout), step
    level.close()


class _Tracked(bytearray):
    """Memory that records which thread released it (a stand-in for a PETSc Vec's array)."""

    released_on: list = []

    def __del__(self):
        import threading

        _Tracked.released_on.append(threading.current_thread().name)


@pytest.mark.parametrize("kind", ["local", "pfs"])
def test_donated_snapshots_are_released_on_the_callers_thread(comm, shared_tmp, kind):
    """Dropping the last reference to a donated Vec view may destroy the Vec: that must happen on
    the thread that calls PETSc, never on the I/O thread, however fast the writes finish."""
    lay = {"u": FieldLayout((4 * comm.size, 3000), (4 * comm.rank, 0), (4, 3000), "float64")}
    level = _make(kind, comm, shared_tmp, lay, capacity=8, queue_depth=2)
    _Tracked.released_on.clear()
    for step in range(8):
        block = np.frombuffer(_Tracked(4 * 3000 * 8), dtype=np.float64).reshape(4, 3000)
        block[...] = step
        level.write(step, {"u": block}, donate=True)
        del block
    level.flush()
    for step in range(8):
        assert level.read(step)["u"][0, 0] == step
        level.free(step)
    level.close()
    import gc

    gc.collect()
    assert len(_Tracked.released_on) == 8
    assert set(_Tracked.released_on) == {"MainThread"}, _Tracked.released_on
