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
        from ..imports import h5py

        if not os.path.isfile(path):
            raise ValueError(f"observations file not found: {path}")
        try:
            with h5py().File(path, "r") as f:
                steps = cls._steps(path, cls._dataset(f, path, "steps"))
                u = cls._dataset(f, path, "u")
                if u.ndim < 3:
                    raise ValueError(f"{path}: 'u' must have shape (k, [nz,] ny, nx) (one state per observed "
                                     f"step), got shape {u.shape}")
                if u.dtype.kind not in "fiu":
                    raise ValueError(f"{path}: 'u' must hold numbers, got {u.dtype} data")
                if u.shape[0] != len(steps):
                    raise ValueError(f"{path}: 'u' has {u.shape[0]} states for {len(steps)} steps")
                for k in range(u.shape[0]):  # one state at a time: a NaN would surface as a solver failure
                    if not np.all(np.isfinite(u[k])):
                        raise ValueError(f"{path}: 'u' holds NaN or infinite values (state {k}, step "
                                         f"{steps[k]})")
        except (OSError, KeyError) as exc:
            raise ValueError(f"cannot read observations from {path}: {exc}") from None
        return cls(steps, path)

    @staticmethod
    def _dataset(f, path: str, name: str):
        """Dataset ``name`` of the open file; ValueError naming the file when it is missing or a group."""
        if name not in f:
            raise ValueError(f"{path}: no dataset '{name}'")
        node = f[name]
        if not hasattr(node, "dtype"):
            raise ValueError(f"{path}: '{name}' is a group, not a dataset")
        return node

    @staticmethod
    def _steps(path: str, dataset) -> list[int]:
        """The observed steps: whole numbers (2.0 is step 2; 2.7 is refused, not taken as 2)."""
        if dataset.dtype.kind not in "fiu":
            raise ValueError(f"{path}: 'steps' must hold whole numbers, got {dataset.dtype} data")
        values = np.asarray(dataset[...], dtype=np.float64).ravel()
        if values.size == 0:
            raise ValueError(f"{path}: 'steps' is empty")
        bad = [float(v) for v in values if not (np.isfinite(v) and v == np.floor(v))]
        if bad:
            raise ValueError(f"{path}: 'steps' must hold whole numbers, got {bad[0]:g}")
        return [int(v) for v in values]

    def check(self, n_steps: int, global_shape) -> None:
        bad = [s for s in self.steps if not 0 <= s <= n_steps]
        if bad:
            raise ValueError(f"observed steps {bad} lie outside 0..{n_steps}")
        if self.path is not None:
            from ..imports import h5py

            with h5py().File(self.path, "r") as f:
                if tuple(f["u"].shape[1:]) != tuple(global_shape):
                    raise ValueError(f"{self.path}: observed states have shape {f['u'].shape[1:]}, "
                                     f"the grid is {tuple(global_shape)}")

    def target_block(self, step: int, grid) -> np.ndarray:
        """This rank's block of d_step."""
        if self.path is None:
            return np.zeros(grid.shape)
        from ..imports import h5py

        k = self.steps.index(step)
        with h5py().File(self.path, "r") as f:
            return np.array(f["u"][(k, *grid.layout().slices)], dtype=np.float64)
