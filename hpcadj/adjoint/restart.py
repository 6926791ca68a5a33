"""Durable progress for restartable gradients: the run directory, its manifest and adjoint states.

A run directory holds:

- ``manifest.json`` — replaced atomically (write, fsync, rename) by rank 0 at every durable point:
  the run's identity (model, grid, steps, dt, ..., a fingerprint of the controls), the rank count,
  the level set-up (run id, node-local directory, HDF5 file), the last durable point, and which
  snapshots each durable level held, complete and verified, at that point.
- ``adjoint.h5`` — lambda_m and the parameter gradients accumulated down to step m, as global
  natural-ordered datasets (parallel HDF5, written under a temporary name then renamed), so a run
  can resume on a different number of ranks.

Durable points: in the forward sweep after a snapshot lands on a durable level (node-local or HDF5)
at the frontier — J so far is recorded with it; in the reverse sweep every ``every`` adjoint steps;
and whenever the run is asked to stop.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from ..fieldio import write_fields
from ..stack import h5py

MANIFEST = "manifest.json"
ADJOINT_FILE = "adjoint.h5"
DURABLE_KINDS = ("local", "pfs")
FORMAT = 1


class RunDirError(ValueError):
    """The run directory cannot be used: unwritable, from another configuration, or broken."""


def controls_fingerprint(model, controls, comm) -> list[float]:
    """Two numbers per control that do not depend on the rank layout (weighted by natural index)."""
    out = []
    layouts = model.control_layout()
    for name in sorted(controls):
        layout = layouts[name]
        values = controls[name].getArray(readonly=True).reshape(layout.shape)
        grids = np.meshgrid(*[np.arange(s, s + m) for s, m in zip(layout.start, layout.shape)], indexing="ij")
        natural = np.ravel_multi_index(grids, layout.global_shape) if values.size else np.zeros(values.shape)
        weights = np.sin(0.7 + 1.3 * natural)
        out.extend([comm.allreduce(float(values.sum())), comm.allreduce(float((values * weights).sum()))])
    return out


def _same_fingerprint(a, b) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-12 * max(1.0, abs(x), abs(y)) for x, y in zip(a, b))


class RunDirectory:
    """One run's directory (every rank calls every method; rank 0 writes the manifest)."""

    def __init__(self, path: str, comm):
        self.path = os.path.abspath(path)
        self.comm = comm
        self.manifest_path = os.path.join(self.path, MANIFEST)
        self.adjoint_path = os.path.join(self.path, ADJOINT_FILE)
        self.manifest: dict | None = None

    # -- opening ---------------------------------------------------------------------------
    def _agree_error(self, message: str | None) -> None:
        messages = [m for m in self.comm.allgather(message) if m]
        if messages:
            raise RunDirError(messages[0])

    def exists(self) -> bool:
        return os.path.isfile(self.manifest_path)

    def create(self, identity: dict, setup: dict) -> None:
        """Start a fresh run here (refused if the directory already holds one)."""
        error = None
        if self.comm.rank == 0:
            try:
                os.makedirs(self.path, exist_ok=True)
                if self.exists():
                    error = (f"run directory {self.path} already holds a run: add --resume to continue "
                             f"it, or choose another --run-dir")
                elif not os.access(self.path, os.W_OK | os.X_OK):
                    error = f"run directory {self.path} is not writable"
            except OSError as exc:
                error = f"cannot create run directory {self.path}: {exc.strerror}"
        self._agree_error(self.comm.bcast(error, root=0))
        self.manifest = {"format": FORMAT, "identity": identity, "setup": setup, "ranks": self.comm.size,
                         "status": "running", "durable": None, "snapshots": {}, "created": time.time()}
        self.save()

    def open(self, identity: dict) -> dict:
        """Load the manifest of the run to resume; refuse one from another configuration."""
        error, manifest = None, None
        if self.comm.rank == 0:
            try:
                with open(self.manifest_path) as f:
                    manifest = json.load(f)
                if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
                    error = f"{self.manifest_path}: not an hpcadj manifest (format {FORMAT})"
            except FileNotFoundError:
                error = f"nothing to resume: {self.manifest_path} does not exist"
            except (OSError, json.JSONDecodeError) as exc:
                error = f"cannot read {self.manifest_path}: {exc}"
            if error is None:
                error = self._identity_mismatch(manifest["identity"], identity)
        self._agree_error(self.comm.bcast(error, root=0))
        self.manifest = self.comm.bcast(manifest, root=0)
        return self.manifest

    @staticmethod
    def _identity_mismatch(saved: dict, current: dict) -> str | None:
        for key in sorted((set(saved) | set(current)) - {"controls"}):
            if saved.get(key) != current.get(key):
                return (f"run directory belongs to another configuration: {key} was "
                        f"{saved.get(key)!r}, now {current.get(key)!r}")
        if not _same_fingerprint(saved.get("controls", []), current.get("controls", [])):
            return "run directory belongs to another configuration: the controls differ"
        return None

    # -- writing ---------------------------------------------------------------------------
    def save(self) -> None:
        """Replace the manifest atomically (rank 0), then let every rank go on."""
        error = None
        if self.comm.rank == 0:
            tmp = self.manifest_path + ".tmp"
            try:
                with open(tmp, "w") as f:
                    json.dump(self.manifest, f, indent=1)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.manifest_path)
            except OSError as exc:
                error = f"cannot write {self.manifest_path}: {exc.strerror}"
        self._agree_error(self.comm.bcast(error, root=0))

    def write_adjoint(self, model, step: int, lam, grad: dict) -> None:
        """Write lambda_step and the gradient so far (collective, atomic by rename)."""
        layouts = {"lambda/" + k: v for k, v in model.snapshot_layout().items()}
        arrays = {"lambda/" + k: v for k, v in model.snapshot(lam).items()}
        controls = model.control_layout()
        for name, vec in grad.items():
            layouts["grad/" + name] = controls[name]
            arrays["grad/" + name] = vec.getArray(readonly=True).reshape(controls[name].shape)
        write_fields(self.adjoint_path, self.comm, layouts, arrays, attrs={"step": step})

    def read_adjoint(self, model, grad_like: dict):
        """(step, lambda Vec, gradient Vecs) from ``adjoint.h5``, read in this run's layout."""
        with h5py().File(self.adjoint_path, "r", driver="mpio", comm=self.comm) as f:
            step = int(f.attrs["step"])
            snapshot = {k: np.array(f["lambda/" + k][v.slices]) for k, v in model.snapshot_layout().items()}
            grad = {}
            controls = model.control_layout()
            for name, like in grad_like.items():
                vec = like.duplicate()
                vec.getArray().reshape(controls[name].shape)[...] = f["grad/" + name][controls[name].slices]
                grad[name] = vec
        return step, model.restore(snapshot), grad


