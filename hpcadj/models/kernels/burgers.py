"""SSP-RK3 kernels of the burgers model: the forward stage, and the whole tangent and adjoint steps (numba).

A state is the pair (u, v) stored as two contiguous (ny, nx) fields (the model's *split* layout), so
every inner loop reads and writes unit-stride rows and LLVM vectorises it. ``ih`` = (1/hy^2, 1/hx^2,
1/(2 hy), 1/(2 hx)).

The stage map. With the stage weights alpha, beta (out = alpha w0 + beta (x + dt N(x)),
N(w) = -b(w, w) + nu lap w) folded into five constants, component u of S(x) = beta (x + dt N(x)) is

    c0 u + lx (u_e + u_w) + ly (u_n + u_s) + cx [u_e A - u_w B] + cy [u_n C - u_s D]

with A = u + u_e, B = u + u_w, C = v + v_n, D = v + v_s (e, w, n, s the east, west, north and south
neighbours), cx = -beta dt / (4 hx), cy = -beta dt / (4 hy), lx = beta dt nu / hx^2, ly likewise,
c0 = beta - 2 (lx + ly); component v the same with v_e, v_w, v_n, v_s in the brackets. The brackets
are the skew-symmetric advection b(w, w) = 1/2 [w . grad w + div(w w)] with central differences,
its terms gathered (u (u_e - u_w) + u_e^2 - u_w^2 = u_e A - u_w B); the rest is the 5-point
Laplacian: 28 floating-point operations a point (the plain form took about 80), most of them fused
multiply-adds. Its tangent (:func:`_tp`) and transpose (:func:`_ap`) are gathered the same way.

Rounding. The arithmetic is IEEE in the written order, no fastmath, and every multiply-add is an
explicit FMA (``fma.fma``: one rounding wherever it runs, vector or scalar), so a point's result
depends only on its neighbours' values, never on the decomposition or the vector lane it fell in:
states, tangents and adjoints are bitwise the same on any rank count and from call to call.

Passes. The forward step is three passes of :func:`stage` (one halo exchange each, the driver's
states at the step's ends); each is memory-bound. The tangent and adjoint steps are one pass each
(:func:`tangent_step`, :func:`adjoint_step`): their stages run as a wavefront over the rows, each
stage a few rows behind the one it reads, through rings of padded rows that stay in cache, on a
margin of halo points recomputed from a deep halo (:class:`..DeepHalo`), so the stage states never
go to memory and no exchange falls between stages. The halo points a rank recomputes are made by
the same arithmetic from the same values as on their owner, so the one-pass steps are bitwise the
stage-by-stage ones.

Memory lessons (1024^2, one core, measured): the rows of the fields a pass reads from memory are
read side by side in one loop (a row of one field, then of the next, ran at a third of the speed:
the prefetcher restarts on every row); the rings' rows lie 512 bytes apart modulo 4096 (a 1024-point
row is 8 KiB, so rows at their natural spacing share the same L1 sets); the one-pass steps write
each output row from a small row buffer in a loop of its own (stores that miss in cache, issued
inside the long arithmetic loop, held its loads up: 18.8 -> 13.2 ns a point), while the
memory-bound forward stage writes straight from its arithmetic loop (its buffered variant was
slower); and every state buffer is page-aligned (``kernels.new_vec``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .fma import fma


# -- rings of rows -----------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _rows(n, width):
    """n ring rows of at least ``width`` values each, 512 bytes apart modulo 4096."""
    return np.empty((n, width + (64 - width) % 512))


@njit(cache=True, inline="always")
def _ring_row(R, t, X, xlo, xhi, jj):
    """Row jj of field X with its x halo into ring row t."""
    mx = X.shape[1]
    R[t, 0] = xlo[jj]
    R[t, mx + 1] = xhi[jj]
    for i in range(mx):
        R[t, i + 1] = X[jj, i]


@njit(cache=True, inline="always")
def _ring_face(R, t, face):
    """A y face (row -1) into ring row t (its x halo is never read)."""
    for i in range(face.shape[0]):
        R[t, i + 1] = face[i]


@njit(cache=True, inline="always")
def _deep_rows(R, t, X, HX, Y, HY, r, d, hd):
    """Row r (-d <= r < my + d) of the fields X and Y, columns -d .. mx + d - 1, into ring rows t and
    t + 1 (at indices 0 .. mx + 2d - 1), from the blocks and their depth-hd halos ``HX``, ``HY`` =
    (ylo, yhi, xlo, xhi), hd >= d. Both fields in one loop: streams read one after the other (a row
    of X, then of Y) ran a third as fast as two read side by side (the prefetcher restarts on every
    row)."""
    my, mx = X.shape
    s = hd - d
    if r < 0:
        for c in range(mx + 2 * d):
            R[t, c] = HX[0][r + hd, c + s]
            R[t + 1, c] = HY[0][r + hd, c + s]
    elif r >= my:
        for c in range(mx + 2 * d):
            R[t, c] = HX[1][r - my, c + s]
            R[t + 1, c] = HY[1][r - my, c + s]
    else:
        for c in range(d):
            R[t, c] = HX[2][r, c + s]
            R[t + 1, c] = HY[2][r, c + s]
            R[t, mx + d + c] = HX[3][r, c]
            R[t + 1, mx + d + c] = HY[3][r, c]
        for c in range(mx):
            R[t, d + c] = X[r, c]
            R[t + 1, d + c] = Y[r, c]


@njit(cache=True, inline="always")
def _store_row(RO, outU, outV, r):
    """Row r of the outputs from the row buffer RO: the arithmetic loop writes into RO (in cache)
    and this loop streams it out. Stores that miss in cache, issued inside a long arithmetic loop,
    held its loads up (burgers' fused tangent step: 18.8 -> 13.2 ns a point with the buffer)."""
    for i in range(outU.shape[1]):
        outU[r, i] = RO[0, i]
        outV[r, i] = RO[1, i]


# -- the point arithmetic: the stage map, its tangent, its transpose ---------------------------
@njit(cache=True, inline="always")
def _constants(beta, nu, dt, ih):
    """(c0, lx, ly, cx, cy) of the stage map S (module docstring)."""
    ihy2, ihx2, ihy, ihx = ih
    bdt = beta * dt
    lx = (bdt * nu) * ihx2
    ly = (bdt * nu) * ihy2
    cx = -(bdt * (0.5 * ihx))
    cy = -(bdt * (0.5 * ihy))
    return beta - 2.0 * (lx + ly), lx, ly, cx, cy


@njit(cache=True, inline="always")
def _dnu_terms(beta, dt, dnu, ih):
    """``m`` of :func:`_tp` for stage weight beta."""
    ihy2, ihx2, _, _ = ih
    mx_ = (beta * dt * dnu) * ihx2
    my_ = (beta * dt * dnu) * ihy2
    return -2.0 * (mx_ + my_), mx_, my_


@njit(cache=True, inline="always")
def _backward_terms(beta, nu, dt, ih):
    """(beta, kn, cx, cy, ihy2, ihx2, m4) of :func:`_ap` for stage weight beta."""
    ihy2, ihx2, ihy, ihx = ih
    bdt = beta * dt
    return beta, bdt * nu, -(bdt * (0.5 * ihx)), -(bdt * (0.5 * ihy)), ihy2, ihx2, -2.0 * (ihx2 + ihy2)


@njit(cache=True, inline="always")
def _sp(u, ue, uw, un, us, v, ve, vw, vn, vs, k):
    """S(x) at a point from its star values (module docstring)."""
    c0, lx, ly, cx, cy = k
    a = u + ue
    b = u + uw
    c = v + vn
    d = v + vs
    xu = fma(ue, a, -(uw * b))
    yu = fma(un, c, -(us * d))
    xv = fma(ve, a, -(vw * b))
    yv = fma(vn, c, -(vs * d))
    su = fma(cy, yu, fma(cx, xu, fma(ly, un + us, fma(lx, ue + uw, c0 * u))))
    sv = fma(cy, yv, fma(cx, xv, fma(ly, vn + vs, fma(lx, ve + vw, c0 * v))))
    return su, sv


@njit(cache=True, inline="always")
def _tp(u, ue, uw, un, us, v, ve, vw, vn, vs, du, due, duw, dun, dus, dv, dve, dvw, dvn, dvs, k, m, dp):
    """S'(x) d [+ dnu dS/dnu] at a point from the star values of x and d. With A, B, C, D as for S
    and dA = d_u + d_u,e etc., the bracket of u is d_u,e A + u_e dA - (d_u,w B + u_w dB);
    dS/dnu = beta dt lap x (``m`` = (-2 (mx + my), mx, my), mx = beta dt dnu / hx^2)."""
    c0, lx, ly, cx, cy = k
    m0, mx_, my_ = m
    a = u + ue
    b = u + uw
    c = v + vn
    d = v + vs
    da = du + due
    db = du + duw
    dc = dv + dvn
    dd = dv + dvs
    xu = fma(due, a, fma(ue, da, -fma(duw, b, uw * db)))
    yu = fma(dun, c, fma(un, dc, -fma(dus, d, us * dd)))
    xv = fma(dve, a, fma(ve, da, -fma(dvw, b, vw * db)))
    yv = fma(dvn, c, fma(vn, dc, -fma(dvs, d, vs * dd)))
    tu = fma(cy, yu, fma(cx, xu, fma(ly, dun + dus, fma(lx, due + duw, c0 * du))))
    tv = fma(cy, yv, fma(cx, xv, fma(ly, dvn + dvs, fma(lx, dve + dvw, c0 * dv))))
    if dp:
        tu = fma(my_, un + us, fma(mx_, ue + uw, fma(m0, u, tu)))
        tv = fma(my_, vn + vs, fma(mx_, ve + vw, fma(m0, v, tv)))
    return tu, tv


@njit(cache=True, inline="always")
def _ap(u, ue, uw, un, us, v, ve, vw, vn, vs, mu, mue, muw, mun, mus, mv, mve, mvw, mvn, mvs, beta, kn, cx, cy,
        ihy2, ihx2, m4):
    """S'(w)^T mu at a point from the star values of w and mu, and the point's w . lap mu (dJ/dnu's
    term).

    Transposing S' (module docstring) gives, for component u,

        beta mu_u + beta dt nu lap mu_u + cx [mu_u,w (B + u) - mu_u,e (A + u) + mu_u (u_e - u_w)
        + mu_v (v_e - v_w) - v (mu_v,e - mu_v,w)] + cy [mu_u,s D - mu_u,n C]

    and for v the same with x and y (and u and v) swapped. dJ/dnu's term is w . lap mu, not
    lap w . mu: the periodic Laplacian is symmetric, so their sums over the grid agree, and lap mu
    is made for the nu term anyway."""
    a = u + ue
    b = u + uw
    c = v + vn
    d = v + vs
    lu = fma(ihx2, mue + muw, fma(ihy2, mun + mus, m4 * mu))
    lv = fma(ihx2, mve + mvw, fma(ihy2, mvn + mvs, m4 * mv))
    xu = fma(muw, b + u, fma(-mue, a + u, fma(mu, ue - uw, fma(mv, ve - vw, -(v * (mve - mvw))))))
    yu = fma(mus, d, -(mun * c))
    xv = fma(mvw, b, -(mve * a))
    yv = fma(mvs, d + v, fma(-mvn, c + v, fma(mv, vn - vs, fma(mu, un - us, -(u * (mun - mus))))))
    su = fma(cx, xu, fma(cy, yu, fma(kn, lu, beta * mu)))
    sv = fma(cx, xv, fma(cy, yv, fma(kn, lv, beta * mv)))
    return su, sv, fma(u, lu, v * lv)


# -- the forward stage (the step: three passes) ------------------------------------------------
@njit(cache=True, inline="always")
def _s(R, bs, cs, un, vn, i, k):
    """S(x) at point i of row j: x's rows j - 1 (slot ``bs``) and j (``cs``) in a ring, its row
    j + 1 values ``un``, ``vn`` given."""
    return _sp(R[cs, i + 1], R[cs, i + 2], R[cs, i], un, R[bs, i + 1],
               R[cs + 1, i + 1], R[cs + 1, i + 2], R[cs + 1, i], vn, R[bs + 1, i + 1], k)


@njit(cache=True, inline="always")
def _stage_row(R, bs, cs, NU, NV, jn, W0U, W0V, j, alpha, first, k, outU, outV):
    """Row j of a forward stage; x's row j + 1 is row ``jn`` of NU, NV (the block, or its y face)."""
    mx = outU.shape[1]
    if first:
        for i in range(mx):
            su, sv = _s(R, bs, cs, NU[jn, i], NV[jn, i], i, k)
            outU[j, i] = su
            outV[j, i] = sv
    else:
        for i in range(mx):
            su, sv = _s(R, bs, cs, NU[jn, i], NV[jn, i], i, k)
            outU[j, i] = fma(alpha, W0U[j, i], su)
            outV[j, i] = fma(alpha, W0V[j, i], sv)


@njit(cache=True, error_model="numpy")
def stage(XU, XV, FU, FV, W0U, W0V, alpha, beta, first, nu, dt, ih, outU, outV):
    """out = S(x) (``first``: alpha = 0, beta = 1) or alpha w0 + S(x), S(x) = beta (x + dt N(x)).

    ``FU``, ``FV`` are the one-point halo faces (ylo, yhi, xlo, xhi) of x's two fields. Rows j - 1
    and j of x sit in a ring of two padded rows per field (the x halo at both ends); row j + 1 is
    read where it lies, inside the arithmetic loop, so its memory traffic overlaps the arithmetic,
    and is copied into the ring afterwards, over row j - 1."""
    k = _constants(beta, nu, dt, ih)
    my, mx = XU.shape
    R = _rows(4, mx + 2)
    _ring_face(R, 0, FU[0])
    _ring_face(R, 1, FV[0])
    if my > 0:
        _ring_row(R, 2, XU, FU[2], FU[3], 0)
        _ring_row(R, 3, XV, FV[2], FV[3], 0)
    topU, topV = FU[1].reshape((1, mx)), FV[1].reshape((1, mx))
    for j in range(my):
        bs, cs = 2 * (j % 2), 2 * ((j + 1) % 2)
        if j + 1 < my:
            _stage_row(R, bs, cs, XU, XV, j + 1, W0U, W0V, j, alpha, first, k, outU, outV)
            _ring_row(R, bs, XU, FU[2], FU[3], j + 1)
            _ring_row(R, bs + 1, XV, FV[2], FV[3], j + 1)
        else:
            _stage_row(R, bs, cs, topU, topV, 0, W0U, W0V, j, alpha, first, k, outU, outV)


# -- the tangent step in one pass --------------------------------------------------------------
TANGENT_DEPTH = 3  # the halo depth tangent_step reads: three stages of a one-point stencil


@njit(cache=True, inline="always")
def _s3(R, bs, cs, ns, i, k):
    """S(x) at ring index i + 1 of row slot ``cs`` (rows below / above in ``bs`` / ``ns``)."""
    return _sp(R[cs, i + 1], R[cs, i + 2], R[cs, i], R[ns, i + 1], R[bs, i + 1],
               R[cs + 1, i + 1], R[cs + 1, i + 2], R[cs + 1, i], R[ns + 1, i + 1], R[bs + 1, i + 1], k)


@njit(cache=True, inline="always")
def _t3(R, bs, cs, ns, i, k, m, dp):
    """:func:`_tp` at ring index i + 1 of row slot ``cs`` (x in fields +0, +1, d in +2, +3)."""
    return _tp(R[cs, i + 1], R[cs, i + 2], R[cs, i], R[ns, i + 1], R[bs, i + 1],
               R[cs + 1, i + 1], R[cs + 1, i + 2], R[cs + 1, i], R[ns + 1, i + 1], R[bs + 1, i + 1],
               R[cs + 2, i + 1], R[cs + 2, i + 2], R[cs + 2, i], R[ns + 2, i + 1], R[bs + 2, i + 1],
               R[cs + 3, i + 1], R[cs + 3, i + 2], R[cs + 3, i], R[ns + 3, i + 1], R[bs + 3, i + 1], k, m, dp)


@njit(cache=True, error_model="numpy")
def tangent_step(WU, WV, HWU, HWV, DU, DV, HDU, HDV, nu, dnu, dt, ih, outU, outV):
    """d_{i+1} of one whole SSP-RK3 tangent step in one pass over the block (temporal blocking).

    From w = u_i and d = its tangent, each with its depth-3 halo (``H*``, :class:`DeepHalo` strips),
    the three stages run as a wavefront over the rows: at step t, row t of (w, d) enters a ring of
    four padded rows, stage 1 makes (w1, d1) of row t - 1 (columns -2 .. mx + 1) into a ring of
    three, stage 2 (w2, d2) of row t - 2 (columns -1 .. mx) into another, and stage 3 the output row
    t - 3. The stage states never leave the cache: the pass reads w and d once and writes d_{i+1}
    (48 bytes a point where three stage passes move 224), and no halo exchange falls between stages.
    The halo points each rank recomputes are made by the same arithmetic from the same values as
    their owner's, and w1, w2 are :func:`stage`'s arithmetic, so the result is bitwise that of the
    three stage-by-stage passes this replaced (w1, w2 by ``stage``, each tangent stage a pass of its
    own), on any decomposition."""
    d = TANGENT_DEPTH
    my, mx = WU.shape
    k1, k2, k3 = _constants(1.0, nu, dt, ih), _constants(0.25, nu, dt, ih), _constants(2.0 / 3.0, nu, dt, ih)
    m1, m2, m3 = _dnu_terms(1.0, dt, dnu, ih), _dnu_terms(0.25, dt, dnu, ih), _dnu_terms(2.0 / 3.0, dt, dnu, ih)
    dp = dnu != 0.0
    third = 1.0 / 3.0
    R0 = _rows(16, mx + 6)  # rows t - 3 .. t of (w, d): 4 slots x 4 fields, columns -3 .. mx + 2
    R1 = _rows(12, mx + 4)  # rows of (w1, d1): 3 slots x 4 fields, columns -2 .. mx + 1
    R2 = _rows(12, mx + 2)  # rows of (w2, d2), columns -1 .. mx
    RO = _rows(2, mx)  # the output row
    for t in range(-d, my + d):
        s0 = 4 * ((t + d) % 4)
        _deep_rows(R0, s0, WU, HWU, WV, HWV, t, d, d)
        _deep_rows(R0, s0 + 2, DU, HDU, DV, HDV, t, d, d)
        r = t - 1  # stage 1, row r, columns -2 .. mx + 1 (ring index c + 2; R0's c + 3)
        if r >= -2 and r <= my + 1:
            bs, cs, ns = 4 * ((r - 1 + d) % 4), 4 * ((r + d) % 4), s0
            q = 4 * ((r + 2) % 3)
            for i in range(mx + 4):
                su, sv = _s3(R0, bs, cs, ns, i, k1)
                R1[q, i] = su
                R1[q + 1, i] = sv
            if dp:  # one loop per case: a branch inside a loop keeps it scalar
                for i in range(mx + 4):
                    tu, tv = _t3(R0, bs, cs, ns, i, k1, m1, True)
                    R1[q + 2, i] = tu
                    R1[q + 3, i] = tv
            else:
                for i in range(mx + 4):
                    tu, tv = _t3(R0, bs, cs, ns, i, k1, m1, False)
                    R1[q + 2, i] = tu
                    R1[q + 3, i] = tv
        r = t - 2  # stage 2, row r, columns -1 .. mx (ring index c + 1; R1's c + 2, R0's c + 3)
        if r >= -1 and r <= my:
            bs, cs, ns = 4 * ((r + 1) % 3), 4 * ((r + 2) % 3), 4 * ((r + 3) % 3)
            c0 = 4 * ((r + d) % 4)
            q = 4 * ((r + 1) % 3)
            for i in range(mx + 2):
                su, sv = _s3(R1, bs, cs, ns, i, k2)
                R2[q, i] = fma(0.75, R0[c0, i + 2], su)
                R2[q + 1, i] = fma(0.75, R0[c0 + 1, i + 2], sv)
            if dp:
                for i in range(mx + 2):
                    tu, tv = _t3(R1, bs, cs, ns, i, k2, m2, True)
                    R2[q + 2, i] = fma(0.75, R0[c0 + 2, i + 2], tu)
                    R2[q + 3, i] = fma(0.75, R0[c0 + 3, i + 2], tv)
            else:
                for i in range(mx + 2):
                    tu, tv = _t3(R1, bs, cs, ns, i, k2, m2, False)
                    R2[q + 2, i] = fma(0.75, R0[c0 + 2, i + 2], tu)
                    R2[q + 3, i] = fma(0.75, R0[c0 + 3, i + 2], tv)
        r = t - 3  # stage 3, row r, columns 0 .. mx - 1 (R2's c + 1, R0's c + 3)
        if r >= 0 and r < my:
            bs, cs, ns = 4 * (r % 3), 4 * ((r + 1) % 3), 4 * ((r + 2) % 3)
            c0 = 4 * ((r + d) % 4)
            if dp:
                for i in range(mx):
                    tu, tv = _t3(R2, bs, cs, ns, i, k3, m3, True)
                    RO[0, i] = fma(third, R0[c0 + 2, i + 3], tu)
                    RO[1, i] = fma(third, R0[c0 + 3, i + 3], tv)
            else:
                for i in range(mx):
                    tu, tv = _t3(R2, bs, cs, ns, i, k3, m3, False)
                    RO[0, i] = fma(third, R0[c0 + 2, i + 3], tu)
                    RO[1, i] = fma(third, R0[c0 + 3, i + 3], tv)
            _store_row(RO, outU, outV, r)


# -- the adjoint step in one pass --------------------------------------------------------------
ADJOINT_DEPTHS = (5, 3)  # adjoint_step's halo depths: u_i (two stages forward, three back), lambda_{i+1}


@njit(cache=True, inline="always")
def _a2(RP, bp, cp, np_, ip, RM, bm, cm, nm, im, terms):
    """:func:`_ap` with w in ring RP (rows ``bp``, ``cp``, ``np_``, centre index ip + 1) and mu in
    ring RM (rows ``bm``, ``cm``, ``nm``, centre index im + 1); ``terms`` from :func:`_backward_terms`."""
    beta, kn, cx, cy, ihy2, ihx2, m4 = terms
    return _ap(RP[cp, ip + 1], RP[cp, ip + 2], RP[cp, ip], RP[np_, ip + 1], RP[bp, ip + 1],
               RP[cp + 1, ip + 1], RP[cp + 1, ip + 2], RP[cp + 1, ip], RP[np_ + 1, ip + 1], RP[bp + 1, ip + 1],
               RM[cm, im + 1], RM[cm, im + 2], RM[cm, im], RM[nm, im + 1], RM[bm, im + 1],
               RM[cm + 1, im + 1], RM[cm + 1, im + 2], RM[cm + 1, im], RM[nm + 1, im + 1], RM[bm + 1, im + 1],
               beta, kn, cx, cy, ihy2, ihx2, m4)


@njit(cache=True, inline="always")
def _backward_row(RP, bp, cp, np_, shift, RM, bm, cm, nm, n, terms, g, RQ, q, acc, owned, margin):
    """One backward stage's row of n points into ring RQ (row slot q, index i): w from ring RP at
    index shift + i + 1, mu from RM at i + 1; the terms of its owned points (ring index margin ..
    margin + mx - 1) added to acc when ``owned`` (a row of the block, not of the margin)."""
    shift = max(shift, 0)  # non-negative: the index shift + i needs no wraparound select (gathers)
    for i in range(n):
        su, sv, gi = _a2(RP, bp, cp, np_, shift + i, RM, bm, cm, nm, i, terms)
        g[i] = gi
        RQ[q, i] = su
        RQ[q + 1, i] = sv
    if owned:
        for i in range(acc.shape[0]):
            acc[i] += g[i + margin]


@njit(cache=True, error_model="numpy")
def adjoint_step(WU, WV, HWU, HWV, MU, MV, HMU, HMV, nu, dt, ih, outU, outV):
    """lambda_i of one whole SSP-RK3 adjoint step in one pass over the block (temporal blocking);
    returns the local sums of w_k . lap mu_k of backward stages 3, 2, 1 (for dJ/dnu).

    From w = u_i with its depth-5 halo and mu = lambda_{i+1} with its depth-3 halo (``H*``,
    :class:`DeepHalo` strips), a wavefront over the rows: at step t, row t of w enters a ring; the
    forward stages make w1 of row t - 1 and w2 of row t - 2; backward stage 3 makes b = S3'(w2)^T mu of
    row t - 3 (mu's row t - 2 enters its ring), stage 2 c = S2'(w1)^T b of row t - 4, and stage 1 the
    output row t - 5: lambda_i = (mu/3 + 3/4 b) + S1'(w)^T c. Each stage runs on the columns and rows
    the next one reads (w1 on a 4-point margin, ..., c on 1). The stage states and the backward
    vectors never leave the cache (the pass reads w and mu once and writes lambda_i: 48 bytes a
    point where five stage passes move 256), and no halo exchange falls between stages. Every point
    is :func:`stage`'s and the stage-wise backward arithmetic on the same values, whoever computes
    it, so lambda_i is bitwise the same on any decomposition; each backward stage's sum adds its
    owned points' terms per column, rows in order, then the columns in order."""
    dw, dm = ADJOINT_DEPTHS
    my, mx = WU.shape
    k1, k2 = _constants(1.0, nu, dt, ih), _constants(0.25, nu, dt, ih)
    a3, a2, a1 = _backward_terms(2.0 / 3.0, nu, dt, ih), _backward_terms(0.25, nu, dt, ih), \
        _backward_terms(1.0, nu, dt, ih)
    third = 1.0 / 3.0
    RW = _rows(14, mx + 10)  # w rows t - 6 .. t (7 slots x 2 fields), columns -5 .. mx + 4
    R1 = _rows(10, mx + 8)  # w1 rows t - 5 .. t - 1, columns -4 .. mx + 3
    R2 = _rows(6, mx + 6)  # w2 rows t - 4 .. t - 2, columns -3 .. mx + 2
    RM = _rows(8, mx + 6)  # mu rows t - 5 .. t - 2, columns -3 .. mx + 2
    RB = _rows(6, mx + 4)  # b rows t - 5 .. t - 3, columns -2 .. mx + 1
    RC = _rows(6, mx + 2)  # c rows t - 6 .. t - 4, columns -1 .. mx
    RO = _rows(2, mx)  # the output row
    g = np.empty(mx + 4)
    acc3, acc2, acc1 = np.zeros(mx), np.zeros(mx), np.zeros(mx)
    for t in range(-dw, my + dw):
        _deep_rows(RW, 2 * ((t + 7) % 7), WU, HWU, WV, HWV, t, dw, dw)
        r = t - 2
        if r >= -dm and r < my + dm:
            _deep_rows(RM, 2 * ((r + 4) % 4), MU, HMU, MV, HMV, r, dm, dm)
        r = t - 1  # w1 = S1(w), row r, columns -4 .. mx + 3 (RW's c + 5, R1's c + 4)
        if r >= -4 and r <= my + 3:
            bs, cs, ns = 2 * ((r + 6) % 7), 2 * ((r + 7) % 7), 2 * ((r + 8) % 7)
            q = 2 * ((r + 5) % 5)
            for i in range(mx + 8):
                su, sv = _s3(RW, bs, cs, ns, i, k1)
                R1[q, i] = su
                R1[q + 1, i] = sv
        r = t - 2  # w2 = 3/4 w + S2(w1), row r, columns -3 .. mx + 2 (R1's c + 4, R2's c + 3)
        if r >= -3 and r <= my + 2:
            bs, cs, ns = 2 * ((r + 4) % 5), 2 * ((r + 5) % 5), 2 * ((r + 6) % 5)
            w0 = 2 * ((r + 7) % 7)
            q = 2 * ((r + 3) % 3)
            for i in range(mx + 6):
                su, sv = _s3(R1, bs, cs, ns, i, k2)
                R2[q, i] = fma(0.75, RW[w0, i + 2], su)
                R2[q + 1, i] = fma(0.75, RW[w0 + 1, i + 2], sv)
        r = t - 3  # b = S3'(w2)^T mu, row r, columns -2 .. mx + 1 (R2's and RM's c + 3, RB's c + 2)
        if r >= -2 and r <= my + 1:
            bp, cp, np_ = 2 * ((r + 2) % 3), 2 * ((r + 3) % 3), 2 * ((r + 4) % 3)
            bm, cm, nm = 2 * ((r + 3) % 4), 2 * ((r + 4) % 4), 2 * ((r + 5) % 4)
            _backward_row(R2, bp, cp, np_, 0, RM, bm, cm, nm, mx + 4, a3, g, RB, 2 * ((r + 3) % 3), acc3,
                          r >= 0 and r < my, 2)
        r = t - 4  # c = S2'(w1)^T b, row r, columns -1 .. mx (R1's c + 4, RB's c + 2, RC's c + 1)
        if r >= -1 and r <= my:
            bp, cp, np_ = 2 * ((r + 4) % 5), 2 * ((r + 5) % 5), 2 * ((r + 6) % 5)
            bm, cm, nm = 2 * ((r + 2) % 3), 2 * ((r + 3) % 3), 2 * ((r + 4) % 3)
            _backward_row(R1, bp, cp, np_, 2, RB, bm, cm, nm, mx + 2, a2, g, RC, 2 * ((r + 3) % 3), acc2,
                          r >= 0 and r < my, 1)
        r = t - 5  # lambda_i = (mu/3 + 3/4 b) + S1'(w)^T c, row r (RW's c + 5, RC's c + 1, RB's c + 2, RM's c + 3)
        if r >= 0 and r < my:
            bp, cp, np_ = 2 * ((r + 6) % 7), 2 * ((r + 7) % 7), 2 * ((r + 8) % 7)
            bm, cm, nm = 2 * ((r + 2) % 3), 2 * ((r + 3) % 3), 2 * ((r + 4) % 3)
            b0, m0 = 2 * ((r + 3) % 3), 2 * ((r + 4) % 4)
            for i in range(mx):
                su, sv, gi = _a2(RW, bp, cp, np_, i + 4, RC, bm, cm, nm, i, a1)
                acc1[i] += gi
                RO[0, i] = fma(0.75, RB[b0, i + 2], RM[m0, i + 3] * third) + su
                RO[1, i] = fma(0.75, RB[b0 + 1, i + 2], RM[m0 + 1, i + 3] * third) + sv
            _store_row(RO, outU, outV, r)
    g3 = g2 = g1 = 0.0
    for i in range(mx):
        g3 += acc3[i]
    for i in range(mx):
        g2 += acc2[i]
    for i in range(mx):
        g1 += acc1[i]
    return g3, g2, g1
