"""Time-tiled (wavefront) advance of the wave model: t leapfrog steps in one pass over a rank's block.

The block is seen in *tile coordinates* (A, B, X): (z, y, x) in 3-D and (y, 1, x) in 2-D, A the axis
the wavefront runs along. Level L is the state after L steps (level -1 is u^{i-1}, level 0 is u^i).
At sweep iteration kk, level L computes its plane p = kk - L from level L-1's planes p-1, p, p+1 and
level L-2's plane p, so a plane is loaded from memory once and stepped t times while it sits in
cache: each level keeps a ring of three halo-padded planes.

On several ranks the block is extended by a halo of depth T (the tile depth; less where the domain
ends) on every side with a neighbour, gathered once per tile; level s is computed on the extended
box shrunk by t - s on each such side (the dependency cone of the owned points), redundantly in the
overlap. Every point's arithmetic is :func:`hpcadj.models.kernels.wave.step`'s, term for term in the
same order (the source added at its node, inside the tile, wherever it lies; the sponge and
per-step r, dt2 and dt/2), so the states are bitwise those of t single steps on any rank count.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...imports import petsc


@njit(cache=True, inline="always")
def _lap_t(u, am, ap, bm, bp, xm, xp, iha2, ihb2, ihx2, has_b):
    """The Laplacian in the single step's order: axis A (z, or y in 2-D), then B (y in 3-D), then x."""
    lap = 0.0
    lap += (am - u) * iha2
    lap += (ap - u) * iha2
    if has_b:
        lap += (bm - u) * ihb2
        lap += (bp - u) * ihb2
    lap += (xm - u) * ihx2
    lap += (xp - u) * ihx2
    return lap


@njit(cache=True, inline="always")
def _fill(plane, F, Hf, rowoff, q, lo, m, E):
    """Plane q of an input field on the extended block: owned rows from F, the rest from the halo
    buffer Hf (rows in C order; an owned row keeps only its x halo there, lo part then hi part)."""
    own_a = lo[0] <= q < lo[0] + m[0]
    hx = E[2] - lo[2] - m[2]
    for j in range(E[1]):
        off = rowoff[q, j]
        dst = plane[j + 1]
        if own_a and lo[1] <= j < lo[1] + m[1]:
            src = F[q - lo[0], j - lo[1]]
            for i in range(lo[2]):
                dst[i + 1] = Hf[off + i]
            base = lo[2] + 1
            for i in range(m[2]):
                dst[base + i] = src[i]
            base += m[2]
            for i in range(hx):
                dst[base + i] = Hf[off + lo[2] + i]
        else:
            for i in range(E[2]):
                dst[i + 1] = Hf[off + i]


