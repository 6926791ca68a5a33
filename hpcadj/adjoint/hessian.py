"""Hessian-vector products H v of the objective, checkpointed exactly as gradients are.

H v = d/de grad J(m + e v) at e = 0 is computed forward-over-reverse: a tangent-linear sweep carries
du_i (the states' derivative in direction v) beside u_i, and a second-order adjoint sweep carries
dlam_i beside the first-order lam_i. Both sweeps are those of one *composite* stepper,
:class:`SecondOrderStepper`, whose state is the pair (u_i, du_i) and whose adjoint is the pair
(lam_i, dlam_i). The driver, the plans, the storage levels, compression, asynchronous I/O and restart
run it unchanged: a snapshot holds both fields (the model's fields and the same prefixed ``d_``), so a
plan's budget counts the pair as one (twice as large) state, and H v is bitwise the same under every
plan, as gradients are.

The composite's controls are the model's controls m plus the direction v under the names
``d_<control>``; its "gradient" dict holds dJ/dm under the model's names and (H v) under the ``d_``
names. With ``gauss_newton=True`` the second derivatives of the time step are dropped (the
Gauss-Newton product J_m^T (d^2 J/du^2) J_m v of FWI codes): the second-order adjoint is then the
first-order adjoint step applied to dlam, which every model has.

What a model provides (declared in :class:`hpcadj.models.base.SecondOrderSteps`):
``add_objective_hessian(i, u, du, dlam)`` (both products) and ``hessian_adjoint_step(...)`` (the
exact Newton product). All four built-in models do, for fixed steps. The products' checks (second-order
Taylor remainders, symmetry, gradient differences) are in :mod:`.verify`, beside the gradients'.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd
import weakref

import numpy as np

from ..checkpoint.mixed_plan import mixed_sizes
from ..checkpoint.schedules import Mixed
from ..checkpoint.schedules.storeall import StoreAll, store_all_slots
from ..checkpoint.storage import RamLevel
from ..snapshot import layout_global_bytes
from ..models.base import Stepper
from .data_check import refuse_untrusted_data
from .driver import Driver, GradientResult
from .session import GradientSession

PREFIX = "d_"


class Pair:
    """A composite state (u, du) or adjoint (lam, dlam): two Vecs of the model's state layout."""

    __slots__ = ("u", "d")

    def __init__(self, u, d):
        self.u, self.d = u, d

    def duplicate(self) -> "Pair":
        return Pair(self.u.duplicate(), self.d.duplicate())

    def set(self, value: float) -> None:
        self.u.set(value)
        self.d.set(value)

    def destroy(self) -> None:
        self.u.destroy()
        self.d.destroy()

    def getArray(self, readonly: bool = True):
        """Both Vecs' local values in one new array (what the driver's finiteness and input guards
        read; a copy, never written through)."""
        if not readonly:
            raise ValueError("a Pair's values are read-only through getArray")
        return np.concatenate((self.u.getArray(readonly=True), self.d.getArray(readonly=True)))

    def map(self, fn) -> "Pair":
        """The pair of ``fn(u)`` and ``fn(du)``."""
        return Pair(fn(self.u), fn(self.d))

    def copy(self, out: "Pair | None" = None) -> "Pair":
        if out is None:
            return Pair(self.u.copy(), self.d.copy())
        self.u.copy(out.u)
        self.d.copy(out.d)
        return out


def _zero_like(vec):
    out = vec.duplicate()
    out.set(0.0)
    return out


def supports_newton(model) -> bool:
    """Whether ``model`` offers the exact (Newton) second-order adjoint step."""
    return callable(getattr(model, "hessian_adjoint_step", None))


def check_model(model, gauss_newton: bool) -> None:
    """ValueError (one line) when ``model`` cannot give the asked product."""
    if model.n_steps is None or getattr(model, "adaptive", False):  # no evaluation's step sequence is kept
        raise ValueError(f"{model.name}: Hessian actions need a fixed step count (adaptive steps are not supported)")
    if not callable(getattr(model, "add_objective_hessian", None)):
        raise ValueError(f"{model.name}: no add_objective_hessian(i, u, du, dlam): the model offers no "
                         f"Hessian actions")
    if not gauss_newton and not supports_newton(model):
        raise ValueError(f"{model.name}: no hessian_adjoint_step: only the Gauss-Newton product is available")


