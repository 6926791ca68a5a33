"""Evaluations of J and dJ/dm keyed by the controls' bytes, so TAO never pays twice for one control.

The key is a SHA-256 over every rank's local bytes of every control (inverted and fixed), in rank
order, and over the configuration (the model's ``describe()``, the inverted names and the
checkpoint codecs: a lossy codec changes the gradient). Equal keys mean bitwise-equal controls on
every rank, so a cached J or gradient is exactly what a fresh session at that control returns.
A control that differs in one bit anywhere misses, and the entry is replaced: nothing computed at
another control is ever reused.

Policies for an objective-only request at a new control (TAO's Armijo line search asks f at trial
points and g at the accepted one; More–Thuente asks f and g together):

- ``"gradient"`` (default): run the checkpointed gradient session (J and g together) and keep g for
  the gradient request that usually follows at the same point;
- ``"forward"``: one forward sweep, no snapshot (n steps); a gradient at that point then runs the
  whole session.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, replace

POLICIES = ("gradient", "forward")


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
    gradient: object = None          # packed PETSc Vec, or None (objective-only, "forward" policy)
    forward_steps: int = 0
    adjoint_steps: int = 0
    seconds: float = 0.0


class EvaluationCache:
    """J and dJ/dm of ``model`` over the packed controls of ``space``, one entry kept.

    ``checkpointing`` is the :class:`~hpcadj.adjoint.session.Checkpointing` every gradient session
    uses; a cost profile calibrated by the first session is reused by the later ones. Collective.
    """

    def __init__(self, model, space, checkpointing=None, *, policy: str = "gradient", log_dir=None):
        from ..adjoint.session import Checkpointing

        if policy not in POLICIES:
            raise ValueError(f"objective-only policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.model, self.space, self.policy = model, space, policy
        self.comm = model.comm
        self.checkpointing = checkpointing or Checkpointing()
        self.configuration = {"model": model.describe(), "invert": space.names,
                              "codecs": {k: c.spec for k, c in self.checkpointing.codecs().items()}}
        self.entry: Evaluation | None = None
        self.forward_steps = 0      # every forward step evaluated, recomputation included
        self.adjoint_steps = 0
        self.sessions = 0           # checkpointed gradient sessions run
        self.forward_sweeps = 0     # objective-only forward sweeps run ("forward" policy)
        self.hits = 0               # requests answered without computing
        self.requests = {"objective": 0, "gradient": 0}
        #: what a loop without cache pays: n steps per objective-only request, one gradient session's
        #: forward steps (the last one run) per gradient request
        self.naive_forward_steps = 0
        self._session_steps = None
        self.notes: list[str] = []

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
        self.naive_forward_steps += self.model.n_steps or e.forward_steps
        return e

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
        self.drop()
        self.entry = self._gradient(x, key) if gradient else self._forward(x, key)
        return self.entry

    def drop(self) -> None:
        """Forget the entry (its gradient Vec destroyed)."""
        if self.entry is not None and self.entry.gradient is not None:
            self.entry.gradient.destroy()
        self.entry = None

    def _gradient(self, x, key: str) -> Evaluation:
        from ..adjoint.session import GradientSession
        from ..models.base import SolverError

        controls = self.space.unpack(x)
        t0 = time.perf_counter()
        session = GradientSession(self.model, self.checkpointing, controls=controls)
        outcome = session.solve()
        if outcome.status != "complete":
            raise SolverError(f"gradient session {outcome.status}: {outcome.message}")
        if self.checkpointing.costs is None:  # calibrated once, reused by every later session
            self.checkpointing = replace(self.checkpointing, costs=session.planned.profile)
        self.notes.extend(n for n in session.notes if n not in self.notes)
        result = outcome.result
        g = self.space.pack(result.gradient)
        for vec in list(result.gradient.values()) + list(controls.values()):
            vec.destroy()
        self.sessions += 1
        self._session_steps = result.forward_steps
        self.forward_steps += result.forward_steps
        self.adjoint_steps += result.adjoint_steps
        return Evaluation(key, result.J, g, result.forward_steps, result.adjoint_steps,
                          time.perf_counter() - t0)

    def _forward(self, x, key: str) -> Evaluation:
        """J from one forward sweep, accumulated in the driver's order (so bitwise the session's J)."""
        from ..imports import petsc

        model = self.model
        if model.n_steps is None:
            raise ValueError("the 'forward' policy needs a model with a known number of steps")
        controls = self.space.unpack(x)
        t0 = time.perf_counter()
        model.set_controls(controls)
        u = model.initial_state()
        J = 0.0
        J += model.objective(0, u)
        for i in range(model.n_steps):
            u = model.step(i, u)
            J += model.objective(i + 1, u)
            petsc().garbage_cleanup(self.comm)
        u.destroy()
        for vec in controls.values():
            vec.destroy()
        petsc().garbage_cleanup(self.comm)
        self.forward_sweeps += 1
        self.forward_steps += model.n_steps
        return Evaluation(key, J, None, model.n_steps, 0, time.perf_counter() - t0)

    def counts(self) -> dict:
        return {"forward_steps": self.forward_steps, "adjoint_steps": self.adjoint_steps,
                "sessions": self.sessions, "forward_sweeps": self.forward_sweeps, "hits": self.hits,
                "objective_requests": self.requests["objective"], "gradient_requests": self.requests["gradient"],
                "naive_forward_steps": self.naive_forward_steps}
