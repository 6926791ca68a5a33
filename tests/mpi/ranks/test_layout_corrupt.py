"""A node-local LAYOUT.json damaged on one rank is a lost level, not a refused resume (issue 27,
item 12): every rank drops the level's node-local files, reports it, and the level starts empty."""

import json
import os

import pytest
from mpi4py import MPI  # noqa: F401 - initialise MPI before the comm fixture starts PETSc

from hpcadj.checkpoint.storage import LevelError, make_level

from test_storage_levels import _layout, _same_bits, _snapshot


def _written(comm, base):
    layout = _layout(comm)
    level = make_level("local", 4, layout, comm, local_dir=base, run_id="lay", keep=True)
    for step in (0, 3):
        level.write(step, _snapshot(step, layout))
    level.flush()
    layout_file = os.path.join(os.path.dirname(level.path(0)), "LAYOUT.json")
    level.close()
    comm.Barrier()
    return layout, layout_file


@pytest.mark.parametrize("damage", ["flip", "value"])
def test_damaged_layout_json_drops_the_level(comm, shared_tmp, damage):
    base = os.path.join(shared_tmp, f"lay-{damage}")
    layout, layout_file = _written(comm, base)
    if comm.rank == comm.size - 1:
        data = bytearray(open(layout_file, "rb").read())
        if damage == "flip":  # one flipped byte: no longer JSON
            data[data.index(b"{")] ^= 0x20
        else:  # one digit changed: still JSON, no longer what was written
            at = data.index(b'"nranks": ') + len(b'"nranks": ')
            data[at] = ord("7")
        open(layout_file, "wb").write(bytes(data))
    comm.Barrier()
    again = make_level("local", 4, layout, comm, local_dir=base, run_id="lay", attach=True)
    assert again.valid_steps() == set()
    assert any("LAYOUT.json" in why and f"rank {comm.size - 1}" in why for why in again.attach_dropped), \
        again.attach_dropped
    assert again.attach_note.startswith("removed"), again.attach_note
    assert not os.path.exists(again.path(0)) and not os.path.exists(again.path(3))
    with open(layout_file) as f:
        assert json.load(f)["nranks"] == comm.size  # rewritten for this run
    again.write(1, _snapshot(1, layout))
    got = again.read(1)
    assert all(_same_bits(got[k], _snapshot(1, layout)[k]) for k in layout)
    again.close()
    comm.Barrier()
    assert not os.path.exists(os.path.join(base, "hpcadj-lay"))


def test_layout_of_another_rank_count_still_refused(comm, shared_tmp):
    """A LAYOUT.json intact but written by another layout is a real mismatch: refused as before."""
    base = os.path.join(shared_tmp, "lay-other")
    layout, layout_file = _written(comm, base)
    if comm.rank == 0:
        record = json.load(open(layout_file))
        record["fields"]["u"]["shape"][0] += 1
        from hpcadj.checkpoint.storage.local import layout_crc

        record["crc32"] = layout_crc(record)
        json.dump(record, open(layout_file, "w"))
    comm.Barrier()
    with pytest.raises(LevelError, match="blocks differ"):
        make_level("local", 4, layout, comm, local_dir=base, run_id="lay", attach=True)
    comm.Barrier()
    cleanup = make_level("local", 4, layout, comm, local_dir=base, run_id="lay")
    cleanup.close()
