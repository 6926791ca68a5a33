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


@dataclass
class TaylorResult:
    control: str
    eps: list
    remainders: list
    rates: list

    @property
    def min_rate(self) -> float:
        return min(self.rates)


def taylor_test(stepper, controls, control: str, *, eps0: float = 1e-2, halvings: int = 4,
                seed: int = 1234, gradient: GradientResult | None = None) -> TaylorResult:
    """Remainders |J(m + eps dm) - J(m) - eps <dJ/dm, dm>| for eps0 / 2^k; rate -> 2 when dJ is exact.

    The direction perturbs only ``control``, relative to its size for parameter fields.
    """
    result = gradient or compute_gradient(stepper, controls)
    direction = random_direction(stepper, controls, seed, relative=(control != "u0"))
    dj = result.gradient[control].dot(direction[control])
    eps_list, remainders = [], []
    for k in range(halvings + 1):
        eps = eps0 / 2 ** k
        J = evaluate_objective(stepper, _axpy_controls(controls, eps, direction, [control]))
        eps_list.append(eps)
        remainders.append(abs(J - result.J - eps * dj))
    stepper.set_controls(controls)
    rates = [math.log(remainders[k] / remainders[k + 1], 2) for k in range(halvings)]
    return TaylorResult(control, eps_list, remainders, rates)


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
