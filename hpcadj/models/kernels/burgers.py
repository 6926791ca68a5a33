"""Fused SSP-RK3 stage kernels of the burgers model: forward, tangent and adjoint stages (numba).

A state is the pair (u, v) stored as two contiguous (ny, nx) fields (the model's *split* layout), so
every inner loop reads and writes unit-stride rows and LLVM vectorises it; the pair interleaved point
by point kept the loops scalar (stride-2 loads). ``error_model="numpy"`` drops numba's zero check on
each division (the divisors are constants), which also kept loops scalar; the arithmetic is IEEE in
the written order either way (no fastmath), the same operations as the interleaved kernels had.
``F*`` are the four periodic halo faces (ylo, yhi, xlo, xhi) of one field. ``ih`` = (1/hy^2, 1/hx^2,
1/(2 hy), 1/(2 hx)). One kernel call is one RK stage over the owned block: it reads the stage input
and its halo, the right-hand side is evaluated point by point (skew-symmetric central advection,
5-point Laplacian) and combined with the stage coefficients in the same loop, so nothing full-size is
made but the stage output itself. Every point reads only its star neighbours, so states are bitwise
the same on any decomposition.
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
    """buf[1:-1] = W[j], buf[0] / buf[-1] the x-neighbours from the faces."""
    mx = W.shape[1]
    row = W[j]
    buf[0] = xlo[j]
    buf[mx + 1] = xhi[j]
    for i in range(mx):
        buf[i + 1] = row[i]


@njit(cache=True, inline="always")
def _lap(xb, ym, yp, i, ihy2, ihx2):
    centre = xb[i + 1]
    lap = 0.0
    lap += (ym[i] - centre) * ihy2
    lap += (yp[i] - centre) * ihy2
    lap += (xb[i] - centre) * ihx2
    lap += (xb[i + 2] - centre) * ihx2
    return lap


@njit(cache=True, inline="always")
def _adv(aub, avb, avm, avp, bb, bm, bp, i, ihy, ihx):
    """One component of b(a, w) = 1/2 [a . grad w_c + div(a w_c)], central differences: ``aub`` /
    ``avb`` the x-row buffers of a's components, ``avm`` / ``avp`` a's v rows below / above, ``bb``
    (``bm``, ``bp``) w_c's x-row buffer (rows below / above)."""
    bx = (bb[i + 2] - bb[i]) * ihx
    by = (bp[i] - bm[i]) * ihy
    fx = (aub[i + 2] * bb[i + 2] - aub[i] * bb[i]) * ihx
    fy = (avp[i] * bp[i] - avm[i] * bm[i]) * ihy
    return 0.5 * (aub[i + 1] * bx + avb[i + 1] * by + fx + fy)


@njit(cache=True, inline="always")
def _rhs(ub, vb, um, up, vm, vp, i, nu, ihy2, ihx2, ihy, ihx):
    """N(x) = -b(x, x) + nu lap x at point i of a row: (u, v) components."""
    nu_ = -_adv(ub, vb, vm, vp, ub, um, up, i, ihy, ihx) + nu * _lap(ub, um, up, i, ihy2, ihx2)
    nv_ = -_adv(ub, vb, vm, vp, vb, vm, vp, i, ihy, ihx) + nu * _lap(vb, vm, vp, i, ihy2, ihx2)
    return nu_, nv_


