"""The problem TAO solves: f, g and (f, g) at TAO's packed points, and the solver object around them.

TAO steps in packed controls (``y = m / s`` under a :class:`~.space.Scaling`); every request
becomes an evaluation at the model's controls m through the evaluations' cache, plus the Tikhonov
term, and after each one the stop check is polled (it raises :class:`~.driver.StopInversion`).
"""

from __future__ import annotations

import math

from ..models.base import SolverError
from ..imports import petsc


class Trials:
    """Evaluations as TAO sees them: a solver that fails at a control after the start's evaluation
    succeeded (a line-search trial that made κ negative, say) is an infinite objective there, so TAO
    backtracks; a failure at the start is the configuration's and is raised."""

    def __init__(self, cache):
        self.cache, self.started, self.failed = cache, False, 0

    def evaluate(self, request, x):
        """``request(x)``'s Evaluation, or None for a failed trial (agreed: a model's solver failure
        is raised on every rank alike)."""
        try:
            e = request(x)
        except SolverError:
            if not self.started:
                raise
            self.cache.drop()
            self.failed += 1
            return None
        self.started = True
        return e


class TaoProblem:
    """J(m) + R(m) and its gradient at TAO's points: ``cache`` evaluates J (``objective``,
    ``gradient``), ``reg`` is R, ``scale`` the optional scaling, ``stop`` the check polled after
    every request."""

    def __init__(self, space, cache, reg, scale, stop):
        self.space, self.cache, self.reg, self.scale, self.stop = space, cache, reg, scale, stop
        self.trials = Trials(cache)
        self._m = space.new() if scale is not None else None

    def physical(self, x):
        """TAO's point as the model's controls m (s ⊙ y under a scaling, in a work vector)."""
        return self.scale.to_m(x, self._m) if self.scale is not None else x

    def controls(self, x) -> dict:
        """TAO's point as new control Vecs by name."""
        return self.space.unpack(self.physical(x))

    def objective(self, tao, x) -> float:
        m = self.physical(x)
        e = self.trials.evaluate(self.cache.objective, m)
        f = e.J + self.reg.value(m) if e is not None else math.inf
        self.stop()
        return f

    def gradient(self, tao, x, g) -> None:
        self._gradient_into(x, g)
        self.stop()

    def objective_gradient(self, tao, x, g) -> float:
        f = self._gradient_into(x, g)
        self.stop()
        return f

    def _gradient_into(self, x, g) -> float:
        """g = the gradient at TAO's point x (in y under a scaling); returns the objective there."""
        m = self.physical(x)
        e = self.trials.evaluate(self.cache.gradient, m)
        if e is None:  # a failed trial: TAO backtracks from an infinite objective
            g.set(math.nan)
            return math.inf
        e.gradient.copy(g)
        self.reg.add_gradient(m, g)
        if self.scale is not None:
            self.scale.gradient(g)
        return e.J + self.reg.value(m)

    def tao(self, comm, tao_type: str, x):
        """A TAO of ``tao_type`` on ``comm`` asking this problem for f and g, starting at ``x``."""
        tao = petsc().TAO().create(comm=comm)
        tao.setType(tao_type)
        tao.setObjective(self.objective)
        tao.setGradient(self.gradient, self.space.new())
        tao.setObjectiveGradient(self.objective_gradient, self.space.new())
        tao.setSolution(x)
        return tao

    def set_bounds(self, tao, bounds: dict) -> None:
        """``bounds`` (control -> (low, high), None for none) as TAO's variable bounds, in y."""
        PETSc = petsc()
        lower = self.space.fill({k: v[0] for k, v in bounds.items() if v[0] is not None}, PETSc.NINFINITY)
        upper = self.space.fill({k: v[1] for k, v in bounds.items() if v[1] is not None}, PETSc.INFINITY)
        if self.scale is not None:
            self.scale.to_y(lower)
            self.scale.to_y(upper)
        tao.setVariableBounds((lower, upper))
