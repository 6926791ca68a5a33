"""A level set-up that is refused leaves nothing behind, on any rank (1, 2 and 3 ranks).

A node-local directory unusable on one rank only: the other ranks' ``hpcadj-<id>/rank<r>/`` and the
``--local-dir`` this set-up created go again. A fresh run refused after its node-local level was
made (the next level failed; a run directory's levels keep their files): no ``LAYOUT.json`` left.
A level's own files are removed at the end as before, and so is the directory it created.
"""

import os

import pytest

from hpcadj.checkpoint.manager import CheckpointConfig, LevelPlan, build_levels
from hpcadj.checkpoint.storage import LevelError, make_level
from hpcadj.snapshot import FieldLayout


def _layout(comm):
    return {"u": FieldLayout((comm.size, 4), (comm.rank, 0), (1, 4), "float64")}


def _tree(path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), path) for d, dirs, files in os.walk(path)
                  for n in dirs + files) if os.path.exists(path) else []


def test_a_directory_unusable_on_one_rank_leaves_no_other_ranks_directories(comm, shared_tmp):
    last = comm.size - 1
    blocker = os.path.join(shared_tmp, "a-file")
    if comm.rank == 0:
        with open(blocker, "w") as f:
            f.write("not a directory")
    comm.Barrier()
    # every rank's own --local-dir, none existing yet; the last rank's lies under a file
    local = os.path.join(blocker if comm.rank == last else shared_tmp, f"local{comm.rank}", "nested")
    with pytest.raises(LevelError, match=f"rank {last}: .*local{last}"):
        make_level("local", 2, _layout(comm), comm, local_dir=local, keep=True)
    comm.Barrier()
    assert not os.path.exists(os.path.join(shared_tmp, f"local{comm.rank}"))
    assert sorted(os.listdir(shared_tmp)) == ["a-file"]


def test_a_fresh_start_refused_after_its_node_local_level_leaves_no_layout(comm, shared_tmp):
    local = os.path.join(shared_tmp, "local")  # not existing: the set-up creates it
    plans = [LevelPlan("disk", "local", 2), LevelPlan("pfs", "pfs", 2)]
    config = CheckpointConfig(budgets={}, local_dir=local, keep=True,  # as a run directory's run
                              pfs_file=os.path.join(shared_tmp, "missing", "ck.h5"))
    with pytest.raises(Exception):  # noqa: B017 - the HDF5 level's own refusal; what matters is below
        build_levels(plans, _layout(comm), comm, config)
    comm.Barrier()
    assert _tree(local) == [], _tree(local)
    assert not os.path.exists(local)


def test_a_level_removes_the_directory_it_created_when_it_ends(comm, shared_tmp):
    made = os.path.join(shared_tmp, "made", "here")
    existing = os.path.join(shared_tmp, "existing")
    if comm.rank == 0:
        os.makedirs(existing)
    comm.Barrier()
    for where in (made, existing):
        level = make_level("local", 2, _layout(comm), comm, local_dir=where)
        level.close()
    comm.Barrier()
    assert not os.path.exists(os.path.join(shared_tmp, "made"))
    assert os.path.isdir(existing) and os.listdir(existing) == []
