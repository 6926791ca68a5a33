"""Fused SSP-RK3 stage kernels of the burgers model: forward, tangent and adjoint stages (numba).

A state is the pair (u, v) stored as two contiguous (ny, nx) fields (the model's *split* layout), so
every inner loop reads and writes unit-stride rows and LLVM vectorises it; the pair interleaved point
by point kept the loops scalar (stride-2 loads). ``error_model="numpy"`` drops numba's zero check on
each division (the divisors are constants), which also kept loops scalar; the arithmetic is IEEE in
the written order either way (no fastmath): the forward and tangent stages the same operations as the
interleaved kernels had, the adjoint stage fewer (its terms gathered, see :func:`_arhs`).
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
def _arhs(pub, pvb, pum, pup, pvm, pvp, mub, mvb, mum, mup, mvm, mvp, i, cly, clx, cy, cx):
    """mu + dt t per component, t = (N'(w))^T mu, and dt nu w . lap mu (dJ/dnu's term), at point i.

    ``cy``, ``cx`` = dt/(4 hy), dt/(4 hx); ``cly``, ``clx`` = dt nu/hy^2, dt nu/hx^2. In the
    one-sided differences of mu at the point (e, w: east and west, mu_e - mu and mu - mu_w; n, s:
    north and south) dt times component u of t is

        cx [(2 w_u + w_u,e) e_u + (2 w_u + w_u,w) w_u' - mu_v dx w_v + w_v dx mu_v]
        + cy [w_v dy mu_u + dy(w_v mu_u)] + cly (n_u - s_u) + clx (e_u - w_u'),

    dx f = f_e - f_w (w_u' the west difference of mu_u): that is b(w, mu)_u + nu lap mu_u -
    1/2 sum_c (mu_c d_x w_c - w_c d_x mu_c) with its common terms gathered, 2 w_u dx mu_u +
    dx(w_u mu_u) - mu_u dx w_u = (2 w_u + w_u,e) e_u + (2 w_u + w_u,w) w_u' (v: x and y swapped).
    dJ/dnu's term is w . lap mu, not lap w . mu: the periodic Laplacian is symmetric, so their sums
    over the grid agree, and dt nu lap mu is made for the nu lap mu term anyway. Everything is
    IEEE arithmetic in the written order (no fastmath), point by point, so the same on any
    decomposition; it is not bitwise the order of the older kernels (differences ~1e-16)."""
    au = pub[i + 1]
    av = pvb[i + 1]
    mu = mub[i + 1]
    mv = mvb[i + 1]
    aue = pub[i + 2]
    auw = pub[i]
    mve = mvb[i + 2]
    mvw = mvb[i]
    mum_ = mum[i]
    mvm_ = mvm[i]
    eu = mub[i + 2] - mu
    wu = mu - mub[i]
    nu_ = mup[i] - mu
    su_ = mu - mum_
    ev = mve - mv
    wv = mv - mvw
    nv = mvp[i] - mv
    sv_ = mv - mvm_
    dymu = nu_ + su_
    dxmv = ev + wv
    lu = cly * (nu_ - su_) + clx * (eu - wu)
    lv = cly * (nv - sv_) + clx * (ev - wv)
    au2 = au + au
    av2 = av + av
    xu = (au2 + aue) * eu + (au2 + auw) * wu - mv * (pvb[i + 2] - pvb[i]) + av * dxmv
    yu = av * dymu + (pvp[i] * mup[i] - pvm[i] * mum_)
    su = mu + ((cx * xu + cy * yu) + lu)
    yv = (av2 + pvp[i]) * nv + (av2 + pvm[i]) * sv_ - mu * (pup[i] - pum[i]) + au * dymu
    xv = au * dxmv + (aue * mve - auw * mvw)
    sv = mv + ((cy * yv + cx * xv) + lv)
    return su, sv, au * lu + av * lv


@njit(cache=True, error_model="numpy")
def adjoint_stage(PU, PV, FPU, FPV, MU, MV, FMU, FMV, mode, nu, dt, ih, out1U, out1V, out2U, out2V):
    """One RK stage backwards: t = (N'(w))^T mu; returns the local sum <w, lap mu> (for dJ/dnu).

    (N'(w))^T mu = b(w, mu) + nu lap mu - 1/2 sum_d (mu_d grad w_d - w_d grad mu_d) (b(w, .) is
    antisymmetric on the periodic grid; its terms gathered as in :func:`_arhs`). mode 3: out1 =
    2/3 (mu + dt t), out2 = mu/3 + 3/4 out1 (mu/3 as mu * (1/3)); mode 2: out1 = 1/4 (mu + dt t);
    mode 1: out2 += mu + dt t.

    The sum's order (a vectorisable one): column i of the block adds its points' terms
    dt nu (w_u lap mu_u + w_v lap mu_v) row by row, j = 0, 1, ... (acc[i], inside the vectorised
    loop); then the columns' sums are added in order, i = 0, 1, ..., and divided by dt nu. The order
    is fixed for a given block, so the sum is deterministic, but another decomposition sums in
    another order (as the ranks' sums, combined by an allreduce, always did).

    ``out1`` may be the memory of P or M (an update in place, so the adjoint step needs no scratch
    of its own for it): each row of P and M is copied before its outputs are written and the row
    below is read from that copy, so every point reads its inputs' old values. The copies' rows lie
    512 bytes apart modulo 4096 (the state's rows are 8 KiB at 1024 points, so all in the same
    cache sets): eight copied rows, each in their own sets, ran the stage 5-10 % faster than at
    mx + 2 apart.
    """
    puylo, puyhi, puxlo, puxhi = FPU
    pvylo, pvyhi, pvxlo, pvxhi = FPV
    muylo, muyhi, muxlo, muxhi = FMU
    mvylo, mvyhi, mvxlo, mvxhi = FMV
    ihy2, ihx2, ihy, ihx = ih
    cy = dt * (0.5 * ihy)
    cx = dt * (0.5 * ihx)
    cly = (dt * nu) * ihy2
    clx = (dt * nu) * ihx2
    third = 1.0 / 3.0
    my, mx = PU.shape
    stride = mx + 2 + (64 - (mx + 2)) % 512  # 512 bytes mod 4096
    rows = np.empty((2, 4, stride))  # row j's copies (pu, pv, mu, mv) in rows[j % 2], row j - 1's in the other
    below = rows[1]
    for i in range(mx):  # row -1: the lower faces
        below[0, i + 1] = puylo[i]
        below[1, i + 1] = pvylo[i]
        below[2, i + 1] = muylo[i]
        below[3, i + 1] = mvylo[i]
    acc = np.zeros(mx)  # per column: the sum over rows of dt nu w . lap mu
    for j in range(my):
        cur = rows[j % 2]
        below = rows[(j + 1) % 2]
        pub, pvb, mub, mvb = cur[0, :mx + 2], cur[1, :mx + 2], cur[2, :mx + 2], cur[3, :mx + 2]
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
                su, sv, g = _arhs(pub, pvb, pum, pup, pvm, pvp, mub, mvb, mum, mup, mvm, mvp,
                                  i, cly, clx, cy, cx)
                acc[i] += g
                b = (2.0 / 3.0) * su
                o1u[i] = b
                o2u[i] = mub[i + 1] * third + 0.75 * b
                b = (2.0 / 3.0) * sv
                o1v[i] = b
                o2v[i] = mvb[i + 1] * third + 0.75 * b
        elif mode == 2:
            o1u, o1v = out1U[j], out1V[j]
            for i in range(mx):
                su, sv, g = _arhs(pub, pvb, pum, pup, pvm, pvp, mub, mvb, mum, mup, mvm, mvp,
                                  i, cly, clx, cy, cx)
                acc[i] += g
                o1u[i] = 0.25 * su
                o1v[i] = 0.25 * sv
        else:
            o2u, o2v = out2U[j], out2V[j]
            for i in range(mx):
                su, sv, g = _arhs(pub, pvb, pum, pup, pvm, pvp, mub, mvb, mum, mup, mvm, mvp,
                                  i, cly, clx, cy, cx)
                acc[i] += g
                o2u[i] += su
                o2v[i] += sv
    dnu = 0.0
    for i in range(mx):
        dnu += acc[i]
    return dnu / (dt * nu)
