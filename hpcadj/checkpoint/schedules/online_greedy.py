"""Online multi-level checkpointing by a priced greedy: each first-sweep step keeps the checkpoint set
(and its levels) that makes the whole plan cheapest if the sweep ended there, with the offline DP's
costs; once n is known the reverse sweep is planned offline over the checkpoints held.

Protocol: as :class:`~.online.OnlineSchedule` (``step()`` before each forward step, ``finish()`` once
u_n is held; every rank makes the same calls).

Configuration. The first sweep holds checkpoints p_0 = 0 < p_1 < ... < p_{m-1} with levels
b_0 >= b_1 >= ... (older on slower levels, as the offline optimum's first sweep places them). The
reverse sweep reverses the intervals [p_j, p_{j+1}] (p_m = n - 1), last first; when interval j runs,
every level faster than b_j is free and level b_j has c_{b_j} - 1 - (checkpoints before j on b_j)
free slots besides the base, so its least cost is r_{b_j} + P[b_j][m_j][L_j], with P the table of
the multi-level DP (multilevel.py: base on level k, m free slots there, faster levels free). The
cost of a configuration at n is the sum of these, C(config, n).

Step i (n >= i + 1 known, u_{i-1} still held; c = i - 1). Candidates: keep; store c on any level k
no slower than the newest checkpoint's; when k is full, free one checkpoint of level k (not u_0) or
move the oldest of level k one level down (cascading to the first level with room, or freeing one
there), or straight to a slower level past empty ones. Each is priced (writes, moves: read +
write) plus C(config', i + 1); the least wins, ties by C at i + 2, i + 3, then by the candidate
order (keep first). The table P grows by doubling as the sweep goes on. Writes a short run would
not pay for are not made: a slow-level write is chosen only when its price is below what it saves
at the current n. Past a few hundred (candidate, interval) pairs a step prices all candidates in one
numpy pass (a row of interval costs each, summed oldest first as C is defined: the same floats, so
the same plans, as one sum per candidate, which smaller steps keep).

Reverse (finish): each interval, last first, takes the cheaper (priced) of the multi-level DP over
the free slots with its base on its level (what C assumed) and revolve on the fastest levels with
room, so the predicted makespan is at most the configuration's priced cost.

Bound. As online_multilevel.py's: every Restore precedes an Advance or Adjoint and every reverse
Store follows its own Advance (R, W_reverse <= F_on); the first sweep stores at most n - 1 states and
a snapshot only moves down, at most K - 1 times; so makespan_on <= F_on (u_f + K (w_max + r_max))
+ n u_b while any offline plan costs at least F_1(n, S) u_f + n u_b (F_1: the one-level binomial
minimum with S = sum c_k slots), hence makespan_on / makespan_off <= (F_on / F_1(n, S))
(1 + K (w_max + r_max) / u_f) (:func:`~.online_multilevel.online_multilevel_bound`). Loose: the
measured ratios are far below it: at most 1.033x the offline multi-level optimum on every
three-level study case with s >= 10 and n <= 10^4 (default costs; experiments/online).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from .actions import Action, Adjoint, Advance, EndForward, EndReverse, Free, Move, Restore, Store
from .base import ScheduleError
from .costs import OpCosts, price_actions
from .multilevel import MultilevelPlanner
from .online_base import begin_finish
from .revolve import segment_actions

_HORIZON = 3
_FIRST_TABLE = 64
#: candidates x checkpoints up to which a step prices candidates one by one (_cost) instead of in
#: one numpy pass (same floats either way; below this the pass's fixed cost is the larger)
_SMALL = 400


class OnlineGreedyMultilevel:
    """Priced greedy online plan over K levels (module docstring); ``costs`` are required.

    ``horizon`` H: candidates compare by their cost at n = i+1, then i+2 .. i+H (ties); ``mean``:
    by the mean over i+1 .. i+H instead (a look-ahead; measured worse, experiments/online/variants.py).
    """

    name = "online-multilevel"

    def __init__(self, capacities: Sequence[int], costs: OpCosts, horizon: int = _HORIZON, mean: bool = False):
        self.capacities = tuple(int(c) for c in capacities)
        if not self.capacities or any(c < 0 for c in self.capacities) or sum(self.capacities) < 1:
            raise ScheduleError("online checkpointing needs at least one slot (for u_0)")
        self.costs = costs.for_levels(len(self.capacities))
        if horizon < 1:
            raise ScheduleError(f"horizon must be >= 1, got {horizon}")
        self.horizon, self.mean = int(horizon), bool(mean)
        self.position = 0
        self.finished = False
        self.points: list[int] = []   # checkpoints, ascending
        self.levels: list[int] = []   # their levels, non-increasing
        self.spent = 0.0              # priced first-sweep stores and moves so far
        self._table_n = 0
        self._planner: MultilevelPlanner | None = None
        self._P: list[list] = []

    # --- the cost of a configuration -------------------------------------------------------------
    def _ensure_table(self, length: int) -> None:
        """Make P cover chains of ``length`` steps (rebuilt at twice the size when too short), with
        the DP's candidate splits: 7x faster than the exact scan at 512 steps, and the same ratios
        to 4 digits on every three-level study case with n <= 3000 (measured)."""
        if length <= self._table_n:
            return
        n = max(_FIRST_TABLE, 2 * self._table_n, length)
        self._planner = MultilevelPlanner(n, self.capacities, self.costs, exact=False)
        self._P = self._planner.layers
        self._table_n = n
        self._flatten_table()

    def _cost(self, points: Sequence[int], levels: Sequence[int], n: int) -> float:
        """C(config, n): the least priced reverse sweep over these checkpoints (module docstring)."""
        return self._costs(points, levels, [n])[0]

    def _costs(self, points: Sequence[int], levels: Sequence[int], ends: Sequence[int]) -> list[float]:
        """C(config, n) for each n in ``ends``: the intervals summed oldest first, the last one (the
        only one that depends on n) added per n to the sum of the others."""
        read, P, caps = self.costs.read, self._P, self.capacities
        total = 0.0
        seen = [0] * len(caps)
        last = len(points) - 1
        for j in range(last + 1):
            b = levels[j]
            layers = P[b]
            row = layers[min(caps[b] - 1 - seen[b], len(layers) - 1)]
            seen[b] += 1
            if j < last:
                total += read[b] + row[points[j + 1] - points[j]]
        return [total + (read[b] + row[n - 1 - points[last]]) for n in ends]

    def _flatten_table(self) -> None:
        """The table as one float64 vector (level k, layer m, length L at offset[k] + m*stride + L)
        so that step() prices all candidates with one gather."""
        parts, offsets, count = [], [], 0
        for layers in self._P:
            offsets.append(count * (self._table_n + 1))
            parts.extend(np.frombuffer(layer, dtype=np.float64) for layer in layers)
            count += len(layers)
        self._flat = np.concatenate(parts)
        self._offset = np.array(offsets, dtype=np.int64)
        self._top_layer = np.array([max(0, len(layers) - 1) for layers in self._P], dtype=np.int64)
        self._caps = np.array(self.capacities, dtype=np.int64)
        self._read = np.array(self.costs.read, dtype=np.float64)

    # --- candidates ------------------------------------------------------------------------------
    def _candidates(self) -> Iterator[tuple[list, tuple[tuple[int, int], ...], int | None, float]]:
        """The moves the module docstring lists, keep first, in groups that differ only in which
        checkpoint they free: (indices freed, None for none; moves as (index, new level), deepest
        first; level u_{i-1} is stored on, None to keep; price of the writes and moves)."""
        caps, K, w, r = self.capacities, len(self.capacities), self.costs.write, self.costs.read
        lvs = self.levels
        if lvs:
            yield [None], (), None, 0.0
        used = [0] * K
        for b in lvs:
            used[b] += 1
        oldest = {b: lvs.index(b) for b in set(lvs)}
        on: dict[int, list] = {}  # each level's checkpoints, u_0 excepted (never freed)
        for j in range(1, len(lvs)):
            on.setdefault(lvs[j], []).append(j)

        def demoted(chain: list[int], frees: list):
            price = 0.0
            for src, dst in zip(reversed(chain[:-1]), reversed(chain[1:])):
                price += r[src] + w[dst]
            moves = tuple((oldest[src], dst) for src, dst in zip(reversed(chain[:-1]), reversed(chain[1:])))
            return frees, moves, chain[0], price + w[chain[0]]

        newest = lvs[-1] if lvs else K - 1
        for k in range(newest + 1):
            if caps[k] < 1:
                continue
            if used[k] < caps[k]:
                yield [None], (), k, 0.0 + w[k]
                continue
            # level k is full: free one of its checkpoints (never u_0) ...
            if k in on:
                yield on[k], (), k, 0.0 + w[k]
            # ... or move the oldest of each full level down, until a level has room (or frees one)
            chain = [k]
            for d in range(k + 1, K):
                if caps[d] < 1:
                    continue
                chain.append(d)
                if used[d] < caps[d]:
                    yield demoted(chain, [None])
                    break
                if d in on:
                    yield demoted(chain, on[d])
            # ... or move the oldest of level k past empty levels (older checkpoints stay slower)
            for d in range(k + 2, K):
                between = range(k + 1, d)
                if caps[d] < 1 or any(used[e] for e in between) or not any(caps[e] for e in between):
                    continue
                if used[d] < caps[d]:
                    yield demoted([k, d], [None])
                elif d in on:
                    yield demoted([k, d], on[d])

    def _candidate_costs(self, groups: list, c: int, ends: Sequence[int]) -> np.ndarray:
        """C(config', n) for every candidate config' of ``groups`` (rows, in order) and every n in
        ``ends`` (columns), summed as :meth:`_cost` sums them (interval by interval, oldest first: the
        same floats), all at once: the closed intervals' sum is shared by every n."""
        pts, lvs = self.points, self.levels
        M, K = len(pts), len(self.capacities)
        W = M + 1
        sizes = [len(g[0]) for g in groups]
        C = sum(sizes)
        level_rows = np.empty((C, W), dtype=np.int64)
        level_rows[:] = lvs + [0]
        shift = np.full(C, W + 1, dtype=np.int64)
        count = np.full(C, M, dtype=np.int64)
        row = 0
        for (frees, moves, store, _), size in zip(groups, sizes):
            rows = slice(row, row + size)
            for index, dst in moves:
                level_rows[rows, index] = dst
            if store is not None:
                level_rows[rows, M] = store
                if frees[0] is None:
                    count[rows] = M + 1
                else:
                    shift[rows] = frees
            row += size
        cols = np.arange(W, dtype=np.int64)
        index = np.minimum(cols + (cols >= shift[:, None]), M)  # the config's j-th checkpoint
        point = np.array(pts + [c], dtype=np.int64)[index]
        index += np.arange(0, C * W, W, dtype=np.int64)[:, None]
        level = level_rows.ravel()[index]  # past the last checkpoint: a level no slower than the newest
        # rank among the earlier checkpoints on the same level: levels do not increase along a row
        first = np.zeros((C, K), dtype=np.int64)
        for k in range(K - 1):
            first[:, k] = (level > k).sum(axis=1)
        rank = cols - first.ravel()[level + np.arange(0, C * K, K, dtype=np.int64)[:, None]]
        layer = np.clip(self._caps[level] - 1 - rank, 0, self._top_layer[level])
        base = self._offset[level] + layer * (self._table_n + 1)
        read = self._read[level]
        closed = cols[:-1] < (count - 1)[:, None]
        terms = np.where(closed, read[:, :-1] + self._flat[base[:, :-1] + (point[:, 1:] - point[:, :-1])], 0.0)
        partial = np.add.accumulate(terms, axis=1)[:, -1] if W > 1 else np.zeros(C)
        last = count - 1 + np.arange(0, C * W, W, dtype=np.int64)
        last_point, last_base, last_read = point.ravel()[last], base.ravel()[last], read.ravel()[last]
        return np.stack([partial + (last_read + self._flat[last_base + (n - 1 - last_point)]) for n in ends],
                        axis=1)

    def _configured(self, c: int, free_j: int | None, moves, store: int | None):
        """(actions, points, levels) of a candidate of :meth:`_candidates` taken from here."""
        pts, lvs = list(self.points), list(self.levels)
        actions: list[Action] = []
        if free_j is not None:
            actions.append(Free(pts[free_j], lvs[free_j]))
        for index, dst in moves:
            actions.append(Move(pts[index], lvs[index], dst))
            lvs[index] = dst
        if free_j is not None:
            del pts[free_j], lvs[free_j]
        if store is not None:
            actions.append(Store(c, store))
            pts.append(c)
            lvs.append(store)
        return actions, pts, lvs

    # --- protocol --------------------------------------------------------------------------------
    def step(self) -> list[Action]:
        """Actions for one more forward step: stores, moves and frees, then ``Advance(i, i + 1)``."""
        if self.finished:
            raise ScheduleError("step() after finish()")
        i = self.position
        actions: list[Action] = []
        if i >= 1:
            H = self.horizon
            self._ensure_table(i + H)
            groups = list(self._candidates())
            price = np.repeat([g[3] for g in groups], [len(g[0]) for g in groups])
            ends = [i + h for h in range(1, H + 1)]
            if len(price) * (len(self.points) + 1) <= _SMALL:
                costs = np.array([self._costs(*self._configured(i - 1, free_j, moves, store)[1:], ends)
                                  for frees, moves, store, _ in groups for free_j in frees])
            else:
                costs = self._candidate_costs(groups, i - 1, ends)
            total = price[:, None] + costs
            if self.mean:
                later = np.zeros(len(price))
                for h in range(1, H):
                    later = later + total[:, h]
                best = int(np.argmin((total[:, 0] + later) / H))
            else:
                order = np.arange(len(price))
                best = int(np.lexsort((order, *(total[:, h] for h in range(H - 1, -1, -1))))[0])
            for frees, moves, store, spent in groups:
                if best < len(frees):
                    break
                best -= len(frees)
            actions, self.points, self.levels = self._configured(i - 1, frees[best], moves, store)
            self.spent += spent
        actions.append(Advance(i, i + 1))
        self.position = i + 1
        return actions

    def finish(self) -> Iterator[Action]:
        """The forward sweep ended at n = steps taken: the reverse sweep, planned knowing n."""
        begin_finish(self)
        return self._reverse(self.position, list(self.points), list(self.levels))

    def predicted(self) -> float:
        """The makespan the plan will at most cost if the sweep ends now (n = steps taken >= 1):
        n (u_f + u_b) + the first sweep's stores and moves + C(config, n); the reverse sweep of
        :meth:`finish` costs no more than C (it takes the table's plan or a cheaper one)."""
        n = self.position
        if n < 1:
            raise ScheduleError("predicted() before any step")
        self._ensure_table(n)
        reverse = self._cost(self.points, self.levels, n) if self.points else 0.0
        return n * (self.costs.forward + self.costs.adjoint) + self.spent + reverse

    def _reverse(self, n: int, points: list[int], levels: list[int]) -> Iterator[Action]:
        caps, K = self.capacities, len(self.capacities)
        self._ensure_table(n)
        yield EndForward()
        yield Adjoint(n, n - 1)
        used = [0] * K
        for b in levels:
            used[b] += 1
        bounds = points + [n - 1]
        for j in range(len(points) - 1, -1, -1):
            lo, hi, b = bounds[j], bounds[j + 1], levels[j]
            free = [c - u for c, u in zip(caps, used)]
            options = [list(_revolve_placed(lo, hi, b, free, k)) for k in range(K)]
            if hi - lo >= 2:
                options.append(list(self._tabled(lo, hi, b, free[b])))
            yield from min(options, key=lambda option: price_actions(option, self.costs))
            used[b] -= 1
        yield EndReverse()

    def _tabled(self, lo: int, hi: int, level: int, free: int) -> Iterator[Action]:
        """Reverse steps hi-1 .. lo by the DP table (u_hi held, u_lo stored on ``level`` with ``free``
        more slots there, faster levels free), as MultilevelPlanner.actions streams a chain whose
        base is not held; the base's slot is freed at the end."""
        planner = self._planner
        return planner.chain_actions(lo, hi, level, min(free, len(planner.layers[level]) - 1), forward=False,
                                     held=False)


def _revolve_placed(lo: int, hi: int, base: int, free: list[int], k: int) -> Iterator[Action]:
    """Revolve over the free slots of levels 0..k plus the base's own, each Store on the fastest
    level with room (Restore/Free where the state is)."""
    room = [f if d <= k else 0 for d, f in enumerate(free)]
    where = {lo: base}
    for action in segment_actions(lo, hi, 1 + sum(room), 0, forward=False):
        if isinstance(action, Store):
            level = next(d for d, f in enumerate(room) if f > 0)
            room[level] -= 1
            where[action.n] = level
            yield Store(action.n, level)
        elif isinstance(action, Restore):
            yield Restore(action.n, where[action.n])
        elif isinstance(action, Free):
            level = where.pop(action.n)
            if action.n != lo:
                room[level] += 1
            yield Free(action.n, level)
        else:
            yield action