@njit(cache=True, error_model="numpy")
def stage(XU, XV, FU, FV, W0U, W0V, alpha, beta, first, nu, dt, ih, outU, outV):
    """out = x + dt N(x) (``first``) or alpha w0 + beta (x + dt N(x)), N(w) = -b(w, w) + nu lap w.

    One loop per case, so each writes its outputs straight from registers (a row buffer and a
    second pass over it cost a quarter of the stage)."""
    uylo, uyhi, uxlo, uxhi = FU
    vylo, vyhi, vxlo, vxhi = FV
    ihy2, ihx2, ihy, ihx = ih
    my, mx = XU.shape
    ub = np.empty(mx + 2)
    vb = np.empty(mx + 2)
    for j in range(my):
        um, up = _yrows(XU, uylo, uyhi, j)
        vm, vp = _yrows(XV, vylo, vyhi, j)
        _fill(ub, XU, uxlo, uxhi, j)
        _fill(vb, XV, vxlo, vxhi, j)
        ou, ov = outU[j], outV[j]
        if first:
            for i in range(mx):
                nu_, nv_ = _rhs(ub, vb, um, up, vm, vp, i, nu, ihy2, ihx2, ihy, ihx)
                ou[i] = ub[i + 1] + dt * nu_
                ov[i] = vb[i + 1] + dt * nv_
        else:
            w0u, w0v = W0U[j], W0V[j]
            for i in range(mx):
                nu_, nv_ = _rhs(ub, vb, um, up, vm, vp, i, nu, ihy2, ihx2, ihy, ihx)
                ou[i] = alpha * w0u[i] + beta * (ub[i + 1] + dt * nu_)
                ov[i] = alpha * w0v[i] + beta * (vb[i + 1] + dt * nv_)


@njit(cache=True, inline="always")
def _trhs(pub, pvb, pum, pup, pvm, pvp, dub, dvb, dum, dup, dvm, dvp, i, nu, ihy2, ihx2, ihy, ihx):
    """T = -b(d, w) - b(w, d) + nu lap d at point i: (u, v) components."""
    tu = (-_adv(dub, dvb, dvm, dvp, pub, pum, pup, i, ihy, ihx)
          - _adv(pub, pvb, pvm, pvp, dub, dum, dup, i, ihy, ihx)
          + nu * _lap(dub, dum, dup, i, ihy2, ihx2))
    tv = (-_adv(dub, dvb, dvm, dvp, pvb, pvm, pvp, i, ihy, ihx)
          - _adv(pub, pvb, pvm, pvp, dvb, dvm, dvp, i, ihy, ihx)
          + nu * _lap(dvb, dvm, dvp, i, ihy2, ihx2))
    return tu, tv


@njit(cache=True, inline="always")
def _trhs_dnu(pub, pvb, pum, pup, pvm, pvp, dub, dvb, dum, dup, dvm, dvp, i, nu, dnu, ihy2, ihx2, ihy, ihx):
    """:func:`_trhs` plus dnu lap w (a separate function: a branch in the loop kept it scalar)."""
    tu, tv = _trhs(pub, pvb, pum, pup, pvm, pvp, dub, dvb, dum, dup, dvm, dvp, i, nu, ihy2, ihx2, ihy, ihx)
    tu += dnu * _lap(pub, pum, pup, i, ihy2, ihx2)
    tv += dnu * _lap(pvb, pvm, pvp, i, ihy2, ihx2)
    return tu, tv


