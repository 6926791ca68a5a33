"""Time-tiled advance of the burgers model: t SSP-RK3 steps (3t stage sweeps) in one pass over a block.

Level L (0 .. 3t) is the state after L stage sweeps: level 3s is u_{i+s}, levels 3s + 1 and 3s + 2
are step s's stage states w1 and w2. From u_i with its depth-3t halo (:class:`..DeepHalo` strips),
a wavefront runs over the rows: at iteration tt, row tt of level 0 enters a ring and level L makes
its row tt - L from level L - 1's rows tt - L - 1 .. tt - L + 1 (and, for a step's second and third
stage, the row of its input u_{i+s}). Each level keeps a ring of four padded rows (a step's input
is read three levels later), so the 3t levels in flight stay in cache; the pass reads u_i and its
halo once and writes u_{i+t} (32 bytes a point for t steps, where t single steps move 112 a step).
Level L is computed on the block grown by 3t - L points on every side (the dependency cone of the
owned points), redundantly where that overlaps a neighbour: every point, whoever computes it, is
:func:`..burgers.stage`'s arithmetic on the same values (the same stage constants, the same FMAs in
the same order), so u_{i+t} is bitwise t calls of the model's step on any decomposition.
"""

from __future__ import annotations

from numba import njit

from .wave_tiled import _cache_bytes

from .burgers import _constants, _deep_rows, _rows, _s3, _store_row
from .fma import fma

#: the stage weights beta of SSP-RK3 (out = alpha w0 + beta (x + dt N(x)), alpha = 0, 3/4, 1/3)
BETAS = (1.0, 0.25, 2.0 / 3.0)


@njit(cache=True, inline="always")
def _slot(r, d):
    """Ring slot (0..3) of row r >= -d - 1 (a non-negative operand: no sign fix-up)."""
    return (r + 4 * d + 4) % 4


@njit(cache=True, error_model="numpy")
def advance(WU, WV, HU, HV, nu, dts, ih, outU, outV):
    """u_{i+t} (``outU``, ``outV``) from u_i = (WU, WV) and its halos ``HU``, ``HV`` (ylo, yhi, xlo,
    xhi strips) of depth at least 3t, t = len(dts), dts[s] the dt of step s (module docstring)."""
    t = dts.shape[0]
    d = 3 * t
    my, mx = WU.shape
    hd = HU[0].shape[0]
    third = 1.0 / 3.0
    R = _rows(8 * (d + 1), mx + 2 * d)  # level L, slot q, field f: row 8 L + 2 q + f; column c at c + d - L
    RO = _rows(2, mx)  # the output row
    for tt in range(-d, my + d):
        _deep_rows(R, 2 * _slot(tt, d), WU, HU, WV, HV, tt, d, hd)
        for lev in range(1, d + 1):
            r = tt - lev
            e = d - lev  # level lev's margin
            if r < -e or r >= my + e:
                continue
            step, q = (lev - 1) // 3, (lev - 1) % 3
            k = _constants(BETAS[0] if q == 0 else (BETAS[1] if q == 1 else BETAS[2]), nu, dts[step], ih)
            p = 8 * (lev - 1)
            bs, cs, ns = p + 2 * _slot(r - 1, d), p + 2 * _slot(r, d), p + 2 * _slot(r + 1, d)
            n = mx + 2 * e
            if q == 0:
                o = 8 * lev + 2 * _slot(r, d)
                for i in range(n):
                    su, sv = _s3(R, bs, cs, ns, i, k)
                    R[o, i] = su
                    R[o + 1, i] = sv
                continue
            w0 = 8 * (lev - 1 - q) + 2 * _slot(r, d)  # the step's input u_{i+s}, column c at i + q + 1
            if q == 1:
                o = 8 * lev + 2 * _slot(r, d)
                for i in range(n):
                    su, sv = _s3(R, bs, cs, ns, i, k)
                    R[o, i] = fma(0.75, R[w0, i + 2], su)
                    R[o + 1, i] = fma(0.75, R[w0 + 1, i + 2], sv)
            elif lev < d:
                o = 8 * lev + 2 * _slot(r, d)
                for i in range(n):
                    su, sv = _s3(R, bs, cs, ns, i, k)
                    R[o, i] = fma(third, R[w0, i + 3], su)
                    R[o + 1, i] = fma(third, R[w0 + 1, i + 3], sv)
            else:
                for i in range(mx):
                    su, sv = _s3(R, bs, cs, ns, i, k)
                    RO[0, i] = fma(third, R[w0, i + 3], su)
                    RO[1, i] = fma(third, R[w0 + 1, i + 3], sv)
                _store_row(RO, outU, outV, r)


def ring_bytes(mx: int, t: int) -> int:
    """Bytes of the rings of a tile of t steps on rows of mx points: 3t + 1 levels of four rows of
    both fields, each mx + 6t points (their padding aside)."""
    return 8 * (3 * t + 1) * (mx + 6 * t) * 8


def auto_depth(mx: int) -> int:
    """The default tile depth: the largest of 8, 4, 2 whose rings fit in a core's L2 (from sysfs;
    experiments/burgers_tiling: 8 the best at 768 and 1024 points a row, 4 at 2048), else 2."""
    l2 = _cache_bytes(2, 2 ** 20)
    for t in (8, 4):
        if ring_bytes(mx, t) <= l2:
            return t
    return 2
