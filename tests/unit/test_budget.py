"""Budgets given as slots or bytes become the same slot counts on every rank."""

import pytest

from hpcadj.checkpoint.budget import Budget, budget_slots, parse_budget


@pytest.mark.parametrize("text, slots", [("8", 8), ("0", 0), (8, 8), (" 12 ", 12)])
def test_plain_numbers_are_slots(text, slots):
    assert parse_budget(text) == Budget(slots=slots)
    assert budget_slots(text) == slots


@pytest.mark.parametrize("text, nbytes", [
    ("2GiB", 2 * 1024**3), ("512MB", 512 * 10**6), ("1.5e9B", 1_500_000_000), ("64k", 65536),
    ("1KB", 1000), ("3 MiB", 3 * 1024**2), ("100b", 100), ("1TiB", 1024**4),
])
def test_units_are_bytes(text, nbytes):
    assert parse_budget(text) == Budget(nbytes=nbytes)


def test_bytes_become_slots_rounding_down():
    assert budget_slots("2GiB", 256 * 1024**2) == 8
    assert budget_slots("2GiB", 300 * 1024**2) == 6
    assert budget_slots("100B", 101) == 0


@pytest.mark.parametrize("text, reason", [
    ("", "not slots"), ("abc", "not slots"), ("2XB", "unknown unit"), ("1.5", "whole number"),
    ("-3", "must be positive"), ("-1GiB", "must be positive"), (-1, "must be positive"), (True, "slots or bytes"),
])
def test_bad_budgets_say_why(text, reason):
    with pytest.raises(ValueError, match=reason):
        parse_budget(text)


def test_bytes_need_a_positive_snapshot_size():
    with pytest.raises(ValueError, match="snapshot size"):
        budget_slots("1GiB")
    with pytest.raises(ValueError, match="positive"):
        budget_slots("1GiB", 0)