class _TrustKey:
    """Stands for a model's composite of one product kind in the data check's memory."""


_TRUST_KEYS = weakref.WeakKeyDictionary()


class NoTangent:
    """The tangent methods of a stepper built for H v, which needs no tangent of its own: they raise."""

    def initial_tangent(self, dcontrols):
        raise NotImplementedError(f"{type(self).__name__} has no tangent of its own")

    def tangent_step(self, i, u, u_next, du, dcontrols):
        raise NotImplementedError(f"{type(self).__name__} has no tangent of its own")


class SecondOrderStepper(NoTangent, Stepper):
    """The model's forward + tangent step as one stepper; its adjoint is the first- and second-order
    adjoint together. Implements the Stepper seam (:mod:`hpcadj.models.base`), so any plan runs it.

    ``direction`` is v (control name -> Vec); it can also come with the controls as ``d_<name>``.
    """

    def __init__(self, model, direction=None, *, gauss_newton: bool = False):
        check_model(model, gauss_newton)
        self.model = model
        self.comm = model.comm
        self.name = model.name
        self.n_steps = model.n_steps
        self.dt = model.dt
        self.gauss_newton = bool(gauss_newton)
        self.adjoint_reads_next = getattr(model, "adjoint_reads_next", True)
        self.names = sorted(model.control_layout())
        self.direction = None if direction is None else {k: direction[k].copy() for k in self.names}

    # -- controls ---------------------------------------------------------------------------
    def composite_controls(self, controls, direction=None) -> dict:
        """The composite's controls: m under the model's names, v under ``d_<name>``."""
        direction = direction if direction is not None else self.direction
        out = {k: controls[k] for k in self.names}
        out.update({PREFIX + k: direction[k] for k in self.names})
        return out

    def default_controls(self):
        controls = self.model.default_controls()
        if self.direction is None:
            direction = {k: _zero_like(v) for k, v in controls.items()}
        else:
            direction = {k: v.copy() for k, v in self.direction.items()}
        return self.composite_controls(controls, direction)

    def set_controls(self, controls):
        self.model.set_controls({k: controls[k] for k in self.names})
        if PREFIX + self.names[0] in controls:
            self.direction = {k: controls[PREFIX + k].copy() for k in self.names}
        if self.direction is None:
            raise ValueError("no direction v: give it to SecondOrderStepper or as d_<control> controls")

    def initial_state(self):
        return Pair(self.model.initial_state(), self.model.initial_tangent(self.direction))

    # -- forward ----------------------------------------------------------------------------
    def step(self, i, u):
        nxt = self.model.step(i, u.u)
        return Pair(nxt, self.model.tangent_step(i, u.u, nxt, u.d, self.direction))

    def objective(self, i, u):
        return self.model.objective(i, u.u)

    def objective_gradient(self, i, u):
        lam = self.model.objective_gradient(i, u.u)
        if lam is None:
            lam = _zero_like(u.u)
        dlam = _zero_like(u.d)
        self.model.add_objective_hessian(i, u.u, u.d, dlam)
        return Pair(lam, dlam)

    def add_objective_gradient(self, i, u, lam):
        self.model.add_objective_gradient(i, u.u, lam.u)
        self.model.add_objective_hessian(i, u.u, u.d, lam.d)

    # -- adjoint ----------------------------------------------------------------------------
    def _split(self, grad):
        return {k: grad[k] for k in self.names}, {k: grad[PREFIX + k] for k in self.names}

    def adjoint_step(self, i, u, u_next, lam_next, grad):
        g, hg = self._split(grad)
        un, dun = (None, None) if u_next is None else (u_next.u, u_next.d)
        if self.gauss_newton:
            lam = self.model.adjoint_step(i, u.u, un, lam_next.u, g)
            dlam = self.model.adjoint_step(i, u.u, un, lam_next.d, hg)
        else:
            lam, dlam = self.model.hessian_adjoint_step(i, u.u, un, u.d, dun, lam_next.u, lam_next.d,
                                                        self.direction, g, hg)
        return Pair(lam, dlam)

    def initial_adjoint(self, lam0, grad):
        g, hg = self._split(grad)
        self.model.initial_adjoint(lam0.u, g)
        self.model.initial_adjoint(lam0.d, hg)

    # -- snapshots --------------------------------------------------------------------------
    def snapshot_layout(self):
        layout = self.model.snapshot_layout()
        return {**layout, **{PREFIX + k: v for k, v in layout.items()}}

    def snapshot(self, u):
        snap = self.model.snapshot(u.u)
        snap.update({PREFIX + k: v for k, v in self.model.snapshot(u.d).items()})
        return snap

    def restore(self, snapshot):
        fields = self.model.snapshot_layout()
        return Pair(self.model.restore({k: snapshot[k] for k in fields}),
                    self.model.restore({k: snapshot[PREFIX + k] for k in fields}))

    def control_layout(self):
        layout = self.model.control_layout()
        return {**layout, **{PREFIX + k: v for k, v in layout.items()}}

    def control_arrays(self, controls):
        plain = self.model.control_arrays({k: controls[k] for k in self.names})
        pref = self.model.control_arrays({k: controls[PREFIX + k] for k in self.names})
        return {**plain, **{PREFIX + k: v for k, v in pref.items()}}

    # -- description ------------------------------------------------------------------------
    def time(self, i):
        return self.model.time(i)

    def describe(self):
        return {**self.model.describe(), "hessian": "gauss-newton" if self.gauss_newton else "newton"}

    def working_set_states(self) -> float:
        """In composite states (two model states): the model's own, the direction's copies and the
        tangent/second-order transients (about two model states)."""
        return 0.5 * self.model.working_set_states() + 1.0 + 0.5 * len(self.names)

    def snapshot_bytes(self) -> int:
        return layout_global_bytes(self.snapshot_layout())

    # -- adjoint data: the model's data of u_i and of du_i ----------------------------------
    @property
    def recomputes_in_adjoint(self) -> bool:
        return bool(getattr(self.model, "recomputes_in_adjoint", False))

    def adjoint_data_layout(self):
        """The model's adjoint data and the same of the tangent (``d_`` names), or None.

        The second-order step and the objective's second derivative read of du_i what the first-order
        step reads of u_i (wave: the current fields u^i and du^i), so where the model's data are a part
        of its state the composite's are that part of both. A model whose adjoint step re-runs its step
        for its data (RK stages) has tangent stages no capture of du_i gives: the composite declares none.
        """
        declared = getattr(self.model, "adjoint_data_layout", None)
        layout = declared() if declared is not None else None
        if layout is None or self.recomputes_in_adjoint:
            return None
        return {**layout, **{PREFIX + k: v for k, v in layout.items()}}

    def adjoint_data(self, i, u, u_next):
        data = self.model.adjoint_data(i, u.u, None if u_next is None else u_next.u)
        tangent = self.model.adjoint_data(i, u.d, None if u_next is None else u_next.d)
        return {**data, **{PREFIX + k: v for k, v in tangent.items()}}

    @property
    def data_trust_key(self):
        """What a passed data check is remembered by (:func:`~.data_check.refuse_untrusted_data`): the
        composite's data are the model's code, not v's, so one object per model object and product kind,
        living as long as the model, and each product of it is not checked again."""
        kind = "gauss-newton" if self.gauss_newton else "newton"
        try:
            tokens = _TRUST_KEYS.setdefault(self.model, {})
        except TypeError:  # a model that takes no weak reference: checked per composite
            return self
        return tokens.setdefault(kind, _TrustKey())

    def adjoint_data_state(self, i, data):
        """(u_i, du_i) stand-ins, each the model's from its half of the data."""
        fields = self.model.adjoint_data_layout()
        return Pair(self.model.adjoint_data_state(i, {k: data[k] for k in fields}),
                    self.model.adjoint_data_state(i, {k: data[PREFIX + k] for k in fields}))


