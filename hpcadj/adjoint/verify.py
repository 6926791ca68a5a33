"""Derivative verification: a gradient's Taylor remainders and tangent-linear/adjoint dot product, and
a Hessian-vector product's second-order Taylor remainders (the same loop), symmetry and agreement
with central differences of gradients."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checkpoint.schedules.storeall import StoreAll, store_all_slots
from ..checkpoint.storage import RamLevel
from .driver import Driver, GradientResult
from .hessian import HessianResult, hessian_action
from ..imports import petsc
from .products import settled_rss
from .session import compute_gradient_checkpointed


def compute_gradient(stepper, controls, schedule=None, levels=None, telemetry=None) -> GradientResult:
    """J and dJ/d(controls); by default every state is kept in RAM (store-all).

    An adaptive model whose step count is not decided yet (``n_steps`` None) needs an online plan:
    :class:`~hpcadj.adjoint.session.GradientSession` chooses one.
    """
    if schedule is None:
        if stepper.n_steps is None:
            raise ValueError("the model's step count is decided as it runs (adaptive steps): store-all "
                             "needs n; use GradientSession, which runs an online plan")
        slots = store_all_slots(stepper.n_steps)
        levels = [RamLevel(slots, stepper.snapshot_layout())]
        schedule = StoreAll(stepper.n_steps, [slots])
    try:
        return Driver(stepper, levels, telemetry).run(schedule, controls)
    finally:
        for level in levels:
            level.close()


def _free_dropped(stepper) -> None:
    """Destroy the states a sweep dropped: petsc4py parks a parallel Vec whose last reference went on
    its communicator's garbage list until ``PETSc.garbage_cleanup`` (collective, as the sweep is)."""
    petsc().garbage_cleanup(stepper.comm)


def evaluate_objective(stepper, controls) -> float:
    """J alone: one forward sweep, nothing stored (each dropped state freed as the sweep goes)."""
    stepper.set_controls(controls)
    u = stepper.initial_state()
    J = stepper.objective(0, u)
    for i in range(stepper.n_steps):
        u = stepper.step(i, u)
        J += stepper.objective(i + 1, u)
        _free_dropped(stepper)
    return J


def random_direction(stepper, controls, seed: int, relative: bool = False) -> dict:
    """A perturbation of every control, identical for any rank count (drawn on the global grid)."""
    layouts = stepper.control_layout()
    rng = np.random.default_rng(seed)
    direction = {}
    for name in sorted(controls):
        layout = layouts[name]
        block = rng.uniform(-1.0, 1.0, size=layout.global_shape)[layout.slices]
        vec = controls[name].duplicate()
        owned = vec.getArray().reshape(layout.shape)
        owned[...] = block
        if relative:
            owned *= controls[name].getArray(readonly=True).reshape(layout.shape)
        direction[name] = vec
    return direction


def _axpy_controls(controls, eps, direction, names):
    out = {name: vec.copy() for name, vec in controls.items()}
    for name in names:
        out[name].axpy(eps, direction[name])
    return out


#: a remainder within this many units of J's round-off (or of its solvers' relative tolerance) is noise
NOISE_UNITS = 10.0
#: halvings a Taylor test adds past those asked while its rate has not reached the rate it needs
EXTRA_HALVINGS = 6


def solver_tolerance(stepper) -> float:
    """The relative tolerance J's solves are made to (a model's ``ksp_rtol``/``snes_rtol``, the larger;
    0 for an explicit model), or the machine's epsilon where that is larger."""
    tol = max(float(getattr(stepper, name, 0.0) or 0.0) for name in ("ksp_rtol", "snes_rtol"))
    return max(tol, float(np.finfo(float).eps))


def noise_floor(stepper, J: float) -> float:
    """What an evaluation of J cannot resolve: :data:`NOISE_UNITS` times its solvers' tolerance
    (or round-off) times |J|. A Taylor remainder below it says nothing about a rate."""
    return NOISE_UNITS * solver_tolerance(stepper) * abs(J)


