"""Plumbing shared by the burgers, wave and grayscott models: scalar controls and stencils on padded blocks.

A scalar control (a viscosity, a feed rate) is a PETSc Vec of global size 1 owned by rank 0, so
``Vec.dot``/``norm`` and the gradient files treat it like any field: its layout is global shape (1,),
block (0,)+(1,) on rank 0 and an empty block elsewhere.
"""

from __future__ import annotations

import numpy as np

from ..snapshot import FieldLayout
from ..imports import petsc


def scalar_vec(comm, value: float = 0.0):
    """A global Vec of size 1, owned by rank 0, holding ``value``."""
    vec = petsc().Vec().createMPI((1 if comm.rank == 0 else 0, 1), comm=comm)
    vec.set(value)
    return vec


def scalar_value(comm, vec) -> float:
    """The value of a size-1 Vec on every rank (collective)."""
    local = vec.getArray(readonly=True)
    return comm.bcast(float(local[0]) if comm.rank == 0 else None, root=0)


def scalar_add(comm, vec, local_contribution: float) -> None:
    """Add the sum over ranks of ``local_contribution`` into a size-1 Vec (collective)."""
    total = comm.allreduce(float(local_contribution))
    # getArray on every rank, not only the owner: it bumps the Vec's state everywhere, so no rank
    # keeps a stale cached norm and skips the allreduce of a later norm()
    local = vec.getArray()
    if comm.rank == 0:
        local[0] += total


def scalar_layout(comm) -> FieldLayout:
    return FieldLayout((1,), (0,), (1,) if comm.rank == 0 else (0,))


def scalar_array(comm, vec) -> np.ndarray:
    return vec.getArray(readonly=True).reshape((1,) if comm.rank == 0 else (0,)).copy()


def laplacian(grid, padded: np.ndarray, spacing) -> np.ndarray:
    """Standard 5/7-point Laplacian of a padded block on the owned points (halo from the padding)."""
    centre = padded[grid.inner]
    out = np.zeros_like(centre)
    for axis, _direction, nb, _inside in grid.neighbours():
        out += (padded[nb] - centre) / spacing[axis] ** 2
    return out


class ComponentSnapshots:
    """Snapshots of a dof-k state (``self.grid``): one natural-order field per component.

    A model lists the field names, one per component, in ``SNAPSHOT_FIELDS``.
    """

    SNAPSHOT_FIELDS: tuple[str, ...] = ()

    def snapshot_layout(self):
        layout = self.grid.component_layout()
        return {name: layout for name in self.SNAPSHOT_FIELDS}

    def snapshot(self, u):
        w = self.grid.owned_view(u)
        return {name: w[..., k] for k, name in enumerate(self.SNAPSHOT_FIELDS)}

    def restore(self, snapshot):
        return self.grid.vec_from(np.stack([snapshot[name] for name in self.SNAPSHOT_FIELDS], axis=-1))
