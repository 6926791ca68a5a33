"""Multi-level checkpointing: the H-Revolve model (Herrmann & Pallez, ACM TOMS 46(2), 2020), any K.

Levels 0..K-1 (RAM, node-local disk, parallel file system, ...) each have a capacity c_k (slots) and
a cost per write w_k and read r_k; a forward step costs u_f, an adjoint step u_b. The plan minimises
the predicted makespan  F*u_f + n*u_b + sum_k (writes_k*w_k + reads_k*r_k)  (see costs.py; pass
energy costs to minimise joules instead).

Dynamic program (hierarchical, as H-Revolve). ``P[k][m][L]`` is the least cost (forward steps and
I/O, adjoint steps excluded) to reverse a chain of L steps whose first state is stored on level k and
held, whose last state is held, with m free slots left on level k, every level below k free and no
level above k used. Its options:

- *run through*: advance L-1 steps without storing, run the last adjoint step, read the base back:
  ``(L-1)*u_f + r_k + P[k][m][L-1]``;
- *split* at 1 <= j <= L-2: advance j steps, store there (on level k, using a slot, or on a lower
  level k' with all its slots: cost ``A(L-j)``), reverse that right part, read the base back and
  reverse the left part: ``j*u_f + A(L-j) + r_k + P[k][m][j]``;
- *drop*: copy the base to a lower level k' and continue there: ``w_k' + P[k'][c_k'-1][L]``.

Advancing j steps costs ``F(j) = j*u_f``, or, with an advance model (costs.py, ``OpCosts.run``),
``fixed + j*per_step`` for j >= 2: every ``j*u_f`` and ``(L-1)*u_f`` above is ``F(j)``, ``F(L-1)``, so
cheap advances make recomputing long chains cheaper than reading them from a slow level, and the DP
finds where. It prices each advance as a recomputation's (the whole run handed over); the first
sweep's keep their last step single (``actions.advance_runs``), which the simulator prices exactly.

The first sweep costs one u_f more (the last step, evaluated once for the objective) with the same
choices, so the total is ``u_f + n*u_b + min_k (w_k + P[k][c_k-1][n])``.

Relation to H-Revolve (and checkpoint_schedules' ``HRevolve``/``get_hopt_table``): their chain of
length l has l forward and l+1 backward steps and maps to our n = l + 1 steps; their optimum plus
one u_f is ours. Their recursion lacks the *run through* option above level 0 and charges r_0 on
chains of one step whatever the level; with free level-0 I/O (w_0 = r_0 = 0, which is how
checkpoint_schedules' ``HRevolve`` calls it) both give the same optimum — the tests check this, and
a brute-force search over all plans (Move included) for K = 3 and small n finds nothing cheaper.
Note: checkpoint_schedules' ``hrevolve_aux`` passes (uf, ub) to ``get_hopt_table(..., ub, uf)`` in
swapped order, so its HRevolve plans are optimal only when uf == ub.

Complexity. The exact DP scans every split: O(n^2 * sum_k c_k) — used while that is at most
``EXACT_LIMIT`` split evaluations. Beyond, each L evaluates only candidate splits: a window around
the previous L's best split, every fourth L also splits at powers of two from either end, then a
local descent. Slot layers stop early once an extra slot no longer lowers any cost. Both loops run
in Python for small DPs and compiled (multilevel_kernels.py, numba: the same float operations in
the same order, so bitwise the same tables and plans) for large ones (``COMPILE_ABOVE_S``): the
DP of n = 10^4 with K = 3 takes milliseconds. On random instances with n <= 120 the candidate DP
matched the exact one in 149 of 150 cases, within 0.11 % (tests/unit/test_schedules_multilevel.py).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator, Sequence
from itertools import repeat
from operator import add, eq

from .actions import Action, Adjoint, Advance, EndForward, EndReverse, Free, Store
from .base import Schedule, ScheduleError, opening, to_the_end
from .costs import OpCosts, default_costs

INF = float("inf")
#: largest number of split evaluations the exact DP may do before switching to candidate splits
EXACT_LIMIT = 2 * 10**7
_WINDOW = 3
_POWER_BASE = 2
_PROBE_EVERY = 4
#: the DPs run the compiled loops of multilevel_kernels.py (numba; the same floats in the same
#: order, so the same tables and plans) once the Python loops' estimated seconds, this DP's and the
#: earlier ones' of the process together (an online plan rebuilds its table as n grows), exceed
#: this: the first compiled DP of a process pays numba's import (~0.25 s) and, unless another numba
#: kernel ran before, its first kernel load (~0.15 s; the DP's own four cached kernels ~10 ms), so
#: small DPs stay pure Python; half of it when numba is already imported (a built-in model's kernels
#: ran, as in calibration or a re-plan mid-run), 1 ms once the DP's kernels are loaded
COMPILE_ABOVE_S = 0.4
#: True / False: always / never compile (tests compare both); None: by the estimate above
COMPILED: bool | None = None
#: the Python loops' seconds per split (exact scan) and per L (candidate splits), per slot layer
_EXACT_SPLIT_S, _CANDIDATE_L_S = 50e-9, 2.5e-6
_KERNELS = __name__.rpartition(".")[0] + ".multilevel_kernels"
_python_s = [0.0]  # the estimated seconds of this process's Python DPs so far


def _compiled(n: int, layers: int, exact: bool) -> bool:
    """Whether a DP of ``n`` steps and at most ``layers`` slot layers runs the compiled loops."""
    if COMPILED is not None:
        return COMPILED
    estimate = layers * (n * n / 2 * _EXACT_SPLIT_S if exact else n * _CANDIDATE_L_S)
    if _KERNELS in sys.modules:
        limit = 1e-3
    else:
        limit = COMPILE_ABOVE_S / 2 if "numba" in sys.modules else COMPILE_ABOVE_S
    if estimate + _python_s[0] > limit:
        return True
    _python_s[0] += estimate
    return False


def _kernels():
    from . import multilevel_kernels

    return multilevel_kernels


class MultilevelPlanner:
    """Solves the multi-level DP once; :meth:`actions` then streams the optimal plan."""

    def __init__(self, n_steps: int, capacities: Sequence[int], costs: OpCosts, exact: bool | None = None):
        self.n = n = int(n_steps)
        self.caps = tuple(int(c) for c in capacities)
        self.costs = costs.for_levels(len(self.caps))
        layers = sum(min(c, max(1, n - 1)) for c in self.caps)
        if exact is None:
            exact = n * n // 2 * layers <= EXACT_LIMIT
        self.exact = exact
        self.compiled = _compiled(n, layers, exact)
        kernels = _kernels() if self.compiled else None
        equal = eq if kernels is None else kernels.equal
        K = len(self.caps)
        uf = self.costs.forward
        # F[L]: advancing L steps (L * uf exactly as before when there is no advance model)
        F = array("d", [L * uf for L in range(n + 1)]) if self.costs.advance is None else \
            array("d", [self.costs.run(L) for L in range(n + 1)])
        self.layers: list[list[array]] = [[] for _ in range(K)]   # P[k][m] as arrays over L
        self.choices: list[list[array]] = [[] for _ in range(K)]  # j > 0 split, -(k'+1) drop to k'
        self.drop: list[array | None] = [None] * K                # D[k][L]: best base below level k
        self.drop_level: list[array | None] = [None] * K
        D = array("d", [INF]) * (n + 1)
        D_level = array("i", [-1]) * (n + 1)
        for k in range(K):
            if k > 0 and self.caps[k - 1] >= 1:
                below, wk = self.layers[k - 1][-1], self.costs.write[k - 1]
                if kernels is not None:
                    view = kernels.view
                    kernels.drop_update(view(D), view(D_level), view(below), wk, k - 1)
                else:
                    for L in range(1, n + 1):
                        v = wk + below[L]
                        if v < D[L]:
                            D[L], D_level[L] = v, k - 1
            self.drop[k], self.drop_level[k] = array("d", D), array("i", D_level)
            if self.caps[k] < 1:
                continue
            previous = None
            for m in range(min(self.caps[k] - 1, max(0, n - 2)) + 1):
                if previous is None:
                    right = array("d", D)
                elif kernels is not None:
                    right = array("d", D)
                    view = kernels.view
                    kernels.right_part(view(right), view(D), view(previous), self.costs.write[k])
                else:
                    right = array("d", map(min, D, map(add, repeat(self.costs.write[k]), previous)))
                right[1] = 0.0  # a right part of one step needs no checkpoint
                P, choice = self._layer(right, D, D_level, F, self.costs.read[k], kernels)
                if previous is not None and equal(P, previous):
                    break  # one more slot on this level lowers no cost: all further layers equal
                self.layers[k].append(P)
                self.choices[k].append(choice)
                previous = P
        tops = [(self.costs.write[k] + self.layers[k][-1][n], k) for k in range(K) if self.caps[k] >= 1]
        best, self.top_level = min(tops)
        self.predicted = uf + n * self.costs.adjoint + (best if n >= 2 else 0.0)

    def _layer(self, right: array, D: array, D_level: array, F: array, rk: float, kernels=None):
        """One slot layer: P[L] and its choice for L = 1..n, given right-part costs ``right`` and
        advance costs ``F`` (``kernels``: multilevel_kernels, whose compiled loops give the same
        floats, or None)."""
        n = self.n
        P = array("d", [INF]) * (n + 1)
        choice = array("i", [0]) * (n + 1)
        B = array("d", [INF]) * (n + 1)  # B[j] = F[j] + P[j]: cost of the left part with its advance
        if kernels is not None:
            view = kernels.view
            views = (view(right), view(D), view(D_level), view(F), float(rk), view(P), view(choice),
                     view(B))
            if self.exact:
                kernels.exact_layer(*views)
            else:
                kernels.candidate_layer(*views, _WINDOW, _POWER_BASE, _PROBE_EVERY)
            return P, choice
        P[1], B[1] = 0.0, F[1]
        if self.exact:
            reversed_right = right[::-1]  # reversed_right[n - x] = right[x]
            for L in range(2, n + 1):
                values = list(map(add, B[1:L], reversed_right[n - L + 1:n]))
                best = min(values)
                j = values.index(best) + 1
                best += rk
                if D[L] < best:
                    best, j = D[L], -(D_level[L] + 1)
                P[L], choice[L], B[L] = best, j, F[L] + best
            return P, choice
        W, base = _WINDOW, _POWER_BASE
        jp = 1
        for L in range(2, n + 1):
            best, bj = B[1] + right[L - 1], 1
            for j in range(max(1, jp - W), min(L, jp + W + 2)):
                v = B[j] + right[L - j]
                if v < best:
                    best, bj = v, j
            x = base if L % _PROBE_EVERY == 0 else L
            while x < L:
                v = B[x] + right[L - x]
                if v < best:
                    best, bj = v, x
                v = B[L - x] + right[x]
                if v < best:
                    best, bj = v, L - x
                x *= base
            moved = True
            while moved:
                moved = False
                for j in (bj - 1, bj + 1):
                    if 1 <= j < L:
                        v = B[j] + right[L - j]
                        if v < best:
                            best, bj, moved = v, j, True
            jp = bj
            best += rk
            if D[L] < best:
                best, bj = D[L], -(D_level[L] + 1)
            P[L], choice[L], B[L] = best, bj, F[L] + best
        return P, choice

    def _right_base(self, k: int, m: int, length: int) -> tuple[int, int]:
        """Where the right part of a split on (level k, m free slots) stores its base: (level, free)."""
        if m >= 1:
            mm = min(m - 1, len(self.layers[k]) - 1)
            if self.costs.write[k] + self.layers[k][mm][length] <= self.drop[k][length]:
                return k, mm
        lower = self.drop_level[k][length]
        return lower, len(self.layers[lower]) - 1

    def actions(self, ram_chain=None) -> Iterator[Action]:
        """Stream the optimal plan (``ram_chain`` as in :meth:`chain_actions`)."""
        n = self.n
        if n == 1:
            yield from (Advance(0, 1), EndForward(), Adjoint(1, 0), EndReverse())
            return
        top = self.top_level
        yield Store(0, top)
        yield from self.chain_actions(0, n, top, len(self.layers[top]) - 1, forward=True, held=True,
                                      ram_chain=ram_chain)
        yield EndReverse()

    def chain_actions(self, lo: int, hi: int, level: int, free: int, forward: bool,
                      held: bool, ram_chain=None) -> Iterator[Action]:
        """The table's plan for the chain u_lo .. u_hi with u_lo's slot on ``level`` and ``free`` more
        slots there (faster levels free): ``forward`` if the chain's last step is still ahead of the
        first sweep, ``held`` if u_lo is the working state (else it is restored first).
        ``ram_chain(lo, hi, forward, held)``, if given, plans every chain whose base is on level 0
        (the whole of level 0 free but the base: a mixed plan's RAM segments) in the table's place."""
        # pending tasks, last first: (lo, hi, level, layer, forward, base_held) or (lo, level) = Free
        stack: list[tuple] = [(lo, hi, level, free, forward, held)]
        while stack:
            task = stack.pop()
            if len(task) == 2:
                yield Free(*task)
                continue
            lo, hi, k, m, fwd, held = task
            if k == 0 and ram_chain is not None:
                yield from ram_chain(lo, hi, fwd, held)
                continue
            if (yield from opening(lo, hi, k, fwd, held)):
                continue
            length = hi - lo
            j = self.choices[k][m][length]
            if j < 0:
                lower = -j - 1
                yield Store(lo, lower)
                stack.append((lo, k))
                stack.append((lo, hi, lower, len(self.layers[lower]) - 1, fwd, True))
            elif j == length - 1:
                yield from to_the_end(lo, hi, fwd)
                stack.append((lo, hi - 1, k, m, False, False))
            else:
                mid = lo + j
                level, free = self._right_base(k, m, length - j)
                yield Advance(lo, mid)
                yield Store(mid, level)
                stack.append((lo, mid, k, m, False, False))
                stack.append((mid, hi, level, free, fwd, True))


class Multilevel(Schedule):
    """Least predicted makespan over K levels with capacities and per-level write/read costs."""

    name = "multilevel"

    def __init__(self, n_steps: int, capacities: Sequence[int], costs: OpCosts | None = None,
                 exact: bool | None = None):
        super().__init__(n_steps, capacities)
        self.costs = costs if costs is not None else default_costs(len(self.capacities))
        if self.costs.levels < len(self.capacities):
            raise ScheduleError(f"costs give {self.costs.levels} levels, capacities {len(self.capacities)}")
        self.planner = MultilevelPlanner(self.n_steps, self.capacities, self.costs, exact)

    @property
    def predicted(self) -> float:
        """The DP's predicted makespan (equals the simulator's count priced with the same costs)."""
        return self.planner.predicted

    def actions(self) -> Iterator[Action]:
        return self.planner.actions()
