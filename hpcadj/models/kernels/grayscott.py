"""Compiled loops of the grayscott model: the Newton residual and the Jacobian's changing values.

Blocks are 2-D in natural order (ny, nx, 2), components (u, v) last; ``faces`` are the halo faces
(ylo, yhi, xlo, xhi) of :class:`hpcadj.models.kernels.Halo`. No fastmath: each point's arithmetic is
written out once and depends on its neighbours' values only, so it is the same on any decomposition.
"""

from __future__ import annotations

from numba import njit


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
                ym = W[j - 1, i, c] if j > 0 else ylo[i, c]
                yp = W[j + 1, i, c] if j < my - 1 else yhi[i, c]
                xm = W[j, i - 1, c] if i > 0 else xlo[j, c]
                xp = W[j, i + 1, c] if i < mx - 1 else xhi[j, c]
                lap = (ym - w) * ihy2
                lap += (yp - w) * ihy2
                lap += (xm - w) * ihx2
                lap += (xp - w) * ihx2
                if c == 0:
                    react = -uvv + feed * (1.0 - u)
                else:
                    react = uvv - (feed + kill) * v
                out[j, i, c] = (w - base[j, i, c]) - dt * (diff[c] * lap + react)


@njit(cache=True)
def jacobian_values(W, dt, diag_lap, feed, kill, diag_pos, cross_pos, values):
    """The point-diagonal 2x2 block of J = I - dt (D lap + K(w)) written into the CSR ``values``.

    Row (p, c) has its diagonal at values[diag_pos[p, c]] and its (p, c)-(p, 1-c) coupling at
    values[cross_pos[p, c]]; ``diag_lap[c]`` = dt D_c (2/hx^2 + 2/hy^2). K = [[-v^2 - F, -2uv],
    [v^2, 2uv - (F + k)]].
    """
    my, mx = W.shape[0], W.shape[1]
    for j in range(my):
        for i in range(mx):
            p = j * mx + i
            u = W[j, i, 0]
            v = W[j, i, 1]
            uv2 = 2.0 * (u * v)
            vv = v * v
            values[diag_pos[p, 0]] = (1.0 + diag_lap[0]) - dt * (-vv - feed)
            values[cross_pos[p, 0]] = -dt * (-uv2)
            values[diag_pos[p, 1]] = (1.0 + diag_lap[1]) - dt * (uv2 - (feed + kill))
            values[cross_pos[p, 1]] = -dt * vv
