"""Fused leapfrog kernels of the wave model: step, adjoint step, tangent step (numba, no fastmath).

Blocks are 3-D in natural order (nz, ny, nx); a 2-D model passes nz = 1 and ``has_z`` False.
The state is the pair (u^{i-1}, u^i) stored as two contiguous fields (the model's *split* layout),
so every inner loop reads and writes unit-stride rows and LLVM vectorises it: the pair interleaved
point by point kept the loops scalar (stride-2 loads) at about a third of the memory bus's speed.
``error_model="numpy"`` drops numba's zero check on each division (1 + s >= 1 here), which also kept
the loops scalar; the arithmetic is IEEE in the written order either way. ``A`` is a = 1/(1+s),
computed once by the model (the same double the step computes), so the adjoint makes no division.
``F*`` are the six halo faces (zlo, zhi, ylo, yhi, xlo, xhi) of the current field, ``s`` = sigma dt / 2
(so a = 1/(1+s), b = 1-s), ``ih2`` the inverse squared spacings (z, y, x). With varying steps, ``r`` =
dt_i / dt_{i-1} and ``dt2`` = (dt_i + dt_{i-1}) dt_i / 2 (the leapfrog on a non-uniform time grid);
r = 1 and dt2 = dt^2 is the uniform scheme, with the same arithmetic (1 + r = 2 and r - s = 1 - s
exactly). Each point reads its star neighbours only, the same way on any decomposition, so the
states are bitwise rank-invariant.
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


@njit(cache=True, error_model="numpy")
def step(P, C, FC, s, c2, ih2, has_z, dt2, r, src, fval, out_p, out_c):
    """(out_p, out_c) = (u^i, a [(1 + r) u^i - b u^{i-1} + dt2 (c^2 L u^i + f)]), b = r - s, with
    (P, C) = (u^{i-1}, u^i) and FC the faces of C; f = fval at owned index src."""
    zlo, zhi, ylo, yhi, xlo, xhi = FC
    ihz2, ihy2, ihx2 = ih2
    mz, my, mx = s.shape
    buf = np.empty(mx + 2)
    two = 1.0 + r
    sk, sj, si = src
    for k in range(mz):
        for j in range(my):
            zm, zp, ym, yp = _rows(C, zlo, zhi, ylo, yhi, k, j, has_z)
            row = C[k, j]
            prow = P[k, j]
            opr = out_p[k, j]
            buf[0] = xlo[k, j]
            buf[mx + 1] = xhi[k, j]
            for i in range(mx):
                buf[i + 1] = row[i]
                opr[i] = row[i]
            srow = s[k, j]
            crow = c2[k, j]
            orow = out_c[k, j]
            for i in range(mx):
                c = buf[i + 1]
                lap = _lap(c, zm[i], zp[i], ym[i], yp[i], buf[i], buf[i + 2], ihz2, ihy2, ihx2, has_z)
                a = 1.0 / (1.0 + srow[i])
                b = r - srow[i]
                orow[i] = a * ((two * c - b * prow[i]) + dt2 * (crow[i] * lap))
            if k == sk and j == sj:
                i = si
                c = buf[i + 1]
                lap = _lap(c, zm[i], zp[i], ym[i], yp[i], buf[i], buf[i + 2], ihz2, ihy2, ihx2, has_z)
                a = 1.0 / (1.0 + srow[i])
                b = r - srow[i]
                orow[i] = a * ((two * c - b * prow[i]) + dt2 * (crow[i] * lap + fval))


@njit(cache=True, error_model="numpy")
def adjoint_step(LP, LC, FL, U, FU, s, A, c, ca, FC, ih2, has_z, dt2, r, grad, out_p, out_c):
    """Transpose of :func:`step` applied to lam = (lam_prev', lam_cur') = (LP, LC), and dJ/dc added
    into ``grad``; U is u^i (faces FU), FL the faces of LC.

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
            lzm, lzp, lym, lyp = _rows(LC, lzlo, lzhi, lylo, lyhi, k, j, has_z)
            czm, czp, cym, cyp = _rows(ca, czlo, czhi, cylo, cyhi, k, j, has_z)
            uzm, uzp, uym, uyp = _rows(U, uzlo, uzhi, uylo, uyhi, k, j, has_z)
            lrow = LC[k, j]
            lprow = LP[k, j]
            crow = ca[k, j]
            urow = U[k, j]
            qbuf[0] = cxlo[k, j] * lxlo[k, j]
            qbuf[mx + 1] = cxhi[k, j] * lxhi[k, j]
            ubuf[0] = uxlo[k, j]
            ubuf[mx + 1] = uxhi[k, j]
            for i in range(mx):
                qbuf[i + 1] = crow[i] * lrow[i]
                ubuf[i + 1] = urow[i]
            srow = s[k, j]
            arow = A[k, j]
            vrow = c[k, j]
            grow = grad[k, j]
            oprow = out_p[k, j]
            orow = out_c[k, j]
            for i in range(mx):
                q = qbuf[i + 1]
                lapq = _lap(q, czm[i] * lzm[i], czp[i] * lzp[i], cym[i] * lym[i],
                            cyp[i] * lyp[i], qbuf[i], qbuf[i + 2], ihz2, ihy2, ihx2, has_z)
                uc = ubuf[i + 1]
                lapu = _lap(uc, uzm[i], uzp[i], uym[i], uyp[i], ubuf[i], ubuf[i + 2],
                            ihz2, ihy2, ihx2, has_z)
                a = arow[i]
                b = r - srow[i]
                mu = a * lrow[i]
                oprow[i] = -b * mu
                orow[i] = (lprow[i] + two * mu) + dt2 * lapq
                grow[i] += two_dt2 * vrow[i] * mu * lapu


