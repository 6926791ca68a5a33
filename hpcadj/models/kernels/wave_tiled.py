"""Time-tiled (wavefront) advance of the wave model: t leapfrog steps in one pass over a rank's block.

The block is seen in *tile coordinates* (A, B, X): (z, y, x) in 3-D and (y, 1, x) in 2-D, A the axis
the wavefront runs along. Level L is the state after L steps (level -1 is u^{i-1}, level 0 is u^i).
At sweep iteration kk, level L computes its plane p = kk - L from level L-1's planes p-1, p, p+1 and
level L-2's plane p, so a plane is loaded from memory once and stepped t times while it sits in
cache: each level keeps a ring of three halo-padded planes. The B axis is cut into slabs (a 2-D
wavefront): slab k computes level L on rows [k W - L, (k + 1) W - L) (shifted and clipped), so a
row's inputs lie in its own slab or an earlier one; each level's last two rows of a slab, kept per
plane, are put back into the ring when the next slab reaches that level and plane. Then a level's
ring holds W + 2 rows, not the whole plane, whatever the grid.

On several ranks the block is extended by a halo of depth T (the tile depth; less where the domain
ends) on every side with a neighbour, gathered once per tile; level s is computed on the extended
box shrunk by t - s on each such side (the dependency cone of the owned points), redundantly in the
overlap. Where a rank's only halo lies along A on one side, A is swept away from it (downwards when
it lies below), so the sweep iterations over owned planes run while the halo is still exchanged. Every point's arithmetic is :func:`hpcadj.models.kernels.wave.step`'s, term for term in the
same order (the source added at its node, inside the tile, wherever it lies; the sponge and
per-step r, dt2 and dt/2; where sigma is 0 the single step's a = 1 and b = r exactly, so a shorter
formula there gives the same doubles), so the states are bitwise those of t single steps on any
rank count.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...imports import petsc
from .wave import _lap, zero_runs


@njit(cache=True, inline="always")
def _lap_t(u, am, ap, bm, bp, xm, xp, iha2, ihb2, ihx2, has_b):
    """The single step's Laplacian (:func:`wave._lap`, the same order: axis A, which is z or y in
    2-D, then B, y in 3-D, then x) in tile coordinates."""
    if has_b:
        return _lap(u, am, ap, bm, bp, xm, xp, iha2, ihb2, ihx2, True)
    return _lap(u, 0.0, 0.0, am, ap, xm, xp, 0.0, iha2, ihx2, False)


@njit(cache=True, inline="always")
def _fill(plane, F, Hf, rowoff, q, lo, m, E, j0, j1):
    """Rows [j0, j1) of plane q of an input field on the extended block: owned rows from F, the rest
    from the halo buffer Hf (rows in C order; an owned row keeps only its x halo there, lo part then
    hi part). Flat views and unsigned offsets, so the copies are unit-stride vector loops."""
    own_a = lo[0] <= q < lo[0] + m[0]
    dst = plane.reshape(-1)
    src = F[q - lo[0]].reshape(-1) if own_a else F[0].reshape(-1)
    lx, mx = np.uint64(lo[2]), np.uint64(m[2])
    hx = np.uint64(E[2] - lo[2] - m[2])
    ex = np.uint64(E[2])
    w2 = ex + np.uint64(2)
    for j in range(j0, j1):
        off = np.uint64(rowoff[q, j])
        d = np.uint64(j + 1) * w2 + np.uint64(1)  # plane[j + 1, 1]
        if own_a and lo[1] <= j < lo[1] + m[1]:
            for i in range(lx):
                dst[d + i] = Hf[off + i]
            d += lx
            s0 = np.uint64(j - lo[1]) * mx
            for i in range(mx):
                dst[d + i] = src[s0 + i]
            d += mx
            off += lx
            for i in range(hx):
                dst[d + i] = Hf[off + i]
        else:
            for i in range(ex):
                dst[d + i] = Hf[off + i]


@njit(cache=True, inline="always")
def _bound(k, s, nt, width, t, rng):
    """Row where slab k begins at level s: the slabs are ``width`` rows wide at level t and skewed
    one row per level (a row's inputs lie in its own slab or earlier ones), clipped to level s's rows."""
    lo_s, hi_s = rng[s, 1, 0], rng[s, 1, 1]
    if k <= 0:
        return lo_s
    if k >= nt:
        return hi_s
    return min(max(rng[t, 1, 0] + k * width + (t - s), lo_s), hi_s)


@njit(cache=True, error_model="numpy")
def advance(P, C, H, rowoff, lo, m, E, rng, sigma, c, ih2, has_b, hdts, rs, dt2s, fvals, src,
            recrow, rec_start, rec_x, rec_col, traces, ring, zero, afield, inner, edge, width, out_p, out_c,
            down, first, stop):
    """(out_p, out_c) = (u^{i+t-1}, u^{i+t}) from (P, C) = (u^{i-1}, u^i), t = len(hdts).

    P, C, out_*: owned blocks (tile coordinates); H (2, nh): the halo of P and C (depth T);
    rowoff (EA, EB): each extended row's offset in H; lo, m, E: halo depth below, owned size and
    extended size per axis; rng[s, axis] = [first, end) of level s's points (extended indices);
    sigma, c: the coefficients on the extended block; per step s: hdts (dt/2), rs (r), dt2s, fvals
    (the source's value, at extended node src). Receivers: recrow[a, b] indexes rec_start for a
    row holding receivers (else -1); traces[s - 1, rec_col] gets level s there. ring
    (t + 1, 3, EB + 2, EX + 2) and zero (EB + 2, EX + 2) are scratch with zero pads.
    afield: a = 1/(1 + dt/2 sigma) on the extended block where every step of the tile has that dt/2
    (the same double each level would make), else empty; inner[a, b] = [first, end) of the x points of
    row (a, b) where sigma is 0 (a shorter formula there, the same doubles). The B axis is cut into slabs ``width``
    rows wide, taken in turn, each swept along A; edge (>= t, EA, 2, EX + 2) keeps each level's
    last two rows of a slab for the next.
    ``down``: sweep A from its last plane to its first (rng's A axis then given in sweep order,
    plane q swept p-th, q = EA - 1 - p), so a rank whose halo lies below starts on owned planes.
    Only sweep iterations n in [first, stop) are taken (n = k * (sweep length) + kk - rng[0, 0, 0]),
    so the iterations reading no halo can run while it is still on its way (:class:`Tiler`).
    """
    iha2, ihb2, ihx2 = ih2
    t = hdts.shape[0]
    sa, sb, sx = src
    EA = E[0]
    uniform = afield.shape[0] > 0
    EX = E[2]
    W2 = EX + 2
    one = np.uint64(1)
    nt = max(1, (rng[t, 1, 1] - rng[t, 1, 0] + width - 1) // width)
    sweep = rng[0, 0, 1] + t - rng[0, 0, 0]
    last_plane = EA - 1 if down else 0  # q = last_plane +- p: the plane swept p-th
    step_a = -1 if down else 1
    for k in range(max(0, first // sweep), min(nt, (stop + sweep - 1) // sweep)):
        f0, f1 = _bound(k, 0, nt, width, t, rng), _bound(k + 1, 0, nt, width, t, rng)
        g0 = max(f0 - 2, 0)
        kk0 = rng[0, 0, 0] + max(0, first - k * sweep)
        kk1 = rng[0, 0, 0] + min(sweep, stop - k * sweep)
        for kk in range(kk0, kk1):
            if kk < rng[0, 0, 1]:
                qf = last_plane + step_a * kk
                _fill(ring[0, kk % 3], P, H[0], rowoff, qf, lo, m, E, g0, f1)
                _fill(ring[1, kk % 3], C, H[1], rowoff, qf, lo, m, E, g0, f1)
            for s in range(1, t + 1):
                p = kk - s
                if p < rng[s, 0, 0] or p >= rng[s, 0, 1]:
                    continue
                q = last_plane + step_a * p  # the plane's index along A
                j0, j1 = _bound(k, s, nt, width, t, rng), _bound(k + 1, s, nt, width, t, rng)
                last = s == t
                if k > 0 and not last:  # the previous slab's last two rows of this level and plane
                    for e in range(2):
                        jj = j0 - 2 + e
                        if jj >= 0:
                            ring[s + 1, p % 3, jj + 1, :] = edge[s - 1, p, e, :]
                # flat views of the planes, made once per level and plane; rows are indexed by unsigned
                # offsets (no negative-index wraparound, so the loops vectorise, and no view per row)
                cen = ring[s, p % 3].reshape(-1)
                am = ring[s, (p - step_a) % 3].reshape(-1) if q > 0 else zero.reshape(-1)
                ap = ring[s, (p + step_a) % 3].reshape(-1) if q + 1 < EA else zero.reshape(-1)
                prv = ring[s - 1, p % 3].reshape(-1)
                sg_p = sigma[q].reshape(-1)
                c_p = c[q].reshape(-1)
                a_p = afield[q].reshape(-1) if uniform else sg_p
                if last:
                    outf = out_c[q - lo[0]].reshape(-1)
                else:
                    outf = ring[s + 1, p % 3].reshape(-1)
                hdt = hdts[s - 1]
                r = rs[s - 1]
                dt2 = dt2s[s - 1]
                two = 1.0 + r
                i0, i1 = rng[s, 2, 0], rng[s, 2, 1]
                for j in range(j0, j1):
                    rl = np.uint64((j + 1) * W2 + i0)  # cen[j + 1, i0] (the pad-shifted left neighbour)
                    rc = rl + one
                    rr = rc + one
                    rm = np.uint64(j * W2 + i0 + 1)
                    rp = np.uint64((j + 2) * W2 + i0 + 1)
                    co = np.uint64(j * EX + i0)
                    if last:
                        oo = np.uint64((j - lo[1]) * m[2] + i0 - lo[2])
                    else:
                        oo = rc
                    # sigma is 0 on [xa, xb) of this row: there a = 1 and b = r exactly, so the single
                    # step's value is (2u - r u_prev) + dt^2 c^2 lap, the same double
                    xa = min(max(inner[q, j, 0], i0), i1)
                    xb = min(max(inner[q, j, 1], xa), i1)
                    for seg in range(3):
                        e0 = np.uint64((i0 if seg == 0 else (xa if seg == 1 else xb)) - i0)
                        e1 = np.uint64((xa if seg == 0 else (xb if seg == 1 else i1)) - i0)
                        if seg == 1:
                            for i in range(e0, e1):
                                u = cen[rc + i]
                                lap = _lap_t(u, am[rc + i], ap[rc + i], cen[rm + i], cen[rp + i], cen[rl + i],
                                             cen[rr + i], iha2, ihb2, ihx2, has_b)
                                ci = c_p[co + i]
                                outf[oo + i] = (two * u - r * prv[rc + i]) + dt2 * ((ci * ci) * lap)
                        elif uniform:
                            for i in range(e0, e1):
                                u = cen[rc + i]
                                lap = _lap_t(u, am[rc + i], ap[rc + i], cen[rm + i], cen[rp + i], cen[rl + i],
                                             cen[rr + i], iha2, ihb2, ihx2, has_b)
                                b = r - hdt * sg_p[co + i]
                                ci = c_p[co + i]
                                outf[oo + i] = a_p[co + i] * ((two * u - b * prv[rc + i]) + dt2 * ((ci * ci) * lap))
                        else:
                            for i in range(e0, e1):
                                u = cen[rc + i]
                                lap = _lap_t(u, am[rc + i], ap[rc + i], cen[rm + i], cen[rp + i], cen[rl + i],
                                             cen[rr + i], iha2, ihb2, ihx2, has_b)
                                sg = hdt * sg_p[co + i]
                                a = 1.0 / (1.0 + sg)
                                b = r - sg
                                ci = c_p[co + i]
                                outf[oo + i] = a * ((two * u - b * prv[rc + i]) + dt2 * ((ci * ci) * lap))
                    if q == sa and j == sb and i0 <= sx < i1:
                        si = np.uint64(sx - i0)
                        u = cen[rc + si]
                        lap = _lap_t(u, am[rc + si], ap[rc + si], cen[rm + si], cen[rp + si], cen[rl + si], cen[rr + si],
                                     iha2, ihb2, ihx2, has_b)
                        sg = hdt * sg_p[co + si]
                        a = 1.0 / (1.0 + sg)
                        b = r - sg
                        ci = c_p[co + si]
                        outf[oo + si] = a * ((two * u - b * prv[rc + si]) + dt2 * ((ci * ci) * lap + fvals[s - 1]))
                    rid = recrow[q, j]
                    if rid >= 0:
                        for qr in range(rec_start[rid], rec_start[rid + 1]):
                            traces[s - 1, rec_col[qr]] = outf[oo + np.uint64(rec_x[qr] - i0)]
                if k + 1 < nt and not last:  # this slab's last two rows, for the next
                    for e in range(2):
                        jj = j1 - 2 + e
                        if jj >= 0:
                            edge[s - 1, p, e, :] = ring[s + 1, p % 3, jj + 1, :]
            pp = kk - (t - 1)  # level t - 1's plane finished this iteration: the owned part is u^{i+t-1}
            qq = last_plane + step_a * pp
            if lo[0] <= qq < lo[0] + m[0]:
                plane = ring[t, pp % 3].reshape(-1)
                dst = out_p[qq - lo[0]].reshape(-1)
                j0 = max(_bound(k, t - 1, nt, width, t, rng), lo[1])
                j1 = min(_bound(k + 1, t - 1, nt, width, t, rng), lo[1] + m[1])
                mx = np.uint64(m[2])
                for j in range(j0, j1):
                    d = np.uint64(j - lo[1]) * mx
                    sr = np.uint64((j + 1) * W2 + lo[2] + 1)
                    for i in range(mx):
                        dst[d + i] = plane[sr + i]


def petsc_field_indices(grid, coords) -> np.ndarray:
    """PETSc global indices of a dof-1 Grid's points at natural coordinates ``coords`` (one integer
    array per natural axis, same shape; inside the domain): ranks numbered x fastest, each rank's
    block contiguous and x-fastest inside (as :func:`hpcadj.models.kernels.petsc_indices`, any dim)."""
    sizes = [np.asarray(r, dtype=np.int64) for r in reversed(grid.ownership_ranges)]
    starts = [np.concatenate(([0], np.cumsum(s))) for s in sizes]
    which = [np.searchsorted(st, g, side="right") - 1 for st, g in zip(starts, coords)]
    rank = np.zeros_like(which[0])
    local = np.zeros_like(which[0])
    for axis in range(len(sizes)):
        rank = rank * len(sizes[axis]) + which[axis]
        local = local * sizes[axis][which[axis]] + (coords[axis] - starts[axis][which[axis]])
    blocks = sizes[0]
    for s in sizes[1:]:
        blocks = np.multiply.outer(blocks, s)
    offset = np.concatenate(([0], np.cumsum(np.ravel(blocks))))
    return offset[rank] + local


class Extended:
    """A rank's block extended by a halo of depth ``depth`` (clipped at the domain's faces), in
    tile coordinates: the geometry the tiled kernel reads, the PETSc field indices of the halo
    points (C order over the extended block, owned points left out) and each row's offset there."""

    def __init__(self, field, depth: int):
        self.field = field
        self.depth = int(depth)
        nat_start, nat_shape, nat_global = field.start, field.shape, field.global_shape
        if field.dim == 2:  # (y, x) -> (y, 1, x): the wavefront runs along y
            start, shape, glob = ((nat_start[0], 0, nat_start[1]), (nat_shape[0], 1, nat_shape[1]),
                                  (nat_global[0], 1, nat_global[1]))
        else:
            start, shape, glob = tuple(nat_start), tuple(nat_shape), tuple(nat_global)
        d = self.depth
        lo = [min(d, s) for s in start]
        hi = [min(d, g - s - m) for s, m, g in zip(start, shape, glob)]
        self.lo = np.array(lo, dtype=np.int64)
        self.m = np.array(shape, dtype=np.int64)
        self.E = np.array([a + m + b for a, m, b in zip(lo, shape, hi)], dtype=np.int64)
        self.shape = tuple(int(e) for e in self.E)
        self.tile_start = start
        owned = np.zeros(self.shape, dtype=bool)
        owned[tuple(slice(a, a + m) for a, m in zip(lo, shape))] = True
        self.halo_mask = ~owned
        counts = self.halo_mask.sum(axis=2).ravel()
        self.rowoff = np.concatenate(([0], np.cumsum(counts)[:-1])).reshape(self.shape[:2]).astype(np.int64)
        self.size = int(counts.sum())
        ext = [np.arange(s - a, s - a + e) for s, a, e in zip(start, lo, self.shape)]
        grids = np.meshgrid(*ext, indexing="ij")
        picked = [g[self.halo_mask] for g in grids]
        nat = [picked[0], picked[2]] if field.dim == 2 else picked
        self.indices = (petsc_field_indices(field, nat) if self.size
                        else np.zeros(0, dtype=np.int64))

    def ranges(self, t: int) -> np.ndarray:
        """rng[s, axis] = [first, end) of the points level s (1..t) computes: the extended box shrunk
        by t - s on each side (the dependency cone of the owned points); levels -1 and 0 are filled."""
        rng = np.zeros((t + 1, 3, 2), dtype=np.int64)
        for s in range(t + 1):
            rng[s, :, 0] = np.maximum(0, self.lo - (t - s))
            rng[s, :, 1] = np.minimum(self.E, self.lo + self.m + (t - s))
        return rng

    def tile_index(self, natural) -> tuple[int, int, int]:
        """Extended tile-coordinate index of a global natural node, or (-1, -1, -1) outside the box."""
        node = (natural[0], 0, natural[1]) if self.field.dim == 2 else tuple(natural)
        e = tuple(int(g - s + a) for g, s, a in zip(node, self.tile_start, self.lo))
        if all(0 <= k < n for k, n in zip(e, self.shape)):
            return e
        return (-1, -1, -1)

    def scatter(self, template, index_maps):
        """A PETSc scatter from Vecs like ``template`` into a sequential Vec holding the halo points
        of each component in turn (``index_maps``: field indices -> the template's, one per component)."""
        PETSc = petsc()
        parts = [fn(self.indices) if fn is not None else self.indices for fn in index_maps]
        index = np.concatenate(parts).astype(PETSc.IntType) if parts else np.zeros(0, PETSc.IntType)
        seq = PETSc.Vec().createSeq(index.size, comm=PETSc.COMM_SELF)
        is_from = PETSc.IS().createGeneral(index, comm=PETSc.COMM_SELF)
        scatter = PETSc.Scatter().create(template, is_from, seq, None)
        is_from.destroy()
        return scatter, seq

    def extend(self, owned_block: np.ndarray, halo_values: np.ndarray) -> np.ndarray:
        """The extended block (tile coordinates) of a field: its owned block and its halo values."""
        out = np.empty(self.shape)
        out[self.halo_mask] = halo_values
        own = tuple(slice(int(a), int(a + m)) for a, m in zip(self.lo, self.m))
        out[own] = owned_block.reshape(tuple(int(v) for v in self.m))
        return out


