"""Compiled loop of the heat model: its operator A = I - theta dt L(kappa) applied matrix-free.

The arrays are flat: ``x`` and ``kappa`` the DMDA's ghosted local blocks, ``out`` the owned block.
A row's entries are computed exactly as the assembled AIJ matrix held them (face diffusivity
(kappa_p + kappa_q) / 2 / h^2, or kappa_p / h^2 at a Dirichlet face; off-diagonals theta-weighted
faces; diagonal 1 + weight * (0 - face - face ...), faces in natural axis order, lower then upper)
and summed in the order PETSc's AIJ MatMult sums them: the on-rank columns by increasing index,
then the off-rank (ghost) columns by increasing index. So y = A x is bitwise what the assembled
matrix gave, on any rank count. No fastmath: IEEE arithmetic in the written order.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def apply(x, kappa, shape, gstride, goff, lo_wall, hi_wall, first, h2, weight, out, diagonal):
    """out = A x on the owned block (or A's diagonal when ``diagonal``).

    ``shape`` the owned block's (3-D) shape, ``gstride``/``goff`` the ghosted block's strides and
    the owned block's offset in it; ``lo_wall[a]``/``hi_wall[a]`` whether the block's lower/upper
    end on axis a is the domain's boundary; axes before ``first`` do not exist (2-D grids).
    """
    m0, m1, m2 = shape[0], shape[1], shape[2]
    face = np.zeros(6)
    kind = np.zeros(6, dtype=np.int64)  # 0: no column (Dirichlet face), 1: on-rank, 2: ghost
    nbr = np.zeros(6, dtype=np.int64)
    pos = np.zeros(3, dtype=np.int64)
    p = 0
    for i0 in range(m0):
        for i1 in range(m1):
            for i2 in range(m2):
                pos[0], pos[1], pos[2] = i0, i1, i2
                g = (i0 + goff[0]) * gstride[0] + (i1 + goff[1]) * gstride[1] + (i2 + goff[2]) * gstride[2]
                kp = kappa[g]
                diag = 0.0
                for a in range(first, 3):
                    for side in range(2):
                        f = 2 * a + side
                        end = pos[a] == 0 if side == 0 else pos[a] == shape[a] - 1
                        wall = end and (lo_wall[a] if side == 0 else hi_wall[a])
                        if wall:
                            face[f] = kp / h2[a]
                            kind[f] = 0
                        else:
                            q = g - gstride[a] if side == 0 else g + gstride[a]
                            face[f] = (0.5 * (kp + kappa[q])) / h2[a]
                            kind[f] = 2 if end else 1
                            nbr[f] = q
                        diag -= face[f]
                centre = 1.0 + weight * diag
                if diagonal:
                    out[p] = centre
                    p += 1
                    continue
                s = 0.0
                for a in range(first, 3):
                    if kind[2 * a] == 1:
                        s += (weight * face[2 * a]) * x[nbr[2 * a]]
                s += centre * x[g]
                for a in range(2, first - 1, -1):
                    if kind[2 * a + 1] == 1:
                        s += (weight * face[2 * a + 1]) * x[nbr[2 * a + 1]]
                for a in range(first, 3):
                    if kind[2 * a] == 2:
                        s += (weight * face[2 * a]) * x[nbr[2 * a]]
                for a in range(2, first - 1, -1):
                    if kind[2 * a + 1] == 2:
                        s += (weight * face[2 * a + 1]) * x[nbr[2 * a + 1]]
                out[p] = s
                p += 1


@njit(cache=True)
def kappa_gradient(w, mu, wf, mf, lo_wall, hi_wall, first, h2, dt, grad):
    """grad += dt d(mu^T L(kappa) w)/d kappa, per owned point: half of each interior face's
    (w_q - w_p) (mu_p - mu_q) / h^2, all of a boundary face's (w = mu = 0 beyond it).

    ``w``, ``mu`` and ``grad`` are owned blocks (3-D shape), ``wf``/``mf`` the six halo faces of w
    and mu (lo then hi per axis, each shaped like the block without that axis; zeros outside the
    domain). The arithmetic and its order are those of the numpy slabs this loop replaced.
    """
    m = w.shape
    pos = np.zeros(3, dtype=np.int64)
    for i0 in range(m[0]):
        for i1 in range(m[1]):
            for i2 in range(m[2]):
                pos[0], pos[1], pos[2] = i0, i1, i2
                wp = w[i0, i1, i2]
                mp = mu[i0, i1, i2]
                acc = 0.0
                for a in range(first, 3):
                    for side in range(2):
                        step = -1 if side == 0 else 1
                        end = pos[a] == 0 if side == 0 else pos[a] == m[a] - 1
                        if end:
                            f = 2 * a + side
                            if a == 0:
                                wq, mq = wf[f][i1, i2], mf[f][i1, i2]
                            elif a == 1:
                                wq, mq = wf[f][i0, i2], mf[f][i0, i2]
                            else:
                                wq, mq = wf[f][i0, i1], mf[f][i0, i1]
                            inside = not (lo_wall[a] if side == 0 else hi_wall[a])
                        else:
                            j0 = i0 + step if a == 0 else i0
                            j1 = i1 + step if a == 1 else i1
                            j2 = i2 + step if a == 2 else i2
                            wq, mq = w[j0, j1, j2], mu[j0, j1, j2]
                            inside = True
                        share = (0.5 if inside else 1.0) / h2[a]
                        acc += ((wq - wp) * share) * (mp - mq)
                grad[i0, i1, i2] += dt * acc
