"""Online checkpointing over several levels (RAM, node-local, HDF5): n unknown until the sweep ends.

This cascade is the plan for unpriced runs (no costs); with costs the driver runs the priced greedy
of online_greedy.py (make_online_plan), which is within 1.05x of the offline optimum where this one
is not (experiments/online).

Protocol: as :class:`~.online.OnlineSchedule` (``step()`` before each forward step, ``finish()``
once u_n is held; every rank makes the same calls).

Planner. The one-level :class:`~.online_binomial.OnlineBinomial` plans over S = sum_k c_k virtual
slots. With ``costs`` (and ``forward_cheap_only``), the first sweep starts on the cheap levels only
(those whose write + read costs less than a forward step), S_cheap slots, and the other levels join
once n passes beta(S_cheap, 3): a short run then never pays slow writes for checkpoints the offline
plan would recompute (measured: worst three-level ratio 1.44 -> 1.13, experiments/online).
A first-sweep ``Store`` goes to the fastest level; when it is full, its oldest snapshot (the
longest-lived: the greedy planner frees recent ones) moves one level down (``Move``, cascading), so
the sweep's long-lived checkpoints end on slow levels and the fast slots stay for the reverse sweep.
A reverse-sweep ``Store`` goes to the fastest level with a free slot; ``Restore``/``Free`` go where
the state is. With ``costs``, each interval's reversal (known once n is) is the cheapest, priced
with ``costs``, of: revolve over the free slots of levels 0..k (each k), and the multi-level DP of
multilevel.py over the free slots with the interval's base on its level (the DP then uses that level
and faster ones). Without ``costs`` the forward evaluations are those of the one-level online plan
with S slots. No level exceeds its capacity: at most S snapshots are stored at once, and a level is
chosen only while it has a free slot.

Bound (proof in three lines). Let F_on be the online plan's forward evaluations, W and R its writes
and reads, and w_max, r_max the largest per-level costs. Every Restore is followed by an Advance or
an Adjoint, and every Store follows an Advance of its own (the first sweep evaluates n steps and stores
at most u_0 .. u_{n-2}; a reverse-sweep Store follows the Advance that computed it), so R <= F_on and
W <= F_on; a first-sweep snapshot moves at most K-1 times (one read and one write each), so

    makespan_on <= F_on (u_f + K (w_max + r_max)) + n u_b.

Any offline plan on the same levels holds at most S snapshots at a time, so it evaluates at least
F_1(n, S) = 1 + p(n, S) forward steps (the one-level binomial minimum), and its makespan is at least
F_1(n, S) u_f + n u_b. Hence

    makespan_on / makespan_off_opt <= (F_on / F_1(n, S)) (1 + K (w_max + r_max) / u_f),

with F_on = F_1(n, S) for every n <= C(S+2, 2) + 1 when no ``costs`` are given (online_binomial.py);
the argument holds for whatever reversal the pricing picks (F_on is then the plan's own). Measured
ratios to the offline multi-level optimum (multilevel.py, same n, capacities and costs) are in
experiments/online.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from .actions import Action, Adjoint, Advance, EndForward, EndReverse, Free, Move, Restore, Store
from .base import ScheduleError, last_step
from .costs import OpCosts, price_actions
from .multilevel import MultilevelPlanner
from .online_binomial import OnlineBinomial
from .revolve import beta, segment_actions


class OnlineMultilevel:
    """Online plan over K levels: one virtual level of sum(capacities) slots, placed fastest first.

    ``cheap_fraction``: a level is cheap when its write + read costs less than that fraction of a
    forward step; ``join_repetitions`` t: the other levels join past beta(S_cheap, t) steps. The
    defaults (1, 3) gave the best worst case of the values tried (experiments/online/variants.py).
    """

    name = "online-multilevel"

    def __init__(self, capacities: Sequence[int], costs: OpCosts | None = None, forward_cheap_only: bool = True,
                 cheap_fraction: float = 1.0, join_repetitions: int = 3):
        self.capacities = tuple(int(c) for c in capacities)
        self.costs = costs.for_levels(len(self.capacities)) if costs is not None else None
        if not self.capacities or any(c < 0 for c in self.capacities) or sum(self.capacities) < 1:
            raise ScheduleError("online checkpointing needs at least one slot (for u_0)")
        self.forward_levels = len(self.capacities)
        if self.costs is not None and forward_cheap_only:
            cheap = [k for k in range(len(self.capacities))
                     if self.costs.write[k] + self.costs.read[k] < cheap_fraction * self.costs.forward
                     and self.capacities[k] > 0]
            if cheap:
                self.forward_levels = cheap[-1] + 1
        self.inner = OnlineBinomial([sum(self.capacities[:self.forward_levels])])
        # past beta(S_cheap, 3) steps the cheap levels' repetition number would exceed 3: slow slots join
        self.grow_at = (beta(self.inner.slots, join_repetitions) if self.forward_levels < len(self.capacities)
                        else None)
        self.used = [0] * len(self.capacities)
        self.where: dict[int, int] = {}

    @property
    def position(self) -> int:
        """Forward steps planned so far."""
        return self.inner.position

    def _place(self, actions: Iterable[Action], forward: bool) -> Iterator[Action]:
        caps = self.capacities
        for action in actions:
            if isinstance(action, Store):
                if forward:
                    level = next(k for k, c in enumerate(caps) if c > 0)
                    if self.used[level] >= caps[level]:
                        yield from self._demote(level)
                else:
                    level = next(k for k in range(len(caps)) if self.used[k] < caps[k])
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

    def _demote(self, level: int) -> Iterator[Action]:
        """Make room on ``level``: its oldest snapshot moves to the next level with a slot (cascading)."""
        below = next(k for k in range(level + 1, len(self.capacities)) if self.capacities[k] > 0)
        if self.used[below] >= self.capacities[below]:
            yield from self._demote(below)
        oldest = min(n for n, k in self.where.items() if k == level)
        self.where[oldest] = below
        self.used[level] -= 1
        self.used[below] += 1
        yield Move(oldest, level, below)

    def step(self) -> list[Action]:
        """Actions for one more forward step: stores and frees, then ``Advance(i, i + 1)``."""
        if self.grow_at is not None and self.inner.position >= self.grow_at:
            self.inner.slots, self.forward_levels, self.grow_at = sum(self.capacities), len(self.capacities), None
        return list(self._place(self.inner.step(), forward=True))

    def finish(self) -> Iterator[Action]:
        """The forward sweep ended at n = steps taken: the reverse sweep, placed on the levels."""
        list(self.inner.finish())  # the one-level plan's checks (finish twice, before any step)
        return self._reverse(self.inner.position, list(self.inner.stored))

    def _reverse(self, n: int, stored: list[int]) -> Iterator[Action]:
        yield EndForward()
        yield Adjoint(n, n - 1)
        bounds = stored + [n - 1]
        for j in range(len(stored) - 1, -1, -1):
            free = [c - u for c, u in zip(self.capacities, self.used)]
            options = {1 + sum(free[:k + 1]) for k in range(len(free))} if self.costs else {1 + sum(free)}
            candidates = []
            for g in sorted(options):
                used, where = list(self.used), dict(self.where)
                segment = segment_actions(bounds[j], bounds[j + 1], g, 0, forward=False)
                candidates.append((list(self._place(segment, False)), self.used, self.where))
                self.used, self.where = used, where
            if self.costs and bounds[j + 1] - bounds[j] >= 2:
                level = self.where[bounds[j]]
                placed = list(_hierarchical(bounds[j], bounds[j + 1], level, free, self.costs))
                used, where = list(self.used), dict(self.where)
                used[level] -= 1
                del where[bounds[j]]
                candidates.append((placed, used, where))
            placed, self.used, self.where = min(
                candidates, key=lambda c: price_actions(c[0], self.costs) if self.costs else 0)
            yield from placed
        yield EndReverse()


def _hierarchical(lo: int, hi: int, level: int, free: list[int], costs: OpCosts) -> Iterator[Action]:
    """Reverse steps hi-1 .. lo, u_hi held, u_lo stored on ``level`` (restored first), with the multi-level
    DP (multilevel.py) over the ``free`` slots per level; the base's slot is freed at the end.

    The DP's task stack as MultilevelPlanner.actions streams it, for a segment whose base is not held.
    """
    caps = list(free)
    caps[level] += 1
    planner = MultilevelPlanner(hi - lo, caps, costs)
    stack: list[tuple] = [(0, hi - lo, level, min(caps[level] - 1, len(planner.layers[level]) - 1), False)]
    while stack:
        task = stack.pop()
        if len(task) == 2:
            yield Free(task[0] + lo, task[1])
            continue
        a, b, k, m, held = task
        if not held:
            yield Restore(a + lo, k)
        length = b - a
        if length == 1:
            yield from last_step(a + lo, k, False)
            continue
        choice = planner.choices[k][m][length]
        if choice < 0:
            lower = -choice - 1
            yield Store(a + lo, lower)
            stack.append((a, k))
            stack.append((a, b, lower, len(planner.layers[lower]) - 1, True))
        elif choice == length - 1:
            yield Advance(a + lo, b + lo - 1)
            yield Adjoint(b + lo, b + lo - 1)
            stack.append((a, b - 1, k, m, False))
        else:
            mid = a + choice
            right_level, right_free = planner._right_base(k, m, length - choice)
            yield Advance(a + lo, mid + lo)
            yield Store(mid + lo, right_level)
            stack.append((a, mid, k, m, False))
            stack.append((mid, b, right_level, right_free, True))


def online_multilevel_bound(online_forward: int, offline_one_level: int, costs) -> float:
    """The proven ratio bound (module docstring) for one plan's forward count and OpCosts ``costs``."""
    worst = costs.levels * (max(costs.write) + max(costs.read))
    return online_forward / offline_one_level * (1 + worst / costs.forward)
