"""Fused leapfrog kernels of the wave model: step, adjoint step, tangent step (numba, no fastmath).

Blocks are 3-D in natural order (nz, ny, nx); a 2-D model passes nz = 1 and ``has_z`` False.
The state is the pair (u^{i-1}, u^i) stored as two contiguous fields (the model's *split* layout),
so every inner loop reads and writes unit-stride rows and LLVM vectorises it: the pair interleaved
point by point kept the loops scalar (stride-2 loads) at about a third of the memory bus's speed.
``error_model="numpy"`` drops numba's zero check on each division (1 + s >= 1 here), which also kept
the loops scalar; the arithmetic is IEEE in the written order either way.

Every kernel reads two coefficient arrays, the sponge ``sigma`` and the velocity ``c``, and makes
s = hdt sigma (``hdt`` = dt / 2), a = 1/(1+s), b = r - s, c^2 = c c and c^2 a per point: the very
doubles the model's numpy expressions ``0.5 * dt * sigma``, ``1 / (1 + s)``, ``c ** 2`` and
``c2 * a`` made when it stored them as arrays, so results are bitwise those of the stored arrays,
with fewer bytes a point and one sponge array for every dt.
``F*`` are the six halo faces (zlo, zhi, ylo, yhi, xlo, xhi) of a field, ``ih2`` the inverse squared
spacings (z, y, x). With varying steps, ``r`` = dt_i / dt_{i-1} and ``dt2`` = (dt_i + dt_{i-1}) dt_i / 2
(the leapfrog on a non-uniform time grid); r = 1 and dt2 = dt^2 is the uniform scheme, with the same
arithmetic (1 + r = 2 and r - s = 1 - s exactly). Each point reads its star neighbours only, the same
way on any decomposition, so the states are bitwise rank-invariant.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _rows(U, zlo, zhi, ylo, yhi, k, j, has_z):
    """Rows (nx) of U's z and y neighbours of row (k, j), from U or from its faces: the step's
    row views. The adjoint and the tangent take plane views once per k instead and index [j, i] (a
    row view per array and row costs numba's reference counting, an atomic update each), written out
    in each kernel: as inline helpers returning the views they ran 4-11 % slower (measured). Taken as
    plane views, the step ran 15-30 % faster and put the adjoint at 1.8-2.6 steps at 96^3 on one rank
    (the aim is at most 2): kept until the adjoint gains as much (experiments/kernels/README.md)."""
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


@njit(cache=True, inline="always")
def _lap_row(buf, Fzm, Fzp, fym, fyp, j, i, ih2, has_z):
    """L f at point (j, i) of a plane: f's row with its x halo in ``buf`` (f at buf[i + 1]), the
    planes and rows around it ``Fzm``, ``Fzp``, ``fym``, ``fyp``."""
    ihz2, ihy2, ihx2 = ih2
    return _lap(buf[i + 1], Fzm[j, i], Fzp[j, i], fym[i], fyp[i], buf[i], buf[i + 2], ihz2, ihy2, ihx2, has_z)


@njit(cache=True, inline="always")
def _damping(s, r):
    """(a, b) = (1 / (1 + s), r - s) of a point whose damping term is s = dt/2 sigma."""
    return 1.0 / (1.0 + s), r - s


def zero_runs(sigma) -> np.ndarray:
    """[first, end) per row (k, j) of the x points where sigma is 0, when they are one run (else
    [0, 0)): there a = 1 and b = r exactly, so the forward kernels take the shorter formula
    (2u - r u_prev) + dt^2 c^2 L u, the same double, with no division."""
    zero = sigma == 0.0
    n = sigma.shape[2]
    first = np.where(zero.any(axis=2), zero.argmax(axis=2), 0)
    end = np.where(zero.any(axis=2), n - zero[:, :, ::-1].argmax(axis=2), 0)
    count = zero.sum(axis=2)
    one_run = count == end - first
    return np.ascontiguousarray(np.stack([np.where(one_run, first, 0), np.where(one_run, end, 0)], axis=2),
                                dtype=np.int64)


@njit(cache=True, inline="always")
def _point(i, buf, Zm, Zp, Ym, Yp, Pk, ck, row, ym0, yp0, b, two, ih2, has_z):
    """Point i of a row as (rest = (1 + r) u - b u^{i-1}, force = c^2 L u), u^{i+1} = a (rest + dt2
    force): u's row with its x halo in ``buf`` (u at buf[i + 1]), the rows around it at offsets
    ``row``, ``ym0``, ``yp0`` of the flat planes; the source's value is added to ``force`` by the caller."""
    ihz2, ihy2, ihx2 = ih2
    one = np.uint64(1)
    u = buf[i + one]
    lap = _lap(u, Zm[row + i], Zp[row + i], Ym[ym0 + i], Yp[yp0 + i], buf[i], buf[i + one + one],
               ihz2, ihy2, ihx2, has_z)
    ci = ck[row + i]
    return two * u - b * Pk[row + i], (ci * ci) * lap


@njit(cache=True, error_model="numpy")
def step(P, C, FC, sigma, hdt, c, ih2, has_z, dt2, r, src, fval, inner, out_p, out_c):
    """(out_p, out_c) = (u^i, a [(1 + r) u^i - b u^{i-1} + dt2 (c^2 L u^i + f)]), b = r - s, with
    (P, C) = (u^{i-1}, u^i) and FC the faces of C; f = fval at owned index src. c^2 is c * c per
    point (the double numpy's ``c ** 2`` gives), so no c^2 array is stored or read. On each row's
    run of sigma = 0 (``inner``, :func:`zero_runs`) a = 1 and b = r exactly: rest + dt2 force there,
    the same double, no division.

    Planes are taken as flat views once per plane and rows indexed by unsigned offsets: a view per
    row costs numba's reference counting (an atomic update each), and a signed index a wraparound
    test that keeps the loop scalar."""
    zlo, zhi, ylo, yhi, xlo, xhi = FC
    mz, my, mx = sigma.shape
    buf = np.empty(mx + 2)
    two = 1.0 + r
    sk, sj, si = src
    n, zero, one = np.uint64(mx), np.uint64(0), np.uint64(1)
    for k in range(mz):
        Ck, Pk, Sk, ck = C[k].reshape(-1), P[k].reshape(-1), sigma[k].reshape(-1), c[k].reshape(-1)
        Ok, OPk = out_c[k].reshape(-1), out_p[k].reshape(-1)
        if has_z:
            Zm = C[k - 1].reshape(-1) if k > 0 else zlo.reshape(-1)
            Zp = C[k + 1].reshape(-1) if k < mz - 1 else zhi.reshape(-1)
        else:
            Zm = Zp = Ck
        Ylo, Yhi = ylo[k], yhi[k]
        for j in range(my):
            row = np.uint64(j) * n
            Ym, ym0 = (Ck, row - n) if j > 0 else (Ylo, zero)
            Yp, yp0 = (Ck, row + n) if j < my - 1 else (Yhi, zero)
            buf[0] = xlo[k, j]
            buf[mx + 1] = xhi[k, j]
            for i in range(n):
                v = Ck[row + i]
                buf[i + one] = v
                OPk[row + i] = v
            xa = np.uint64(min(max(inner[k, j, 0], 0), mx))
            xb = np.uint64(min(max(inner[k, j, 1], xa), mx))
            for i in range(xa, xb):
                rest, force = _point(i, buf, Zm, Zp, Ym, Yp, Pk, ck, row, ym0, yp0, r, two, ih2, has_z)
                Ok[row + i] = rest + dt2 * force
            for seg in range(2):
                for i in range(zero if seg == 0 else xb, xa if seg == 0 else n):
                    a, b = _damping(hdt * Sk[row + i], r)
                    rest, force = _point(i, buf, Zm, Zp, Ym, Yp, Pk, ck, row, ym0, yp0, b, two, ih2, has_z)
                    Ok[row + i] = a * (rest + dt2 * force)
            if k == sk and j == sj:
                i = np.uint64(si)
                a, b = _damping(hdt * Sk[row + i], r)
                rest, force = _point(i, buf, Zm, Zp, Ym, Yp, Pk, ck, row, ym0, yp0, b, two, ih2, has_z)
                Ok[row + i] = a * (rest + dt2 * (force + fval))


@njit(cache=True, inline="always")
def _fill_q(Q, LC, FL, c, sigma, hdt, FQ, k):
    """Plane ``Q`` (my + 2, mx + 2) = q = (c^2 a) lam_cur' over plane k of the block with its y and x
    halo, a = 1/(1+s) (the doubles ``(c * c) * (1 / (1 + s))`` numpy's ``c**2 * a`` gives); k = -1
    or mz: the z faces' q (``FQ`` are the faces of c^2 a, FL lam_cur''s)."""
    lzlo, lzhi, lylo, lyhi, lxlo, lxhi = FL
    qzlo, qzhi, qylo, qyhi, qxlo, qxhi = FQ
    mz, my, mx = sigma.shape
    if k < 0 or k >= mz:
        fq = qzlo if k < 0 else qzhi
        fl = lzlo if k < 0 else lzhi
        for j in range(my):
            for i in range(mx):
                Q[j + 1, i + 1] = fq[j, i] * fl[j, i]
        return
    ck, Sk, LCk = c[k], sigma[k], LC[k]  # plane views, indexed [j, i] (see _rows)
    for j in range(my):
        Q[j + 1, 0] = qxlo[k, j] * lxlo[k, j]
        Q[j + 1, mx + 1] = qxhi[k, j] * lxhi[k, j]
        for i in range(mx):
            ci = ck[j, i]
            Q[j + 1, i + 1] = ((ci * ci) * (1.0 / (1.0 + hdt * Sk[j, i]))) * LCk[j, i]
    lo = Q[0]
    hi = Q[my + 1]
    qlo, llo, qhi, lhi = qylo[k], lylo[k], qyhi[k], lyhi[k]
    for i in range(mx):
        lo[i + 1] = qlo[i] * llo[i]
        hi[i + 1] = qhi[i] * lhi[i]


@njit(cache=True, error_model="numpy")
def adjoint_step(LP, LC, FL, U, FU, sigma, hdt, c, FQ, ih2, has_z, dt2, r, grad, out_p, out_c):
    """Transpose of :func:`step` applied to lam = (lam_prev', lam_cur') = (LP, LC), and dJ/dc added
    into ``grad``; U is u^i (faces FU), FL the faces of LC, FQ those of c^2 a.

    With mu = a lam_cur': out = (-b mu, lam_prev' + (1 + r) mu + dt2 L(c^2 a lam_cur')),
    grad += 2 dt2 c mu L u^i. q = c^2 a lam_cur' is made once per point, a plane ahead, in a ring
    of three halo-padded planes (cache-resident), from c and s: no c^2 a or a array is read. In 3-D
    that plane-ahead pass also writes out_p and keeps, in two-plane rings, part = lam_prev' +
    (1 + r) mu and t = 2 dt2 c mu: the point loop then reads no lam, sigma or c again and finishes
    out_c = part + dt2 L q, grad += t L u^i, the same operations in the same order (bitwise).
    """
    if not has_z:
        _adjoint_2d(LP, LC, FL, U, FU, sigma, hdt, c, FQ, ih2, has_z, dt2, r, grad, out_p, out_c)
        return
    uzlo, uzhi, uylo, uyhi, uxlo, uxhi = FU
    ihz2, ihy2, ihx2 = ih2
    mz, my, mx = sigma.shape
    ring = np.empty((3, my + 2, mx + 2))  # plane k's q in ring[(k + 1) % 3]
    parts = np.empty((2, my, mx))  # plane k's part and t in [k % 2]
    ts = np.empty((2, my, mx))
    ubuf = np.empty(mx + 2)
    two_dt2 = 2.0 * dt2
    two = 1.0 + r
    _fill_q(ring[0], LC, FL, c, sigma, hdt, FQ, -1)
    _fill_plane(ring[1], parts[0], ts[0], LP, LC, FL, c, sigma, hdt, r, two, two_dt2, FQ, 0, out_p)
    for k in range(mz):
        if k + 1 < mz:
            _fill_plane(ring[(k + 2) % 3], parts[(k + 1) % 2], ts[(k + 1) % 2], LP, LC, FL, c, sigma, hdt, r,
                        two, two_dt2, FQ, k + 1, out_p)
        else:
            _fill_q(ring[(k + 2) % 3], LC, FL, c, sigma, hdt, FQ, mz)
        Qc = ring[(k + 1) % 3]
        Qm = ring[k % 3]
        Qp = ring[(k + 2) % 3]
        Pk, Tk = parts[k % 2], ts[k % 2]
        Uk, Gk, Ok = U[k], grad[k], out_c[k]
        Uzm = U[k - 1] if k > 0 else uzlo
        Uzp = U[k + 1] if k < mz - 1 else uzhi
        for j in range(my):
            uym = Uk[j - 1] if j > 0 else uylo[k]
            uyp = Uk[j + 1] if j < my - 1 else uyhi[k]
            ubuf[0] = uxlo[k, j]
            ubuf[mx + 1] = uxhi[k, j]
            for i in range(mx):
                ubuf[i + 1] = Uk[j, i]
            for i in range(mx):
                q = Qc[j + 1, i + 1]
                lapq = _lap(q, Qm[j + 1, i + 1], Qp[j + 1, i + 1], Qc[j, i + 1], Qc[j + 2, i + 1], Qc[j + 1, i],
                            Qc[j + 1, i + 2], ihz2, ihy2, ihx2, True)
                lapu = _lap_row(ubuf, Uzm, Uzp, uym, uyp, j, i, ih2, True)
                Ok[j, i] = Pk[j, i] + dt2 * lapq
                Gk[j, i] += Tk[j, i] * lapu


@njit(cache=True, inline="always")
def _fill_plane(Q, P, T, LP, LC, FL, c, sigma, hdt, r, two, two_dt2, FQ, k, out_p):
    """Owned plane k of the 3-D adjoint's plane-ahead pass: q (with its y and x halo) into ``Q``,
    part = lam_prev' + (1 + r) mu into ``P``, t = (2 dt2 c) mu into ``T``, and out_p = -b mu;
    a = 1/(1+s), b = r - s, mu = a lam_cur', the doubles :func:`_fill_q` and :func:`_damping` make."""
    lzlo, lzhi, lylo, lyhi, lxlo, lxhi = FL
    qzlo, qzhi, qylo, qyhi, qxlo, qxhi = FQ
    mz, my, mx = sigma.shape
    ck, Sk, LCk, LPk, OPk = c[k], sigma[k], LC[k], LP[k], out_p[k]
    for j in range(my):
        Q[j + 1, 0] = qxlo[k, j] * lxlo[k, j]
        Q[j + 1, mx + 1] = qxhi[k, j] * lxhi[k, j]
        for i in range(mx):
            ci = ck[j, i]
            a, b = _damping(hdt * Sk[j, i], r)
            lc = LCk[j, i]
            mu = a * lc
            Q[j + 1, i + 1] = ((ci * ci) * a) * lc
            OPk[j, i] = -b * mu
            P[j, i] = LPk[j, i] + two * mu
            T[j, i] = two_dt2 * ci * mu
    lo = Q[0]
    hi = Q[my + 1]
    qlo, llo, qhi, lhi = qylo[k], lylo[k], qyhi[k], lyhi[k]
    for i in range(mx):
        lo[i + 1] = qlo[i] * llo[i]
        hi[i + 1] = qhi[i] * lhi[i]


@njit(cache=True, error_model="numpy")
def _adjoint_2d(LP, LC, FL, U, FU, sigma, hdt, c, FQ, ih2, has_z, dt2, r, grad, out_p, out_c):
    """:func:`adjoint_step` of a 2-D block (one plane): q made for the whole plane first, then the
    point loop reads lam_cur', sigma and c again. The 3-D kernel's per-plane temporaries would be
    the whole field here (2-3x slower at 300x257, measured)."""
    uzlo, uzhi, uylo, uyhi, uxlo, uxhi = FU
    ihz2, ihy2, ihx2 = ih2
    mz, my, mx = sigma.shape
    ring = np.empty((3, my + 2, mx + 2))  # plane k's q in ring[(k + 1) % 3]
    ubuf = np.empty(mx + 2)
    two_dt2 = 2.0 * dt2
    two = 1.0 + r
    if has_z:
        _fill_q(ring[0], LC, FL, c, sigma, hdt, FQ, -1)
    _fill_q(ring[1], LC, FL, c, sigma, hdt, FQ, 0)
    for k in range(mz):
        if has_z:
            _fill_q(ring[(k + 2) % 3], LC, FL, c, sigma, hdt, FQ, k + 1)
        Qc = ring[(k + 1) % 3]
        Qm = ring[k % 3]
        Qp = ring[(k + 2) % 3]
        Uk, LCk, LPk, Sk, ck, Gk, OPk, Ok = U[k], LC[k], LP[k], sigma[k], c[k], grad[k], out_p[k], out_c[k]
        if has_z:
            Uzm = U[k - 1] if k > 0 else uzlo
            Uzp = U[k + 1] if k < mz - 1 else uzhi
        else:
            Uzm = Uzp = Uk
        for j in range(my):
            uym = Uk[j - 1] if j > 0 else uylo[k]
            uyp = Uk[j + 1] if j < my - 1 else uyhi[k]
            ubuf[0] = uxlo[k, j]
            ubuf[mx + 1] = uxhi[k, j]
            for i in range(mx):
                ubuf[i + 1] = Uk[j, i]
            for i in range(mx):
                q = Qc[j + 1, i + 1]
                lapq = _lap(q, Qm[j + 1, i + 1], Qp[j + 1, i + 1], Qc[j, i + 1], Qc[j + 2, i + 1], Qc[j + 1, i],
                            Qc[j + 1, i + 2], ihz2, ihy2, ihx2, has_z)
                lapu = _lap_row(ubuf, Uzm, Uzp, uym, uyp, j, i, ih2, has_z)
                a, b = _damping(hdt * Sk[j, i], r)
                mu = a * LCk[j, i]
                OPk[j, i] = -b * mu
                Ok[j, i] = (LPk[j, i] + two * mu) + dt2 * lapq
                Gk[j, i] += two_dt2 * ck[j, i] * mu * lapu


@njit(cache=True, error_model="numpy")
def tangent_step(DP, DC, FD, U, FU, sigma, hdt, c, dc, ih2, has_z, dt2, r, out_p, out_c):
    """(out_p, out_c) = (du^i, a [(1 + r) du^i - b du^{i-1} + dt2 (c^2 L du^i + 2 c dc L u^i)]),
    with (DP, DC) = (du^{i-1}, du^i) (faces FD of DC) and U = u^i (faces FU); c^2 = c * c per point."""
    dzlo, dzhi, dylo, dyhi, dxlo, dxhi = FD
    uzlo, uzhi, uylo, uyhi, uxlo, uxhi = FU
    ihz2, ihy2, ihx2 = ih2
    mz, my, mx = sigma.shape
    dbuf = np.empty(mx + 2)
    ubuf = np.empty(mx + 2)
    two = 1.0 + r
    for k in range(mz):
        # plane views, indexed [j, i] in the loops (see _rows): the row views cost about a quarter
        # of the kernel at 96^3
        Dk, Uk, DPk, OPk = DC[k], U[k], DP[k], out_p[k]
        Sk, Ck, dCk, Ok = sigma[k], c[k], dc[k], out_c[k]
        if has_z:
            Dzm = DC[k - 1] if k > 0 else dzlo
            Dzp = DC[k + 1] if k < mz - 1 else dzhi
            Uzm = U[k - 1] if k > 0 else uzlo
            Uzp = U[k + 1] if k < mz - 1 else uzhi
        else:
            Dzm = Dzp = Dk
            Uzm = Uzp = Uk
        for j in range(my):
            dym = Dk[j - 1] if j > 0 else dylo[k]
            dyp = Dk[j + 1] if j < my - 1 else dyhi[k]
            uym = Uk[j - 1] if j > 0 else uylo[k]
            uyp = Uk[j + 1] if j < my - 1 else uyhi[k]
            dbuf[0] = dxlo[k, j]
            dbuf[mx + 1] = dxhi[k, j]
            ubuf[0] = uxlo[k, j]
            ubuf[mx + 1] = uxhi[k, j]
            for i in range(mx):
                dbuf[i + 1] = Dk[j, i]
                ubuf[i + 1] = Uk[j, i]
                OPk[j, i] = Dk[j, i]
            for i in range(mx):
                d = dbuf[i + 1]
                lapd = _lap(d, Dzm[j, i], Dzp[j, i], dym[i], dyp[i], dbuf[i], dbuf[i + 2],
                            ihz2, ihy2, ihx2, has_z)
                lapu = _lap_row(ubuf, Uzm, Uzp, uym, uyp, j, i, ih2, has_z)
                a, b = _damping(hdt * Sk[j, i], r)
                ci = Ck[j, i]
                Ok[j, i] = a * ((two * d - b * DPk[j, i])
                                + dt2 * ((ci * ci) * lapd + 2.0 * ci * dCk[j, i] * lapu))
