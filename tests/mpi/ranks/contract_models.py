"""User-style Steppers for the contract checker and the run guards: one that keeps the contract and
one per way of breaking it, written from docs/api.md and README's example (public API only)."""

from __future__ import annotations

import numpy as np

from hpcadj.models.base import Stepper
from hpcadj.models.dmda import Grid


class Reaction(Stepper):
    """Explicit Euler for u_t = Laplacian(u) - a(x) u, u = 0 on the boundary; J = 1/2 |u_n|^2."""

    name = "reaction"

    def __init__(self, comm, grid=(12, 10), n_steps=6, dt=2e-4, rate=2.0):
        self.comm, self.n_steps, self.dt, self.rate = comm, n_steps, dt, rate
        self.grid = Grid(comm, grid)
        self.h = self.grid.spacing()

    def default_controls(self):
        y, x = self.grid.node_coordinates()
        u0 = self.grid.vec_from(np.sin(np.pi * x) * np.sin(np.pi * y) + 0.3 * np.sin(2 * np.pi * x))
        a = self.grid.vec_from(self.rate + 0.5 * x + 0.25 * y)
        return {"u0": u0, "a": a}

    def set_controls(self, controls):
        self.controls = {name: vec.copy() for name, vec in controls.items()}

    def initial_state(self):
        return self.controls["u0"].copy()

    def laplacian(self, u):
        padded = self.grid.padded(u)
        centre = padded[self.grid.inner]
        return sum((padded[nb] - centre) / self.h[axis] ** 2 for axis, _, nb, _ in self.grid.neighbours())

    def step(self, i, u):
        a, ui = self.grid.owned(self.controls["a"]), self.grid.owned(u)
        return self.grid.vec_from(ui + self.dt * (self.laplacian(u) - a * ui))

    def objective(self, i, u):
        if i != self.n_steps:
            return 0.0
        return self.comm.allreduce(0.5 * float(np.sum(self.grid.owned(u) ** 2)))

    def objective_gradient(self, i, u):
        return u.copy() if i == self.n_steps else None

    def adjoint_step(self, i, u, u_next, lam_next, grad):
        a, lam = self.grid.owned(self.controls["a"]), self.grid.owned(lam_next)
        self.grid.owned(grad["a"])[...] -= self.dt * self.grid.owned(u) * lam
        return self.grid.vec_from(lam + self.dt * (self.laplacian(lam_next) - a * lam))

    def initial_adjoint(self, lam0, grad):
        grad["u0"].axpy(1.0, lam0)

    def initial_tangent(self, dcontrols):
        return dcontrols["u0"].copy()

    def tangent_step(self, i, u, u_next, du, dcontrols):
        a, da = self.grid.owned(self.controls["a"]), self.grid.owned(dcontrols["a"])
        dui, ui = self.grid.owned(du), self.grid.owned(u)
        return self.grid.vec_from(dui + self.dt * (self.laplacian(du) - a * dui - da * ui))

    def snapshot_layout(self):
        return {"u": self.grid.layout()}

    def snapshot(self, u):
        return {"u": self.grid.owned_view(u)}

    def restore(self, snapshot):
        return self.grid.vec_from(snapshot["u"])

    def control_layout(self):
        return {"u0": self.grid.layout(), "a": self.grid.layout()}

    def control_arrays(self, controls):
        return {name: self.grid.owned(vec).copy() for name, vec in controls.items()}

    def describe(self):
        return {"model": self.name, "steps": self.n_steps, "dt": self.dt, "rate": self.rate,
                "grid": "x".join(map(str, self.grid.global_shape[::-1]))}

    def working_set_states(self):
        return 4.0  # the padded copy, the Laplacian's sum and temporaries, the controls' copies


class ScalesInput(Reaction):
    """step() uses its input as scratch: the result is right, but u_i is halved in place."""

    def step(self, i, u):
        out = super().step(i, u)
        u.scale(0.5)
        return out


class Counter(Reaction):
    """step() has hidden state: a call counter that nudges every result."""

    calls = 0

    def step(self, i, u):
        self.calls += 1
        out = super().step(i, u)
        self.grid.owned(out)[...] *= 1.0 + 1e-12 * self.calls
        return out


class CachedGuess(Reaction):
    """step() keeps its last output and lets it leak into the next one (a reused Krylov guess)."""

    cache = None

    def step(self, i, u):
        out = super().step(i, u)
        if self.cache is not None:
            self.grid.owned(out)[...] += 1e-14 * self.cache
        self.cache = self.grid.owned(out).copy()
        return out


