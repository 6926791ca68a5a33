"""Online checkpointing: the number of steps is unknown while the forward sweep runs.

Runs use the greedy planners (``make_schedule("online", None, capacities)``: online_binomial.py on
one level, online_greedy.py on several); the thinning :class:`OnlineSchedule` here stays for its
provable bound (below) and as their baseline in experiments/online.

Protocol (the driver's side)::

    plan = OnlineSchedule(capacities)
    while not done:                            # adaptive time stepping decides `done`
        for action in plan.step():             # Store/Free of earlier states, then Advance(i, i+1)
            execute(action)
    for action in plan.finish():               # n is now known: EndForward, reverse sweep, EndReverse
        execute(action)

``step()`` is called once per forward step, before that step; ``finish()`` once, when the driver
holds the final state u_n. Every rank must see the same sequence of calls (the stopping decision
has to be collective).

Algorithm (thinning, one level). While at most s slots suffice, every state u_0 .. u_{n-2} is
stored, each only once the next step is known to be needed, so n <= s + 1 steps cost the minimum n
evaluations (store-all). Past that, states are kept at multiples of a spacing d (a power of two) and
at most ``keep = s - s // 2`` of them; when one more would not fit, d doubles and the states that are
no longer multiples are freed. After the sweep each interval between kept states (length <= d) is
reversed with binomial-optimal revolve over the slots still free, which grow as intervals finish.

Bound (tested against the simulator): with ``g = s // 2 + 1`` slots per interval at least and
``d <= max(1, 2 (n - 2) / (keep - 1))`` (keep >= 2),

    forward evaluations <= n + t(d, g) * (n - 1),   t(d, g) the revolve repetition number,

and exactly n for n <= s + 1 (optimal); for s = 1 it is the optimum n + (n-1)(n-2)/2. The offline
optimum is 1 + t(n, s) n - beta(s + 1, t - 1). Measured (n, s -> online / offline): 100, 10 ->
261 / 223; 1000, 20 -> 2858 / 2748; 10^4, 50 -> 29148 / 28623 (the bound: 397, 3997, 39997). Stumm & Walther (SISC 32(2), 2010)
and Wang, Moin & Iaccarino (SISC 31(4), 2009) reach the offline repetition number at the price of a
more intricate state machine; this schedule trades some optimality for a simple, provable one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from .actions import Action, Advance, Free, Store
from .base import Schedule, ScheduleError
from .online_base import OneLevelOnline
from .online_binomial import OnlineBinomial
from .revolve import repetition


class OnlineSchedule(OneLevelOnline):
    """Online plan on one level (see the module docstring for the protocol and the bound)."""

    name = "online"

    def __init__(self, capacities: Sequence[int], level: int | None = None):
        super().__init__(capacities, level)
        self.keep = self.slots - self.slots // 2
        self.spacing = 1

    def step(self) -> list[Action]:
        """Actions for one more forward step: stores and frees, then ``Advance(i, i + 1)``."""
        if self.finished:
            raise ScheduleError("step() after finish()")
        actions: list[Action] = []
        i = self.position
        if i >= 1:
            candidate = i - 1  # u_{i-1} is still held: the step before needed it
            limit = self.slots if self.spacing == 1 else self.keep
            if candidate % self.spacing == 0 and len(self.stored) >= limit:
                actions += self._thin(candidate)
            if candidate % self.spacing == 0:
                self.stored.append(candidate)
                actions.append(Store(candidate, self.level))
        actions.append(Advance(i, i + 1))
        self.position = i + 1
        return actions

    def _thin(self, candidate: int) -> list[Action]:
        """Double the spacing until the kept states and ``candidate`` fit in ``keep`` slots."""
        def kept(d):
            return [c for c in self.stored if c % d == 0]

        d = self.spacing * 2
        while len(kept(d)) + (candidate % d == 0) > self.keep:
            d *= 2
        self.spacing = d
        survivors = kept(d)
        freed = [Free(c, self.level) for c in self.stored if c % d]
        self.stored = survivors
        return freed


def online_bound(n_steps: int, slots: int) -> int:
    """The documented upper bound on the online schedule's forward evaluations."""
    if n_steps <= slots + 1:
        return n_steps
    if slots == 1:
        return n_steps + (n_steps - 1) * (n_steps - 2) // 2
    keep = slots - slots // 2
    spacing = max(1, (2 * (n_steps - 2)) // (keep - 1)) if keep >= 2 else n_steps
    return n_steps + repetition(spacing, slots // 2 + 1) * (n_steps - 1)


class OnlineFixed(Schedule):
    """The online schedule as an ordinary n-step plan: it learns n only at the end of the sweep.

    Runs :class:`~.online_binomial.OnlineBinomial` (binomial-optimal up to n = C(s+2, 2) + 1; 2748
    evaluations at n = 1000, s = 20 where :class:`OnlineSchedule` needs 2858)."""

    name = "online"

    def __init__(self, n_steps: int, capacities: Sequence[int], level: int | None = None):
        super().__init__(n_steps, capacities)
        self.level = level

    def actions(self) -> Iterator[Action]:
        plan = OnlineBinomial(self.capacities, self.level)
        for _ in range(self.n_steps):
            yield from plan.step()
        yield from plan.finish()
