"""Write distributed fields to one HDF5 file in natural ordering, in parallel (h5py, MPI-IO driver).

Each field becomes a global dataset; every rank writes its own block collectively. The file is
written under a temporary name and renamed when complete, so a failed run never leaves a file that
looks like a result.
"""

from __future__ import annotations

import os

import numpy as np

from .snapshot import Snapshot, SnapshotLayout
from .stack import h5py


def check_writable(path: str) -> None:
    """Raise ValueError unless a file can be created at ``path``."""
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(parent):
        raise ValueError(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write {path}: directory {parent} is not writable")
    if os.path.isdir(path):
        raise ValueError(f"cannot write {path}: it is a directory")


def _write_block(dset, slices, block) -> None:
    """Write this rank's block inside a collective context; an empty block (a scalar owned by another
    rank) still joins the collective call, which h5py's ``dset[...] = `` skips and so would deadlock."""
    if block.size:
        dset[slices] = block
        return
    h5s = h5py().h5s
    fspace = dset.id.get_space()
    fspace.select_none()
    mspace = h5s.create_simple((1,))
    mspace.select_none()
    dset.id.write(mspace, fspace, np.zeros(1, dtype=dset.dtype), dxpl=dset._dxpl)


def write_fields(path: str, comm, layouts: SnapshotLayout, arrays: Snapshot, attrs: dict | None = None,
                 prefix: str = "") -> None:
    """Collectively write ``arrays`` (this rank's blocks) as datasets ``prefix + name``."""
    tmp = f"{path}.partial"
    with h5py().File(tmp, "w", driver="mpio", comm=comm) as f:
        for key, value in (attrs or {}).items():
            f.attrs[key] = value
        for name in sorted(arrays):
            layout = layouts[name]
            dset = f.create_dataset(prefix + name, shape=layout.global_shape, dtype=layout.dtype)
            with dset.collective:
                _write_block(dset, layout.slices, arrays[name])
    comm.Barrier()
    if comm.rank == 0:
        os.replace(tmp, path)
    comm.Barrier()