class Tiler:
    """The wave model's tiled advance at depth T: the extended block, the halo scatter of the states
    (made on first use from a state Vec), the coefficients on the extended block, the ring planes
    and the receivers in tile coordinates. Built per T; the velocity's extension is rebuilt when
    the model's controls change."""

    def __init__(self, model, depth: int, width: int | None = None, down: bool | None = None):
        from . import readonly

        self.model = model
        self.depth = int(depth)
        ext = self.ext = Extended(model.field, depth)
        # sweep A downwards where the only halo along it lies below (None: so; tests force either)
        self.down = bool(ext.lo[0] > 0 and ext.lo[0] + ext.m[0] == ext.E[0]) if down is None else bool(down)
        EA, EB, EX = ext.shape
        self.width = int(width) if width else auto_width(model.field, depth)
        self.ring = np.zeros((self.depth + 1, 3, EB + 2, EX + 2))
        self.zero = np.zeros((EB + 2, EX + 2))
        slabs = self.width < EB
        self.edge = np.zeros((self.depth, EA, 2, EX + 2) if slabs else (1, 1, 2, EX + 2))
        self._a_of = None  # (dt/2, a = 1/(1 + dt/2 sigma) on the extended block)
        self._no_a = np.zeros((0, 0, 0))
        self._state_scatter = None
        self.sigma = readonly(self._extend_field(model._sigma))
        self.inner = zero_runs(self.sigma)
        self._c_of = None  # (the model's c array it was made from, the extended c)
        self.rng = {}
        src = model.source
        self.src = np.array(ext.tile_index(src), dtype=np.int64)
        rows, cols, xs = {}, [], []
        for k, loc in model._receivers_local:
            node = tuple(g + s for g, s in zip(loc, model.field.start))
            a, b, x = ext.tile_index(node)
            rows.setdefault((a, b), []).append((x, k))
        self.recrow = np.full(ext.shape[:2], -1, dtype=np.int64)
        starts = [0]
        for rid, ((a, b), members) in enumerate(rows.items()):
            self.recrow[a, b] = rid
            for x, k in members:
                xs.append(x)
                cols.append(k)
            starts.append(len(xs))
        self.rec_start = np.array(starts, dtype=np.int64)
        self.rec_x = np.array(xs, dtype=np.int64)
        self.rec_col = np.array(cols, dtype=np.int64)
        self.n_traces = len(model.receivers)

    def _extend_field(self, owned3) -> np.ndarray:
        """A coefficient field (the model's 3-D kernel block) on the extended block (collective)."""
        field = self.model.field
        vec = field.vec_from(owned3.reshape(field.shape))
        scatter, seq = self.ext.scatter(vec, [None])
        scatter.scatter(vec, seq, addv=petsc().InsertMode.INSERT, mode=petsc().ScatterMode.FORWARD)
        out = self.ext.extend(owned3, seq.getArray(readonly=True))
        for obj in (scatter, seq, vec):
            obj.destroy()
        return out

    def velocity(self):
        """c on the extended block for the model's current controls (collective when rebuilt)."""
        from . import readonly

        c = self.model._c
        if self._c_of is None or self._c_of[0] is not c:
            self._c_of = None
            self._c_of = (c, readonly(self._extend_field(c)))
        return self._c_of[1]

    def a_field(self, hdt: float) -> np.ndarray:
        """a = 1/(1 + hdt sigma) on the extended block, kept for the last hdt asked (each point's
        double is the one the single step makes)."""
        if self._a_of is None or self._a_of[0] != hdt:
            self._a_of = None
            self._a_of = (hdt, 1.0 / (1.0 + hdt * self.sigma))
        return self._a_of[1]

    def ranges(self, t: int) -> np.ndarray:
        if t not in self.rng:
            self.rng[t] = self.ext.ranges(t)
        return self.rng[t]

    def _halo_scatter(self, u):
        """The scatter of both fields' depth-T halo from states like ``u`` and its (2, nh) buffer."""
        if self._state_scatter is None:
            split = self.model._split_pair
            scatter, seq = self.ext.scatter(u, [split._index_map(0), split._index_map(1)])
            self._state_scatter = (scatter, seq, seq.getArray(readonly=True).reshape(2, self.ext.size))
        return self._state_scatter

    def sweep(self, t: int):
        """(rng with its A axis in sweep order, the sweep iterations that read no halo): the block is
        swept along A away from its only halo there (down when that lies below), so the owned planes
        come first and their iterations run while the halo is exchanged; 0 of them where a halo lies
        across B or X or on the side swept first (both sides on a middle rank)."""
        ext, rng = self.ext, self.ranges(t)
        hi = ext.E - ext.lo - ext.m
        if self.down:
            flat, rng = rng, rng.copy()
            rng[:, 0, 0], rng[:, 0, 1] = ext.E[0] - flat[:, 0, 1], ext.E[0] - flat[:, 0, 0]
        ahead = ext.lo[0] if not self.down else hi[0]
        across = ext.lo[1] + hi[1] + ext.lo[2] + hi[2]
        return rng, (0 if ahead or across else int(ext.m[0]))

    def run(self, u, out, params, traces):
        """One tile: ``out`` = the state t = len(params) steps after ``u``; params per step are
        (hdt, r, dt2, source value). The halo exchange is started first and waited for only when
        the sweep reaches the first iteration reading it."""
        model = self.model
        t = len(params)
        hdts, rs, dt2s, fvals = (np.array(col, dtype=np.float64) for col in zip(*params))
        PETSc = petsc()
        scatter, seq, H = self._halo_scatter(u)
        modes = (PETSc.InsertMode.INSERT, PETSc.ScatterMode.FORWARD)
        scatter.begin(u, seq, *modes)
        tile3 = tuple(int(v) for v in self.ext.m)
        P, C = (f.reshape(tile3) for f in model._block(u))
        out_p, out_c = (f.reshape(tile3) for f in model._block(out, readonly=False))
        ih2 = model._ih2 if model.dim == 3 else (model._ih2[1], 1.0, model._ih2[2])
        rng, ready = self.sweep(t)
        args = (P, C, H, self.ext.rowoff, self.ext.lo, self.ext.m, self.ext.E, rng,
                self.sigma, self.velocity(), ih2, model.dim == 3, hdts, rs, dt2s, fvals, self.src,
                self.recrow, self.rec_start, self.rec_x, self.rec_col, traces, self.ring, self.zero,
                self.a_field(hdts[0]) if np.all(hdts == hdts[0]) else self._no_a, self.inner, self.edge, self.width,
                out_p, out_c, self.down)
        if ready:
            advance(*args, 0, ready)
        scatter.end(u, seq, *modes)
        advance(*args, ready, _ALL)


