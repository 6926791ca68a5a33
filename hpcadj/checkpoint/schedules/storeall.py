"""Store-all: keep every state the reverse sweep needs on one level; no recomputation."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from .actions import Action, Adjoint, Advance, EndForward, EndReverse, Free, Restore, Store
from .base import Schedule, ScheduleError


def store_all_slots(n_steps: int) -> int:
    """Slots store-all needs: u_0 .. u_{n-2}; u_{n-1} and u_n stay in the working states."""
    return max(1, n_steps - 1)


class StoreAll(Schedule):
    """Every state u_0 .. u_{n-2} stored on ``level``: n forward evaluations, the minimum."""

    name = "store-all"

    def __init__(self, n_steps: int, capacities: Sequence[int], level: int = 0):
        super().__init__(n_steps, capacities)
        if not 0 <= level < len(self.capacities):
            raise ScheduleError(f"level {level} does not exist ({len(self.capacities)} levels)")
        need = store_all_slots(self.n_steps)
        if self.capacities[level] < need:
            raise ScheduleError(f"store-all needs {need} slots on level {level} for {self.n_steps} steps, "
                                f"it has {self.capacities[level]}")
        self.level = level

    def actions(self) -> Iterator[Action]:
        n, lv = self.n_steps, self.level
        stored = range(store_all_slots(n))
        for i in stored:
            yield Store(i, lv)
            yield Advance(i, i + 1)
        if n > len(stored):
            yield Advance(len(stored), n)
        yield EndForward()
        for i in reversed(range(n)):
            if i != n - 1:  # u_{n-1} is still a working state after the forward sweep
                yield Restore(i, lv)
            yield Adjoint(i + 1, i)
            if i in stored:
                yield Free(i, lv)
        yield EndReverse()