@njit(cache=True, error_model="numpy")
def advance(P, C, H, rowoff, lo, m, E, rng, sigma, c, ih2, has_b, hdts, rs, dt2s, fvals, src,
            recrow, rec_start, rec_x, rec_col, traces, ring, zero, aring, out_p, out_c):
    """(out_p, out_c) = (u^{i+t-1}, u^{i+t}) from (P, C) = (u^{i-1}, u^i), t = len(hdts).

    P, C, out_*: owned blocks (tile coordinates); H (2, nh): the halo of P and C (depth T);
    rowoff (EA, EB): each extended row's offset in H; lo, m, E: halo depth below, owned size and
    extended size per axis; rng[s, axis] = [first, end) of level s's points (extended indices);
    sigma, c: the coefficients on the extended block; per step s: hdts (dt/2), rs (r), dt2s, fvals
    (the source's value, at extended node src). Receivers: recrow[a, b] indexes rec_start for a
    row holding receivers (else -1); traces[s - 1, rec_col] gets level s there. ring
    (t + 1, 3, EB + 2, EX + 2) and zero (EB + 2, EX + 2) are scratch with zero pads; aring
    (>= t + 1, EB, EX) too: where every step of the tile has the same dt/2, a = 1/(1 + s) is made
    once per point there and read by all t levels (the same double every level would make).
    """
    iha2, ihb2, ihx2 = ih2
    t = hdts.shape[0]
    sa, sb, sx = src
    EA = E[0]
    R = aring.shape[0]
    uniform = True
    for q in range(t):
        if hdts[q] != hdts[0]:
            uniform = False
    for kk in range(EA + t):
        if kk < EA:
            _fill(ring[0, kk % 3], P, H[0], rowoff, kk, lo, m, E)
            _fill(ring[1, kk % 3], C, H[1], rowoff, kk, lo, m, E)
            if uniform:
                hdt0 = hdts[0]
                ap_ = aring[kk % R]
                sp_ = sigma[kk]
                for j in range(E[1]):
                    arow_, srow_ = ap_[j], sp_[j]
                    for i in range(E[2]):
                        arow_[i] = 1.0 / (1.0 + hdt0 * srow_[i])
        for s in range(1, t + 1):
            p = kk - s
            if p < rng[s, 0, 0] or p >= rng[s, 0, 1]:
                continue
            lev = ring[s]
            cen = lev[p % 3]
            am = lev[(p - 1) % 3] if p > 0 else zero
            ap = lev[(p + 1) % 3] if p + 1 < EA else zero
            prv = ring[s - 1, p % 3]
            hdt = hdts[s - 1]
            r = rs[s - 1]
            dt2 = dt2s[s - 1]
            two = 1.0 + r
            j0, j1 = rng[s, 1, 0], rng[s, 1, 1]
            i0, i1 = rng[s, 2, 0], rng[s, 2, 1]
            last = s == t
            n = i1 - i0
            for j in range(j0, j1):
                # row views starting at the first point computed, indexed from 0: indices LLVM can
                # prove non-negative, so the loop vectorises (a runtime start kept it scalar)
                if last:
                    orow = out_c[p - lo[0], j - lo[1], i0 - lo[2]:]
                else:
                    orow = ring[s + 1, p % 3, j + 1, i0 + 1:]
                row = cen[j + 1, i0:]
                bm = cen[j, i0 + 1:]
                bp = cen[j + 2, i0 + 1:]
                zm = am[j + 1, i0 + 1:]
                zp = ap[j + 1, i0 + 1:]
                prow = prv[j + 1, i0 + 1:]
                srow = sigma[p, j, i0:]
                crow = c[p, j, i0:]
                if uniform:
                    arow = aring[p % R, j, i0:]
                    for i in range(n):
                        u = row[i + 1]
                        lap = _lap_t(u, zm[i], zp[i], bm[i], bp[i], row[i], row[i + 2], iha2, ihb2, ihx2, has_b)
                        b = r - hdt * srow[i]
                        ci = crow[i]
                        orow[i] = arow[i] * ((two * u - b * prow[i]) + dt2 * ((ci * ci) * lap))
                else:
                    for i in range(n):
                        u = row[i + 1]
                        lap = _lap_t(u, zm[i], zp[i], bm[i], bp[i], row[i], row[i + 2], iha2, ihb2, ihx2, has_b)
                        sg = hdt * srow[i]
                        a = 1.0 / (1.0 + sg)
                        b = r - sg
                        ci = crow[i]
                        orow[i] = a * ((two * u - b * prow[i]) + dt2 * ((ci * ci) * lap))
                if p == sa and j == sb and i0 <= sx < i1:
                    i = sx - i0
                    u = row[i + 1]
                    lap = _lap_t(u, zm[i], zp[i], bm[i], bp[i], row[i], row[i + 2], iha2, ihb2, ihx2, has_b)
                    sg = hdt * srow[i]
                    a = 1.0 / (1.0 + sg)
                    b = r - sg
                    ci = crow[i]
                    orow[i] = a * ((two * u - b * prow[i]) + dt2 * ((ci * ci) * lap + fvals[s - 1]))
                rid = recrow[p, j]
                if rid >= 0:
                    for q in range(rec_start[rid], rec_start[rid + 1]):
                        traces[s - 1, rec_col[q]] = orow[rec_x[q] - i0]
        pp = kk - (t - 1)  # level t - 1's plane finished this iteration: the owned part is u^{i+t-1}
        if lo[0] <= pp < lo[0] + m[0]:
            plane = ring[t, pp % 3]
            for j in range(m[1]):
                dst = out_p[pp - lo[0], j]
                srow_ = plane[lo[1] + j + 1]
                for i in range(m[2]):
                    dst[i] = srow_[lo[2] + i + 1]


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

    def __init__(self, model, depth: int):
        from . import readonly

        self.model = model
        self.depth = int(depth)
        ext = self.ext = Extended(model.field, depth)
        EB, EX = ext.shape[1], ext.shape[2]
        self.ring = np.zeros((self.depth + 1, 3, EB + 2, EX + 2))
        self.zero = np.zeros((EB + 2, EX + 2))
        self.aring = np.zeros((self.depth + 1, EB, EX))
        self._state_scatter = None
        self.sigma = readonly(self._extend_field(model._sigma))
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

    def ranges(self, t: int) -> np.ndarray:
        if t not in self.rng:
            self.rng[t] = self.ext.ranges(t)
        return self.rng[t]

    def halo(self, u) -> np.ndarray:
        """The depth-T halo of both fields of state ``u``, as (2, nh) (collective)."""
        if self._state_scatter is None:
            split = self.model._split_pair
            self._state_scatter = self.ext.scatter(u, [split._index_map(0), split._index_map(1)])
        scatter, seq = self._state_scatter
        PETSc = petsc()
        scatter.scatter(u, seq, addv=PETSc.InsertMode.INSERT, mode=PETSc.ScatterMode.FORWARD)
        return seq.getArray(readonly=True).reshape(2, self.ext.size)

    def run(self, u, out, params, traces):
        """One tile: ``out`` = the state t = len(params) steps after ``u``; params per step are
        (hdt, r, dt2, source value)."""
        model = self.model
        t = len(params)
        hdts, rs, dt2s, fvals = (np.array(col, dtype=np.float64) for col in zip(*params))
        H = self.halo(u)
        tile3 = tuple(int(v) for v in self.ext.m)
        P, C = (f.reshape(tile3) for f in model._block(u))
        out_p, out_c = (f.reshape(tile3) for f in model._block(out, readonly=False))
        ih2 = model._ih2 if model.dim == 3 else (model._ih2[1], 1.0, model._ih2[2])
        advance(P, C, H, self.ext.rowoff, self.ext.lo, self.ext.m, self.ext.E, self.ranges(t),
                self.sigma, self.velocity(), ih2, model.dim == 3, hdts, rs, dt2s, fvals, self.src,
                self.recrow, self.rec_start, self.rec_x, self.rec_col, traces, self.ring, self.zero,
                self.aring, out_p, out_c)


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