_ALL = 1 << 60  # ``stop`` past every sweep iteration

#: the deepest tile offered: the ring holds T + 1 levels of three planes each
MAX_DEPTH = 64


def _split_extents(field, comm):
    """(axis name, thinnest owned extent over the ranks) of every natural axis split over ranks."""
    from ...imports import mpi

    names = ("z", "y", "x")[3 - field.dim:]
    out = []
    for axis, sizes in enumerate(reversed(field.ownership_ranges)):
        if len(sizes) > 1:
            out.append((names[axis], comm.allreduce(int(field.shape[axis]), op=mpi().MIN)))
    return out


def depth_limit(field, comm) -> int:
    """The largest tile depth a partition allows (collective): a halo of depth T must come from the
    next rank alone, so T is at most the thinnest owned extent along a split axis."""
    return min([MAX_DEPTH] + [extent for _name, extent in _split_extents(field, comm)])


def limit_reason(field, comm) -> str:
    """Why :func:`depth_limit` is what it is, in words (collective)."""
    extents = _split_extents(field, comm)
    if not extents or min(e for _n, e in extents) >= MAX_DEPTH:
        return f"at most {MAX_DEPTH} levels are kept"
    name, extent = min(extents, key=lambda item: item[1])
    return f"the thinnest rank's block is {extent} points along {name}; a halo must come from the next rank"


