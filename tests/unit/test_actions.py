"""The working-state rules of the action stream and the store-all plan."""

import pytest

from hpcadj.checkpoint.schedules.actions import (Adjoint, Advance, EndForward, EndReverse, Free, PlanError,
                                                 Restore, Store, WorkingStates)
from hpcadj.checkpoint.schedules.base import ScheduleError
from hpcadj.checkpoint.schedules.storeall import StoreAll, store_all_slots


def test_advance_keeps_last_input_after_the_forward_sweep():
    work = WorkingStates(0, "u0")
    work.advanced(0, 3, "u2", "u3")
    assert work.steps() == [2, 3]


def test_advance_keeps_the_state_held_for_the_reverse_sweep():
    work = WorkingStates(0, "u0")
    work.advanced(0, 3, "u2", "u3")
    work.adjoint_done(2)
    assert work.steps() == [2]
    work.restored(0, "u0")
    assert work.steps() == [0, 2]
    work.advanced(0, 1, "u0", "u1")
    assert work.steps() == [1, 2]
    assert work.get(1) == "u1" and work.get(2) == "u2"


def test_missing_state_is_a_plan_error():
    work = WorkingStates(0, "u0")
    with pytest.raises(PlanError):
        work.get(5)


def test_actions_validate_their_steps():
    with pytest.raises(ValueError):
        Advance(3, 3)
    with pytest.raises(ValueError):
        Adjoint(4, 2)


def test_store_all_stream_for_three_steps():
    assert list(StoreAll(3, [2]).actions()) == [
        Store(0, 0), Advance(0, 1), Store(1, 0), Advance(1, 2), Advance(2, 3), EndForward(),
        Adjoint(3, 2), Restore(1, 0), Adjoint(2, 1), Free(1, 0), Restore(0, 0), Adjoint(1, 0), Free(0, 0),
        EndReverse()]


def test_store_all_needs_its_slots():
    assert store_all_slots(1) == 1 and store_all_slots(10) == 9
    with pytest.raises(ScheduleError):
        StoreAll(10, [8])