def data_composite(model, controls, seed: int = 43):
    """(the composite of ``model``'s exact product, or Gauss-Newton's without one, its controls with a
    random direction) when the model offers products and the composite declares adjoint data, else
    None: what ``hpcadj check`` checks beside the model's own data."""
    try:
        check_model(model, gauss_newton=not supports_newton(model))
    except ValueError:
        return None
    rng = np.random.default_rng(seed + model.comm.rank)
    direction = {}
    for name in sorted(model.control_layout()):
        direction[name] = controls[name].duplicate()
        direction[name].getArray()[...] = rng.uniform(-0.1, 0.1, controls[name].getLocalSize())
    stepper = SecondOrderStepper(model, direction, gauss_newton=not supports_newton(model))
    if stepper.adjoint_data_layout() is None:
        return None
    return stepper, stepper.composite_controls(controls)


@dataclass
class HessianResult:
    """J, dJ/dm and H v (control name -> Vec each) at the controls m, for direction v."""

    J: float
    gradient: dict
    hessian: dict
    result: GradientResult

    @property
    def forward_steps(self) -> int:
        return self.result.forward_steps


def _result(stepper, result: GradientResult) -> HessianResult:
    g, hg = stepper._split(result.gradient)
    return HessianResult(J=result.J, gradient=g, hessian=hg, result=result)


