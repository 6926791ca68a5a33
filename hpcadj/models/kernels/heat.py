"""Compiled loop of the heat model: its operator A = I - theta dt L(kappa) applied matrix-free.

The arrays are flat: ``x`` and ``kappa`` the DMDA's ghosted local blocks, ``out`` the owned block.
A row's entries are computed exactly as the assembled AIJ matrix held them (face diffusivity
(kappa_p + kappa_q) / 2 / h^2, or kappa_p / h^2 at a Dirichlet face; off-diagonals theta-weighted
faces; diagonal 1 + weight * (0 - face - face ...), faces in natural axis order, lower then upper)
and summed in the order PETSc's AIJ MatMult sums them: the on-rank columns by increasing index,
then the off-rank (ghost) columns by increasing index. So y = A x is bitwise what the assembled
matrix gave, on any rank count. No fastmath: IEEE arithmetic in the written order.

The loop goes row by row along x. A row whose z and y neighbours are all owned (the bulk of the
block) runs one branch-free unit-stride loop over row slices, which LLVM vectorises
(``error_model="numpy"`` drops numba's zero check per division); its two end points and the
block's boundary rows take general paths with the same arithmetic in the same order. Nothing is
held beyond a six-row scratch: the faces are computed per product, not stored.
"""

from __future__ import annotations

import numpy as np
from numba import njit


#: a face's neighbour: none (the leading axis of a 2-D grid), a Dirichlet wall (no column),
#: an owned point (a column of the diagonal block), a ghost (a column of the off-rank block)
ABSENT, WALL, OWNED, GHOST = -1, 0, 1, 2


@njit(cache=True, inline="always")
def _kinds(i, m, lo_wall, hi_wall, exists):
    """The kinds of the lower and upper neighbours of index ``i`` of ``m`` on one axis."""
    if not exists:
        return ABSENT, ABSENT
    lo = OWNED if i > 0 else (WALL if lo_wall else GHOST)
    hi = OWNED if i < m - 1 else (WALL if hi_wall else GHOST)
    return lo, hi


@njit(cache=True, inline="always")
def _face(kappa, kp, q, kind, h2):
    """A face's diffusivity / h^2: kp / h^2 at a wall, the mean with kappa[q] towards a point
    (0 where the axis does not exist; such a face is never used)."""
    if kind == WALL:
        return kp / h2
    if kind == ABSENT:
        return 0.0
    return (0.5 * (kp + kappa[q])) / h2


@njit(cache=True, inline="always", error_model="numpy")
def _point(x, kappa, g, s0, s1, kzl, kzh, kyl, kyh, kxl, kxh, h2z, h2y, h2x, weight, diagonal):
    """One entry of A x (or of A's diagonal) for any neighbour kinds, scalars only: the end points
    of the bulk rows (inlined there with the z and y kinds constant)."""
    kp = kappa[g]
    fzl = _face(kappa, kp, g - s0, kzl, h2z)
    fzh = _face(kappa, kp, g + s0, kzh, h2z)
    fyl = _face(kappa, kp, g - s1, kyl, h2y)
    fyh = _face(kappa, kp, g + s1, kyh, h2y)
    fxl = _face(kappa, kp, g - 1, kxl, h2x)
    fxh = _face(kappa, kp, g + 1, kxh, h2x)
    d = 0.0
    if kzl != ABSENT:
        d = (d - fzl) - fzh
    d = (((d - fyl) - fyh) - fxl) - fxh
    centre = 1.0 + weight * d
    if diagonal:
        return centre
    s = 0.0
    if kzl == OWNED:
        s += (weight * fzl) * x[g - s0]
    if kyl == OWNED:
        s += (weight * fyl) * x[g - s1]
    if kxl == OWNED:
        s += (weight * fxl) * x[g - 1]
    s += centre * x[g]
    if kxh == OWNED:
        s += (weight * fxh) * x[g + 1]
    if kyh == OWNED:
        s += (weight * fyh) * x[g + s1]
    if kzh == OWNED:
        s += (weight * fzh) * x[g + s0]
    if kzl == GHOST:
        s += (weight * fzl) * x[g - s0]
    if kyl == GHOST:
        s += (weight * fyl) * x[g - s1]
    if kxl == GHOST:
        s += (weight * fxl) * x[g - 1]
    if kxh == GHOST:
        s += (weight * fxh) * x[g + 1]
    if kyh == GHOST:
        s += (weight * fyh) * x[g + s1]
    if kzh == GHOST:
        s += (weight * fzh) * x[g + s0]
    return s