class Durability:
    """The driver's durability hook: records durable points in the run directory.

    Forward sweep: J is remembered for each snapshot stored on a durable level at the frontier;
    every ``every`` such stores (and at a stop) the durable levels are flushed and the manifest
    lists the snapshots and J at each. Reverse sweep: every ``every`` adjoint steps lambda and the
    gradient so far are written, then the manifest.
    """

    def __init__(self, rundir: RunDirectory, model, levels, every: int = 10):
        self.rundir = rundir
        self.model = model
        self.levels = levels
        self.every = max(1, int(every))
        self._since = 0
        self._forward_J: dict[int, float] = {}

    def _durable_snapshots(self) -> dict:
        """Flush the durable levels and list their complete snapshots (the same on every rank)."""
        from ..checkpoint.storage.base import LevelError
        from ..stack import mpi

        out = {}
        for level in self.levels:
            if level.kind in DURABLE_KINDS:
                failure = None
                try:
                    level.flush()
                except LevelError as exc:
                    failure = exc
                if self.rundir.comm.allreduce(failure is not None, op=mpi().LOR):
                    # every rank leaves together; the driver re-plans around the failed level
                    raise failure or LevelError(f"{level.name}: a write failed on another rank")
                mine = set(level.valid_steps())
                for other in self.rundir.comm.allgather(sorted(mine)):
                    mine &= set(other)
                out[level.name] = sorted(mine)
        return out

    def _record(self, durable: dict) -> None:
        m = self.rundir.manifest
        m["snapshots"] = self._durable_snapshots()
        stored = {step for steps in m["snapshots"].values() for step in steps}
        m["forward_points"] = {str(step): J for step, J in self._forward_J.items() if step in stored}
        m["durable"] = durable
        self.rundir.save()

    def forward_point(self, driver, level) -> None:
        if level.kind not in DURABLE_KINDS:
            return
        self._forward_J[driver.frontier] = driver.result.J
        self._since += 1
        if self._since >= self.every:
            self._since = 0
            self._record({"phase": "forward"})

    def reverse_point(self, driver, force: bool = False) -> None:
        self._since += 1
        if not force and self._since < self.every and driver.lam_step != 0:
            return
        self._since = 0
        self.rundir.write_adjoint(self.model, driver.lam_step, driver.lam, driver.grad)
        self._record({"phase": "reverse", "J": driver.result.J, "lam_step": driver.lam_step})

    def stop(self, driver) -> None:
        """Make everything durable before a requested stop."""
        if driver.lam_step is not None:
            self.reverse_point(driver, force=True)
        else:
            self._record({"phase": "forward"})
        self.rundir.manifest["status"] = "stopped"
        self.rundir.save()

    def finished(self) -> None:
        self.rundir.manifest["status"] = "complete"
        self.rundir.save()


def resume_point(rundir: RunDirectory, model, controls, levels, costs=None):
    """The residual plan and :class:`ResumePoint` that continue the run recorded in ``rundir``.

    ``levels`` are the run's levels reopened on their existing snapshots; every snapshot not used
    (not listed durable in the manifest, not valid on every rank, or beyond the resume point) is
    discarded from them. Returns ``(plan, point)``; ``point`` is None when nothing durable exists
    (the run starts over with its ordinary plan).
    """
    from ..checkpoint.schedules.resume import Residual
    from .driver import ResumePoint

    manifest = rundir.manifest
    durable = manifest.get("durable") or {}
    n = model.n_steps
    valid = {}
    for index, level in enumerate(levels):
        listed = set(manifest.get("snapshots", {}).get(level.name, []))
        mine = set(level.valid_steps()) & listed
        for other in rundir.comm.allgather(sorted(mine)):
            mine &= set(other)
        for step in mine:
            valid.setdefault(step, index)
    point = None
    if durable.get("phase") == "reverse" and os.path.isfile(rundir.adjoint_path):
        lam_step, lam, grad = rundir.read_adjoint(model, controls)
        point = ResumePoint(frontier=n, J=durable["J"], lam_step=lam_step, lam=lam, grad=grad)
        top = lam_step
    else:
        forward = {int(k): J for k, J in manifest.get("forward_points", {}).items() if int(k) in valid}
        if forward:
            s = max(forward)
            point = ResumePoint(frontier=s, J=forward[s])
            top = s + 1
    keep = {step: index for step, index in valid.items() if point is not None and step < top}
    for index, level in enumerate(levels):
        for step in sorted(level.valid_steps()):
            if keep.get(step) != index:
                level.discard(step)
    if point is None:
        return None, None
    capacities = [level.capacity for level in levels]
    return Residual(n, capacities, keep, lam_step=point.lam_step, costs=costs), point