def _l2_bytes() -> int:
    """The per-core L2 cache size from sysfs (1 MiB when it cannot be read)."""
    import glob

    for path in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/level")):
        try:
            with open(path) as f:
                if f.read().strip() != "2":
                    continue
            with open(path.replace("level", "size")) as f:
                text = f.read().strip().upper()
            scale = {"K": 1024, "M": 2 ** 20}.get(text[-1], 1)
            return int(text.rstrip("KMB")) * scale
        except (OSError, ValueError):
            continue
    return 2 ** 20


def _tile_shape(field):
    """(owned shape, split flags) in tile coordinates: (z, y, x), or (y, 1, x) in 2-D."""
    shape = tuple(field.shape)
    split = [len(r) > 1 for r in reversed(field.ownership_ranges)]
    if field.dim == 2:
        return (shape[0], 1, shape[1]), (split[0], False, split[1])
    return shape, tuple(split)


def _ring_bytes(field, depth: int) -> int:
    """Bytes of the ring planes at ``depth`` (three halo-padded planes per level, T + 1 levels)."""
    (_ma, mb, mx), (_sa, sb, sx) = _tile_shape(field)
    plane = (mb + 2 * depth * sb + 2) * (mx + 2 * depth * sx + 2) * 8
    return (depth + 1) * 4 * plane  # and the plane of a per level


def auto_depth(field) -> int:
    """The default tile depth: 16 on an unsplit block whose ring planes fit in twice the L2 cache,
    else 8 (experiments/wavefront: 8 was the best or near it at 96^3-192^3 on 1 and 2 ranks, 2 and 4
    gained little or nothing; a split block pays 2T halo planes of redundant work per tile)."""
    _shape, split = _tile_shape(field)
    if not any(split) and _ring_bytes(field, 16) <= 2 * _l2_bytes():
        return 16
    return 8


def extra_states(field, depth: int) -> float:
    """What :class:`Tiler` holds, in state-equivalents (a state is two owned fields), no more than:
    sigma and c on the extended block, the halo buffer of both fields and the ring planes."""
    shape, split = _tile_shape(field)
    owned = float(np.prod(shape))
    extended = float(np.prod([m + 2 * depth * s for m, s in zip(shape, split)]))
    return (2 * extended + 2 * (extended - owned) + _ring_bytes(field, depth) / 8) / (2 * owned)