@njit(cache=True, error_model="numpy")
def tangent_step(DP, DC, FD, U, FU, s, c, c2, dc, ih2, has_z, dt2, r, out_p, out_c):
    """(out_p, out_c) = (du^i, a [(1 + r) du^i - b du^{i-1} + dt2 (c^2 L du^i + 2 c dc L u^i)]),
    with (DP, DC) = (du^{i-1}, du^i) (faces FD of DC) and U = u^i (faces FU)."""
    dzlo, dzhi, dylo, dyhi, dxlo, dxhi = FD
    uzlo, uzhi, uylo, uyhi, uxlo, uxhi = FU
    ihz2, ihy2, ihx2 = ih2
    mz, my, mx = s.shape
    dbuf = np.empty(mx + 2)
    ubuf = np.empty(mx + 2)
    two = 1.0 + r
    for k in range(mz):
        for j in range(my):
            dzm, dzp, dym, dyp = _rows(DC, dzlo, dzhi, dylo, dyhi, k, j, has_z)
            uzm, uzp, uym, uyp = _rows(U, uzlo, uzhi, uylo, uyhi, k, j, has_z)
            drow = DC[k, j]
            dprow = DP[k, j]
            urow = U[k, j]
            oprow = out_p[k, j]
            dbuf[0] = dxlo[k, j]
            dbuf[mx + 1] = dxhi[k, j]
            ubuf[0] = uxlo[k, j]
            ubuf[mx + 1] = uxhi[k, j]
            for i in range(mx):
                dbuf[i + 1] = drow[i]
                ubuf[i + 1] = urow[i]
                oprow[i] = drow[i]
            srow = s[k, j]
            vrow = c[k, j]
            c2row = c2[k, j]
            dcrow = dc[k, j]
            orow = out_c[k, j]
            for i in range(mx):
                d = dbuf[i + 1]
                lapd = _lap(d, dzm[i], dzp[i], dym[i], dyp[i], dbuf[i], dbuf[i + 2],
                            ihz2, ihy2, ihx2, has_z)
                uc = ubuf[i + 1]
                lapu = _lap(uc, uzm[i], uzp[i], uym[i], uyp[i], ubuf[i], ubuf[i + 2],
                            ihz2, ihy2, ihx2, has_z)
                a = 1.0 / (1.0 + srow[i])
                b = r - srow[i]
                orow[i] = a * ((two * d - b * dprow[i])
                               + dt2 * (c2row[i] * lapd + 2.0 * vrow[i] * dcrow[i] * lapu))
