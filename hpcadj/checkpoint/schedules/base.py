"""The schedule interface: a pure, re-iterable stream of actions for n steps and K levels."""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence

from .actions import Action, Adjoint, Advance, EndForward, Free, Restore


class ScheduleError(ValueError):
    """No plan of this kind exists for these inputs (e.g. a budget too small)."""


class Schedule(abc.ABC):
    """A checkpoint plan for ``n_steps`` steps over levels with ``capacities`` slots each.

    Planning has no side effects: :meth:`actions` may be iterated any number of times and yields the
    same stream on every rank.
    """

    name: str = "abstract"

    def __init__(self, n_steps: int, capacities: Sequence[int]):
        if n_steps < 1:
            raise ScheduleError(f"steps must be >= 1, got {n_steps}")
        if not capacities or any(c < 0 for c in capacities):
            raise ScheduleError(f"capacities must be non-negative slot counts, got {list(capacities)}")
        if sum(capacities) < 1:
            raise ScheduleError("no slot on any level: at least u_0 must be stored")
        self.n_steps = int(n_steps)
        self.capacities = tuple(int(c) for c in capacities)

    @abc.abstractmethod
    def actions(self) -> Iterator[Action]:
        """Yield the plan, ending with ``EndReverse``."""

    def __iter__(self) -> Iterator[Action]:
        return self.actions()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_steps={self.n_steps}, capacities={self.capacities})"


def opening(lo: int, hi: int, level: int, forward: bool, held: bool):
    """The first actions of the segment [lo, hi] whose base u_lo is stored on ``level``: its
    restore unless ``held``; for one step the whole segment (:func:`last_step`). Returns whether
    that finished the segment (``done = yield from opening(...)``)."""
    if not held:
        yield Restore(lo, level)
    if hi - lo == 1:
        yield from last_step(lo, level, forward)
        return True
    return False


def to_the_end(lo: int, hi: int, forward: bool):
    """Actions of a segment [lo, hi] reversed at its end without a checkpoint, u_lo held: advance to
    u_hi (ending the forward sweep) when ``forward``, else to u_{hi-1}; then adjoint step hi - 1."""
    if forward:
        yield Advance(lo, hi)
        yield EndForward()
    else:
        yield Advance(lo, hi - 1)
    yield Adjoint(hi, hi - 1)


def last_step(lo: int, level: int, forward: bool):
    """Actions of a one-step segment [lo, lo + 1] whose base u_lo is held and stored on ``level``:
    the final forward step (ending the forward sweep) when ``forward``, the adjoint step, then the
    base's slot released."""
    if forward:
        yield Advance(lo, lo + 1)
        yield EndForward()
    yield Adjoint(lo + 1, lo)
    yield Free(lo, level)