@njit(cache=True, inline="always", error_model="numpy")
def _bulk3(kc, kzl, kzh, kyl, kyh, i, h2z, h2y, h2x, weight):
    """(A's diagonal, the six faces z-, z+, y-, y+, x-, x+) at point i of a bulk row (all six
    neighbours points): one formula for the diagonal and the product loops of :func:`_row3`."""
    kp = kc[i]
    fzl = (0.5 * (kp + kzl[i])) / h2z
    fzh = (0.5 * (kp + kzh[i])) / h2z
    fyl = (0.5 * (kp + kyl[i])) / h2y
    fyh = (0.5 * (kp + kyh[i])) / h2y
    fxl = (0.5 * (kp + kc[i - 1])) / h2x
    fxh = (0.5 * (kp + kc[i + 1])) / h2x
    return 1.0 + weight * ((((((0.0 - fzl) - fzh) - fyl) - fyh) - fxl) - fxh), fzl, fzh, fyl, fyh, fxl, fxh


@njit(cache=True, inline="always", error_model="numpy")
def _bulk2(kc, kyl, kyh, i, h2y, h2x, weight):
    """As :func:`_bulk3` on a 2-D grid: (A's diagonal, faces y-, y+, x-, x+) for :func:`_row2`."""
    kp = kc[i]
    fyl = (0.5 * (kp + kyl[i])) / h2y
    fyh = (0.5 * (kp + kyh[i])) / h2y
    fxl = (0.5 * (kp + kc[i - 1])) / h2x
    fxh = (0.5 * (kp + kc[i + 1])) / h2x
    return 1.0 + weight * ((((0.0 - fyl) - fyh) - fxl) - fxh), fyl, fyh, fxl, fxh


@njit(cache=True, error_model="numpy")
def _row3(x, kappa, g0, s0, s1, n, kxl, kxh, h2z, h2y, h2x, weight, out, p0, diagonal):
    """A 3-D row whose z and y neighbours are all owned: points 1 .. n-2 in one unit-stride loop
    over row slices (non-negative indices, no branches), which LLVM vectorises, columns in
    increasing order z-1, y-1, x-1, centre, x+1, y+1, z+1; the end points (x neighbours of kinds
    ``kxl``, ``kxh``) by :func:`_point`."""
    kc = kappa[g0:g0 + n]
    kzl, kzh = kappa[g0 - s0:g0 - s0 + n], kappa[g0 + s0:g0 + s0 + n]
    kyl, kyh = kappa[g0 - s1:g0 - s1 + n], kappa[g0 + s1:g0 + s1 + n]
    y = out[p0:p0 + n]
    y[0] = _point(x, kappa, g0, s0, s1, OWNED, OWNED, OWNED, OWNED, kxl, OWNED,
                  h2z, h2y, h2x, weight, diagonal)
    y[n - 1] = _point(x, kappa, g0 + n - 1, s0, s1, OWNED, OWNED, OWNED, OWNED, OWNED, kxh,
                      h2z, h2y, h2x, weight, diagonal)
    if diagonal:
        for i in range(1, n - 1):
            y[i] = _bulk3(kc, kzl, kzh, kyl, kyh, i, h2z, h2y, h2x, weight)[0]
        return
    xc = x[g0:g0 + n]
    xzl, xzh = x[g0 - s0:g0 - s0 + n], x[g0 + s0:g0 + s0 + n]
    xyl, xyh = x[g0 - s1:g0 - s1 + n], x[g0 + s1:g0 + s1 + n]
    for i in range(1, n - 1):
        centre, fzl, fzh, fyl, fyh, fxl, fxh = _bulk3(kc, kzl, kzh, kyl, kyh, i, h2z, h2y, h2x, weight)
        s = 0.0 + (weight * fzl) * xzl[i]
        s += (weight * fyl) * xyl[i]
        s += (weight * fxl) * xc[i - 1]
        s += centre * xc[i]
        s += (weight * fxh) * xc[i + 1]
        s += (weight * fyh) * xyh[i]
        s += (weight * fzh) * xzh[i]
        y[i] = s


