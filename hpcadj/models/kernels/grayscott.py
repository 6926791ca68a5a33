"""Compiled loops of the grayscott model: the Newton residual and the Jacobian's changing values.

Blocks are 2-D in natural order (ny, nx, 2), components (u, v) last; ``faces`` are the halo faces
(ylo, yhi, xlo, xhi) of :class:`hpcadj.models.kernels.Halo`. No fastmath: each point's arithmetic is
written out once and depends on its neighbours' values only, so it is the same on any decomposition.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _lap(F, j, i, c, ylo, yhi, xlo, xhi, ihy2, ihx2):
    """The 5-point Laplacian of component c of the block F at (j, i), the halo faces beyond its
    edges: one sum, in one order, for the residual and the Jacobian."""
    my, mx = F.shape[0], F.shape[1]
    f = F[j, i, c]
    ym = F[j - 1, i, c] if j > 0 else ylo[i, c]
    yp = F[j + 1, i, c] if j < my - 1 else yhi[i, c]
    xm = F[j, i - 1, c] if i > 0 else xlo[j, c]
    xp = F[j, i + 1, c] if i < mx - 1 else xhi[j, c]
    lap = (ym - f) * ihy2
    lap += (yp - f) * ihy2
    lap += (xm - f) * ihx2
    lap += (xp - f) * ihx2
    return lap


@njit(cache=True)
def residual(W, ylo, yhi, xlo, xhi, base, dt, diff, ih2, feed, kill, out):
    """out = w - w_i - dt (D lap w + R(w)), R = (-u v^2 + F (1 - u), u v^2 - (F + k) v)."""
    my, mx = W.shape[0], W.shape[1]
    ihy2, ihx2 = ih2
    for j in range(my):
        for i in range(mx):
            u = W[j, i, 0]
            v = W[j, i, 1]
            uvv = u * v * v
            for c in range(2):
                w = W[j, i, c]
                lap = _lap(W, j, i, c, ylo, yhi, xlo, xhi, ihy2, ihx2)
                if c == 0:
                    react = -uvv + feed * (1.0 - u)
                else:
                    react = uvv - (feed + kill) * v
                out[j, i, c] = (w - base[j, i, c]) - dt * (diff[c] * lap + react)


@njit(cache=True)
def _block_positions(ptr, cols, row):
    """Where row ``row`` (local, = 2 p + c) of the diagonal block holds its diagonal and its
    (p, c)-(p, 1-c) coupling: a scan of its (at most six) local columns."""
    diag = cross = -1
    for k in range(ptr[row], ptr[row + 1]):
        if cols[k] == row:
            diag = k
        elif cols[k] == row ^ 1:
            cross = k
    return diag, cross


@njit(cache=True)
def jacobian_values(W, dt, diag_lap, feed, kill, ptr, cols, values):
    """The point-diagonal 2x2 block of J = I - dt (D lap + K(w)) written into the CSR ``values``.

    ``ptr``/``cols`` are the diagonal block's CSR (local columns); the entries' positions are
    found per row (no position arrays kept). ``diag_lap[c]`` = dt D_c (2/hx^2 + 2/hy^2).
    K = [[-v^2 - F, -2uv], [v^2, 2uv - (F + k)]].
    """
    my, mx = W.shape[0], W.shape[1]
    for j in range(my):
        for i in range(mx):
            p = j * mx + i
            u = W[j, i, 0]
            v = W[j, i, 1]
            uv2 = 2.0 * (u * v)
            vv = v * v
            d0, x0 = _block_positions(ptr, cols, 2 * p)
            d1, x1 = _block_positions(ptr, cols, 2 * p + 1)
            values[d0] = (1.0 + diag_lap[0]) - dt * (-vv - feed)
            values[x0] = -dt * (-uv2)
            values[d1] = (1.0 + diag_lap[1]) - dt * (uv2 - (feed + kill))
            values[x1] = -dt * vv


@njit(cache=True)
def _row_columns(lg, j, i, c, out):
    """The six columns of Jacobian row (point (j, i), component c), by entry kind: the diagonal,
    the other component at the point, then the y-, y+, x- and x+ neighbours (padded indices)."""
    out[0] = lg[j + 1, i + 1, c]
    out[1] = lg[j + 1, i + 1, 1 - c]
    out[2] = lg[j, i + 1, c]
    out[3] = lg[j + 2, i + 1, c]
    out[4] = lg[j + 1, i, c]
    out[5] = lg[j + 1, i + 2, c]


@njit(cache=True)
def count_local(lg, rstart, rend, counts):
    """counts[row] = how many of the row's six columns lie in this rank's range [rstart, rend)."""
    my, mx = lg.shape[0] - 2, lg.shape[1] - 2
    cols = np.empty(6, dtype=np.int64)
    for j in range(my):
        for i in range(mx):
            for c in range(2):
                _row_columns(lg, j, i, c, cols)
                k = 0
                for e in range(6):
                    if rstart <= cols[e] < rend:
                        k += 1
                counts[(j * mx + i) * 2 + c] = k


@njit(cache=True)
def fill_csr(lg, rstart, rend, table, diag_ptr, diag_cols, diag_vals, off_ptr, off_cols, off_vals):
    """The Jacobian's CSR split into this rank's diagonal block (columns less ``rstart``) and the
    off-rank part (global columns): each row's entries sorted by column, then entry kind, valued
    ``table[component, kind]``. No array beyond the outputs."""
    my, mx = lg.shape[0] - 2, lg.shape[1] - 2
    cols = np.empty(6, dtype=np.int64)
    keys = np.empty(6, dtype=np.int64)
    for j in range(my):
        for i in range(mx):
            p = j * mx + i
            for c in range(2):
                row = p * 2 + c
                _row_columns(lg, j, i, c, cols)
                for part in range(2):
                    n = 0
                    for e in range(6):
                        local = rstart <= cols[e] < rend
                        if local == (part == 0):
                            keys[n] = (cols[e] - (rstart if part == 0 else 0)) * 8 + e
                            n += 1
                    for a in range(1, n):  # insertion sort of at most six keys
                        key = keys[a]
                        b = a - 1
                        while b >= 0 and keys[b] > key:
                            keys[b + 1] = keys[b]
                            b -= 1
                        keys[b + 1] = key
                    start = diag_ptr[row] if part == 0 else off_ptr[row]
                    for a in range(n):
                        e = keys[a] & 7
                        if part == 0:
                            diag_cols[start + a] = keys[a] >> 3
                            diag_vals[start + a] = table[c, e]
                        else:
                            off_cols[start + a] = keys[a] >> 3
                            off_vals[start + a] = table[c, e]


@njit(cache=True)
def jacobian_mult(X, ylo, yhi, xlo, xhi, W, dt, diff, ih2, feed, kill, transpose, out):
    """out = J(w) x, or J(w)^T x: J = I - dt (D lap + K(w)) applied point by point, no matrix.

    The Laplacian is :func:`residual`'s (symmetric on the periodic grid, so it serves J^T too) and
    K(w) the 2x2 reaction Jacobian of the point, transposed for J^T. ``X`` is x's owned block and
    ``ylo``..``xhi`` its halo faces.
    """
    my, mx = X.shape[0], X.shape[1]
    ihy2, ihx2 = ih2
    for j in range(my):
        for i in range(mx):
            u = W[j, i, 0]
            v = W[j, i, 1]
            vv = v * v
            uv2 = 2.0 * (u * v)
            k00 = -vv - feed
            k11 = uv2 - (feed + kill)
            x0 = X[j, i, 0]
            x1 = X[j, i, 1]
            if transpose:
                react0 = k00 * x0 + vv * x1
                react1 = -uv2 * x0 + k11 * x1
            else:
                react0 = k00 * x0 - uv2 * x1
                react1 = vv * x0 + k11 * x1
            for c in range(2):
                x = X[j, i, c]
                lap = _lap(X, j, i, c, ylo, yhi, xlo, xhi, ihy2, ihx2)
                react = react0 if c == 0 else react1
                out[j, i, c] = x - dt * (diff[c] * lap + react)


@njit(cache=True)
def jacobi_apply(X, W, dt, diag_lap, feed, kill, out):
    """out = x / diag J(w) point by point (J's diagonal is its transpose's: one kernel for both)."""
    my, mx = X.shape[0], X.shape[1]
    for j in range(my):
        for i in range(mx):
            u = W[j, i, 0]
            v = W[j, i, 1]
            out[j, i, 0] = X[j, i, 0] / ((1.0 + diag_lap[0]) - dt * (-(v * v) - feed))
            out[j, i, 1] = X[j, i, 1] / ((1.0 + diag_lap[1]) - dt * (2.0 * (u * v) - (feed + kill)))


@njit(cache=True)
def parameter_dots(W, M):
    """(<dR/dF, m>, <dR/dk, m>) on the owned block, dR/dF = (1 - u, -v), dR/dk = (0, -v): one pass
    in natural order, no temporaries."""
    my, mx = W.shape[0], W.shape[1]
    su = 0.0
    sv = 0.0
    for j in range(my):
        for i in range(mx):
            su += (1.0 - W[j, i, 0]) * M[j, i, 0]
            sv += W[j, i, 1] * M[j, i, 1]
    return su - sv, -sv
