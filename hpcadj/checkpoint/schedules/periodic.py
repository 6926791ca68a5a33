"""Periodic: every k-th state to one level, recomputation inside each period.

The first sweep stores u_0, u_k, u_2k, ... on ``level``. The reverse sweep takes the periods last
first: it restores the period's first state and, when another level has room for the period's
k - 1 inner states, recomputes the period once storing them there (store-all inside the period);
otherwise it recomputes from the period's start for every adjoint step (k(k-1)/2 per period).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from .actions import Action, Adjoint, Advance, EndForward, EndReverse, Free, Restore, Store
from .base import Schedule, ScheduleError


class Periodic(Schedule):
    """Checkpoints every ``period`` steps on ``level`` (default: the largest level, smallest period)."""

    name = "periodic"

    def __init__(self, n_steps: int, capacities: Sequence[int], period: int | None = None,
                 level: int | None = None):
        super().__init__(n_steps, capacities)
        if level is None:
            level = max(range(len(self.capacities)), key=lambda i: (self.capacities[i], -i))
        if not 0 <= level < len(self.capacities) or self.capacities[level] < 1:
            raise ScheduleError(f"periodic needs a slot on level {level}")
        n, cap = self.n_steps, self.capacities[level]
        if period is None:
            period = -(-n // cap)  # the smallest period whose checkpoints fit
        if period < 1:
            raise ScheduleError(f"period must be >= 1, got {period}")
        if -(-n // period) > cap:
            raise ScheduleError(f"period {period} needs {-(-n // period)} slots on level {level}, it has {cap}")
        self.level, self.period = level, period
        inner = [i for i, c in enumerate(self.capacities)
                 if (c - (self.capacities[level] if i == level else 0)) >= period - 1 and i != level]
        if not inner and cap - (-(-n // period)) >= period - 1:
            inner = [level]
        self.inner_level = inner[0] if inner and period > 2 else None

    def actions(self) -> Iterator[Action]:
        n, k, lv = self.n_steps, self.period, self.level
        starts = list(range(0, n, k))
        if n == 1:
            yield from (Advance(0, 1), EndForward(), Adjoint(1, 0), EndReverse())
            return
        for s in starts:
            yield Store(s, lv)
            yield Advance(s, min(s + k, n))
        yield EndForward()
        for p in reversed(starts):
            end = min(p + k, n)
            if end == n:
                yield Adjoint(n, n - 1)  # u_{n-1} is still held after the sweep
                end = n - 1
            if end > p:
                yield Restore(p, lv)
                if self.inner_level is not None and end - p > 2:
                    inner = self.inner_level
                    for i in range(p, end - 1):
                        yield Advance(i, i + 1)
                        if i + 1 < end - 1:
                            yield Store(i + 1, inner)
                    yield Adjoint(end, end - 1)
                    for i in range(end - 2, p, -1):
                        yield Restore(i, inner)
                        yield Adjoint(i + 1, i)
                        yield Free(i, inner)
                    yield Restore(p, lv)
                    yield Adjoint(p + 1, p)
                else:
                    for i in range(end - 1, p, -1):
                        yield Advance(p, i)
                        yield Adjoint(i + 1, i)
                        yield Restore(p, lv)
                    yield Adjoint(p + 1, p)
            yield Free(p, lv)
        yield EndReverse()
