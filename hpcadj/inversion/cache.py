"""Evaluations of J and dJ/dm keyed by the controls' bytes, so TAO never pays twice for one control.

The key is a SHA-256 over every rank's local bytes of every control (inverted and fixed), in rank
order, and over the configuration (the model's ``describe()``, the inverted names and the
checkpoint codecs: a lossy codec changes the gradient). Equal keys mean bitwise-equal controls on
every rank, so a cached J or gradient is exactly what a fresh session at that control returns.
A control that differs in one bit anywhere misses, and the entry is replaced: nothing computed at
another control is ever reused.

Policies for an objective-only request at a new control (TAO's Armijo line search asks f at trial
points and g at the accepted one; More–Thuente asks f and g together):

- ``"keep"`` (default): the session's first sweep with the plan's stores (n steps), its levels and
  the states the plan holds kept; a gradient at the same key runs only the reverse sweep from them
  (:meth:`~hpcadj.adjoint.session.GradientSession.forward`, then ``solve()``). Before the reverse
  sweep starts, the kept session's controls are hashed again and must give the key;
- ``"gradient"``: run the checkpointed gradient session (J and g together) and keep g for the
  gradient request that usually follows at the same point;
- ``"forward"``: one forward sweep, no snapshot (n steps); a gradient at that point then runs the
  whole session.

Every evaluation at another key discards the entry first: its gradient, and the kept session's
levels (RAM slots, node-local files, HDF5 file) and states.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, replace

from ..models.base import SolverError, begin_evaluation
from ..adjoint.session import Checkpointing, GradientSession
from ..buffers import release_idle_buffers
from ..imports import petsc

POLICIES = ("keep", "gradient", "forward")


def control_hash(comm, controls: dict, configuration: dict | None = None) -> str:
    """Hex SHA-256 of every rank's control bytes (by name, in rank order) and ``configuration``;
    the same string on every rank (collective)."""
    mine = hashlib.sha256()
    for name in sorted(controls):
        a = controls[name].getArray(readonly=True)
        mine.update(name.encode())
        mine.update(a.dtype.str.encode())
        mine.update(a.tobytes())
    total = hashlib.sha256(json.dumps(configuration or {}, sort_keys=True, default=str).encode())
    for digest in comm.allgather(mine.digest()):
        total.update(digest)
    return total.hexdigest()


@dataclass
class Evaluation:
    """J (the model's objective: the misfit) and, if computed, the packed gradient at control ``key``."""

    key: str
    J: float
    gradient: object = None          # packed PETSc Vec, or None (objective-only)
    forward_steps: int = 0
    adjoint_steps: int = 0
    seconds: float = 0.0
    session: object = None           # the paused GradientSession whose levels are kept ("keep" policy)


class EvaluationCache:
    """J and dJ/dm of ``model`` over the packed controls of ``space``, one entry kept.

    ``checkpointing`` is the :class:`~hpcadj.adjoint.session.Checkpointing` every gradient session
    uses; a cost profile calibrated by the first session is reused by the later ones. Collective.
    """

    def __init__(self, model, space, checkpointing=None, *, policy: str = "keep"):
        if policy not in POLICIES:
            raise ValueError(f"objective-only policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.model, self.space, self.policy = model, space, policy
        self.comm = model.comm
        self.checkpointing = checkpointing or Checkpointing()
        begin_evaluation(model)  # the key's configuration, not the step count a past evaluation found
        self.configuration = {"model": model.describe(), "invert": space.names,
                              "codecs": {k: c.spec for k, c in self.checkpointing.codecs().items()}}
        self.entry: Evaluation | None = None
        self.forward_steps = 0      # every forward step evaluated, recomputation included
        self.adjoint_steps = 0
        self.sessions = 0           # checkpointed gradient sessions run
        self.forward_sweeps = 0     # objective-only forward sweeps run ("forward" policy)
        self.kept_sweeps = 0        # objective-only first sweeps whose levels were kept ("keep" policy)
        self.reverse_from_kept = 0  # gradients whose reverse sweep started from kept levels
        self.hits = 0               # requests answered without computing
        self.requests = {"objective": 0, "gradient": 0}
        #: what a loop without cache pays: n steps per objective-only request, one gradient session's
        #: forward steps (the last one run) per gradient request
        self.naive_forward_steps = 0
        self._session_steps = None
        self.notes: list[str] = []
        #: the id of every session's level files (None: a fresh one each); at most one session's
        #: levels exist at a time, so they can share it (an inversion's run directory records it)
        self.run_id: str | None = None

    def remove_left(self, record: dict, local_dir=None, pfs_file=None) -> list[str]:
        """What a killed process's evaluation left (node-local snapshots, the HDF5 file, named by
        ``record``'s run id: :func:`~hpcadj.restart.rundir.record_owned`), removed. Collective."""
        from ..restart.rundir import remove_owned

        ck = self.checkpointing
        return remove_owned(self.comm, record, local_dir=local_dir or ck.local_dir, pfs_file=pfs_file or ck.pfs_file)

    def key(self, x) -> str:
        controls = self.space.unpack(x)
        try:
            return control_hash(self.comm, controls, self.configuration)
        finally:
            for vec in controls.values():
                vec.destroy()

    def objective(self, x) -> Evaluation:
        e = self._evaluate(x, gradient=self.policy == "gradient", needed=False)
        self.requests["objective"] += 1
        self.naive_forward_steps += self._naive_objective_steps(e)
        return e

    def _naive_objective_steps(self, e: Evaluation) -> int:
        """What a loop without cache pays for an objective-only request: one forward sweep."""
        return self.model.n_steps or e.forward_steps

    def gradient(self, x) -> Evaluation:
        e = self._evaluate(x, gradient=True, needed=True)
        self.requests["gradient"] += 1
        self.naive_forward_steps += self._session_steps
        return e

    def _evaluate(self, x, gradient: bool, needed: bool) -> Evaluation:
        key = self.key(x)
        entry = self.entry
        if entry is not None and entry.key == key and (entry.gradient is not None or not needed):
            self.hits += 1
            return entry
        if entry is not None and entry.key == key and entry.session is not None:
            return self._reverse(x, entry)
        self.drop()
        self.entry = self._compute(x, key, gradient)
        return self.entry

    def _compute(self, x, key: str, gradient: bool) -> Evaluation:
        """A new entry at ``key``: a gradient session, or an objective as the policy says."""
        if gradient:
            return self._gradient(x, key)
        return self._kept_forward(x, key) if self.policy == "keep" else self._forward(x, key)

    def drop(self) -> None:
        """Forget the entry: its gradient Vec destroyed, a kept session's levels and states discarded."""
        entry, self.entry = self.entry, None
        if entry is None:
            return
        if entry.gradient is not None:
            entry.gradient.destroy()
        if entry.session is not None:
            self._discard(entry)

    def _discard(self, entry: Evaluation) -> None:
        session, entry.session = entry.session, None
        session.close()
        for vec in session.controls.values():
            vec.destroy()

    def _session(self, x):
        release_idle_buffers()  # the last session's RAM slots, still pooled, are no baseline of this one
        return GradientSession(self.model, self.checkpointing, controls=self.space.unpack(x), run_id=self.run_id)

    def _complete(self, session, outcome, key: str, t0: float, counted: int = 0) -> Evaluation:
        """The entry of a finished session; ``counted`` forward steps were counted at its first sweep."""
        try:
            if outcome.status != "complete":
                raise SolverError(f"gradient session {outcome.status}: {outcome.message}")
            self._calibrated(session)
            result = outcome.result
            g = self.space.pack(result.gradient)
            for vec in result.gradient.values():
                vec.destroy()
        finally:
            for vec in session.controls.values():
                vec.destroy()
        self.sessions += 1
        self._session_steps = result.forward_steps
        self.forward_steps += result.forward_steps - counted
        self.adjoint_steps += result.adjoint_steps
        return Evaluation(key, result.J, g, result.forward_steps, result.adjoint_steps,
                          time.perf_counter() - t0)

    def _calibrated(self, session) -> None:
        if self.checkpointing.costs is None:  # calibrated once, reused by every later session
            self.checkpointing = replace(self.checkpointing, costs=session.planned.costs)
        self.notes.extend(n for n in session.notes if n not in self.notes)

    def _gradient(self, x, key: str) -> Evaluation:
        t0 = time.perf_counter()
        session = self._session(x)
        return self._complete(session, _solved(session), key, t0)

    def _kept_forward(self, x, key: str) -> Evaluation:
        """J from the session's first sweep; its levels and held states kept for a gradient at ``key``."""
        t0 = time.perf_counter()
        session = self._session(x)
        try:
            outcome = session.forward()
        except BaseException:
            session.close()
            for vec in session.controls.values():
                vec.destroy()
            raise
        if outcome.status != "paused":
            for vec in session.controls.values():
                vec.destroy()
            raise SolverError(f"gradient session {outcome.status}: {outcome.message}")
        self._calibrated(session)
        steps = outcome.result.forward_steps
        self.kept_sweeps += 1
        self.forward_steps += steps
        return Evaluation(key, outcome.result.J, None, forward_steps=steps, seconds=time.perf_counter() - t0,
                          session=session)

    def _reverse(self, x, entry: Evaluation) -> Evaluation:
        """The gradient at the kept entry's key: its session's reverse sweep from the kept levels.

        The kept session's controls are hashed again first: Vecs changed in place since its first
        sweep make its levels another control's, so they are discarded and a whole session runs."""
        session = entry.session
        if control_hash(self.comm, session.controls, self.configuration) != entry.key:
            self.drop()
            self.notes.append("a kept first sweep's controls changed in place: its levels were discarded")
            self.entry = self._gradient(x, entry.key)
            return self.entry
        entry.session, self.entry = None, None
        t0 = time.perf_counter() - entry.seconds
        self.entry = self._complete(session, _solved(session), entry.key, t0, counted=entry.forward_steps)
        self.reverse_from_kept += 1
        return self.entry

    def _forward(self, x, key: str) -> Evaluation:
        """J from one forward sweep, accumulated in the driver's order (so bitwise the session's J)."""
        model = self.model
        begin_evaluation(model)  # adaptive steps: decided afresh at this control, as a session would
        done = getattr(model, "done", None) or (lambda i: i >= model.n_steps)
        controls = self.space.unpack(x)
        t0 = time.perf_counter()
        model.set_controls(controls)
        u = model.initial_state()
        J = 0.0
        J += model.objective(0, u)
        n = 0
        while not done(n):
            u = model.step(n, u)
            n += 1
            J += model.objective(n, u)
            petsc().garbage_cleanup(self.comm)
        u.destroy()
        for vec in controls.values():
            vec.destroy()
        petsc().garbage_cleanup(self.comm)
        self.forward_sweeps += 1
        self.forward_steps += n
        return Evaluation(key, J, None, n, 0, time.perf_counter() - t0)

    def counts(self) -> dict:
        return {"forward_steps": self.forward_steps, "adjoint_steps": self.adjoint_steps,
                "sessions": self.sessions, "forward_sweeps": self.forward_sweeps, "hits": self.hits,
                "kept_sweeps": self.kept_sweeps, "reverse_from_kept": self.reverse_from_kept,
                "objective_requests": self.requests["objective"], "gradient_requests": self.requests["gradient"],
                "naive_forward_steps": self.naive_forward_steps}


def _solved(session):
    """``session.solve()``'s outcome; the session's controls destroyed if it raises."""
    try:
        return session.solve()
    except BaseException:
        for vec in session.controls.values():
            vec.destroy()
        raise
