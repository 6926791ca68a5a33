"""Gradient verification: Taylor remainder convergence and the tangent-linear/adjoint dot product."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checkpoint.schedules.storeall import StoreAll, store_all_slots
from ..checkpoint.storage import RamLevel
from .driver import Driver, GradientResult


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
    from ..imports import petsc

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


@dataclass
class DotProductResult:
    tangent: float
    adjoint: float

    @property
    def relative_mismatch(self) -> float:
        return abs(self.tangent - self.adjoint) / max(abs(self.tangent), abs(self.adjoint), 1e-300)


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
    tangent = tangent_linear(stepper, controls, direction)
    return DotProductResult(tangent=tangent, adjoint=adjoint)
