"""Fused leapfrog kernels of the wave model: step, adjoint step, tangent step (numba, no fastmath).

Blocks are 3-D in natural order (nz, ny, nx[, 2]); a 2-D model passes nz = 1 and ``has_z`` False.
The state is the pair (u^{i-1}, u^i) interleaved as the last axis. ``A`` is a = 1/(1+s), computed
once by the model (the same double the step computes), so the adjoint makes no division. ``F*`` are the six halo faces
(zlo, zhi, ylo, yhi, xlo, xhi) of a field, ``s`` = sigma dt / 2 (so a = 1/(1+s), b = 1-s), ``ih2`` the
inverse squared spacings (z, y, x). With varying steps, ``r`` = dt_i / dt_{i-1} and ``dt2`` =
(dt_i + dt_{i-1}) dt_i / 2 (the leapfrog on a non-uniform time grid); r = 1 and dt2 = dt^2 is the
uniform scheme, with the same arithmetic (1 + r = 2 and r - s = 1 - s exactly). Each point reads its star neighbours only, the same way on any
decomposition, so the states are bitwise rank-invariant.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _rows(U, zlo, zhi, ylo, yhi, k, j, has_z):
    """Rows (nx[, dof]) of U's z and y neighbours of row (k, j), from U or from its faces."""
    mz, my = U.shape[0], U.shape[1]
    if has_z:
        zm = U[k - 1, j] if k > 0 else zlo[j]
        zp = U[k + 1, j] if k < mz - 1 else zhi[j]
    else:
        zm = U[k, j]
        zp = U[k, j]
    ym = U[k, j - 1] if j > 0 else ylo[k]
    yp = U[k, j + 1] if j < my - 1 else yhi[k]
    return zm, zp, ym, yp


@njit(cache=True, inline="always")
def _lap(c, zm, zp, ym, yp, xm, xp, ihz2, ihy2, ihx2, has_z):
    lap = 0.0
    if has_z:
        lap += (zm - c) * ihz2
        lap += (zp - c) * ihz2
    lap += (ym - c) * ihy2
    lap += (yp - c) * ihy2
    lap += (xm - c) * ihx2
    lap += (xp - c) * ihx2
    return lap


@njit(cache=True)
def step(U, FU, s, c2, ih2, has_z, dt2, r, src, fval, out):
    """out = (u^i, a [(1 + r) u^i - b u^{i-1} + dt2 (c^2 L u^i + f)]), b = r - s; f = fval at owned index src."""
    zlo, zhi, ylo, yhi, xlo, xhi = FU
    ihz2, ihy2, ihx2 = ih2
    mz, my, mx = s.shape
    buf = np.empty(mx + 2)
    two = 1.0 + r
    sk, sj, si = src
    for k in range(mz):
        for j in range(my):
            zm, zp, ym, yp = _rows(U, zlo, zhi, ylo, yhi, k, j, has_z)
            row = U[k, j]
            buf[0] = xlo[k, j, 1]
            buf[mx + 1] = xhi[k, j, 1]
            for i in range(mx):
                buf[i + 1] = row[i, 1]
            srow = s[k, j]
            crow = c2[k, j]
            orow = out[k, j]
            for i in range(mx):
                c = buf[i + 1]
                lap = _lap(c, zm[i, 1], zp[i, 1], ym[i, 1], yp[i, 1], buf[i], buf[i + 2],
                           ihz2, ihy2, ihx2, has_z)
                a = 1.0 / (1.0 + srow[i])
                b = r - srow[i]
                orow[i, 0] = c
                orow[i, 1] = a * ((two * c - b * row[i, 0]) + dt2 * (crow[i] * lap))
            if k == sk and j == sj:
                i = si
                c = buf[i + 1]
                lap = _lap(c, zm[i, 1], zp[i, 1], ym[i, 1], yp[i, 1], buf[i], buf[i + 2],
                           ihz2, ihy2, ihx2, has_z)
                a = 1.0 / (1.0 + srow[i])
                b = r - srow[i]
                orow[i, 1] = a * ((two * c - b * row[i, 0]) + dt2 * (crow[i] * lap + fval))