@njit(cache=True, error_model="numpy")
def tangent_stage(PU, PV, FPU, FPV, DU, DV, FDU, FDV, D0U, D0V, alpha, beta, first, nu, dnu, dt, ih,
                  outU, outV):
    """out = [alpha d0 + beta] (d + dt T), T = -b(d, w) - b(w, d) + nu lap d + dnu lap w."""
    puylo, puyhi, puxlo, puxhi = FPU
    pvylo, pvyhi, pvxlo, pvxhi = FPV
    duylo, duyhi, duxlo, duxhi = FDU
    dvylo, dvyhi, dvxlo, dvxhi = FDV
    ihy2, ihx2, ihy, ihx = ih
    my, mx = PU.shape
    pub = np.empty(mx + 2)
    pvb = np.empty(mx + 2)
    dub = np.empty(mx + 2)
    dvb = np.empty(mx + 2)
    for j in range(my):
        pum, pup = _yrows(PU, puylo, puyhi, j)
        pvm, pvp = _yrows(PV, pvylo, pvyhi, j)
        dum, dup = _yrows(DU, duylo, duyhi, j)
        dvm, dvp = _yrows(DV, dvylo, dvyhi, j)
        _fill(pub, PU, puxlo, puxhi, j)
        _fill(pvb, PV, pvxlo, pvxhi, j)
        _fill(dub, DU, duxlo, duxhi, j)
        _fill(dvb, DV, dvxlo, dvxhi, j)
        ou, ov = outU[j], outV[j]
        d0u, d0v = D0U[j], D0V[j]
        # one loop per case (first stage or not, dnu zero or not): a branch inside kept it scalar
        if dnu != 0.0 and first:
            for i in range(mx):
                tu, tv = _trhs_dnu(pub, pvb, pum, pup, pvm, pvp, dub, dvb, dum, dup, dvm, dvp, i, nu, dnu,
                                   ihy2, ihx2, ihy, ihx)
                ou[i] = dub[i + 1] + dt * tu
                ov[i] = dvb[i + 1] + dt * tv
        elif dnu != 0.0:
            for i in range(mx):
                tu, tv = _trhs_dnu(pub, pvb, pum, pup, pvm, pvp, dub, dvb, dum, dup, dvm, dvp, i, nu, dnu,
                                   ihy2, ihx2, ihy, ihx)
                ou[i] = alpha * d0u[i] + beta * (dub[i + 1] + dt * tu)
                ov[i] = alpha * d0v[i] + beta * (dvb[i + 1] + dt * tv)
        elif first:
            for i in range(mx):
                tu, tv = _trhs(pub, pvb, pum, pup, pvm, pvp, dub, dvb, dum, dup, dvm, dvp, i, nu,
                               ihy2, ihx2, ihy, ihx)
                ou[i] = dub[i + 1] + dt * tu
                ov[i] = dvb[i + 1] + dt * tv
        else:
            for i in range(mx):
                tu, tv = _trhs(pub, pvb, pum, pup, pvm, pvp, dub, dvb, dum, dup, dvm, dvp, i, nu,
                               ihy2, ihx2, ihy, ihx)
                ou[i] = alpha * d0u[i] + beta * (dub[i + 1] + dt * tu)
                ov[i] = alpha * d0v[i] + beta * (dvb[i + 1] + dt * tv)


@njit(cache=True, inline="always")
def _arhs(pub, pvb, pum, pup, pvm, pvp, mub, mvb, mum, mup, mvm, mvp, i, nu, dt, ihy2, ihx2, ihy, ihx):
    """(mu + dt t) per component and the terms lap w_c mu_c of dJ/dnu, at point i."""
    sx = 0.0
    sy = 0.0
    sx += mub[i + 1] * ((pub[i + 2] - pub[i]) * ihx) - pub[i + 1] * ((mub[i + 2] - mub[i]) * ihx)
    sy += mub[i + 1] * ((pup[i] - pum[i]) * ihy) - pub[i + 1] * ((mup[i] - mum[i]) * ihy)
    sx += mvb[i + 1] * ((pvb[i + 2] - pvb[i]) * ihx) - pvb[i + 1] * ((mvb[i + 2] - mvb[i]) * ihx)
    sy += mvb[i + 1] * ((pvp[i] - pvm[i]) * ihy) - pvb[i + 1] * ((mvp[i] - mvm[i]) * ihy)
    t = _adv(pub, pvb, pvm, pvp, mub, mum, mup, i, ihy, ihx) + nu * _lap(mub, mum, mup, i, ihy2, ihx2)
    t -= 0.5 * sx
    su = mub[i + 1] + dt * t
    gu = _lap(pub, pum, pup, i, ihy2, ihx2) * mub[i + 1]
    t = _adv(pub, pvb, pvm, pvp, mvb, mvm, mvp, i, ihy, ihx) + nu * _lap(mvb, mvm, mvp, i, ihy2, ihx2)
    t -= 0.5 * sy
    sv = mvb[i + 1] + dt * t
    gv = _lap(pvb, pvm, pvp, i, ihy2, ihx2) * mvb[i + 1]
    return su, sv, gu, gv