@njit(cache=True, error_model="numpy")
def _row2(x, kappa, g0, s1, n, kxl, kxh, h2y, h2x, weight, out, p0, diagonal):
    """As :func:`_row3` for a 2-D grid (no z faces): columns y-1, x-1, centre, x+1, y+1."""
    kc = kappa[g0:g0 + n]
    kyl, kyh = kappa[g0 - s1:g0 - s1 + n], kappa[g0 + s1:g0 + s1 + n]
    y = out[p0:p0 + n]
    y[0] = _point(x, kappa, g0, 0, s1, ABSENT, ABSENT, OWNED, OWNED, kxl, OWNED,
                  1.0, h2y, h2x, weight, diagonal)
    y[n - 1] = _point(x, kappa, g0 + n - 1, 0, s1, ABSENT, ABSENT, OWNED, OWNED, OWNED, kxh,
                      1.0, h2y, h2x, weight, diagonal)
    if diagonal:
        for i in range(1, n - 1):
            y[i] = _bulk2(kc, kyl, kyh, i, h2y, h2x, weight)[0]
        return
    xc = x[g0:g0 + n]
    xyl, xyh = x[g0 - s1:g0 - s1 + n], x[g0 + s1:g0 + s1 + n]
    for i in range(1, n - 1):
        centre, fyl, fyh, fxl, fxh = _bulk2(kc, kyl, kyh, i, h2y, h2x, weight)
        s = 0.0 + (weight * fyl) * xyl[i]
        s += (weight * fxl) * xc[i - 1]
        s += centre * xc[i]
        s += (weight * fxh) * xc[i + 1]
        s += (weight * fyh) * xyh[i]
        y[i] = s


@njit(cache=True, inline="always", error_model="numpy")
def _faces(f, kappa, kc, g0, q, n, kind, h2):
    """f[i] = the face of point i of a row towards row offset ``q``, per its kind (any but ABSENT)."""
    if kind == WALL:
        for i in range(n):
            f[i] = kc[i] / h2
    else:
        kq = kappa[g0 + q:g0 + q + n]
        for i in range(n):
            f[i] = (0.5 * (kc[i] + kq[i])) / h2


@njit(cache=True, inline="always", error_model="numpy")
def _term(y, f, x, g0, q, n, weight):
    """y[i] += (weight * f[i]) * x[g0 + q + i] over a row."""
    xq = x[g0 + q:g0 + q + n]
    for i in range(n):
        y[i] += (weight * f[i]) * xq[i]


