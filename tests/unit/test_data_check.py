"""The data check's verdict is remembered once per model object without touching the user's object:
a model that passed is not checked again, a new object with wrong data is still refused, and an
object's entry goes with it (the check itself: tests/mpi/ranks/test_mixed.py and test_ts_stages.py)."""

import gc

import pytest

from hpcadj.adjoint import data_check
from hpcadj.checkpoint.options import ConfigError


class Model:
    """What refuse_untrusted_data reads of a model beside the (stubbed) check: its name."""

    name = "toy"

    def __init__(self, wrong=False):
        self.wrong = wrong


class AlwaysEqual(Model):
    """A user's model that compares equal to everything and cannot be hashed."""

    __hash__ = None

    def __eq__(self, other):
        return True


class Slotted:
    """A model whose class takes no weak reference."""

    __slots__ = ("wrong",)
    name = "slotted"

    def __init__(self):
        self.wrong = False


@pytest.fixture
def checked(monkeypatch):
    """The models the check ran on, in order; a model made with wrong=True fails it."""
    seen = []

    def problem(model, controls, steps=2, seed=41):
        seen.append(model)
        return ("step 0's adjoint data leave out u" if model.wrong else None), ""

    monkeypatch.setattr(data_check, "adjoint_data_problem", problem)
    return seen


def test_a_passing_object_is_checked_once_and_left_untouched(checked):
    model = Model()
    before = dict(vars(model))
    for _ in range(3):
        data_check.refuse_untrusted_data(model, {})
    assert checked == [model]
    assert vars(model) == before


def test_a_new_object_with_wrong_data_is_still_refused(checked):
    data_check.refuse_untrusted_data(Model(), {})
    for _ in range(2):
        with pytest.raises(ConfigError, match="cannot trust 'toy''s adjoint data: step 0"):
            data_check.refuse_untrusted_data(Model(wrong=True), {})
    assert len(checked) == 3


def test_an_object_s_entry_goes_with_it(checked):
    model = Model()
    data_check.refuse_untrusted_data(model, {})
    key = id(model)
    assert key in data_check.TRUSTED._refs
    checked.clear()
    del model
    gc.collect()
    assert key not in data_check.TRUSTED._refs
    data_check.refuse_untrusted_data(Model(), {})
    assert len(checked) == 1


def test_identity_not_equality_and_no_weak_reference_checks_every_time(checked):
    equal = AlwaysEqual()
    data_check.refuse_untrusted_data(equal, {})
    data_check.refuse_untrusted_data(equal, {})
    other = AlwaysEqual(wrong=True)
    with pytest.raises(ConfigError):
        data_check.refuse_untrusted_data(other, {})
    slotted = Slotted()
    data_check.refuse_untrusted_data(slotted, {})
    data_check.refuse_untrusted_data(slotted, {})
    assert [id(m) for m in checked] == [id(equal), id(other), id(slotted), id(slotted)]