class WrongParameterAdjoint(Reaction):
    """adjoint_step adds dJ/da with the wrong sign: not the transpose of tangent_step."""

    def adjoint_step(self, i, u, u_next, lam_next, grad):
        before = self.grid.owned(grad["a"]).copy()
        lam = super().adjoint_step(i, u, u_next, lam_next, grad)
        self.grid.owned(grad["a"])[...] = 2 * before - self.grid.owned(grad["a"])
        return lam


class SameDescribe(Reaction):
    """describe() does not change when the constructor's ``rate`` does."""

    def describe(self):
        return {"model": self.name, "steps": self.n_steps}


class Greedy(Reaction):
    """Declares half a state of working set and holds 40 state-sized scratch arrays."""

    def set_controls(self, controls):
        super().set_controls(controls)
        self.scratch = [np.ones(self.grid.shape) for _ in range(40)]

    def working_set_states(self):
        return 0.5


class Blows(Reaction):
    """A state becomes infinite at step ``bad`` of the first sweep (an overflow)."""

    bad = 3

    def step(self, i, u):
        out = super().step(i, u)
        if i + 1 == self.bad and self.comm.rank == self.comm.size - 1:
            self.grid.owned(out)[..., 0] = np.inf
        return out


class NanAdjoint(Reaction):
    """lambda becomes NaN at adjoint step 2 on the last rank."""

    def adjoint_step(self, i, u, u_next, lam_next, grad):
        lam = super().adjoint_step(i, u, u_next, lam_next, grad)
        if i == 2 and self.comm.rank == self.comm.size - 1:
            self.grid.owned(lam)[..., 0] = np.nan
        return lam


class TwoSpecies(Reaction):
    """Two decoupled species in one dof-2 state; a checkpoint holds each as a field."""

    def __init__(self, comm, grid=(12, 10), n_steps=6, dt=2e-4, rate=2.0):
        super().__init__(comm, grid, n_steps, dt, rate)
        self.scalar = self.grid
        self.grid = Grid(comm, grid, dof=2, like=self.scalar)

    def default_controls(self):
        y, x = self.scalar.node_coordinates()
        block = np.empty(self.grid.shape + (2,))
        block[..., 0] = np.sin(np.pi * x) * np.sin(np.pi * y)
        block[..., 1] = np.sin(2 * np.pi * x) * np.sin(np.pi * y)
        return {"u0": self.grid.vec_from(block), "a": self.scalar.vec_from(self.rate + 0.5 * x + 0 * y)}

    def rate_field(self):
        return self.scalar.owned(self.controls["a"])[..., None]

    def step(self, i, u):
        ui = self.grid.owned(u)
        return self.grid.vec_from(ui + self.dt * (self.laplacian(u) - self.rate_field() * ui))

    def objective(self, i, u):
        if i != self.n_steps:
            return 0.0
        return self.comm.allreduce(0.5 * float(np.sum(self.grid.owned(u) ** 2)))

    def adjoint_step(self, i, u, u_next, lam_next, grad):
        lam = self.grid.owned(lam_next)
        self.scalar.owned(grad["a"])[...] -= self.dt * np.sum(self.grid.owned(u) * lam, axis=-1)
        return self.grid.vec_from(lam + self.dt * (self.laplacian(lam_next) - self.rate_field() * lam))

    def tangent_step(self, i, u, u_next, du, dcontrols):
        da = self.scalar.owned(dcontrols["a"])[..., None]
        dui, ui = self.grid.owned(du), self.grid.owned(u)
        return self.grid.vec_from(dui + self.dt * (self.laplacian(du) - self.rate_field() * dui - da * ui))

    def snapshot_layout(self):
        return {"u": self.grid.component_layout(), "v": self.grid.component_layout()}

    def snapshot(self, u):
        block = self.grid.owned_view(u)
        return {"u": block[..., 0].copy(), "v": block[..., 1].copy()}

    def restore(self, snapshot):
        block = np.empty(self.grid.shape + (2,))
        block[..., 0], block[..., 1] = snapshot["u"], snapshot["v"]
        return self.grid.vec_from(block)

    def control_layout(self):
        return {"u0": self.grid.layout(), "a": self.scalar.layout()}


class LosesField(TwoSpecies):
    """restore() rebuilds the first species only: the second comes back as zeros."""

    def restore(self, snapshot):
        block = np.zeros(self.grid.shape + (2,))
        block[..., 0] = snapshot["u"]
        return self.grid.vec_from(block)
