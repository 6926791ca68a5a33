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
exact Newton product). All four built-in models do, for fixed steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checkpoint.schedules.storeall import StoreAll, store_all_slots
from ..checkpoint.storage import RamLevel
from ..snapshot import layout_global_bytes
from ..models.base import Stepper
from .driver import Driver, GradientResult
from .verify import evaluate_objective, noise_floor, random_direction, solver_tolerance, taylor_remainders

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


class SecondOrderStepper(Stepper):
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

    # -- tangent of the composite (not needed for H v) ---------------------------------------
    def initial_tangent(self, dcontrols):
        raise NotImplementedError("the composite stepper has no tangent of its own")

    def tangent_step(self, i, u, u_next, du, dcontrols):
        raise NotImplementedError("the composite stepper has no tangent of its own")

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


def hessian_action(model, controls, direction, *, schedule=None, levels=None, gauss_newton: bool = False,
                   telemetry=None) -> HessianResult:
    """J, dJ/dm and H v at ``controls`` for ``direction`` (control name -> Vec) in one forward +
    reverse sweep of the composite stepper; ``schedule`` and ``levels`` as for a gradient's
    :class:`~.driver.Driver` (their snapshots hold the pair), by default store-all in RAM."""
    stepper = SecondOrderStepper(model, direction, gauss_newton=gauss_newton)
    own_levels = schedule is None
    if own_levels:
        slots = store_all_slots(stepper.n_steps)
        levels = [RamLevel(slots, stepper.snapshot_layout())]
        schedule = StoreAll(stepper.n_steps, [slots])
    try:
        result = Driver(stepper, levels, telemetry).run(schedule, stepper.composite_controls(controls))
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
        from .session import GradientSession

        stepper = SecondOrderStepper(self.model, v, gauss_newton=self.gauss_newton)
        session = GradientSession(stepper, self.checkpointing, controls=stepper.composite_controls(controls, v),
                                  **self.session_options)
        self.last_session = session
        outcome = self.last_outcome = session.solve()
        if outcome.status != "complete":
            raise RuntimeError(outcome.message)
        return _result(stepper, outcome.result)


# -- verification ---------------------------------------------------------------------------
def _dot(a: dict, b: dict) -> float:
    return sum(a[k].dot(b[k]) for k in sorted(a))


def _shifted(controls, eps, direction):
    out = {k: v.copy() for k, v in controls.items()}
    for k in direction:
        out[k].axpy(eps, direction[k])
    return out


def scaled_direction(model, controls, seed: int, scale: dict | None = None) -> dict:
    """A random direction over every control, each relative to its control's size (u0-like
    controls, possibly zero, get absolute entries), times ``scale[name]`` if given."""
    direction = random_direction(model, controls, seed, relative=False)
    for name, vec in direction.items():
        size = controls[name].norm() / math.sqrt(max(controls[name].getSize(), 1))
        factor = size if size > 0 else 1.0
        vec.scale(factor * (scale or {}).get(name, 1.0))
    return direction


def second_order_taylor_test(model, controls, direction, *, eps0: float = 1e-2, halvings: int = 4,
                             hess: HessianResult | None = None, need: float | None = None):
    """|J(m + e v) - J(m) - e <g, v> - e^2/2 <v, H v>| for e = eps0 / 2^k: rate -> 3 when H v is exact
    (:func:`~.verify.taylor_remainders`, the gradients' loop; ``need``: halve on until the rate shows)."""
    hess = hess or hessian_action(model, controls, direction)
    gv, vhv = _dot(hess.gradient, direction), _dot(hess.hessian, direction)
    out = taylor_remainders(lambda e: evaluate_objective(model, _shifted(controls, e, direction)),
                            lambda e: hess.J + e * gv + 0.5 * e * e * vhv, eps0=eps0, halvings=halvings,
                            floor=noise_floor(model, hess.J), need=need)
    model.set_controls(controls)
    return out


def symmetry_test(model, controls, v, w, *, gauss_newton: bool = False) -> tuple[float, float]:
    """(<H v, w>, <v, H w>): equal for an exact H."""
    hv = hessian_action(model, controls, v, gauss_newton=gauss_newton).hessian
    hw = hessian_action(model, controls, w, gauss_newton=gauss_newton).hessian
    return _dot(hv, w), _dot(v, hw)