def _cache_bytes(level: int, default: int) -> int:
    """The size of cpu0's cache of ``level`` (per core: divided among the CPUs sharing it) from
    sysfs, ``default`` when it cannot be read."""
    import glob

    for path in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/level")):
        try:
            with open(path) as f:
                if f.read().strip() != str(level):
                    continue
            with open(path.replace("level", "size")) as f:
                text = f.read().strip().upper()
            scale = {"K": 1024, "M": 2 ** 20}.get(text[-1], 1)
            size = int(text.rstrip("KMB")) * scale
            try:
                with open(path.replace("level", "shared_cpu_list")) as f:
                    sharing = sum(int(b) - int(a) + 1 for a, b in
                                  (part.split("-") if "-" in part else (part, part)
                                   for part in f.read().strip().split(",")))
            except (OSError, ValueError):
                sharing = 1
            return size // max(1, sharing)
        except (OSError, ValueError):
            continue
    return default


def _tile_shape(field):
    """(owned shape, split flags) in tile coordinates: (z, y, x), or (y, 1, x) in 2-D."""
    shape = tuple(field.shape)
    split = [len(r) > 1 for r in reversed(field.ownership_ranges)]
    if field.dim == 2:
        return (shape[0], 1, shape[1]), (split[0], False, split[1])
    return shape, tuple(split)