@njit(cache=True)
def adjoint_step(L, FL, U, FU, s, A, c, ca, FC, ih2, has_z, dt2, r, grad, out):
    """Transpose of :func:`step` applied to lam = (lam_prev', mu'), and dJ/dc added into ``grad``.

    With mu = a lam_cur': out = (-b mu, lam_prev' + (1 + r) mu + dt2 L(c^2 a lam_cur')),
    grad += 2 dt2 c mu L u^i. ``ca`` = c^2 a (owned block, faces FC).
    """
    lzlo, lzhi, lylo, lyhi, lxlo, lxhi = FL
    uzlo, uzhi, uylo, uyhi, uxlo, uxhi = FU
    czlo, czhi, cylo, cyhi, cxlo, cxhi = FC
    ihz2, ihy2, ihx2 = ih2
    mz, my, mx = s.shape
    qbuf = np.empty(mx + 2)
    ubuf = np.empty(mx + 2)
    two_dt2 = 2.0 * dt2
    two = 1.0 + r
    for k in range(mz):
        for j in range(my):
            lzm, lzp, lym, lyp = _rows(L, lzlo, lzhi, lylo, lyhi, k, j, has_z)
            czm, czp, cym, cyp = _rows(ca, czlo, czhi, cylo, cyhi, k, j, has_z)
            uzm, uzp, uym, uyp = _rows(U, uzlo, uzhi, uylo, uyhi, k, j, has_z)
            lrow = L[k, j]
            crow = ca[k, j]
            urow = U[k, j]
            qbuf[0] = cxlo[k, j] * lxlo[k, j, 1]
            qbuf[mx + 1] = cxhi[k, j] * lxhi[k, j, 1]
            ubuf[0] = uxlo[k, j, 1]
            ubuf[mx + 1] = uxhi[k, j, 1]
            for i in range(mx):
                qbuf[i + 1] = crow[i] * lrow[i, 1]
                ubuf[i + 1] = urow[i, 1]
            srow = s[k, j]
            arow = A[k, j]
            vrow = c[k, j]
            grow = grad[k, j]
            orow = out[k, j]
            for i in range(mx):
                q = qbuf[i + 1]
                lapq = _lap(q, czm[i] * lzm[i, 1], czp[i] * lzp[i, 1], cym[i] * lym[i, 1],
                            cyp[i] * lyp[i, 1], qbuf[i], qbuf[i + 2], ihz2, ihy2, ihx2, has_z)
                uc = ubuf[i + 1]
                lapu = _lap(uc, uzm[i, 1], uzp[i, 1], uym[i, 1], uyp[i, 1], ubuf[i], ubuf[i + 2],
                            ihz2, ihy2, ihx2, has_z)
                a = arow[i]
                b = r - srow[i]
                mu = a * lrow[i, 1]
                orow[i, 0] = -b * mu
                orow[i, 1] = (lrow[i, 0] + two * mu) + dt2 * lapq
                grow[i] += two_dt2 * vrow[i] * mu * lapu


@njit(cache=True)
def tangent_step(D, FD, U, FU, s, c, c2, dc, ih2, has_z, dt2, r, out):
    """out = (du^i, a [(1 + r) du^i - b du^{i-1} + dt2 (c^2 L du^i + 2 c dc L u^i)])."""
    dzlo, dzhi, dylo, dyhi, dxlo, dxhi = FD
    uzlo, uzhi, uylo, uyhi, uxlo, uxhi = FU
    ihz2, ihy2, ihx2 = ih2
    mz, my, mx = s.shape
    dbuf = np.empty(mx + 2)
    ubuf = np.empty(mx + 2)
    two = 1.0 + r
    for k in range(mz):
        for j in range(my):
            dzm, dzp, dym, dyp = _rows(D, dzlo, dzhi, dylo, dyhi, k, j, has_z)
            uzm, uzp, uym, uyp = _rows(U, uzlo, uzhi, uylo, uyhi, k, j, has_z)
            drow = D[k, j]
            urow = U[k, j]
            dbuf[0] = dxlo[k, j, 1]
            dbuf[mx + 1] = dxhi[k, j, 1]
            ubuf[0] = uxlo[k, j, 1]
            ubuf[mx + 1] = uxhi[k, j, 1]
            for i in range(mx):
                dbuf[i + 1] = drow[i, 1]
                ubuf[i + 1] = urow[i, 1]
            srow = s[k, j]
            vrow = c[k, j]
            c2row = c2[k, j]
            dcrow = dc[k, j]
            orow = out[k, j]
            for i in range(mx):
                d = dbuf[i + 1]
                lapd = _lap(d, dzm[i, 1], dzp[i, 1], dym[i, 1], dyp[i, 1], dbuf[i], dbuf[i + 2],
                            ihz2, ihy2, ihx2, has_z)
                uc = ubuf[i + 1]
                lapu = _lap(uc, uzm[i, 1], uzp[i, 1], uym[i, 1], uyp[i, 1], ubuf[i], ubuf[i + 2],
                            ihz2, ihy2, ihx2, has_z)
                a = 1.0 / (1.0 + srow[i])
                b = r - srow[i]
                orow[i, 0] = d
                orow[i, 1] = a * ((two * d - b * drow[i, 0])
                                  + dt2 * (c2row[i] * lapd + 2.0 * vrow[i] * dcrow[i] * lapu))