def gradient_difference(model, controls, direction, eps: float, checkpointing=None) -> dict:
    """(g(m + e v) - g(m - e v)) / 2e, control name -> Vec: H v to O(e^2). The two gradients are
    store-all, or checkpointed sessions under ``checkpointing`` (a memory budget, say)."""
    from .session import compute_gradient_checkpointed
    from .verify import compute_gradient

    def gradient(at):
        if checkpointing is None:
            return compute_gradient(model, at).gradient
        return compute_gradient_checkpointed(model, checkpointing, controls=at).gradient

    plus = gradient(_shifted(controls, eps, direction))
    minus = gradient(_shifted(controls, -eps, direction))
    out = {}
    for k in plus:
        out[k] = plus[k].copy()
        out[k].axpy(-1.0, minus[k])
        out[k].scale(1.0 / (2.0 * eps))
    model.set_controls(controls)
    return out


@dataclass
class DifferenceCheck:
    """H v against central gradient differences at step pairs (e, e / 2), the steps growing 4x a rung
    until the errors fall at the rate truncation gives: ``eps`` and ``errors`` per rung tried,
    ``rate`` the last rung's, ``noise`` the solver-tolerance bound on the last rung's smaller step
    (:func:`difference_check`), ``limited`` why no rung showed the rate, when noise explains it."""

    eps: list
    errors: list
    rate: float
    noise: float
    passed: bool
    limited: str | None = None


#: rungs of step pairs a gradient-difference check tries, each step 4x the last
DIFFERENCE_RUNGS = 4


def difference_check(model, controls, direction, hess: HessianResult, *, eps0: float, need: float,
                     floor: float, checkpointing=None) -> DifferenceCheck:
    """Whether H v matches (g(m + e v) - g(m - e v)) / 2e. A pair passes when its errors fall at rate
    >= ``need`` or are <= ``floor``. An error e(e) also holds the gradients' own error, the solvers'
    relative tolerance t times ||g||, divided by 2e: ``noise`` = NOISE_UNITS t ||g|| / (2 e ||H v||)
    grows as e shrinks, so the steps are chosen from the problem: from ``eps0`` up by 4x a rung (at
    most :data:`DIFFERENCE_RUNGS`) until truncation shows its rate. When none does and every error is
    within that noise, the check is limited by the solver tolerance, not failed."""
    from .verify import NOISE_UNITS

    gnorm, hnorm = math.sqrt(_dot(hess.gradient, hess.gradient)), math.sqrt(_dot(hess.hessian, hess.hessian))
    tol = solver_tolerance(model)
    eps, errors, rate, noise, within = [], [], -math.inf, math.inf, []
    for k in range(DIFFERENCE_RUNGS):
        e = eps0 * 4 ** k
        pair = [relative_difference(gradient_difference(model, controls, direction, x, checkpointing), hess.hessian)
                for x in (e, 0.5 * e)]
        eps.append([e, 0.5 * e])
        errors.append(pair)
        rate = math.log2(pair[0] / pair[1]) if pair[1] > 0 else math.inf
        noise = NOISE_UNITS * tol * gnorm / (e * max(hnorm, 1e-300))  # at the pair's smaller step
        if rate >= need or pair[0] <= floor:
            return DifferenceCheck(eps, errors, rate, noise, True)
        if min(pair) <= noise:
            within.append((min(pair), noise, 0.5 * e))
    if within:
        error, bound, step = within[0]
        return DifferenceCheck(eps, errors, rate, noise, True, limited=(
            f"limited by the solver tolerance: the error {error:.1e} at eps {step:.2g} is within the gradients' "
            f"own error over 2 eps ({bound:.1e}), and no larger step shows the O(eps^2) rate"))
    return DifferenceCheck(eps, errors, rate, noise, False)


def relative_difference(a: dict, b: dict) -> float:
    """||a - b|| / ||b|| over all controls together."""
    num = den = 0.0
    for k in a:
        d = a[k].copy()
        d.axpy(-1.0, b[k])
        num += d.norm() ** 2
        den += b[k].norm() ** 2
    return math.sqrt(num) / max(math.sqrt(den), 1e-300)


def owned_arrays(model, vecs: dict) -> dict:
    """This rank's owned blocks of control-shaped Vecs (for bitwise comparisons)."""
    return {k: np.array(v) for k, v in model.control_arrays(vecs).items()}
