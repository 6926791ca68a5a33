"""Fused SSP-RK3 stage kernels of the burgers model: forward, tangent and adjoint stages (numba).

Blocks are (ny, nx, 2) with (u, v) interleaved; ``F*`` are the four periodic halo faces
(ylo, yhi, xlo, xhi) of a field. ``ih`` = (1/hy^2, 1/hx^2, 1/(2 hy), 1/(2 hx)). One kernel call is one
RK stage over the owned block: it reads the stage input and its halo, the right-hand side is
evaluated point by point (skew-symmetric central advection, 5-point Laplacian) and combined with
the stage coefficients in the same loop, so nothing full-size is made but the stage output itself.
Every point reads only its star neighbours, so states are bitwise the same on any decomposition.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _yrows(W, ylo, yhi, j):
    my = W.shape[0]
    ym = W[j - 1] if j > 0 else ylo
    yp = W[j + 1] if j < my - 1 else yhi
    return ym, yp


@njit(cache=True, inline="always")
def _fill(buf, W, xlo, xhi, j):
    """buf[1:-1] = W[j] (both components), buf[0] / buf[-1] the x-neighbours from the faces."""
    mx = W.shape[1]
    row = W[j]
    buf[0, 0] = xlo[j, 0]
    buf[0, 1] = xlo[j, 1]
    buf[mx + 1, 0] = xhi[j, 0]
    buf[mx + 1, 1] = xhi[j, 1]
    for i in range(mx):
        buf[i + 1, 0] = row[i, 0]
        buf[i + 1, 1] = row[i, 1]


@njit(cache=True, inline="always")
def _lap(xb, ym, yp, i, c, ihy2, ihx2):
    centre = xb[i + 1, c]
    lap = 0.0
    lap += (ym[i, c] - centre) * ihy2
    lap += (yp[i, c] - centre) * ihy2
    lap += (xb[i, c] - centre) * ihx2
    lap += (xb[i + 2, c] - centre) * ihx2
    return lap


@njit(cache=True, inline="always")
def _adv(axb, aym, ayp, bxb, bym, byp, i, c, ihy, ihx):
    """Component c of b(a, w) = 1/2 [a . grad w_c + div(a w_c)], central differences."""
    bx = (bxb[i + 2, c] - bxb[i, c]) * ihx
    by = (byp[i, c] - bym[i, c]) * ihy
    fx = (axb[i + 2, 0] * bxb[i + 2, c] - axb[i, 0] * bxb[i, c]) * ihx
    fy = (ayp[i, 1] * byp[i, c] - aym[i, 1] * bym[i, c]) * ihy
    return 0.5 * (axb[i + 1, 0] * bx + axb[i + 1, 1] * by + fx + fy)


@njit(cache=True)
def stage(X, FX, W0, alpha, beta, first, nu, dt, ih, out):
    """out = x + dt N(x) (``first``) or alpha w0 + beta (x + dt N(x)), N(w) = -b(w, w) + nu lap w."""
    ylo, yhi, xlo, xhi = FX
    ihy2, ihx2, ihy, ihx = ih
    my, mx = X.shape[0], X.shape[1]
    xb = np.empty((mx + 2, 2))
    for j in range(my):
        ym, yp = _yrows(X, ylo, yhi, j)
        _fill(xb, X, xlo, xhi, j)
        w0 = W0[j]
        orow = out[j]
        for i in range(mx):
            for c in range(2):
                n = -_adv(xb, ym, yp, xb, ym, yp, i, c, ihy, ihx) + nu * _lap(xb, ym, yp, i, c, ihy2, ihx2)
                x = xb[i + 1, c] + dt * n
                if first:
                    orow[i, c] = x
                else:
                    orow[i, c] = alpha * w0[i, c] + beta * x


@njit(cache=True)
def tangent_stage(P, FP, D, FD, D0, alpha, beta, first, nu, dnu, dt, ih, out):
    """out = [alpha d0 + beta] (d + dt T), T = -b(d, w) - b(w, d) + nu lap d + dnu lap w."""
    pylo, pyhi, pxlo, pxhi = FP
    dylo, dyhi, dxlo, dxhi = FD
    ihy2, ihx2, ihy, ihx = ih
    my, mx = P.shape[0], P.shape[1]
    pb = np.empty((mx + 2, 2))
    db = np.empty((mx + 2, 2))
    for j in range(my):
        pym, pyp = _yrows(P, pylo, pyhi, j)
        dym, dyp = _yrows(D, dylo, dyhi, j)
        _fill(pb, P, pxlo, pxhi, j)
        _fill(db, D, dxlo, dxhi, j)
        d0 = D0[j]
        orow = out[j]
        for i in range(mx):
            for c in range(2):
                t = (-_adv(db, dym, dyp, pb, pym, pyp, i, c, ihy, ihx)
                     - _adv(pb, pym, pyp, db, dym, dyp, i, c, ihy, ihx)
                     + nu * _lap(db, dym, dyp, i, c, ihy2, ihx2))
                if dnu != 0.0:
                    t += dnu * _lap(pb, pym, pyp, i, c, ihy2, ihx2)
                x = db[i + 1, c] + dt * t
                if first:
                    orow[i, c] = x
                else:
                    orow[i, c] = alpha * d0[i, c] + beta * x


@njit(cache=True)
def adjoint_stage(P, FP, M, FM, mode, nu, dt, ih, out1, out2):
    """One RK stage backwards: t = (N'(w))^T mu; returns the local sum <lap w, mu> (for dJ/dnu).

    (N'(w))^T mu = b(w, mu) + nu lap mu - 1/2 sum_d (mu_d grad w_d - w_d grad mu_d) (b(w, .) is
    antisymmetric on the periodic grid). mode 3: out1 = 2/3 (mu + dt t), out2 = mu/3 + 3/4 out1;
    mode 2: out1 = 1/4 (mu + dt t); mode 1: out2 += mu + dt t.
    """
    pylo, pyhi, pxlo, pxhi = FP
    mylo, myhi, mxlo, mxhi = FM
    ihy2, ihx2, ihy, ihx = ih
    my, mx = P.shape[0], P.shape[1]
    pb = np.empty((mx + 2, 2))
    mb = np.empty((mx + 2, 2))
    dnu = 0.0
    for j in range(my):
        pym, pyp = _yrows(P, pylo, pyhi, j)
        mym, myp = _yrows(M, mylo, myhi, j)
        _fill(pb, P, pxlo, pxhi, j)
        _fill(mb, M, mxlo, mxhi, j)
        for i in range(mx):
            sx = 0.0
            sy = 0.0
            for d in range(2):
                wd = pb[i + 1, d]
                md = mb[i + 1, d]
                wx = (pb[i + 2, d] - pb[i, d]) * ihx
                wy = (pyp[i, d] - pym[i, d]) * ihy
                mxd = (mb[i + 2, d] - mb[i, d]) * ihx
                myd = (myp[i, d] - mym[i, d]) * ihy
                sx += md * wx - wd * mxd
                sy += md * wy - wd * myd
            for c in range(2):
                t = _adv(pb, pym, pyp, mb, mym, myp, i, c, ihy, ihx) + nu * _lap(mb, mym, myp, i, c, ihy2, ihx2)
                t -= 0.5 * (sx if c == 0 else sy)
                m = mb[i + 1, c]
                dnu += _lap(pb, pym, pyp, i, c, ihy2, ihx2) * m
                if mode == 3:
                    b = (2.0 / 3.0) * (m + dt * t)
                    out1[j, i, c] = b
                    out2[j, i, c] = m / 3.0 + 0.75 * b
                elif mode == 2:
                    out1[j, i, c] = 0.25 * (m + dt * t)
                else:
                    out2[j, i, c] += m + dt * t
    return dnu