@dataclass
class TaylorResult:
    """A Taylor test's steps, remainders and rates; ``floor`` the noise below which a remainder is
    round-off or solver tolerance (:func:`noise_floor`)."""

    control: str | None
    eps: list
    remainders: list
    rates: list
    floor: float = 0.0

    @property
    def min_rate(self) -> float:
        return min(self.rates)

    @property
    def resolved(self) -> list:
        """The rates of the step pairs whose remainders both stand above the noise floor."""
        return [r for r, a, b in zip(self.rates, self.remainders, self.remainders[1:]) if min(a, b) > self.floor]

    @property
    def rate(self) -> float:
        """The asymptotic rate: the last resolved pair's (inf when none is: the expansion is exact to
        within the noise, so no step could show a wrong term)."""
        return self.resolved[-1] if self.resolved else math.inf

    @property
    def limited(self) -> str | None:
        """Why some remainders say nothing about the rate (None when all are resolved)."""
        if len(self.resolved) == len(self.rates):
            return None
        return (f"remainders below {self.floor:.1e} are round-off or solver tolerance (|J| times "
                f"{NOISE_UNITS:g} x the solver's relative tolerance): those steps are left out of the rate")


def taylor_remainders(evaluate, expansion, *, eps0: float, halvings: int, floor: float = 0.0,
                      need: float | None = None, control: str | None = None) -> TaylorResult:
    """The one Taylor loop: |evaluate(e) - expansion(e)| for e = eps0 / 2^k, k = 0 .. ``halvings``.
    With ``need``, it halves on (at most :data:`EXTRA_HALVINGS` more) while the last rate is below it
    and the remainders are still well above ``floor``: a first step too large for the asymptotic
    regime is the problem's scale, not a wrong derivative."""
    eps, rem = [], []
    k = 0
    while True:
        e = eps0 / 2 ** k
        eps.append(e)
        rem.append(abs(evaluate(e) - expansion(e)))
        k += 1
        if k <= halvings:
            continue
        if need is None or k > halvings + EXTRA_HALVINGS or _rate(rem[-2], rem[-1]) >= need:
            break
        if rem[-1] <= 4 * floor:  # the next halving would reach the noise
            break
    rates = [_rate(a, b) for a, b in zip(rem, rem[1:])]
    return TaylorResult(control, eps, rem, rates, floor)


def _rate(a: float, b: float) -> float:
    return math.log(a / b, 2) if a > 0 and b > 0 else (math.inf if b == 0 else -math.inf)


def taylor_test(stepper, controls, control: str, *, eps0: float = 1e-2, halvings: int = 4,
                seed: int = 1234, gradient: GradientResult | None = None, need: float | None = None) -> TaylorResult:
    """Remainders |J(m + eps dm) - J(m) - eps <dJ/dm, dm>| for eps0 / 2^k; rate -> 2 when dJ is exact.

    The direction perturbs only ``control``, relative to its size for parameter fields. ``need``:
    halve on while the rate is below it (see :func:`taylor_remainders`).
    """
    result = gradient or compute_gradient(stepper, controls)
    direction = random_direction(stepper, controls, seed, relative=(control != "u0"))
    dj = result.gradient[control].dot(direction[control])
    out = taylor_remainders(lambda e: evaluate_objective(stepper, _axpy_controls(controls, e, direction, [control])),
                            lambda e: result.J + e * dj, eps0=eps0, halvings=halvings,
                            floor=noise_floor(stepper, result.J), need=need, control=control)
    stepper.set_controls(controls)
    return out


#: the dot-product test's allowance, in units of steps x solver tolerance (or round-off) x sum |g_k| |dm_k|
DOT_UNITS = 10.0


@dataclass
class DotProductResult:
    """The tangent-linear and adjoint directional derivatives, and what their difference may be.

    Each step's solves (or, for an explicit model, its arithmetic) are exact to a relative
    ``unit`` (:func:`solver_tolerance`), and their errors add up over the ``steps``, relative to
    ``scale`` = sum over the controls of |dJ/dm_k| |dm_k| (what the dot products are sums of; a random
    direction's cancellation makes the dot product itself smaller). :attr:`limit` allows
    :data:`DOT_UNITS` times ``steps x unit x scale``, as a mismatch relative to the larger derivative:
    on the shipped models the measured mismatch stays below 0.2 of those units (docs/models.md).
    """

    tangent: float
    adjoint: float
    scale: float = 0.0
    steps: int = 1
    unit: float = float(np.finfo(float).eps)

    @property
    def relative_mismatch(self) -> float:
        return abs(self.tangent - self.adjoint) / max(abs(self.tangent), abs(self.adjoint), 1e-300)

    @property
    def limit(self) -> float:
        """The largest relative mismatch round-off and solver tolerance explain at this problem's size."""
        allowed = DOT_UNITS * max(self.steps, 1) * self.unit * self.scale
        return allowed / max(abs(self.tangent), abs(self.adjoint), 1e-300)


