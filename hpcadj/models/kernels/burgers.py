"""Fused SSP-RK3 stage kernels of the burgers model: forward, tangent and adjoint stages (numba).

A state is the pair (u, v) stored as two contiguous (ny, nx) fields (the model's *split* layout), so
every inner loop reads and writes unit-stride rows and LLVM vectorises it; the pair interleaved point
by point kept the loops scalar (stride-2 loads). ``error_model="numpy"`` drops numba's zero check on
each division (the divisors are constants), which also kept loops scalar; the arithmetic is IEEE in
the written order either way (no fastmath): the forward stage the same operations as the
interleaved kernels had, the adjoint and tangent stages fewer (their terms gathered, see
:func:`_arhs` and :func:`_tpart`).
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
def _tpart(R, bs, cs, as_, d0u, d0v, ou, ov, j, i, k, dp, first, alpha, beta):
    """Point (j, i) of a tangent stage: out = [alpha d0 + beta] (d + dt T), T = -b(d, w) - b(w, d)
    + nu lap d [+ dnu lap w] (``dp``: with the dnu term). ``R`` is the ring of :func:`tangent_stage`
    (row ``bs``/``cs``/``as_`` + f: field f of rows j - 1 / j / j + 1); ``k`` = (kx, ky, 2 kx,
    2 ky, lnx, lny, ldx, ldy), kx = -dt/(4 hx), ky = -dt/(4 hy), lnx = dt nu/hx^2, lny = dt nu/hy^2,
    ldx / ldy the same with dnu.

    With one-sided differences of d at the point (e, w, n, s: d_e - d, d - d_w, d_n - d, d - d_s),
    dt times component u of T is

        kx [d_u dx w_u + w_u (e + w)] + 2 kx (Q_u,e - Q_u,w) + ky [d_v dy w_u + w_v (n + s)
        + (S_n - S_s)] + lny (n - s) + lnx (e - w)  [+ the same for w_u with ldy, ldx],

    dx f = f_e - f_w, dy f = f_n - f_s, Q_u = w_u d_u, S = d_v w_u + w_v d_u (made once per point
    in the ring); v: x and y swapped, Q_v = w_v d_v and the same S. That is -b(d, w) - b(w, d) with
    its common terms gathered (the flux products of both advections meet in Q and S), the 1/2,
    1/(2h), dt and nu folded into the constants. IEEE arithmetic in the written order (no
    fastmath), point by point: the same on any decomposition."""
    kx, ky, kx2, ky2, lnx, lny, ldx, ldy = k
    pu = R[cs, i + 1]
    pue = R[cs, i + 2]
    puw = R[cs, i]
    pun = R[as_, i + 1]
    pus = R[bs, i + 1]
    pv = R[cs + 1, i + 1]
    pve = R[cs + 1, i + 2]
    pvw = R[cs + 1, i]
    pvn = R[as_ + 1, i + 1]
    pvs = R[bs + 1, i + 1]
    du = R[cs + 2, i + 1]
    due = R[cs + 2, i + 2]
    duw = R[cs + 2, i]
    dun = R[as_ + 2, i + 1]
    dus = R[bs + 2, i + 1]
    dv = R[cs + 3, i + 1]
    dve = R[cs + 3, i + 2]
    dvw = R[cs + 3, i]
    dvn = R[as_ + 3, i + 1]
    dvs = R[bs + 3, i + 1]
    eu = due - du
    wu = du - duw
    nu_ = dun - du
    su = du - dus
    ev = dve - dv
    wv = dv - dvw
    nv = dvn - dv
    sv = dv - dvs
    if dp:
        epu = pue - pu
        wpu = pu - puw
        npu = pun - pu
        spu = pu - pus
        epv = pve - pv
        wpv = pv - pvw
        npv = pvn - pv
        spv = pv - pvs
        dxpu = epu + wpu
        dypu = npu + spu
        dxpv = epv + wpv
        dypv = npv + spv
    else:
        dxpu = pue - puw
        dypu = pun - pus
        dxpv = pve - pvw
        dypv = pvn - pvs
    xu = du * dxpu + pu * (eu + wu)
    yu = (dv * dypu + pv * (nu_ + su)) + (R[as_ + 4, i + 1] - R[bs + 4, i + 1])
    tu = ((kx * xu + kx2 * (R[cs + 6, i + 2] - R[cs + 6, i])) + ky * yu) + (lny * (nu_ - su) + lnx * (eu - wu))
    yv = dv * dypv + pv * (nv + sv)
    xv = (du * dxpv + pu * (ev + wv)) + (R[cs + 4, i + 2] - R[cs + 4, i])
    tv = ((ky * yv + ky2 * (R[as_ + 5, i + 1] - R[bs + 5, i + 1])) + kx * xv) + (lny * (nv - sv) + lnx * (ev - wv))
    if dp:
        tu += ldy * (npu - spu) + ldx * (epu - wpu)
        tv += ldy * (npv - spv) + ldx * (epv - wpv)
    if first:
        ou[j, i] = du + tu
        ov[j, i] = dv + tv
    else:
        ou[j, i] = alpha * d0u[j, i] + beta * (du + tu)
        ov[j, i] = alpha * d0v[j, i] + beta * (dv + tv)


@njit(cache=True, inline="always")
def _tring(R, t, pu, pv, du, dv, i):
    """Row slot ``t`` of the ring at column i (halo included): the four fields and the products
    S = d_v w_u + w_v d_u, Q_v = w_v d_v, Q_u = w_u d_u."""
    R[t, i] = pu
    R[t + 1, i] = pv
    R[t + 2, i] = du
    R[t + 3, i] = dv
    R[t + 4, i] = dv * pu + pv * du
    R[t + 5, i] = pv * dv
    R[t + 6, i] = pu * du


@njit(cache=True, inline="always")
def _fring(R, bs, cs, as_, w0u, w0v, ou, ov, j, i, alpha, beta, first, nu, dt, ihy2, ihx2, ihy, ihx):
    """Point (j, i) of a forward stage from the ring of :func:`_tangent_rows` (w_u, w_v in fields
    0, 1 of rows ``bs`` / ``cs`` / ``as_``): :func:`stage`'s arithmetic operation for operation
    (:func:`_rhs`, :func:`_adv`, :func:`_lap` in the same order on the same values), so bitwise its
    output."""
    # _adv(ub, vb, vm, vp, ub, um, up): b(w, w)_u
    bx = (R[cs, i + 2] - R[cs, i]) * ihx
    by = (R[as_, i + 1] - R[bs, i + 1]) * ihy
    fx = (R[cs, i + 2] * R[cs, i + 2] - R[cs, i] * R[cs, i]) * ihx
    fy = (R[as_ + 1, i + 1] * R[as_, i + 1] - R[bs + 1, i + 1] * R[bs, i + 1]) * ihy
    au = 0.5 * (R[cs, i + 1] * bx + R[cs + 1, i + 1] * by + fx + fy)
    # _lap(ub, um, up)
    centre = R[cs, i + 1]
    lu = 0.0
    lu += (R[bs, i + 1] - centre) * ihy2
    lu += (R[as_, i + 1] - centre) * ihy2
    lu += (R[cs, i] - centre) * ihx2
    lu += (R[cs, i + 2] - centre) * ihx2
    nu_ = -au + nu * lu
    # _adv(ub, vb, vm, vp, vb, vm, vp): b(w, w)_v
    bx = (R[cs + 1, i + 2] - R[cs + 1, i]) * ihx
    by = (R[as_ + 1, i + 1] - R[bs + 1, i + 1]) * ihy
    fx = (R[cs, i + 2] * R[cs + 1, i + 2] - R[cs, i] * R[cs + 1, i]) * ihx
    fy = (R[as_ + 1, i + 1] * R[as_ + 1, i + 1] - R[bs + 1, i + 1] * R[bs + 1, i + 1]) * ihy
    av = 0.5 * (R[cs, i + 1] * bx + R[cs + 1, i + 1] * by + fx + fy)
    # _lap(vb, vm, vp)
    centre = R[cs + 1, i + 1]
    lv = 0.0
    lv += (R[bs + 1, i + 1] - centre) * ihy2
    lv += (R[as_ + 1, i + 1] - centre) * ihy2
    lv += (R[cs + 1, i] - centre) * ihx2
    lv += (R[cs + 1, i + 2] - centre) * ihx2
    nv_ = -av + nu * lv
    if first:
        ou[j, i] = R[cs, i + 1] + dt * nu_
        ov[j, i] = R[cs + 1, i + 1] + dt * nv_
    else:
        ou[j, i] = alpha * w0u[j, i] + beta * (R[cs, i + 1] + dt * nu_)
        ov[j, i] = alpha * w0v[j, i] + beta * (R[cs + 1, i + 1] + dt * nv_)


@njit(cache=True, inline="always")
def _tangent_rows(PU, PV, FPU, FPV, DU, DV, FDU, FDV, W0U, W0V, D0U, D0V, alpha, beta, first, nu, dnu,
                  dt, ih, fwd, outWU, outWV, outU, outV):
    """The body of :func:`tangent_stage` (``fwd`` False) and :func:`tangent_forward_stage`."""
    puylo, puyhi, puxlo, puxhi = FPU
    pvylo, pvyhi, pvxlo, pvxhi = FPV
    duylo, duyhi, duxlo, duxhi = FDU
    dvylo, dvyhi, dvxlo, dvxhi = FDV
    ihy2, ihx2, ihy, ihx = ih
    kx = -(dt * (0.5 * ihx))
    ky = -(dt * (0.5 * ihy))
    k = (kx, ky, 2.0 * kx, 2.0 * ky, (dt * nu) * ihx2, (dt * nu) * ihy2, (dt * dnu) * ihx2, (dt * dnu) * ihy2)
    my, mx = PU.shape
    stride = mx + 2 + (64 - (mx + 2)) % 512  # 512 bytes mod 4096
    R = np.empty((21, stride))  # row jj's seven fields from row 7 ((jj + 1) % 3)
    for i in range(mx):  # row -1: the lower faces
        _tring(R, 0, puylo[i], pvylo[i], duylo[i], dvylo[i], i + 1)
    if my > 0:  # row 0 (later rows: one ahead of the loop below)
        _tring(R, 7, puxlo[0], pvxlo[0], duxlo[0], dvxlo[0], 0)
        _tring(R, 7, puxhi[0], pvxhi[0], duxhi[0], dvxhi[0], mx + 1)
        for i in range(mx):
            _tring(R, 7, PU[0, i], PV[0, i], DU[0, i], DV[0, i], i + 1)
    dp = dnu != 0.0
    for j in range(my):
        bs, cs, as_ = 7 * (j % 3), 7 * ((j + 1) % 3), 7 * ((j + 2) % 3)
        jj = j + 1
        if jj < my:
            _tring(R, as_, puxlo[jj], pvxlo[jj], duxlo[jj], dvxlo[jj], 0)
            _tring(R, as_, puxhi[jj], pvxhi[jj], duxhi[jj], dvxhi[jj], mx + 1)
            for i in range(mx):
                _tring(R, as_, PU[jj, i], PV[jj, i], DU[jj, i], DV[jj, i], i + 1)
        else:
            for i in range(mx):
                _tring(R, as_, puyhi[i], pvyhi[i], duyhi[i], dvyhi[i], i + 1)
        if fwd:  # the forward stage's row j from the same ring rows (its own loop: registers)
            if first:
                for i in range(mx):
                    _fring(R, bs, cs, as_, W0U, W0V, outWU, outWV, j, i, alpha, beta, True, nu, dt,
                           ihy2, ihx2, ihy, ihx)
            else:
                for i in range(mx):
                    _fring(R, bs, cs, as_, W0U, W0V, outWU, outWV, j, i, alpha, beta, False, nu, dt,
                           ihy2, ihx2, ihy, ihx)
        # one loop per case (first stage or not, dnu zero or not): a branch inside kept it scalar
        if dp and first:
            for i in range(mx):
                _tpart(R, bs, cs, as_, D0U, D0V, outU, outV, j, i, k, True, True, alpha, beta)
        elif dp:
            for i in range(mx):
                _tpart(R, bs, cs, as_, D0U, D0V, outU, outV, j, i, k, True, False, alpha, beta)
        elif first:
            for i in range(mx):
                _tpart(R, bs, cs, as_, D0U, D0V, outU, outV, j, i, k, False, True, alpha, beta)
        else:
            for i in range(mx):
                _tpart(R, bs, cs, as_, D0U, D0V, outU, outV, j, i, k, False, False, alpha, beta)


@njit(cache=True, error_model="numpy")
def tangent_stage(PU, PV, FPU, FPV, DU, DV, FDU, FDV, D0U, D0V, alpha, beta, first, nu, dnu, dt, ih,
                  outU, outV):
    """out = [alpha d0 + beta] (d + dt T), T = -b(d, w) - b(w, d) + nu lap d + dnu lap w.

    The stage's inputs pass through a ring of three rows (j - 1, j, j + 1; row j + 1 copied while
    row j is computed), each holding w, d and the products S, Q_v, Q_u of :func:`_tpart` with the
    row's x halo; the ring's rows lie 512 bytes apart modulo 4096 (a state's 1024-point rows are
    8 KiB, so all map to the same cache sets). Rows are addressed by index, never by a row view:
    a view per row and array costs numba's reference counting."""
    _tangent_rows(PU, PV, FPU, FPV, DU, DV, FDU, FDV, D0U, D0V, D0U, D0V, alpha, beta, first, nu, dnu,
                  dt, ih, False, outU, outV, outU, outV)


@njit(cache=True, error_model="numpy")
def tangent_forward_stage(PU, PV, FPU, FPV, DU, DV, FDU, FDV, W0U, W0V, D0U, D0V, alpha, beta, first,
                          nu, dnu, dt, ih, outWU, outWV, outU, outV):
    """:func:`tangent_stage` at w (= P) and, from the same ring rows, the forward stage w -> outW of
    :func:`stage` (``W0`` its w0): bitwise :func:`stage`'s output, so the tangent step linearises at
    exactly the forward trajectory, without a second read of w and its halo. Outputs must not alias
    inputs (rows j - 1 .. j + 1 of P and D are read after row j's outputs are written)."""
    _tangent_rows(PU, PV, FPU, FPV, DU, DV, FDU, FDV, W0U, W0V, D0U, D0V, alpha, beta, first, nu, dnu,
                  dt, ih, True, outWU, outWV, outU, outV)


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
