"""Compiled loops of the multi-level DP (multilevel.py): one slot layer, exact or candidate splits,
and the drop / right-part vectors a layer takes (``F[L]``: what advancing L steps costs).

Each is the Python loop of :class:`~.multilevel.MultilevelPlanner` line for line (numba,
``cache=True``, no ``fastmath``): the same float operations in the same order, the same comparisons
(strict ``<``, so the exact scan keeps the first least split as ``values.index(min(values))`` does,
and the candidate search its candidates' order), so tables, choices and plans are bitwise those of
the Python loops. The planner passes numpy views of its ``array.array`` vectors (``np.frombuffer``,
no copy) and imports this module only for DPs large enough to repay numba's import (multilevel.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit


def view(values):
    """A writable numpy view of an ``array.array`` of doubles ("d") or C ints ("i"), no copy."""
    return np.frombuffer(values, dtype=np.float64 if values.typecode == "d" else np.intc)


def equal(a, b) -> bool:
    """``a == b`` for two double arrays of one length, as ``array.array`` compares them (== per
    element: inf equals inf, -0.0 equals 0.0, a NaN nothing)."""
    return bool(np.array_equal(view(a), view(b)))


@njit(cache=True)
def drop_update(D, D_level, below, wk, level):
    """D[L] = wk + below[L] (and D_level[L] = level) where that is lower, L = 1..n."""
    for L in range(1, D.shape[0]):
        v = wk + below[L]
        if v < D[L]:
            D[L] = v
            D_level[L] = level


@njit(cache=True)
def right_part(right, D, previous, wk):
    """right[L] = min(D[L], wk + previous[L]) as Python's min takes it (D[L] unless strictly
    above), then right[1] = 0 (a right part of one step needs no checkpoint)."""
    for L in range(D.shape[0]):
        v = wk + previous[L]
        d = D[L]
        right[L] = v if v < d else d
    right[1] = 0.0


@njit(cache=True, inline="always")
def _descend(j, L, B, right, best, bj):
    """(best, bj, moved) after trying split j of length L, where 1 <= j < L: taken if strictly better."""
    if 1 <= j < L:
        v = B[j] + right[L - j]
        if v < best:
            return v, j, True
    return best, bj, False


@njit(cache=True, inline="always")
def _settle(L, best, j, rk, D, D_level, F, P, choice, B):
    """Length L's entry once its best split j (cost ``best``, before the read ``rk``) is known:
    dropping the chain to a lower level instead where that is strictly cheaper."""
    best += rk
    if D[L] < best:
        best = D[L]
        j = -(D_level[L] + 1)
    P[L] = best
    choice[L] = j
    B[L] = F[L] + best


@njit(cache=True)
def exact_layer(right, D, D_level, F, rk, P, choice, B):
    """P[L], choice[L] for L = 2..n scanning every split j = 1..L-1 (the first least one wins)."""
    n = P.shape[0] - 1
    P[1] = 0.0
    B[1] = F[1]
    for L in range(2, n + 1):
        best = B[1] + right[L - 1]
        j = 1
        for i in range(2, L):
            v = B[i] + right[L - i]
            if v < best:
                best = v
                j = i
        _settle(L, best, j, rk, D, D_level, F, P, choice, B)


@njit(cache=True)
def candidate_layer(right, D, D_level, F, rk, P, choice, B, window, base, probe_every):
    """P[L], choice[L] for L = 2..n over the candidate splits of MultilevelPlanner._layer, in its
    order: j = 1, the window around the previous best, powers of ``base`` from either end every
    ``probe_every``-th L, then the local descent."""
    n = P.shape[0] - 1
    P[1] = 0.0
    B[1] = F[1]
    jp = 1
    for L in range(2, n + 1):
        best = B[1] + right[L - 1]
        bj = 1
        for j in range(max(1, jp - window), min(L, jp + window + 2)):
            v = B[j] + right[L - j]
            if v < best:
                best = v
                bj = j
        x = base if L % probe_every == 0 else L
        while x < L:
            v = B[x] + right[L - x]
            if v < best:
                best = v
                bj = x
            v = B[L - x] + right[x]
            if v < best:
                best = v
                bj = L - x
            x *= base
        moved = True
        while moved:
            lo, hi = bj - 1, bj + 1  # both neighbours of the best at the pass's start, lower first
            best, bj, below = _descend(lo, L, B, right, best, bj)
            best, bj, above = _descend(hi, L, B, right, best, bj)
            moved = below or above
        jp = bj
        _settle(L, best, bj, rk, D, D_level, F, P, choice, B)
