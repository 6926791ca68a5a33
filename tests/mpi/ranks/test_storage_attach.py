"""Attach (restart) and write failures of the file levels on every rank: the HDF5 level reopened on
another rank count, a write failing on one rank only, node-local attach after damage on one rank."""

import os

import pytest
from mpi4py import MPI  # initialise MPI (THREAD_MULTIPLE) before the comm fixture starts PETSc

from hpcadj.checkpoint.storage import LevelError, make_level

from test_storage_levels import _flip_pfs_byte, _layout, _same_bits, _snapshot


def _check(level, layout, steps):
    for step in steps:
        got = level.read(step)
        assert all(_same_bits(got[k], _snapshot(step, layout)[k]) for k in layout), step


@pytest.mark.parametrize("async_io", [True, False], ids=["async", "sync"])
def test_pfs_attach_on_another_rank_count(comm, shared_tmp, async_io):
    path = os.path.join(shared_tmp, f"attach-{async_io}.h5")
    writers = max(1, comm.size - 1)  # written by fewer ranks than attach
    sub = comm.Split(0 if comm.rank < writers else MPI.UNDEFINED, comm.rank)
    if sub != MPI.COMM_NULL:
        old = _layout(sub)
        level = make_level("pfs", 5, old, sub, path=path, run_id="att", keep=True, async_io=async_io)
        for step in range(4):
            level.write(step, _snapshot(step, old), time=0.25 * step)
        level.free(1)
        level.write(7, _snapshot(7, old))
        level.flush()
        _flip_pfs_byte(level, sub, 2, "w", writers - 1)  # old rank's block of step 2 damaged
        level.close()  # a killed run leaves the same file (flushed after every write)
        sub.Free()
    comm.Barrier()
    layout = _layout(comm)
    again = make_level("pfs", 5, layout, comm, path=path, run_id="att", attach=True,
                       async_io=async_io)
    assert again.valid_steps() == {0, 3, 7}, again.attach_note
    assert again.times[3] == 0.75
    again.prefetch(7)
    _check(again, layout, [7, 0, 3])
    again.write(5, _snapshot(5, layout))   # a freed slot of the old layout, written anew
    again.write(6, _snapshot(6, layout))
    _check(again, layout, [5, 6])
    again.keep = True
    again.close()
    third = make_level("pfs", 5, layout, comm, path=path, run_id="att", attach=True)
    assert third.valid_steps() == {0, 3, 5, 6, 7}
    _check(third, layout, [5, 0])
    third.close()
    comm.Barrier()
    assert not os.path.exists(path)


def test_pfs_attach_refuses_another_runs_file(comm, shared_tmp):
    layout = _layout(comm)
    path = os.path.join(shared_tmp, "other.h5")
    level = make_level("pfs", 2, layout, comm, path=path, run_id="mine", keep=True)
    level.close()
    with pytest.raises(LevelError, match="belongs to run mine"):
        make_level("pfs", 2, layout, comm, path=path, run_id="yours", attach=True)
    fresh = make_level("pfs", 2, layout, comm, path=os.path.join(shared_tmp, "none.h5"),
                       run_id="x", attach=True)
    assert fresh.valid_steps() == set() and "no file" in fresh.attach_note
    fresh.close()


@pytest.mark.parametrize("async_io", [True, False], ids=["async", "sync"])
def test_pfs_write_failing_on_one_rank_fails_on_every_rank(comm, shared_tmp, async_io):
    layout = _layout(comm)
    level = make_level("pfs", 4, layout, comm, path=os.path.join(shared_tmp, f"f{async_io}.h5"),
                       async_io=async_io)
    victim = comm.size - 1
    # the raw-bytes writer on the I/O thread, or h5py's
    writer = level.transport.raw if async_io else level.transport
    if comm.rank == victim:
        real = writer.write_block

        def failing(*args):
            if failing.armed:
                raise OSError(28, "No space left on device (injected on one rank)")
            real(*args)
        failing.armed = False
        writer.write_block = failing
    level.write(0, _snapshot(0, layout))
    level.write(1, _snapshot(1, layout))
    level.flush()
    if comm.rank == victim:
        writer.write_block.armed = True
    raised = 0
    for step in (2, 3):
        try:
            level.write(step, _snapshot(step, layout))
        except LevelError as exc:
            assert exc.writing is True and exc.step == 2
            raised += 1
    with pytest.raises(LevelError, match="injected on one rank") as info:
        level.flush()
    assert info.value.step == 2 and info.value.writing is True
    level.flush()
    assert level.valid_steps() == {0, 1}
    _check(level, layout, [1, 0])
    if comm.rank == victim:
        writer.write_block.armed = False
    level.write(2, _snapshot(2, layout))
    _check(level, layout, [2])
    level.close()


def test_local_attach_drops_a_step_damaged_on_one_rank(comm, shared_tmp):
    layout = _layout(comm)
    base = os.path.join(shared_tmp, "att-local")
    level = make_level("local", 4, layout, comm, local_dir=base, run_id="loc", keep=True)
    for step in (0, 2, 4):
        level.write(step, _snapshot(step, layout))
    level.flush()
    if comm.rank == comm.size - 1:
        os.truncate(level.path(4), 40)
    level.close()
    comm.Barrier()
    again = make_level("local", 4, layout, comm, local_dir=base, run_id="loc", attach=True)
    assert again.valid_steps() == {0, 2}
    assert not os.path.exists(again.path(4))
    _check(again, layout, [2, 0])
    again.close()
    comm.Barrier()
    assert not os.path.exists(os.path.join(base, "hpcadj-loc"))
