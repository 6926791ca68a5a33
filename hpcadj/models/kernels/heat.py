"""Compiled loops of the heat model: its operator A = I - theta dt L(kappa) applied matrix-free,
and the adjoint step's d/dkappa.

The operator keeps the face diffusivities (kappa_p + kappa_q) / 2 / h^2 (kappa_p / h^2 at a
Dirichlet face) per axis, one array each (:func:`faces`; d state-equivalents, against 9-12 for the
assembled AIJ matrix): a product then reads no kappa and divides nothing. A row's entries are those
the AIJ matrix held (off-diagonals weight * face; diagonal 1 + weight * (0 - face - face ...), faces
in natural axis order, lower then upper) and are summed in the order PETSc's AIJ MatMult sums them:
the on-rank columns by increasing index, then the off-rank (ghost) columns by increasing index. So
y = A x is bitwise what the assembled matrix gave, on any rank count. No fastmath: IEEE arithmetic
in the written order.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def faces(kappa, shape, gstride, goff, lo_wall, hi_wall, first, h2, f0, f1, f2):
    """The face diffusivities / h^2 of the owned block, per axis: ``fa`` has one more entry than
    the block along axis a, entry j the face between points j-1 and j (j = 0 and j = m_a: the
    block's lower and upper faces). (kappa_p + kappa_q) / 2 / h^2 inside the domain, kappa_p / h^2
    on its boundary; ``kappa`` is the ghosted local block (flat). A face shared by two points is
    the same double from either side (the sum commutes), so each is computed once."""
    m = (shape[0], shape[1], shape[2])
    out = (f0, f1, f2)
    for a in range(first, 3):
        fa = out[a]
        for i0 in range(fa.shape[0]):
            for i1 in range(fa.shape[1]):
                for i2 in range(fa.shape[2]):
                    j = i0 if a == 0 else (i1 if a == 1 else i2)
                    # the point above the face (j), or below it (j - 1) for the block's upper face
                    up = j if j < m[a] else j - 1
                    q0 = (up if a == 0 else i0) + goff[0]
                    q1 = (up if a == 1 else i1) + goff[1]
                    q2 = (up if a == 2 else i2) + goff[2]
                    g = q0 * gstride[0] + q1 * gstride[1] + q2
                    kp = kappa[g]
                    if (j == 0 and lo_wall[a]) or (j == m[a] and hi_wall[a]):
                        fa[i0, i1, i2] = kp / h2[a]
                    else:
                        other = g - gstride[a] if j < m[a] else g + gstride[a]
                        fa[i0, i1, i2] = (0.5 * (kp + kappa[other])) / h2[a]


@njit(cache=True)
def _point(x, f0, f1, f2, shape, gstride, lo_wall, hi_wall, first, weight, i0, i1, i2, g, diagonal):
    """A x (or A's diagonal) at one owned point, any position: faces on the domain's boundary
    (no column) and off-rank neighbours (summed after the on-rank columns) handled."""
    pos = (i0, i1, i2)
    lo = (f0[i0, i1, i2] if first == 0 else 0.0, f1[i0, i1, i2], f2[i0, i1, i2])
    hi = (f0[i0 + 1, i1, i2] if first == 0 else 0.0, f1[i0, i1 + 1, i2], f2[i0, i1, i2 + 1])
    diag = 0.0
    for a in range(first, 3):
        diag -= lo[a]
        diag -= hi[a]
    centre = 1.0 + weight * diag
    if diagonal:
        return centre
    s = 0.0
    for group in range(2):  # on-rank columns by index, then the off-rank (ghost) ones
        for a in range(first, 3):
            if pos[a] > 0 and group == 0:
                s += (weight * lo[a]) * x[g - gstride[a]]
            elif pos[a] == 0 and not lo_wall[a] and group == 1:
                s += (weight * lo[a]) * x[g - gstride[a]]
        if group == 0:
            s += centre * x[g]
        for a in range(2, first - 1, -1):
            if pos[a] < shape[a] - 1 and group == 0:
                s += (weight * hi[a]) * x[g + gstride[a]]
            elif pos[a] == shape[a] - 1 and not hi_wall[a] and group == 1:
                s += (weight * hi[a]) * x[g + gstride[a]]
    return s


@njit(cache=True)
def apply(x, f0, f1, f2, shape, gstride, goff, lo_wall, hi_wall, first, weight, out, diagonal):
    """out = A x on the owned block (or A's diagonal when ``diagonal``), A = I + weight L.

    ``x`` is the input's ghosted local block (flat), ``f0, f1, f2`` the faces of :func:`faces`;
    ``shape`` the owned block's (3-D) shape, ``gstride``/``goff`` the ghosted block's strides and
    the owned block's offset in it; ``lo_wall[a]``/``hi_wall[a]`` whether the block's lower/upper
    end on axis a is the domain's boundary; axes before ``first`` do not exist (2-D grids). Points
    inside the block (every neighbour on this rank) take a branch-free row loop, the same
    arithmetic in the same order as :func:`_point`.
    """
    m0, m1, m2 = shape[0], shape[1], shape[2]
    s0, s1 = gstride[0], gstride[1]
    for i0 in range(m0):
        for i1 in range(m1):
            row = (i0 * m1 + i1) * m2
            base = (i0 + goff[0]) * s0 + (i1 + goff[1]) * s1 + goff[2]
            inner = not diagonal and 0 < i1 < m1 - 1 and (first == 1 or 0 < i0 < m0 - 1)
            for i2 in range(m2):
                if inner and 0 < i2 < m2 - 1:
                    continue
                out[row + i2] = _point(x, f0, f1, f2, shape, gstride, lo_wall, hi_wall, first, weight,
                                       i0, i1, i2, base + i2, diagonal)
            if not inner:
                continue
            if first == 0:
                _row3(x[base - s0:base - s0 + m2], x[base - s1:base - s1 + m2], x[base - 1:base + m2 + 1],
                      x[base + s1:base + s1 + m2], x[base + s0:base + s0 + m2], f0[i0, i1], f0[i0 + 1, i1],
                      f1[i0, i1], f1[i0, i1 + 1], f2[i0, i1], weight, out[row:row + m2])
            else:
                _row2(x[base - s1:base - s1 + m2], x[base - 1:base + m2 + 1], x[base + s1:base + s1 + m2],
                      f1[i0, i1], f1[i0, i1 + 1], f2[i0, i1], weight, out[row:row + m2])


@njit(cache=True)
def _row3(x0m, x1m, xc, x1p, x0p, f0m, f0p, f1m, f1p, f2, weight, out):
    """The inside points 1 .. m-2 of one 3-D row, from row slices (``xc`` is the row with one more
    point at each end, ``f2`` the row's m + 1 axis-2 faces): no branch and no index arithmetic
    beyond i +- 1, so the loop vectorises."""
    for i in range(1, out.shape[0] - 1):
        a0m, a0p, a1m, a1p, a2m, a2p = f0m[i], f0p[i], f1m[i], f1p[i], f2[i], f2[i + 1]
        centre = 1.0 + weight * (0.0 - a0m - a0p - a1m - a1p - a2m - a2p)
        s = 0.0 + (weight * a0m) * x0m[i]
        s += (weight * a1m) * x1m[i]
        s += (weight * a2m) * xc[i]
        s += centre * xc[i + 1]
        s += (weight * a2p) * xc[i + 2]
        s += (weight * a1p) * x1p[i]
        s += (weight * a0p) * x0p[i]
        out[i] = s


@njit(cache=True)
def _row2(x1m, xc, x1p, f1m, f1p, f2, weight, out):
    """The inside points 1 .. m-2 of one 2-D row (as :func:`_row3` without axis 0)."""
    for i in range(1, out.shape[0] - 1):
        a1m, a1p, a2m, a2p = f1m[i], f1p[i], f2[i], f2[i + 1]
        centre = 1.0 + weight * (0.0 - a1m - a1p - a2m - a2p)
        s = 0.0 + (weight * a1m) * x1m[i]
        s += (weight * a2m) * xc[i]
        s += centre * xc[i + 1]
        s += (weight * a2p) * xc[i + 2]
        s += (weight * a1p) * x1p[i]
        out[i] = s


@njit(cache=True)
def kappa_gradient(w, mu, wf, mf, lo_wall, hi_wall, first, h2, dt, grad):
    """grad += dt d(mu^T L(kappa) w)/d kappa, per owned point: half of each interior face's
    (w_q - w_p) (mu_p - mu_q) / h^2, all of a boundary face's (w = mu = 0 beyond it).

    ``w``, ``mu`` and ``grad`` are owned blocks (3-D shape), ``wf``/``mf`` the six halo faces of w
    and mu (lo then hi per axis, each shaped like the block without that axis; zeros outside the
    domain). The arithmetic and its order are those of the numpy slabs this loop replaced.
    """
    m = w.shape
    pos = np.zeros(3, dtype=np.int64)
    for i0 in range(m[0]):
        for i1 in range(m[1]):
            for i2 in range(m[2]):
                pos[0], pos[1], pos[2] = i0, i1, i2
                wp = w[i0, i1, i2]
                mp = mu[i0, i1, i2]
                acc = 0.0
                for a in range(first, 3):
                    for side in range(2):
                        step = -1 if side == 0 else 1
                        end = pos[a] == 0 if side == 0 else pos[a] == m[a] - 1
                        if end:
                            f = 2 * a + side
                            if a == 0:
                                wq, mq = wf[f][i1, i2], mf[f][i1, i2]
                            elif a == 1:
                                wq, mq = wf[f][i0, i2], mf[f][i0, i2]
                            else:
                                wq, mq = wf[f][i0, i1], mf[f][i0, i1]
                            inside = not (lo_wall[a] if side == 0 else hi_wall[a])
                        else:
                            j0 = i0 + step if a == 0 else i0
                            j1 = i1 + step if a == 1 else i1
                            j2 = i2 + step if a == 2 else i2
                            wq, mq = w[j0, j1, j2], mu[j0, j1, j2]
                            inside = True
                        share = (0.5 if inside else 1.0) / h2[a]
                        acc += ((wq - wp) * share) * (mp - mq)
                grad[i0, i1, i2] += dt * acc