def _store_all(stepper, controls):
    """RAM levels and plan of store-all: every step's adjoint data where the composite declares data
    smaller than its state (wave: u^i and du^i, half the pair), checked first; else every pair."""
    n, layout = stepper.n_steps, stepper.snapshot_layout()
    if stepper.adjoint_data_layout() is not None and n >= 2:
        r, d = mixed_sizes(stepper)
        if d < r:
            refuse_untrusted_data(stepper, controls, "store-all")
            unit = gcd(r, d)
            return [RamLevel(1, layout)], Mixed(n, [(n - 1) * d // unit], r // unit, d // unit)
    slots = store_all_slots(n)
    return [RamLevel(slots, layout)], StoreAll(n, [slots])


def hessian_action(model, controls, direction, *, schedule=None, levels=None, gauss_newton: bool = False,
                   telemetry=None) -> HessianResult:
    """J, dJ/dm and H v at ``controls`` for ``direction`` (control name -> Vec) in one forward +
    reverse sweep of the composite stepper; ``schedule`` and ``levels`` as for a gradient's
    :class:`~.driver.Driver` (their snapshots hold the pair), by default store-all in RAM (steps' adjoint data where the composite declares them)."""
    stepper = SecondOrderStepper(model, direction, gauss_newton=gauss_newton)
    composite = stepper.composite_controls(controls)
    own_levels = schedule is None
    if own_levels:
        levels, schedule = _store_all(stepper, composite)
    try:
        result = Driver(stepper, levels, telemetry).run(schedule, composite)
    finally:
        if own_levels:
            for level in levels:
                level.close()
    return _result(stepper, result)


class HessianSession:
    """H v under a :class:`~.session.GradientSession`'s checkpointing (budgets, levels, plans,
    compression, restart, logs): each :meth:`hessian_action` is one composite gradient run.

    ``session_options`` go to every GradientSession (``restart``, ``log_dir``, ...);
    ``last_outcome`` is the last run's :class:`~.session.Outcome` (its ``info``: steps, memory, ...).
    """

    def __init__(self, model, checkpointing=None, *, gauss_newton: bool = False, **session_options):
        check_model(model, gauss_newton)
        self.model = model
        self.checkpointing = checkpointing
        self.gauss_newton = gauss_newton
        self.session_options = session_options
        self.last_session = self.last_outcome = None

    def hessian_action(self, controls, v) -> HessianResult:
        """J, dJ/dm and H v at ``controls`` (name -> Vec) for direction ``v`` (name -> Vec)."""
        stepper = SecondOrderStepper(self.model, v, gauss_newton=self.gauss_newton)
        session = GradientSession(stepper, self.checkpointing, controls=stepper.composite_controls(controls, v),
                                  **self.session_options)
        self.last_session = session
        outcome = self.last_outcome = session.solve()
        if outcome.status != "complete":
            raise RuntimeError(outcome.message)
        return _result(stepper, outcome.result)


def owned_arrays(model, vecs: dict) -> dict:
    """This rank's owned blocks of control-shaped Vecs (for bitwise comparisons)."""
    return {k: np.array(v) for k, v in model.control_arrays(vecs).items()}