@njit(cache=True, error_model="numpy")
def _row_any(x, kappa, g0, s0, s1, n, kzl, kzh, kyl, kyh, xlo_wall, xhi_wall, h2z, h2y, h2x,
             weight, out, p0, diagonal, buf):
    """A whole row with any neighbour kinds (the block's boundary rows): each face and each
    term of the sum is a unit-stride loop over the row (``buf``: six rows of scratch), the terms
    added in the order of the general path. The x faces are shared by neighbours (a + b is b + a)."""
    kc = kappa[g0:g0 + n]
    fzl, fzh, fyl, fyh, fx, centre = buf[0], buf[1], buf[2], buf[3], buf[4], buf[5]
    three = kzl != ABSENT
    if three:
        _faces(fzl, kappa, kc, g0, -s0, n, kzl, h2z)
        _faces(fzh, kappa, kc, g0, s0, n, kzh, h2z)
    _faces(fyl, kappa, kc, g0, -s1, n, kyl, h2y)
    _faces(fyh, kappa, kc, g0, s1, n, kyh, h2y)
    fx[0] = kc[0] / h2x if xlo_wall else (0.5 * (kc[0] + kappa[g0 - 1])) / h2x
    for i in range(1, n):
        fx[i] = (0.5 * (kc[i] + kc[i - 1])) / h2x
    fx[n] = kc[n - 1] / h2x if xhi_wall else (0.5 * (kc[n - 1] + kappa[g0 + n])) / h2x
    if three:
        for i in range(n):
            centre[i] = (0.0 - fzl[i]) - fzh[i]
    else:
        for i in range(n):
            centre[i] = 0.0
    y = out[p0:p0 + n]
    for i in range(n):
        centre[i] = 1.0 + weight * ((((centre[i] - fyl[i]) - fyh[i]) - fx[i]) - fx[i + 1])
    if diagonal:
        for i in range(n):
            y[i] = centre[i]
        return
    for i in range(n):
        y[i] = 0.0
    if kzl == OWNED:
        _term(y, fzl, x, g0, -s0, n, weight)
    if kyl == OWNED:
        _term(y, fyl, x, g0, -s1, n, weight)
    xc = x[g0:g0 + n]
    for i in range(1, n):
        y[i] += (weight * fx[i]) * xc[i - 1]
    for i in range(n):
        y[i] += centre[i] * xc[i]
    for i in range(n - 1):
        y[i] += (weight * fx[i + 1]) * xc[i + 1]
    if kyh == OWNED:
        _term(y, fyh, x, g0, s1, n, weight)
    if kzh == OWNED:
        _term(y, fzh, x, g0, s0, n, weight)
    if kzl == GHOST:
        _term(y, fzl, x, g0, -s0, n, weight)
    if kyl == GHOST:
        _term(y, fyl, x, g0, -s1, n, weight)
    if not xlo_wall:
        y[0] += (weight * fx[0]) * x[g0 - 1]
    if not xhi_wall:
        y[n - 1] += (weight * fx[n]) * x[g0 + n]
    if kyh == GHOST:
        _term(y, fyh, x, g0, s1, n, weight)
    if kzh == GHOST:
        _term(y, fzh, x, g0, s0, n, weight)


@njit(cache=True, error_model="numpy")
def apply(x, kappa, shape, gstride, goff, lo_wall, hi_wall, first, h2, weight, out, diagonal):
    """out = A x on the owned block (or A's diagonal when ``diagonal``).

    ``shape`` the owned block's (3-D) shape, ``gstride``/``goff`` the ghosted block's strides and
    the owned block's offset in it; ``lo_wall[a]``/``hi_wall[a]`` whether the block's lower/upper
    end on axis a is the domain's boundary; axes before ``first`` do not exist (2-D grids).
    Rows (along x) whose z and y neighbours are all owned take the branch-free vectorised loop
    (:func:`_row3`, :func:`_row2`), the block's boundary rows :func:`_row_any`.
    """
    m0, m1, m2 = shape[0], shape[1], shape[2]
    s0, s1 = gstride[0], gstride[1]
    h2z, h2y, h2x = h2[0], h2[1], h2[2]
    kxl = WALL if lo_wall[2] else GHOST
    kxh = WALL if hi_wall[2] else GHOST
    buf = np.empty((6, m2 + 1))
    for i0 in range(m0):
        kzl, kzh = _kinds(i0, m0, lo_wall[0], hi_wall[0], first == 0)
        for i1 in range(m1):
            kyl, kyh = _kinds(i1, m1, lo_wall[1], hi_wall[1], True)
            g0 = (i0 + goff[0]) * s0 + (i1 + goff[1]) * s1 + goff[2]
            p0 = (i0 * m1 + i1) * m2
            if m2 > 2 and kyl == OWNED and kyh == OWNED and kzl == ABSENT:
                _row2(x, kappa, g0, s1, m2, kxl, kxh, h2y, h2x, weight, out, p0, diagonal)
            elif m2 > 2 and kyl == OWNED and kyh == OWNED and kzl == OWNED and kzh == OWNED:
                _row3(x, kappa, g0, s0, s1, m2, kxl, kxh, h2z, h2y, h2x, weight, out, p0, diagonal)
            else:
                _row_any(x, kappa, g0, s0, s1, m2, kzl, kzh, kyl, kyh, lo_wall[2], hi_wall[2],
                         h2z, h2y, h2x, weight, out, p0, diagonal, buf)


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
