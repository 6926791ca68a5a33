"""Accepted iterates made durable in a run directory, so a stopped inversion resumes where it was.

Layout of ``run_dir``:

- ``iterate-KKKKK.h5``: the controls of accepted iterate K (every control, inverted and fixed) as
  global natural-ordered datasets, each with per-chunk CRC-32 checksums (:func:`hpcadj.fieldio.
  write_fields`), written to a ``.partial`` file and renamed when complete;
- ``inversion.json``: written atomically after the controls file: the inversion's identity (model,
  inverted controls, bounds, weight, TAO type), the last accepted iterate (K, J, misfit,
  regularisation, ‖g‖, the controls file and its SHA-256) and every accepted iterate's record, with
  the CRC-32 of its canonical JSON (``crc32``): an edited or damaged state is refused on resume.

- ``owned.json``: the run id of the evaluations' level files, their node-local base and HDF5 path
  (:meth:`IterateStore.own_levels`), written before any evaluation, so a resume removes what a
  killed evaluation left.

The previous iterate's file is removed only once ``inversion.json`` names the new one, so a crash at
any point leaves one complete, checksummed iterate. petsc4py 3.18 exposes no LMVM history, so the
optimiser's state is not stored: a resume starts TAO afresh at the stored controls.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
from ..imports import h5py
from ..telemetry.jsonlog import dumps, write_json_atomic

STATE = "inversion.json"


class IterateError(ValueError):
    """A run directory whose iterates cannot be resumed (missing, corrupt, another inversion's)."""


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class IterateStore:
    """Durable iterates of one inversion in ``run_dir`` (collective)."""

    def __init__(self, run_dir: str, model, identity: dict):
        self.path = run_dir
        self.model = model
        self.comm = model.comm
        self.identity = json.loads(json.dumps(identity, default=str))
        self.state_path = os.path.join(run_dir, STATE)

    def create(self, resuming: bool = False) -> None:
        """Start a new inversion here; refuses a directory that already holds one (use resume), unless
        ``resuming`` one that stopped before its first accepted iterate."""
        problem = None
        if self.comm.rank == 0:
            if os.path.exists(self.state_path) and not resuming:
                problem = (f"{self.path} already holds an inversion ({STATE}): continue it with --resume, "
                           f"or choose another --run-dir")
            else:
                try:
                    os.makedirs(self.path, exist_ok=True)
                except OSError as exc:
                    problem = f"cannot create --run-dir {self.path}: {exc.strerror or exc}"
        problem = self.comm.bcast(problem, root=0)
        if problem:
            raise IterateError(problem)

    def own_levels(self, checkpointing, resuming: bool, write: bool = True) -> dict:
        """The record of this inversion's level files (:func:`~hpcadj.restart.rundir.record_owned`):
        the run id every evaluation's levels are named by, their node-local base and HDF5 path. A
        fresh inversion records them (``write``: its primary group) before any evaluation creates a
        file; a resume reads them, to remove what a killed evaluation left. The id is derived from
        the directory's path, so every shot group agrees on it without talking. Collective."""
        from ..restart.rundir import RunDirError, read_owned, record_hosts, record_owned

        record = read_owned(self.path, self.comm) if resuming else None
        run_id = "inv-" + hashlib.sha256(os.path.realpath(self.path).encode()).hexdigest()[:16]
        local = getattr(checkpointing, "local_dir", None)
        pfs = getattr(checkpointing, "pfs_file", None)
        if not write:
            return record or {"run_id": run_id, "local_dir": local, "pfs_file": None}
        try:  # on resume this job's hosts join the record before any evaluation puts files there
            return record_hosts(self.path, self.comm, record) if record is not None else \
                record_owned(self.path, self.comm, run_id, local, pfs)
        except RunDirError as exc:
            raise IterateError(str(exc)) from None

    def recorded(self) -> bool:
        """Whether an accepted iterate is recorded here (collective)."""
        found = os.path.exists(self.state_path) if self.comm.rank == 0 else None
        return bool(self.comm.bcast(found, root=0))

    def save(self, iteration: int, controls: dict, record: dict, history: list) -> None:
        """Make accepted iterate ``iteration`` durable: its controls file, then the state naming it."""
        from ..fieldio import write_fields

        model = self.model
        name = f"iterate-{iteration:05d}.h5"
        path = os.path.join(self.path, name)
        write_fields(path, self.comm, model.control_layout(), model.control_arrays(controls),
                     attrs={"iteration": iteration, "J": record["J"]})
        previous = self._read_state(quiet=True) if self.comm.rank == 0 else None
        if self.comm.rank == 0:
            from ..restart.rundir import json_crc32

            state = json.loads(dumps({"identity": self.identity, "iteration": iteration, "controls_file": name,
                                      "controls_sha256": _sha256(path), "last": record, "history": history}))
            write_json_atomic(self.state_path, {**state, "crc32": json_crc32(state)})
            old = (previous or {}).get("controls_file")
            if old and old != name:
                try:
                    os.remove(os.path.join(self.path, old))
                except OSError:
                    pass
        self.comm.Barrier()

    def _read_state(self, quiet: bool = False):
        try:
            with open(self.state_path) as f:
                return json.load(f)
        except (OSError, ValueError) as exc:
            if quiet:
                return None
            raise IterateError(f"--resume: cannot read {self.state_path}: "
                               f"{getattr(exc, 'strerror', None) or exc}") from None

    def load(self, like: dict) -> tuple[dict, dict]:
        """(the state, the controls of the last accepted iterate as new Vecs shaped like ``like``);
        IterateError on every rank if anything is missing, corrupt or another inversion's."""
        from ..fieldio import CorruptFile, verify_fields
        from ..restart.rundir import json_crc32

        state, problem = None, None
        if self.comm.rank == 0:
            try:
                state = self._read_state()
                if not isinstance(state, dict) or state.get("crc32") != json_crc32(
                        {k: v for k, v in state.items() if k != "crc32"}):
                    raise IterateError(f"--resume: {self.state_path} fails its checksum (edited or damaged): "
                                       f"restore it, or choose another --run-dir")
                if state.get("identity") != self.identity:
                    raise IterateError(f"--resume: {self.path} holds another inversion ({_differences(state.get('identity'), self.identity)}): "
                                       f"resume with the same options, or choose another --run-dir")
                path = os.path.join(self.path, state["controls_file"])
                if not os.path.isfile(path):
                    raise IterateError(f"--resume: the controls file {path} is missing")
                if _sha256(path) != state["controls_sha256"]:
                    raise IterateError(f"--resume: the controls file {path} is corrupt (SHA-256 mismatch)")
            except IterateError as exc:
                problem = str(exc)
            except (KeyError, TypeError) as exc:
                problem = f"--resume: {self.state_path} is incomplete ({exc})"
        problem = self.comm.bcast(problem, root=0)
        if problem:
            raise IterateError(problem)
        state = self.comm.bcast(state, root=0)
        path = os.path.join(self.path, state["controls_file"])
        try:
            verify_fields(path, self.comm)
        except CorruptFile as exc:
            raise IterateError(f"--resume: {exc}") from None
        return state, self._read_controls(path, like)

    def _read_controls(self, path: str, like: dict) -> dict:
        layouts = self.model.control_layout()
        out, problem = {}, None
        try:
            with h5py().File(path, "r") as f:
                for name, vec in like.items():
                    block = np.array(f[name][layouts[name].slices], dtype=np.float64)
                    copy = vec.duplicate()
                    copy.getArray()[:] = block.ravel()
                    out[name] = copy
        except (OSError, KeyError, ValueError) as exc:
            problem = f"--resume: cannot read the controls from {path}: {exc}"
        problems = [p for p in self.comm.allgather(problem) if p]
        if problems:
            raise IterateError(problems[0])
        return out


def _differences(then: dict | None, now: dict) -> str:
    then = then or {}
    keys = sorted(k for k in set(then) | set(now) if then.get(k) != now.get(k))
    return "; ".join(f"{k}: recorded {then.get(k)!r}, now {now.get(k)!r}" for k in keys) or "unreadable identity"