def _row_bytes(field, depth: int) -> int:
    """Bytes of one halo-padded row of the extended block along x."""
    (_ma, _mb, mx), (_sa, _sb, sx) = _tile_shape(field)
    return (mx + 2 * depth * sx + 2) * 8


def _extended_rows(field, depth: int) -> int:
    """Rows along B (y in 3-D) of the extended block."""
    (_ma, mb, _mx), (_sa, sb, _sx) = _tile_shape(field)
    return mb + 2 * depth * sb


def slab_bytes(field, depth: int, width: int) -> int:
    """What a slab ``width`` rows wide keeps in cache while it is swept: three planes of each level's
    rows (the slab's, skewed, and two edge rows) and, for the t planes in flight, the rows of sigma,
    c and a they read."""
    rows = min(width + depth + 2, _extended_rows(field, depth) + 2)
    return (3 * (depth + 1) * rows + 3 * depth * rows) * _row_bytes(field, depth)


def auto_width(field, depth: int) -> int:
    """The default slab width: the whole block when its working set fits in half the L2 cache or in
    a core's share of the last-level cache (there the skew and edge rows of slabs cost more than the
    L2 saves: experiments/wavefront), else the widest slab fitting half the L2 (at least 4 rows)."""
    full = _extended_rows(field, depth)
    budget = _cache_bytes(2, 2 ** 20) // 2
    if slab_bytes(field, depth, full) <= max(budget, _cache_bytes(3, 0)):
        return full
    width = 4
    while width < full and slab_bytes(field, depth, width + 4) <= budget:
        width += 4
    return width


