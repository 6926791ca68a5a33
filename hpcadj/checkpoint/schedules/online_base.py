"""What every one-level online planner shares: its level, the step()/finish() bookkeeping, and the
reverse sweep over the checkpoints its first sweep left (see online.py for the protocol)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from .actions import Action, Adjoint, EndForward, EndReverse
from .base import ScheduleError
from .revolve import segment_actions


def begin_finish(planner) -> None:
    """An online planner's ``finish()`` starts: ScheduleError if it was called before or before any
    step, else the planner is marked finished."""
    if planner.finished:
        raise ScheduleError("finish() called twice")
    if planner.position < 1:
        raise ScheduleError("finish() before any step")
    planner.finished = True


class OneLevelOnline:
    """Checkpoints ``stored`` (ascending, u_0 first) on ``level``; subclasses decide them in ``step()``.

    After the sweep each interval between stored states is reversed, last first, with binomial
    revolve over the slots its predecessors do not hold.
    """

    def __init__(self, capacities: Sequence[int], level: int | None = None):
        self.capacities = tuple(int(c) for c in capacities)
        if level is None:
            level = next((i for i, c in enumerate(self.capacities) if c > 0), 0)
        if not 0 <= level < len(self.capacities) or self.capacities[level] < 1:
            raise ScheduleError("online checkpointing needs at least one slot on its level (for u_0)")
        self.level = level
        self.slots = self.capacities[level]
        self.position = 0
        self.stored: list[int] = []
        self.finished = False

    def finish(self) -> Iterator[Action]:
        """The forward sweep ended at n = number of steps taken: the rest of the plan."""
        begin_finish(self)
        return self._reverse(self.position, list(self.stored))

    def _reverse(self, n: int, stored: list[int]) -> Iterator[Action]:
        yield EndForward()
        yield Adjoint(n, n - 1)
        bounds = stored + [n - 1]
        for j in range(len(stored) - 1, -1, -1):
            yield from segment_actions(bounds[j], bounds[j + 1], self.slots - j, self.level, forward=False)
        yield EndReverse()
