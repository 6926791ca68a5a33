"""Helpers shared by models on a non-periodic or periodic PETSc DMDA (physics-free plumbing).

Arrays are in natural axis order (slowest first: (ny, nx) or (nz, ny, nx)), with a trailing component
axis when dof > 1; PETSc's x-fastest, component-interleaved vector layout is exactly the C-order
flattening of that shape, so owned blocks are plain reshapes.
"""

from __future__ import annotations

import numpy as np

from ..snapshot import FieldLayout
from ..imports import petsc


def parse_grid(text: str) -> tuple[int, ...]:
    """'128x128' -> (128, 128) in (nx, ny[, nz]) order; ValueError on anything else."""
    try:
        sizes = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"grid must look like 128x128 or 32x32x32, got {text!r}") from None
    if len(sizes) not in (2, 3):
        raise ValueError(f"grid must have 2 or 3 axes, got {text!r}")
    if any(n < 1 for n in sizes):
        raise ValueError(f"grid sizes must be positive, got {text!r}")
    return sizes


class Grid:
    """A DMDA with stencil width 1 and ``dof`` components, and its owned/ghost geometry in natural order.

    With dof > 1 owned and padded blocks carry a trailing component axis. ``like`` (another Grid of the
    same sizes) makes this one share its partition, so fields of different dof line up rank by rank.
    """

    def __init__(self, comm, sizes: tuple[int, ...], periodic: bool = False, dof: int = 1,
                 like: "Grid | None" = None):
        PETSc = petsc()
        boundary = PETSc.DM.BoundaryType.PERIODIC if periodic else PETSc.DM.BoundaryType.NONE
        extra = {}
        if like is not None:
            extra = {"proc_sizes": like.da.getProcSizes(), "ownership_ranges": like.da.getOwnershipRanges()}
        try:
            self.da = PETSc.DMDA().create(dim=len(sizes), sizes=sizes, dof=dof, stencil_width=1,
                                          stencil_type=PETSc.DMDA.StencilType.STAR,
                                          boundary_type=(boundary,) * len(sizes), comm=comm, **extra)
        except PETSc.Error as exc:
            reason = [line for line in str(exc).splitlines() if line.strip()][-1].split("] ")[-1]
            raise ValueError(f"PETSc cannot split grid {'x'.join(map(str, sizes))} over {comm.size} "
                             f"ranks ({reason.strip()})") from None
        self.comm = comm
        self.periodic = periodic
        self.sizes_xyz = tuple(sizes)
        self.global_shape = tuple(reversed(sizes))
        ranges = self.da.getRanges()
        ghosts = self.da.getGhostRanges()
        self.start = tuple(r[0] for r in reversed(ranges))
        self.shape = tuple(r[1] - r[0] for r in reversed(ranges))
        self.gstart = tuple(r[0] for r in reversed(ghosts))
        self.gshape = tuple(r[1] - r[0] for r in reversed(ghosts))
        self.dim = len(sizes)
        # cells per rank along each axis (x first), kept for index maps made after the DMDA is gone
        self.ownership_ranges = tuple(np.asarray(r, dtype=np.int64) for r in self.da.getOwnershipRanges())
        self.dof = int(dof)
        self.components = () if self.dof == 1 else (self.dof,)
        self._local = self.da.createLocalVec()

    # -- vectors --------------------------------------------------------------------------
    def create_vec(self):
        return self.da.createGlobalVec()

    def layout(self) -> FieldLayout:
        """Layout of the whole (all-component) field."""
        return FieldLayout(self.global_shape + self.components, self.start + (0,) * len(self.components),
                           self.shape + self.components)

    def component_layout(self) -> FieldLayout:
        """Layout of one component (a scalar field on the grid)."""
        return FieldLayout(self.global_shape, self.start, self.shape)

    def owned(self, vec) -> np.ndarray:
        """The owned block of a global Vec as a natural-order view (writes go into the Vec)."""
        return vec.getArray().reshape(self.shape + self.components)

    def owned_view(self, vec) -> np.ndarray:
        """The owned block of a global Vec as a read-only natural-order view, valid while ``vec`` lives."""
        return vec.getArray(readonly=True).reshape(self.shape + self.components)

    def vec_from(self, block: np.ndarray):
        vec = self.create_vec()
        self.owned(vec)[...] = block
        return vec

    def node_coordinates(self) -> list[np.ndarray]:
        """Owned node coordinates per natural axis, x_i = (i+1)h with h = 1/(N+1) (Dirichlet)."""
        coords = []
        for axis, (n, s, m) in enumerate(zip(self.global_shape, self.start, self.shape)):
            h = 1.0 / n if self.periodic else 1.0 / (n + 1)
            offset = 0.0 if self.periodic else 1.0
            shape = [1] * self.dim
            shape[axis] = m
            coords.append(((np.arange(s, s + m) + offset) * h).reshape(shape))
        return coords

    # -- halo access ----------------------------------------------------------------------
    def padded(self, vec, fill: float = 0.0) -> np.ndarray:
        """Owned block plus a one-point halo (neighbours' values; ``fill`` outside the domain)."""
        self.da.globalToLocal(vec, self._local)
        local = self._local.getArray(readonly=True).reshape(self.gshape + self.components)
        out = np.full(tuple(m + 2 for m in self.shape) + self.components, fill, dtype=local.dtype)
        out[self._ghost_window()] = local
        return out

    def padded_indices(self) -> np.ndarray:
        """PETSc global indices over the padded block (-1 outside the domain)."""
        lg = self.da.getLGMap().getIndices().reshape(self.gshape + self.components)
        out = np.full(tuple(m + 2 for m in self.shape) + self.components, -1, dtype=np.int64)
        out[self._ghost_window()] = lg
        return out

    def _ghost_window(self) -> tuple[slice, ...]:
        window = []
        for s, gs, gm in zip(self.start, self.gstart, self.gshape):
            # ghost start relative to the padded block's first point (global index s - 1)
            lo = gs - (s - 1)
            window.append(slice(lo, lo + gm))
        return tuple(window)

    def neighbours(self):
        """Yield (axis, direction, neighbour view slice into padded arrays, inside-domain mask)."""
        inner = tuple(slice(1, 1 + m) for m in self.shape)
        for axis in range(self.dim):
            n, s, m = self.global_shape[axis], self.start[axis], self.shape[axis]
            for direction in (-1, 1):
                sl = list(inner)
                sl[axis] = slice(1 + direction, 1 + direction + m)
                g = np.arange(s, s + m) + direction
                mask_shape = [1] * self.dim
                mask_shape[axis] = m
                inside = ((g >= 0) & (g < n)).reshape(mask_shape)
                if self.periodic:
                    inside = np.ones(mask_shape, dtype=bool)
                yield axis, direction, tuple(sl), inside

    @property
    def inner(self) -> tuple[slice, ...]:
        return tuple(slice(1, 1 + m) for m in self.shape)

    def owned_global_indices(self) -> np.ndarray:
        """PETSc global indices of the owned points (computed on each call, not kept)."""
        return self.padded_indices()[self.inner]

    def spacing(self) -> tuple[float, ...]:
        """Grid spacing per natural axis."""
        return tuple((1.0 / n if self.periodic else 1.0 / (n + 1)) for n in self.global_shape)
