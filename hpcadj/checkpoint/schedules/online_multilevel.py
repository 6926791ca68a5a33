"""Online checkpointing over several levels (RAM, node-local, HDF5): n unknown until the sweep ends.

Protocol: as :class:`~.online.OnlineSchedule` (``step()`` before each forward step, ``finish()``
once u_n is held; every rank makes the same calls).

Planner. The one-level :class:`~.online_binomial.OnlineBinomial` plans over S = sum_k c_k virtual
slots. A first-sweep ``Store`` (a long-lived checkpoint, read a few times) goes to the slowest level
with a free slot, a reverse-sweep ``Store`` (revolve's short-lived ones, read often) to the fastest
with a free slot (levels are ordered fastest first); ``Restore``/``Free`` go where the state is.
With ``costs``, each interval's reversal (known once n is) also chooses how many of the free slots
its revolve uses (those of the fastest levels 0..k, each k tried, the plan priced with ``costs``):
fewer recomputations are not worth slow reads. So the forward
evaluations are those of the one-level online plan with S slots, and no level exceeds its capacity
(at most S snapshots are ever stored, and a level is only chosen while it has a free slot).

Bound (proof in three lines). Let F_on be the online plan's forward evaluations, W and R its writes
and reads, and w_max, r_max the largest per-level costs. Every Restore is followed by an Advance or
an Adjoint, and every Store follows an Advance of its own (the first sweep evaluates n steps and stores
at most u_0 .. u_{n-2}; a reverse-sweep Store follows the Advance that computed it), so R <= F_on and
W <= F_on, and

    makespan_on <= F_on (u_f + w_max + r_max) + n u_b.

Any offline plan on the same levels holds at most S snapshots at a time, so it evaluates at least
F_1(n, S) = 1 + p(n, S) forward steps (the one-level binomial minimum), and its makespan is at least
F_1(n, S) u_f + n u_b. Hence

    makespan_on / makespan_off_opt <= (F_on / F_1(n, S)) (1 + (w_max + r_max) / u_f),

with F_on = F_1(n, S) for every n <= C(S+2, 2) + 1 when no ``costs`` are given (online_binomial.py);
the argument holds for whatever slot counts the priced reversal picks (F_on is then the plan's own). Measured ratios to the
offline multi-level optimum (multilevel.py, same n, capacities and costs) are in experiments/online.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from .actions import Action, Adjoint, Advance, EndForward, EndReverse, Free, Restore, Store
from .base import ScheduleError
from .costs import OpCosts
from .online_binomial import OnlineBinomial
from .revolve import segment_actions


class OnlineMultilevel:
    """Online plan over K levels: one virtual level of sum(capacities) slots, placed fastest first."""

    name = "online-multilevel"

    def __init__(self, capacities: Sequence[int], costs: OpCosts | None = None):
        self.capacities = tuple(int(c) for c in capacities)
        self.costs = costs.for_levels(len(self.capacities)) if costs is not None else None
        if not self.capacities or any(c < 0 for c in self.capacities) or sum(self.capacities) < 1:
            raise ScheduleError("online checkpointing needs at least one slot (for u_0)")
        self.inner = OnlineBinomial([sum(self.capacities)])
        self.used = [0] * len(self.capacities)
        self.where: dict[int, int] = {}

    @property
    def position(self) -> int:
        """Forward steps planned so far."""
        return self.inner.position

    def _place(self, actions: Iterable[Action], slowest: bool) -> Iterator[Action]:
        order = range(len(self.capacities) - 1, -1, -1) if slowest else range(len(self.capacities))
        for action in actions:
            if isinstance(action, Store):
                level = next(k for k in order if self.used[k] < self.capacities[k])
                self.used[level] += 1
                self.where[action.n] = level
                yield Store(action.n, level)
            elif isinstance(action, Restore):
                yield Restore(action.n, self.where[action.n])
            elif isinstance(action, Free):
                level = self.where.pop(action.n)
                self.used[level] -= 1
                yield Free(action.n, level)
            else:
                yield action

    def step(self) -> list[Action]:
        """Actions for one more forward step: stores and frees, then ``Advance(i, i + 1)``."""
        return list(self._place(self.inner.step(), slowest=True))

    def finish(self) -> Iterator[Action]:
        """The forward sweep ended at n = steps taken: the reverse sweep, placed on the levels."""
        list(self.inner.finish())  # the one-level plan's checks (finish twice, before any step)
        return self._reverse(self.inner.position, list(self.inner.stored))

    def _price(self, actions: list[Action]) -> float:
        costs = self.costs
        total = 0.0
        for a in actions:
            if isinstance(a, Advance):
                total += (a.n1 - a.n0) * costs.forward
            elif isinstance(a, Store):
                total += costs.write[a.level]
            elif isinstance(a, Restore):
                total += costs.read[a.level]
        return total

    def _reverse(self, n: int, stored: list[int]) -> Iterator[Action]:
        yield EndForward()
        yield Adjoint(n, n - 1)
        bounds = stored + [n - 1]
        for j in range(len(stored) - 1, -1, -1):
            free = [c - u for c, u in zip(self.capacities, self.used)]
            best = None
            options = {1 + sum(free[:k + 1]) for k in range(len(free))} if self.costs else {1 + sum(free)}
            for g in sorted(options):
                used, where = list(self.used), dict(self.where)
                placed = list(self._place(segment_actions(bounds[j], bounds[j + 1], g, 0, forward=False), False))
                price = self._price(placed) if self.costs else 0.0
                if best is None or price < best[0]:
                    best = (price, placed, self.used, self.where)
                self.used, self.where = used, where
            _, placed, self.used, self.where = best
            yield from placed
        yield EndReverse()


def online_multilevel_bound(online_forward: int, offline_one_level: int, costs) -> float:
    """The proven ratio bound (module docstring) for one plan's forward count and OpCosts ``costs``."""
    worst = max(costs.write) + max(costs.read)
    return online_forward / offline_one_level * (1 + worst / costs.forward)