def auto_depth(field) -> int:
    """The default tile depth: 16 on an unsplit block, 8 on a split one, which recomputes up to T
    halo planes on each split side per tile (experiments/wavefront: 16 the best on one rank, 8 on
    two at 96^3-192^3; 2 and 4 gain little)."""
    _shape, split = _tile_shape(field)
    return 8 if any(split) else 16


def extra_states(field, depth: int, width: int | None = None) -> float:
    """What :class:`Tiler` holds, in state-equivalents (a state is two owned fields), no more than:
    sigma, c and a on the extended block, the halo buffer of both fields, the ring planes, the zero
    plane, sigma's zero runs, the receivers' row index and, when the block is swept in slabs
    ``width`` rows wide (default :func:`auto_width`), their edge rows."""
    shape, split = _tile_shape(field)
    owned = float(np.prod(shape))
    extended = float(np.prod([m + 2 * depth * s for m, s in zip(shape, split)]))
    rows = _extended_rows(field, depth) + 2
    ring = (depth + 1) * 3 * rows * _row_bytes(field, depth) / 8
    slabs = (width or auto_width(field, depth)) < _extended_rows(field, depth)
    planes = shape[0] + 2 * depth * split[0]
    edge = depth * planes * 2 * _row_bytes(field, depth) / 8 if slabs else 0.0
    zero_and_runs = rows * _row_bytes(field, depth) / 8 + 3 * planes * rows
    return (3 * extended + 2 * (extended - owned) + ring + edge + zero_and_runs) / (2 * owned)
