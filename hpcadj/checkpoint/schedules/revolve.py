"""Revolve: binomial checkpointing on one level, the least forward evaluations for s slots.

With s slots (u_0's included) and the driver's two working states (actions.py), reversing n steps
needs at least ``1 + t*n - beta(s+1, t-1)`` forward evaluations, t the least integer with
``beta(s, t) >= n`` (Griewank & Walther, ACM TOMS 26(1), 2000; docs/architecture.md, step counting).
The "1 +" is the last step u_{n-1} -> u_n, which the first sweep evaluates once for the objective;
every other step is evaluated as in the classical model, where reversing a chain of L steps from a
checkpoint costs ``p(L, s) = t*L - beta(s+1, t-1)`` forward steps.

Actions are generated on the fly from an explicit stack of pending segments (no O(n*s) table, no
recursion): splits come from the closed-form range of optimal first advances, so n = 10^6 streams
in seconds.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from math import comb

from .actions import Action, Adjoint, Advance, EndForward, EndReverse, Store
from .base import Schedule, ScheduleError, opening, to_the_end


def beta(s: int, t: int) -> int:
    """beta(s, t) = C(s + t, s): the most steps s slots reverse with repetition number t (0 if t < 0)."""
    return comb(s + t, s) if t >= 0 else 0


def repetition(length: int, slots: int) -> int:
    """The least t with beta(slots, t) >= length."""
    if slots < 1:
        raise ValueError("repetition needs at least one slot")
    t = 0
    while beta(slots, t) < length:
        t += 1
    return t


def classic_cost(length: int, slots: int) -> int:
    """Forward steps to reverse ``length`` steps from a stored, not held base (the classical p(L, s))."""
    t = repetition(length, slots)
    return t * length - beta(slots + 1, t - 1)


def min_forward_steps(n_steps: int, slots: int) -> int:
    """The least forward evaluations for n steps with ``slots`` slots on one level (docs/architecture.md)."""
    if n_steps < 1 or slots < 1:
        raise ValueError("need n_steps >= 1 and slots >= 1")
    return 1 + classic_cost(n_steps, slots)


class _Binomial:
    """Cached beta(g, t) sequences per slot count g, for O(log t) repetition numbers."""

    def __init__(self, n_max: int):
        self.n_max = n_max
        self.tables: dict[int, list[int]] = {}

    def table(self, g: int) -> list[int]:
        table = self.tables.get(g)
        if table is None:
            table = [1]
            while table[-1] < self.n_max:
                table.append(beta(g, len(table)))
            self.tables[g] = table
        return table

    def first_advance(self, length: int, g: int) -> int:
        """An optimal first advance k for a chain of ``length`` >= 2 steps with g >= 2 slots.

        Any k with ``L - beta(g-1, t) <= k <= beta(g, t-1)`` and ``beta(g, t-2) <= k <=
        L - beta(g-1, t-1)`` is optimal (both sides then sit on their cost function's linear piece of
        slope t-1 and t); the largest is taken.
        """
        t = bisect_left(self.table(g), length)
        right = self.table(g - 1)
        return min(self.tables[g][t - 1], length - right[t - 1])


def revolve_actions(n_steps: int, slots: int, level: int = 0) -> Iterator[Action]:
    """The full revolve plan for ``n_steps`` with ``slots`` slots (u_0's included) on ``level``."""
    n = n_steps
    if n == 1:
        yield Advance(0, 1)
        yield EndForward()
        yield Adjoint(1, 0)
        yield EndReverse()
        return
    yield Store(0, level)
    yield from segment_actions(0, n, slots, level, forward=True)
    yield EndReverse()


def segment_actions(start: int, end: int, slots: int, level: int, forward: bool) -> Iterator[Action]:
    """Reverse steps end-1 .. start with u_start stored on ``level`` and ``slots`` slots (its own included).

    ``forward``: u_start is held and u_end not yet computed (the first sweep; yields EndForward);
    otherwise u_end is held and u_start must be restored. The slot of u_start is freed at the end.
    """
    binom = _Binomial(end - start)
    # pending segments, last first: (start, end, slots, forward, base_held)
    stack = [(start, end, slots, forward, forward)]
    pop, push = stack.pop, stack.append
    while stack:
        lo, hi, g, fwd, held = pop()
        if (yield from opening(lo, hi, level, fwd, held)):
            continue
        length = hi - lo
        k = length - 1 if g == 1 else binom.first_advance(length, g)
        if k >= length - 1:
            yield from to_the_end(lo, hi, fwd)  # no checkpoint: the last step reversed at once
            push((lo, hi - 1, g, False, False))
            continue
        mid = lo + k
        yield Advance(lo, mid)
        yield Store(mid, level)
        push((lo, mid, g, False, False))
        push((mid, hi, g - 1, fwd, True))


class Revolve(Schedule):
    """Binomial-optimal checkpointing on one level (default: the first level with a slot)."""

    name = "revolve"

    def __init__(self, n_steps: int, capacities: Sequence[int], level: int | None = None):
        super().__init__(n_steps, capacities)
        if level is None:
            level = next(i for i, c in enumerate(self.capacities) if c > 0)
        if not 0 <= level < len(self.capacities):
            raise ScheduleError(f"level {level} does not exist ({len(self.capacities)} levels)")
        if self.capacities[level] < 1:
            raise ScheduleError(f"revolve needs at least one slot on level {level} (for u_0)")
        self.level = level
        # more slots than steps - 1 never help; capping keeps the binomial tables small
        self.slots = max(1, min(self.capacities[level], self.n_steps - 1))

    def forward_steps(self) -> int:
        """Forward evaluations this plan performs: the binomial minimum."""
        return min_forward_steps(self.n_steps, self.slots)

    def actions(self) -> Iterator[Action]:
        return revolve_actions(self.n_steps, self.slots, self.level)
