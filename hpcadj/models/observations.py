"""Observed states for misfit objectives: which steps are observed and the data at each."""

from __future__ import annotations

import os

import numpy as np


class Observations:
    """Targets d_i for observed steps i; ``path`` None means d_i = 0.

    File format (HDF5): dataset ``steps`` (k integers) and dataset ``u`` of shape (k, *grid) in natural
    order ((ny, nx) or (nz, ny, nx)); each rank reads only its own block.
    """

    def __init__(self, steps, path: str | None = None):
        self.steps = [int(s) for s in steps]
        self.path = path

    @classmethod
    def final_state_zero(cls, n_steps: int) -> "Observations":
        return cls([n_steps])

    @classmethod
    def from_file(cls, path: str) -> "Observations":
        from ..stack import h5py

        if not os.path.isfile(path):
            raise ValueError(f"observations file not found: {path}")
        try:
            with h5py().File(path, "r") as f:
                steps = np.asarray(f["steps"][...]).ravel()
                if f["u"].shape[0] != len(steps):
                    raise ValueError(f"{path}: 'u' has {f['u'].shape[0]} states for {len(steps)} steps")
        except (OSError, KeyError) as exc:
            raise ValueError(f"cannot read observations from {path}: {exc}") from None
        return cls(steps, path)

    def check(self, n_steps: int, global_shape) -> None:
        bad = [s for s in self.steps if not 0 <= s <= n_steps]
        if bad:
            raise ValueError(f"observed steps {bad} lie outside 0..{n_steps}")
        if self.path is not None:
            from ..stack import h5py

            with h5py().File(self.path, "r") as f:
                if tuple(f["u"].shape[1:]) != tuple(global_shape):
                    raise ValueError(f"{self.path}: observed states have shape {f['u'].shape[1:]}, "
                                     f"the grid is {tuple(global_shape)}")

    def target_block(self, step: int, grid) -> np.ndarray:
        """This rank's block of d_step."""
        if self.path is None:
            return np.zeros(grid.shape)
        from ..stack import h5py

        k = self.steps.index(step)
        with h5py().File(self.path, "r") as f:
            return np.array(f["u"][(k, *grid.layout().slices)], dtype=np.float64)
