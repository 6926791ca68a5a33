"""Compiled stencil kernels of the explicit models (wave, burgers) and their halo plumbing.

The kernels are numba functions (``cache=True``, no ``fastmath``: IEEE arithmetic in the written
order, no reassociation, no contraction into FMA), one fused loop over a rank's owned block per
step, adjoint step or tangent step. They read the owned block of a state straight from its PETSc
Vec and the one-point halo from six *face* arrays, which a PETSc VecScatter fills with exactly the
neighbours' face values (no ghosted copy of the whole block, as ``DMGlobalToLocal`` makes). Every
point's arithmetic depends only on its neighbours' values, never on the decomposition, so states are
bitwise the same on any rank count.

Why numba (README, "The models' kernels"): a wheel on PyPI for every CPython 3.10-3.13 with
numpy 1.22-2.x (Debian 12's 1.24 and Debian 13's 2.2 alike, so pip keeps the system numpy under the
constraints file), no compiler or Python headers at install, strict IEEE semantics by default, and
an on-disk cache so a run after the first pays tens of milliseconds, not seconds, of compilation.
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np

from ...buffers import IDLE_KEPT, register_pool, release_free_memory, trim_idle_buffers
from ...snapshot import mapped_empty
from ...imports import petsc
from ..dmda import Grid

# numba's cache goes next to the source (__pycache__) when that is writable and to the user's cache
# directory otherwise (read-only installs); NUMBA_CACHE_DIR overrides both.


def lazy(name: str):
    """The kernel module ``name`` (``"wave"``), executed at its first attribute access: numba (about
    55 MiB a process and half a second) loads when a model first runs a kernel, so importing a model,
    the command line's start-up and a TS model's run never load it."""
    fullname = f"{__name__}.{name}"
    module = sys.modules.get(fullname)
    if module is None:
        spec = importlib.util.find_spec(fullname)
        spec.loader = importlib.util.LazyLoader(spec.loader)
        module = importlib.util.module_from_spec(spec)
        sys.modules[fullname] = module
        spec.loader.exec_module(module)
        globals()[name] = module  # as an import binds a submodule on its package
    return module


class Halo:
    """The one-point star halo of a DMDA Grid's states, gathered by one VecScatter into face arrays.

    ``faces(vec)`` returns the six (three-D) or four (two-D) faces in natural axis order, lo then hi
    per axis; each face is shaped like the owned block without that axis (plus the component axis).
    A face outside a non-periodic domain is a zero array (u = 0 there). Several buffers (``slots``)
    let a step hold the halos of several fields at once; a buffer is overwritten by the next
    ``faces`` call on the same slot, so callers use one slot per live field.
    """

    def __init__(self, grid, slots: int = 1, source=None, index_map=None):
        """``source`` (a Grid, default ``grid``) gives the layout of the Vecs scattered from, and
        ``index_map`` turns ``grid``'s PETSc indices into that layout's (a field stored inside a
        larger state Vec, as wave's split pair stores its current field)."""
        PETSc = petsc()
        lg = grid.padded_indices()
        if index_map is not None:
            lg = np.where(lg < 0, lg, index_map(lg))
        dim = grid.dim
        inner = [slice(1, -1)] * dim
        self._layout = []  # per face: (offset, shape) into the buffer, or a zero array
        indices = []
        offset = 0
        for axis in range(dim):
            for end in (0, -1):
                sl = list(inner)
                sl[axis] = end
                face = lg[tuple(sl)]
                shape = face.shape
                if face.size and (face < 0).all():
                    self._layout.append(readonly(np.zeros(shape)))
                    continue
                if (face < 0).any():
                    raise AssertionError("a halo face is partly outside the domain")
                indices.append(face.ravel())
                self._layout.append((offset, shape))
                offset += face.size
        index = np.concatenate(indices).astype(PETSc.IntType) if indices else np.zeros(0, PETSc.IntType)
        self.size = offset
        self._seqs = [PETSc.Vec().createSeq(offset, comm=PETSc.COMM_SELF) for _ in range(slots)]
        src = (source or grid).create_vec()
        is_from = PETSc.IS().createGeneral(index, comm=PETSc.COMM_SELF)
        self._scatter = PETSc.Scatter().create(src, is_from, self._seqs[0], None)
        src.destroy()
        is_from.destroy()
        self._views = []
        for seq in self._seqs:
            buf = seq.getArray()
            views = []
            for entry in self._layout:
                if isinstance(entry, tuple):
                    off, shape = entry
                    views.append(readonly(buf[off:off + int(np.prod(shape))].reshape(shape)))
                else:
                    views.append(entry)
            self._views.append(tuple(views))

    def faces(self, vec, slot: int = 0):
        """Scatter ``vec``'s neighbour faces into buffer ``slot``; return its face arrays."""
        return _gather(self, vec, slot)


def petsc_indices(grid, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """PETSc global indices of the 2-D grid points (rows[k], cols[l]) (natural indices, wrapped
    periodically; -1 outside a non-periodic domain): each rank's owned block is contiguous in PETSc's
    ordering, ranks numbered x fastest, and a block is x-fastest inside."""
    ny, nx = grid.global_shape
    lx, ly = grid.ownership_ranges
    x0 = np.concatenate(([0], np.cumsum(lx)))
    y0 = np.concatenate(([0], np.cumsum(ly)))
    sizes = np.outer(ly, lx).ravel()  # rank r = iy * px + ix
    offset = np.concatenate(([0], np.cumsum(sizes)))
    gy, gx = np.meshgrid(np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64), indexing="ij")
    outside = (gy < 0) | (gy >= ny) | (gx < 0) | (gx >= nx)
    if grid.periodic:
        gy, gx = gy % ny, gx % nx
        outside[...] = False
    gy, gx = np.clip(gy, 0, ny - 1), np.clip(gx, 0, nx - 1)
    iy = np.searchsorted(y0, gy, side="right") - 1
    ix = np.searchsorted(x0, gx, side="right") - 1
    index = offset[iy * len(lx) + ix] + (gy - y0[iy]) * lx[ix] + (gx - x0[ix])
    return np.where(outside, -1, index)


class DeepHalo:
    """The depth-``d`` box halo of a 2-D Grid's states (corners included), gathered by one
    VecScatter into four strips: ``ylo``, ``yhi`` (rows -d..-1 and my..my+d-1 of the block, columns
    -d..mx+d-1) and ``xlo``, ``xhi`` (rows 0..my-1, columns -d..-1 and mx..mx+d-1). What a kernel
    needs that fuses s stencil sweeps of one point each (d = s) in one pass over the block: the
    neighbours' points it recomputes redundantly, each from the same values the owner reads, so
    bitwise the owner's. A strip may reach past the next rank (d larger than its block): the
    indices come from the grid's ownership ranges, not from the DMDA's own one-point ghosts.
    ``source`` and ``index_map`` as for :class:`Halo`. Points outside a non-periodic domain are 0.
    """

    def __init__(self, grid, depth: int, slots: int = 1, source=None, index_map=None, template=None):
        """``template``: a Vec of the source layout to build the scatter on (a model's scratch state):
        made lazily, in the middle of a sweep, the halo's own full-size Vec would add a state to the
        process's peak."""
        PETSc = petsc()
        if grid.dim != 2 or depth < 1:
            raise ValueError("DeepHalo is 2-D, depth >= 1")
        (my, mx), (ys, xs), d = grid.shape, grid.start, int(depth)
        padded_cols = np.arange(xs - d, xs + mx + d)
        parts = [petsc_indices(grid, np.arange(ys - d, ys), padded_cols),
                 petsc_indices(grid, np.arange(ys + my, ys + my + d), padded_cols),
                 petsc_indices(grid, np.arange(ys, ys + my), np.arange(xs - d, xs)),
                 petsc_indices(grid, np.arange(ys, ys + my), np.arange(xs + mx, xs + mx + d))]
        if index_map is not None:
            parts = [np.where(p < 0, p, index_map(p)) for p in parts]
        self._shapes = [p.shape for p in parts]
        flat = np.concatenate([p.ravel() for p in parts])
        inside = flat >= 0
        self._seqs = [PETSc.Vec().createSeq(flat.size, comm=PETSc.COMM_SELF) for _ in range(slots)]
        for seq in self._seqs:
            seq.set(0.0)  # points outside the domain stay 0
        src = template if template is not None else (source or grid).create_vec()
        is_from = PETSc.IS().createGeneral(flat[inside].astype(PETSc.IntType), comm=PETSc.COMM_SELF)
        is_to = PETSc.IS().createGeneral(np.flatnonzero(inside).astype(PETSc.IntType), comm=PETSc.COMM_SELF)
        self._scatter = PETSc.Scatter().create(src, is_from, self._seqs[0], is_to)
        for obj in (is_from, is_to) if template is not None else (src, is_from, is_to):
            obj.destroy()
        self._views = []
        for seq in self._seqs:
            buf, views, off = seq.getArray(), [], 0
            for shape in self._shapes:
                n = int(np.prod(shape))
                views.append(readonly(buf[off:off + n].reshape(shape)))
                off += n
            self._views.append(tuple(views))

    def strips(self, vec, slot: int = 0):
        """Scatter ``vec``'s halo into buffer ``slot``; return (ylo, yhi, xlo, xhi)."""
        return _gather(self, vec, slot)


def _gather(halo, vec, slot):
    """A halo's scatter from ``vec`` into its buffer ``slot``; that buffer's views."""
    PETSc = petsc()
    halo._scatter.scatter(vec, halo._seqs[slot], addv=PETSc.InsertMode.INSERT, mode=PETSc.ScatterMode.FORWARD)
    return halo._views[slot]


def _plain_vec(layout):
    """A zeroed global Vec of ``layout`` (its shape, dof and communicator), as a DMDA's would be."""
    n = int(np.prod(layout.shape)) * layout.dof
    N = int(np.prod(layout.global_shape)) * layout.dof
    vec = petsc().Vec().createMPI((n, N), bsize=layout.dof, comm=layout.comm)
    vec.set(0.0)
    return vec


class LeanGrid(Grid):
    """A Grid whose DMDA serves only while the model is built (its halos need the DMDA's index
    map): :meth:`release` then destroys it, and the Grid keeps its geometry, its Vecs being plain
    MPI Vecs of the same layout. A DMDA's scatter and index maps cost ~1.8 state-equivalents per
    rank (wave 128^3, 2 ranks), which dropping the last reference does not return."""

    def release(self) -> None:
        """Destroy the DMDA and its local Vec (collective: every rank, at the same point)."""
        if self.da is not None:
            self._local.destroy()
            self.da.destroy()
            self._local = self.da = None
            release_free_memory()

    def create_vec(self):
        return super().create_vec() if self.da is not None else _plain_vec(self)


class PairLayout:
    """The dof-2 layout (interleaved pairs) over a dof-1 Grid's partition, without a DMDA of its own.

    The two-field models need dof-2 Vecs for their control u0 and as the size of their states, but
    no dof-2 stencil machinery (see :class:`LeanGrid`). Grid's geometry methods serve as they are."""

    dof = 2
    components = (2,)
    layout = Grid.layout
    component_layout = Grid.component_layout
    owned = Grid.owned
    owned_view = Grid.owned_view
    vec_from = Grid.vec_from
    node_coordinates = Grid.node_coordinates
    spacing = Grid.spacing

    def __init__(self, field):
        for name in ("comm", "dim", "shape", "start", "global_shape", "sizes_xyz", "periodic"):
            setattr(self, name, getattr(field, name))

    def create_vec(self):
        """A zeroed global Vec of this layout (as ``DMCreateGlobalVector`` gives)."""
        return _plain_vec(self)


class SplitPair:
    """The *split* layout of a two-field state: a global Vec of the dof-2 ``pair`` grid's size whose
    owned part holds field 0's block, then field 1's, each contiguous in natural order (unit-stride
    rows, so the kernels vectorise), while controls keep the DMDA's interleaved layout.

    It owns the model's buffer pool and converts between the layouts at the model's edges."""

    def __init__(self, field, pair):
        self.field = field
        self.pool = VecPool(pair)
        self._pair = pair
        probe = field.create_vec()
        self._ranges = np.asarray(probe.getOwnershipRanges(), dtype=np.int64)
        probe.destroy()

    def _index_map(self, component: int):
        """Field point g's index in split states: g + the start of its owner's field range
        (component 0) or its end (component 1)."""
        ranges, shift = self._ranges, component - 1
        return lambda g: g + ranges[np.searchsorted(ranges, g, side="right") + shift]

    def halo(self, component: int, slots: int = 1) -> Halo:
        """The one-point halo of one field read straight from split states."""
        return Halo(self.field, slots=slots, source=self._pair, index_map=self._index_map(component))

    def deep_halo(self, component: int, depth: int, slots: int = 1, template=None) -> "DeepHalo":
        """The depth-``depth`` box halo of one field read straight from split states (2-D);
        ``template`` as for :class:`DeepHalo`."""
        return DeepHalo(self.field, depth, slots=slots, source=self._pair, index_map=self._index_map(component),
                        template=template)

    def fields(self, vec, readonly: bool = True) -> np.ndarray:
        """A state's two owned fields as one (2, *field shape) view."""
        return vec.getArray(readonly=readonly).reshape((2,) + self.field.shape)

    def split(self, pair_vec):
        """The state of an interleaved pair in the control layout (u0, du0), in a pooled buffer."""
        vec = self.pool.new_vec()
        fields = self.fields(vec, readonly=False)
        w = self._pair.owned_view(pair_vec)
        fields[0] = w[..., 0]
        fields[1] = w[..., 1]
        return vec

    def add_into(self, pair_vec, state) -> None:
        """pair_vec (control layout) += state, field by field (dJ/du0 += lambda_0)."""
        w = self._pair.owned(pair_vec)
        fields = self.fields(state)
        w[..., 0] += fields[0]
        w[..., 1] += fields[1]

    def share(self, state):
        """A new Vec over ``state``'s pooled buffer (a state kept by the model, handed out as u_0)."""
        return self.pool.vec_sharing([state.getArray(readonly=True)])

    def restore(self, first, second):
        """A state from two field blocks: the pooled state itself when they are its views (a RAM
        level holds donated snapshots by reference; states are never changed in place), else a
        copy in a pooled buffer."""
        shared = self.pool.vec_sharing([first, second])
        if shared is not None:
            return shared
        vec = self.pool.new_vec()
        fields = self.fields(vec, readonly=False)
        fields[0] = first
        fields[1] = second
        return vec


def kept_copy(array: np.ndarray) -> np.ndarray:
    """A read-only C-order copy of ``array`` in a mapping of its own, for model data kept for the
    run (c, the sponge): freed whole when dropped, not left as a hole in the heap."""
    out = mapped_empty(array.shape, array.dtype)
    np.copyto(out, array)
    return readonly(out)


def readonly(array: np.ndarray) -> np.ndarray:
    """``array`` marked read-only (numba types read-only and writable arrays apart; kernels take
    every input read-only, so faces, states and coefficient arrays must agree)."""
    array.flags.writeable = False
    return array


def new_vec(grid):
    """A fresh global Vec of ``grid``'s layout whose memory is an uninitialised page-aligned buffer.

    ``DMCreateGlobalVector`` callocs, i.e. writes the whole block once more before the kernel does;
    a kernel that writes every entry needs no zeros. Page-aligned like the pool's buffers
    (:func:`mapped_empty`), so a kernel's input and output rows at the same column lie at the same
    address modulo 4096: on the heap two scratch Vecs landed 16 bytes apart modulo 4096, and a stage
    reading one while writing the other stalled on every load (the CPU takes a load for dependent
    on a store whose address matches in bits 0-11): burgers' stage 2 ran 2.9 -> 6.1 ms at 1024^2.
    The Vec keeps the buffer alive (petsc4py composes it onto the PETSc object), and views of it
    keep the PETSc object alive.
    """
    return _vec_over(grid, mapped_empty((int(np.prod(grid.shape)) * grid.dof,), np.float64))


class VecPool:
    """Fresh-looking output Vecs for a model's steps, over recycled numpy buffers.

    A step must return a new state (the driver and the levels may still hold the old ones), but a
    new 8-32 MiB buffer per step costs its page faults every time: with large allocations served
    by mmap (glibc's default) that was 5x the wave step itself at 128^3 (83 ms against 11). The pool
    hands a buffer out again only when nothing but the pool refers to it (its Vec destroyed, which
    the driver's per-step ``garbage_cleanup`` does, and no view of it alive): a buffer still in use
    is never reused, so states are never changed behind anyone's back. It keeps every buffer it
    made, so it holds at most as many as were ever in use at once: the states a step works on, and
    those a RAM level holds by reference (donated snapshots). Kernels overwrite every entry, so a
    recycled buffer's old contents never show.
    """

    def __init__(self, grid):
        self.grid = grid
        self._n = int(np.prod(grid.shape)) * grid.dof
        self._buffers: list[np.ndarray] = []
        register_pool(self)

    def trim(self, keep: int = 0) -> int:
        """Drop the buffers no one but the pool refers to, all but ``keep`` of them (their mappings go
        back to the system); the number dropped. Between gradient sessions: a session's RAM slots
        stay in the pool otherwise, and the next session, measuring its baseline, counts them twice."""
        kept = []
        for buf in self._buffers:
            # references: the list, this loop variable and getrefcount's argument
            if sys.getrefcount(buf) > 3 or keep > 0:
                keep -= sys.getrefcount(buf) <= 3
                kept.append(buf)
        dropped = len(self._buffers) - len(kept)
        self._buffers = kept
        return dropped

    def new_vec(self):
        """A global Vec of the grid's layout over a buffer no one else holds (contents undefined)."""
        return _vec_over(self.grid, self.new_buffer())

    def new_buffer(self) -> np.ndarray:
        """A flat buffer of the grid's local size that no one else holds (contents undefined). The
        pool sees it in use through references to it or to a Vec over it; a numpy view of it refers
        to the memory mapping beneath (see :func:`mapped_empty`), so hold the buffer or its Vec."""
        buf = None
        for candidate in self._buffers:
            # references: the list, this loop variable and getrefcount's argument
            if sys.getrefcount(candidate) <= 3:
                buf = candidate
                break
        if buf is None:
            # growing: the buffers other pools (another layout) keep idle go first, else a run that
            # turns data slots into restart states, or back, holds both
            trim_idle_buffers(IDLE_KEPT, but=self)
            # a mapping of its own: numpy's hugepage advice on large arrays made the kernel compact
            # memory on first touch (wave 128^3 first sweep 1.5 -> 2.2 s on this VM)
            buf = mapped_empty((self._n,), np.float64)
            self._buffers.append(buf)
        return buf

    def vec_sharing(self, fields):
        """A Vec over the pooled buffer that ``fields`` (1-D views, in order) tile exactly, or None.

        A RAM level holds donated snapshots by reference, so a snapshot to restore is often a set
        of views of a state this pool made; as states are never changed in place, the restored
        state may share that buffer instead of copying it (a 32 MiB copy per restore at 128^3)."""
        for buf in self._buffers:
            at = buf.__array_interface__["data"][0]
            for field in fields:
                if (field.__array_interface__["data"][0] != at or not field.flags.c_contiguous
                        or field.dtype != buf.dtype):
                    break
                at += field.nbytes
            else:
                if at == buf.__array_interface__["data"][0] + buf.nbytes:
                    return _vec_over(self.grid, buf)
        return None


def _vec_over(grid, buf: np.ndarray):
    PETSc = petsc()
    N = int(np.prod(grid.global_shape)) * grid.dof
    return PETSc.Vec().createWithArray(buf, size=(buf.size, N), bsize=grid.dof, comm=grid.comm)


def owned(grid, vec, readonly: bool = True) -> np.ndarray:
    """The owned block of ``vec`` in natural order with an explicit component axis (dof >= 1)."""
    return vec.getArray(readonly=readonly).reshape(grid.shape + (grid.dof,))

