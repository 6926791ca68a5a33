"""Online binomial checkpointing: one level, the binomial optimum for every n up to C(s+2, 2).

Same step()/finish() protocol as :class:`~.online.OnlineSchedule` (see online.py): ``step()`` once
before each forward step, ``finish()`` once the driver holds u_n; every rank makes the same calls.

Cost of a checkpoint set. With checkpoints 0 = p_0 < ... < p_{m-1} <= n-2 after the first sweep,
the reverse sweep runs Adjoint(n, n-1) on the held states, then reverses each interval
[p_j, p_{j+1}] (p_m = n-1), last first, with binomial revolve over the s - j slots not held by
p_0..p_{j-1}. Its forward evaluations are

    F(S, n) = n + sum_j p(p_{j+1} - p_j, s - j),    p(L, g) = t L - beta(g+1, t-1)

(revolve.classic_cost), and the offline optimum 1 + p(n, s) is the least F over all sets (offline
revolve's first sweep builds exactly such a set), so a set is optimal for n iff F(S, n) = 1 + p(n, s).

Planner (greedy). At ``step(i)`` n >= i + 1 is known and u_{i-1} is still held. The candidates are:
keep the set; add i-1 if a slot is free; or add i-1 and free one stored p_j (j >= 1). The planner
takes the candidate with the least F at n = i+1, ties broken by n = i+2, i+3, then by keeping, then
adding, then the smallest j.
All candidates cost O(s) per step from prefix/suffix sums.

What holds (checked by simulation in tests/unit/test_schedules_online.py):
- optimal (F = offline minimum) for every n <= C(s+2, 2) + 1, the range up to which Stumm and
  Walther's online algorithm is optimal (SISC 32(2), 2010: repetition number t <= 2); simulated for
  every such n with s <= 14, and (1000, 20), (10^4, 50) are optimal too;
- beyond, it is not proven optimal; measured ratios to the offline minimum are in experiments/online
  (e.g. s = 10: at most 1.027 up to n = 10^4). The proven guarantee it keeps beyond C(s+2, 2) is
  the trivial one, F <= n + (n-1)(n-2)/2 (each interval has a slot, p(L, g) <= p(L, 1) = L(L-1)/2,
  and the lengths sum to n - 1): it is *not* Stumm-Walther's bound beyond their range; where a provable
  bound near the optimum matters, :class:`~.online.OnlineSchedule` states one (t(d, s//2+1) extra
  sweeps) at a measured 1.0-1.31x the optimum (experiments/online).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from .actions import Action, Advance, Free, Store
from .base import ScheduleError
from .online_base import OneLevelOnline
from .revolve import classic_cost

_HORIZON = 3


@lru_cache(maxsize=1 << 18)
def _p(length: int, slots: int) -> int:
    """Forward steps to reverse ``length`` steps from a stored base with ``slots`` slots."""
    return classic_cost(length, slots)


def reverse_cost(stored: Sequence[int], n: int, slots: int) -> int:
    """F(S, n): forward evaluations of the whole plan when the first sweep ends with ``stored``."""
    bounds = list(stored) + [n - 1]
    return n + sum(_p(bounds[j + 1] - bounds[j], slots - j) for j in range(len(stored)))


class OnlineBinomial(OneLevelOnline):
    """Greedy online plan on one level, binomial-optimal up to n = C(s+2, 2) + 1 (module docstring)."""

    name = "online-binomial"

    def _choose(self, c: int, n: int) -> int | None:
        """-1: keep the set; 0: add c; j >= 1: add c and free stored[j]; chosen by least F (ties later n)."""
        s, S = self.slots, self.stored
        m = len(S)
        lengths = [S[k + 1] - S[k] for k in range(m - 1)] + [c - S[-1]]  # with c appended
        last = n - 1 - c
        keep_tail = n - 1 - S[-1]
        # cost of the set unchanged, and with c appended, at n + h
        base = sum(_p(lengths[k], s - k) for k in range(m - 1))
        options: list[tuple[tuple[int, ...], int]] = []
        options.append((tuple(base + _p(keep_tail + h, s - m + 1) for h in range(_HORIZON)), -1))
        if m < s:
            head = base + _p(lengths[m - 1], s - m + 1)
            options.append((tuple(head + _p(last + h, s - m) for h in range(_HORIZON)), 0))
        else:
            # intervals 0..m with c appended: remove index j merges intervals j-1, j and shifts later ones
            pref = [0] * (m + 1)
            for k in range(m):
                pref[k + 1] = pref[k] + _p(lengths[k], s - k)
            suf = [0] * (m + 1)  # suf[k] = sum over intervals k..m-1 with one slot more
            for k in range(m - 1, -1, -1):
                suf[k] = suf[k + 1] + _p(lengths[k], s - k + 1)
            for j in range(1, m):
                merged = pref[j - 1] + _p(lengths[j - 1] + lengths[j], s - j + 1) + suf[j + 1]
                options.append((tuple(merged + _p(last + h, s - m + 1) for h in range(_HORIZON)), j))
        return min(options)[1]

    def step(self) -> list[Action]:
        """Actions for one more forward step: stores and frees, then ``Advance(i, i + 1)``."""
        if self.finished:
            raise ScheduleError("step() after finish()")
        actions: list[Action] = []
        i = self.position
        if i == 1:
            self.stored.append(0)
            actions.append(Store(0, self.level))
        elif i >= 2:
            c = i - 1
            choice = self._choose(c, i + 1)
            if choice >= 0:
                if choice >= 1:
                    actions.append(Free(self.stored.pop(choice), self.level))
                self.stored.append(c)
                actions.append(Store(c, self.level))
        actions.append(Advance(i, i + 1))
        self.position = i + 1
        return actions
