"""A user-style model for the run-directory tests, written as README's example is: a setting of its
own (the velocity) that its describe() does not list, and a command-line adapter taking it.

u_{i+1} = u_i + dt (Laplacian(u_i) - v . grad(u_i) - a(x) u_i), u = 0 on the boundary, central
differences; controls u_0 and the rate field a; J = 1/2 |u_n|^2.
"""

import numpy as np

from hpcadj.models.base import Stepper
from hpcadj.models.dmda import Grid


class Drift(Stepper):
    name = "drift"

    def __init__(self, comm, grid=(12, 10), n_steps=12, dt=1e-3, velocity=(1.0, 0.5)):
        self.comm, self.n_steps, self.dt = comm, n_steps, dt
        self.velocity = tuple(velocity)            # (vx, vy): not in describe()
        self.grid = Grid(comm, grid)
        self.h = self.grid.spacing()

    def default_controls(self):
        y, x = self.grid.node_coordinates()
        u0 = self.grid.vec_from(np.sin(np.pi * x) * np.sin(np.pi * y) * (1 + x))
        a = self.grid.vec_from(2.0 + 0.5 * x * y)
        return {"u0": u0, "a": a}

    def set_controls(self, controls):
        self.controls = {name: vec.copy() for name, vec in controls.items()}

    def initial_state(self):
        return self.controls["u0"].copy()

    def operator(self, u, sign=1.0):
        """Laplacian(u) - sign v . grad(u) (sign -1: the transpose, central advection being skew)."""
        padded = self.grid.padded(u)
        centre = padded[self.grid.inner]
        out = np.zeros_like(centre)
        v = (self.velocity[1], self.velocity[0])  # natural axes: y, x
        for axis, direction, nb, _ in self.grid.neighbours():
            out += (padded[nb] - centre) / self.h[axis] ** 2
            out -= sign * v[axis] * direction * padded[nb] / (2 * self.h[axis])
        return out

    def step(self, i, u):
        a, ui = self.grid.owned(self.controls["a"]), self.grid.owned(u)
        return self.grid.vec_from(ui + self.dt * (self.operator(u) - a * ui))

    def objective(self, i, u):
        if i != self.n_steps:
            return 0.0
        return self.comm.allreduce(0.5 * float(np.sum(self.grid.owned(u) ** 2)))

    def objective_gradient(self, i, u):
        return u.copy() if i == self.n_steps else None

    def adjoint_step(self, i, u, u_next, lam_next, grad):
        a, lam = self.grid.owned(self.controls["a"]), self.grid.owned(lam_next)
        self.grid.owned(grad["a"])[...] -= self.dt * self.grid.owned(u) * lam
        return self.grid.vec_from(lam + self.dt * (self.operator(lam_next, -1.0) - a * lam))

    def initial_adjoint(self, lam0, grad):
        grad["u0"].axpy(1.0, lam0)

    def initial_tangent(self, dcontrols):
        return dcontrols["u0"].copy()

    def tangent_step(self, i, u, u_next, du, dcontrols):
        a, da = self.grid.owned(self.controls["a"]), self.grid.owned(dcontrols["a"])
        dui, ui = self.grid.owned(du), self.grid.owned(u)
        return self.grid.vec_from(dui + self.dt * (self.operator(du) - a * dui - da * ui))

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


class DriftCLI:
    """``hpcadj run --model tests/mpi/ranks/rundir_model.py:DriftCLI --velocity VX,VY``."""

    def add_arguments(self, parser):
        parser.add_argument("--velocity", default="1.0,0.5", help="advection velocity VX,VY")

    def build(self, comm, args):
        velocity = tuple(float(v) for v in args.velocity.split(","))
        return Drift(comm, n_steps=args.steps or 12, dt=args.dt or 1e-3, velocity=velocity)