@njit(cache=True, error_model="numpy")
def adjoint_stage(PU, PV, FPU, FPV, MU, MV, FMU, FMV, mode, nu, dt, ih, out1U, out1V, out2U, out2V):
    """One RK stage backwards: t = (N'(w))^T mu; returns the local sum <lap w, mu> (for dJ/dnu).

    (N'(w))^T mu = b(w, mu) + nu lap mu - 1/2 sum_d (mu_d grad w_d - w_d grad mu_d) (b(w, .) is
    antisymmetric on the periodic grid). mode 3: out1 = 2/3 (mu + dt t), out2 = mu/3 + 3/4 out1;
    mode 2: out1 = 1/4 (mu + dt t); mode 1: out2 += mu + dt t. The sum runs point by point, u's
    term then v's, in the interleaved kernels' order (so dJ/dnu is bitwise theirs): a scalar loop
    over a row's terms after the vectorised one.

    ``out1`` may be the memory of P or M (an update in place, so the adjoint step needs no scratch
    of its own for it): each row of P and M is copied before its outputs are written and the row
    below is read from that copy, so every point reads its inputs' old values.
    """
    puylo, puyhi, puxlo, puxhi = FPU
    pvylo, pvyhi, pvxlo, pvxhi = FPV
    muylo, muyhi, muxlo, muxhi = FMU
    mvylo, mvyhi, mvxlo, mvxhi = FMV
    ihy2, ihx2, ihy, ihx = ih
    my, mx = PU.shape
    rows = np.empty((2, 4, mx + 2))  # row j's copies (pu, pv, mu, mv) in rows[j % 2], row j - 1's in the other
    below = rows[1]
    for i in range(mx):  # row -1: the lower faces
        below[0, i + 1] = puylo[i]
        below[1, i + 1] = pvylo[i]
        below[2, i + 1] = muylo[i]
        below[3, i + 1] = mvylo[i]
    gu = np.empty(mx)  # lap w_c mu_c, per component
    gv = np.empty(mx)
    dnu = 0.0
    for j in range(my):
        cur = rows[j % 2]
        below = rows[(j + 1) % 2]
        pub, pvb, mub, mvb = cur[0], cur[1], cur[2], cur[3]
        pum, pvm, mum, mvm = below[0, 1:mx + 1], below[1, 1:mx + 1], below[2, 1:mx + 1], below[3, 1:mx + 1]
        pup = PU[j + 1] if j < my - 1 else puyhi
        pvp = PV[j + 1] if j < my - 1 else pvyhi
        mup = MU[j + 1] if j < my - 1 else muyhi
        mvp = MV[j + 1] if j < my - 1 else mvyhi
        _fill(pub, PU, puxlo, puxhi, j)
        _fill(pvb, PV, pvxlo, pvxhi, j)
        _fill(mub, MU, muxlo, muxhi, j)
        _fill(mvb, MV, mvxlo, mvxhi, j)
        if mode == 3:
            o1u, o1v, o2u, o2v = out1U[j], out1V[j], out2U[j], out2V[j]
            for i in range(mx):
                su, sv, gu[i], gv[i] = _arhs(pub, pvb, pum, pup, pvm, pvp, mub, mvb, mum, mup, mvm, mvp,
                                             i, nu, dt, ihy2, ihx2, ihy, ihx)
                b = (2.0 / 3.0) * su
                o1u[i] = b
                o2u[i] = mub[i + 1] / 3.0 + 0.75 * b
                b = (2.0 / 3.0) * sv
                o1v[i] = b
                o2v[i] = mvb[i + 1] / 3.0 + 0.75 * b
        elif mode == 2:
            o1u, o1v = out1U[j], out1V[j]
            for i in range(mx):
                su, sv, gu[i], gv[i] = _arhs(pub, pvb, pum, pup, pvm, pvp, mub, mvb, mum, mup, mvm, mvp,
                                             i, nu, dt, ihy2, ihx2, ihy, ihx)
                o1u[i] = 0.25 * su
                o1v[i] = 0.25 * sv
        else:
            o2u, o2v = out2U[j], out2V[j]
            for i in range(mx):
                su, sv, gu[i], gv[i] = _arhs(pub, pvb, pum, pup, pvm, pvp, mub, mvb, mum, mup, mvm, mvp,
                                             i, nu, dt, ihy2, ihx2, ihy, ihx)
                o2u[i] += su
                o2v[i] += sv
        for i in range(mx):
            dnu += gu[i]
            dnu += gv[i]
    return dnu