def tangent_linear(stepper, controls, dcontrols) -> float:
    """dJ in direction ``dcontrols`` by the tangent-linear model (one forward sweep)."""
    stepper.set_controls(controls)
    u = stepper.initial_state()
    du = stepper.initial_tangent(dcontrols)

    def observe(i, u, du):
        g = stepper.objective_gradient(i, u)
        return 0.0 if g is None else g.dot(du)

    dJ = observe(0, u, du)
    for i in range(stepper.n_steps):
        u_next = stepper.step(i, u)
        du = stepper.tangent_step(i, u, u_next, du, dcontrols)
        u = u_next
        dJ += observe(i + 1, u, du)
        _free_dropped(stepper)
    return dJ


def dot_product_test(stepper, controls, *, seed: int = 4321,
                     gradient: GradientResult | None = None) -> DotProductResult:
    """<dJ/dm, dm> from the adjoint against the tangent-linear dJ(dm), all controls perturbed at once."""
    result = gradient or compute_gradient(stepper, controls)
    direction = random_direction(stepper, controls, seed, relative=False)
    adjoint = sum(result.gradient[name].dot(direction[name]) for name in sorted(direction))
    scale = sum(result.gradient[name].norm() * direction[name].norm() for name in sorted(direction))
    tangent = tangent_linear(stepper, controls, direction)
    return DotProductResult(tangent=tangent, adjoint=adjoint, scale=scale, steps=stepper.n_steps or 1,
                            unit=solver_tolerance(stepper))


# -- Hessian-vector products ------------------------------------------------------------------
def controls_dot(a: dict, b: dict) -> float:
    """The dot product over all controls together (name -> Vec each)."""
    return sum(a[k].dot(b[k]) for k in sorted(a))


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
    (:func:`taylor_remainders`, the gradients' loop; ``need``: halve on until the rate shows)."""
    hess = hess or hessian_action(model, controls, direction)
    gv, vhv = controls_dot(hess.gradient, direction), controls_dot(hess.hessian, direction)
    out = taylor_remainders(lambda e: evaluate_objective(model, _axpy_controls(controls, e, direction, direction)),
                            lambda e: hess.J + e * gv + 0.5 * e * e * vhv, eps0=eps0, halvings=halvings,
                            floor=noise_floor(model, hess.J), need=need)
    model.set_controls(controls)
    return out


def symmetry_test(model, controls, v, w, *, gauss_newton: bool = False) -> tuple[float, float]:
    """(<H v, w>, <v, H w>): equal for an exact H."""
    hv = hessian_action(model, controls, v, gauss_newton=gauss_newton).hessian
    hw = hessian_action(model, controls, w, gauss_newton=gauss_newton).hessian
    return controls_dot(hv, w), controls_dot(v, hw)


def gradient_difference(model, controls, direction, eps: float, checkpointing=None) -> dict:
    """(g(m + e v) - g(m - e v)) / 2e, control name -> Vec: H v to O(e^2). The two gradients are
    store-all, or checkpointed sessions under ``checkpointing`` (a memory budget, say)."""
    def gradient(at):
        if checkpointing is None:
            return compute_gradient(model, at).gradient
        settled_rss(model.comm)  # what earlier work left pooled is no part of a budget's baseline
        return compute_gradient_checkpointed(model, checkpointing, controls=at).gradient

    plus = gradient(_axpy_controls(controls, eps, direction, direction))
    minus = gradient(_axpy_controls(controls, -eps, direction, direction))
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
    gnorm, hnorm = math.sqrt(controls_dot(hess.gradient, hess.gradient)), math.sqrt(controls_dot(hess.hessian, hess.hessian))
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
