"""2-D viscous Burgers w_t + (w . grad) w = nu lap w for the velocity w = (u, v), periodic unit square.

Nodes x_j = j h, h = 1/N per axis, on a DMDA with dof 2 (u, v interleaved). Advection in the
skew-symmetric form b(w, w)_c = 1/2 [w . grad w_c + div(w w_c)] with second-order *central*
differences, diffusion with the 5-point Laplacian. Why central: N(w) = -b(w, w) + nu lap w is a
polynomial in w, so the discrete map is smooth and its adjoint exact (an upwind switch on sign(u) is
not differentiable and spoils Taylor tests where the velocity changes sign). Why skew-symmetric: the
central advective form alone blows up on coarse grids (cell Reynolds number above 2); the
skew-symmetric one conserves the discrete kinetic energy, so only the viscosity changes it.
Time stepping: SSP-RK3 (Shu-Osher)

    w1 = w + dt N(w);  w2 = 3/4 w + 1/4 (w1 + dt N(w1));  w_{i+1} = 1/3 w + 2/3 (w2 + dt N(w2)),

with the default dt = cfl * min(sqrt(3) / max(|u|/h + |v|/h), 2.5 / (8 nu / h^2)) from the default
initial velocity, fixed at construction so that dt never depends on the controls. The adjoint step
recomputes the stages w, w1, w2 from u_i and runs the three stages backwards; everything is pointwise
or a stencil, so states are bitwise the same on any rank count.

Controls: ``u0`` (initial velocity, both components, shape (ny, nx, 2)) and ``nu`` (scalar viscosity).
Objective: the final kinetic energy J = 1/2 h^2 sum |w_n|^2.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from ..stack import mpi
from .base import Stepper
from .common import (ComponentSnapshots, central_difference, laplacian, scalar_add, scalar_array,
                     scalar_layout, scalar_value, scalar_vec)
from .dmda import Grid, parse_grid


class BurgersModel(ComponentSnapshots, Stepper):
    """Viscous Burgers with SSP-RK3 and central advection; controls ``u0`` (velocity) and ``nu``."""

    name = "burgers"
    SNAPSHOT_FIELDS = ("u", "v")
    default_steps = 100
    default_nu = 0.01
    default_cfl = 0.5

    def __init__(self, comm, grid=(64, 64), n_steps: int = 100, nu: float = 0.01, dt: float | None = None,
                 cfl: float = 0.5):
        if len(grid) != 2:
            raise ValueError(f"burgers is 2-D, got a {len(grid)}-D grid")
        if min(grid) < 3:
            raise ValueError("burgers needs at least 3 points per axis")
        if n_steps < 1:
            raise ValueError(f"steps must be >= 1, got {n_steps}")
        if not nu > 0 or not math.isfinite(nu):
            raise ValueError(f"viscosity must be positive, got {nu}")
        if not 0 < cfl <= 1:
            raise ValueError(f"cfl must lie in (0, 1], got {cfl}")
        self.comm = comm
        self.n_steps = int(n_steps)
        self.grid = Grid(comm, tuple(grid), periodic=True, dof=2)
        self.h = self.grid.spacing()
        self.cell_volume = float(np.prod(self.h))
        self.default_nu_value = float(nu)
        self._work = self.grid.create_vec()
        self._controls = None
        self.nu = float(nu)
        self.dt = float(dt) if dt is not None else self.stable_dt(cfl)
        if not self.dt > 0 or not math.isfinite(self.dt):
            raise ValueError(f"dt must be positive, got {self.dt}")
        if dt is not None and self.dt > (limit := self.stable_dt(1.0)):
            # explicit RK3: beyond the stability limit the states blow up and the gradient is garbage
            raise ValueError(f"dt {self.dt:g} exceeds the explicit RK3 stability limit {limit:.6g} "
                             f"for this grid and viscosity")

    def stable_dt(self, cfl: float) -> float:
        """cfl times the RK3 limits for central advection (sqrt 3) and diffusion (2.5), default controls."""
        w = self.grid.owned(self.default_controls()["u0"])
        hy, hx = self.h
        rate = np.max(np.abs(w[..., 0]) / hx + np.abs(w[..., 1]) / hy) if w.size else 0.0
        rate = self.comm.allreduce(float(rate), op=mpi().MAX)
        diffusion = 4.0 * self.default_nu_value * (1.0 / hx ** 2 + 1.0 / hy ** 2)
        return cfl * min(math.sqrt(3.0) / rate, 2.5 / diffusion)

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("burgers model")
        group.add_argument("--viscosity", type=float, default=None,
                           help=f"burgers: viscosity nu (default {cls.default_nu})")
        group.add_argument("--cfl", type=float, default=None,
                           help=f"burgers: fraction of the RK3 stability limit for the default dt "
                                f"(default {cls.default_cfl})")

    @classmethod
    def from_args(cls, comm, args) -> "BurgersModel":
        sizes = parse_grid(args.grid or "64x64")
        nu = args.viscosity if getattr(args, "viscosity", None) is not None else cls.default_nu
        cfl = args.cfl if getattr(args, "cfl", None) is not None else cls.default_cfl
        n_steps = args.steps if args.steps is not None else cls.default_steps
        return cls(comm, sizes, n_steps=n_steps, nu=nu, dt=args.dt, cfl=cfl)

    # -- controls ----------------------------------------------------------------------------
    def default_controls(self):
        y, x = self.grid.node_coordinates()
        u0 = self.grid.create_vec()
        w = self.grid.owned(u0)
        two_pi = 2.0 * np.pi
        w[..., 0] = np.sin(two_pi * x) * np.cos(two_pi * y) + 0.3 * np.cos(two_pi * (x + 2.0 * y))
        w[..., 1] = -np.cos(two_pi * x) * np.sin(two_pi * y) + 0.2 * np.sin(two_pi * (2.0 * x - y)) + 0.1
        return {"u0": u0, "nu": scalar_vec(self.comm, self.default_nu_value)}

    def set_controls(self, controls):
        self._controls = {name: vec.copy() for name, vec in controls.items()}
        self.nu = scalar_value(self.comm, self._controls["nu"])

    def initial_state(self):
        return self._controls["u0"].copy()

    # -- the right-hand side and its derivatives (owned blocks; padded inputs carry the halo) -----
    def _pad(self, block):
        self.grid.owned(self._work)[...] = block
        return self.grid.padded(self._work)

    def _grads(self, padded):
        hy, hx = self.h
        return (central_difference(self.grid, padded, 1, hx), central_difference(self.grid, padded, 0, hy))

    def _advection(self, A, B):
        """Skew-symmetric central form b(a, w)_c = 1/2 [a . grad w_c + div(a w_c)] from padded a, w."""
        a = A[self.grid.inner]
        bx, by = self._grads(B)
        fx, _ = self._grads(A[..., :1] * B)
        _, fy = self._grads(A[..., 1:] * B)
        return 0.5 * (a[..., :1] * bx + a[..., 1:] * by + fx + fy)

    def _rhs(self, P, nu):
        """N(w) = -b(w, w) + nu lap w."""
        return -self._advection(P, P) + nu * laplacian(self.grid, P, self.h)

    def _rhs_tangent(self, P, D, nu, dnu):
        """N'(w) d + dnu lap w = -b(d, w) - b(w, d) + nu lap d + dnu lap w."""
        out = -self._advection(D, P) - self._advection(P, D) + nu * laplacian(self.grid, D, self.h)
        if dnu:
            out += dnu * laplacian(self.grid, P, self.h)
        return out

    def _rhs_adjoint(self, P, M, nu):
        """(N'(w))^T mu and the local part of (dN/dnu)^T mu = <lap w, mu>.

        b(w, .) is antisymmetric on a periodic grid (central differences are), so its transpose is
        -b(w, .); the transpose of d -> b(d, w) is pointwise: 1/2 sum_c (mu_c grad w_c - w_c grad mu_c).
        """
        w, mu = P[self.grid.inner], M[self.grid.inner]
        wx, wy = self._grads(P)
        mx, my = self._grads(M)
        out = self._advection(P, M) + nu * laplacian(self.grid, M, self.h)
        out[..., 0] -= 0.5 * np.sum(mu * wx - w * mx, axis=-1)
        out[..., 1] -= 0.5 * np.sum(mu * wy - w * my, axis=-1)
        dnu = float(np.sum(laplacian(self.grid, P, self.h) * mu))
        return out, dnu

    def _stages(self, u):
        """Padded stage states w, w1, w2 of one RK3 step and the new state's block."""
        dt, nu = self.dt, self.nu
        P0 = self.grid.padded(u)
        w0 = P0[self.grid.inner]
        w1 = w0 + dt * self._rhs(P0, nu)
        P1 = self._pad(w1)
        w2 = 0.75 * w0 + 0.25 * (w1 + dt * self._rhs(P1, nu))
        P2 = self._pad(w2)
        w3 = w0 / 3.0 + (2.0 / 3.0) * (w2 + dt * self._rhs(P2, nu))
        return P0, P1, P2, w3

    # -- forward -----------------------------------------------------------------------------
    def step(self, i, u):
        *_stages, w3 = self._stages(u)
        return self.grid.vec_from(w3)

    def objective(self, i, u):
        if i != self.n_steps:
            return 0.0
        w = self.grid.owned(u)
        return self.comm.allreduce(0.5 * self.cell_volume * float(np.sum(w * w)))

    def objective_gradient(self, i, u):
        if i != self.n_steps:
            return None
        return self.grid.vec_from(self.cell_volume * self.grid.owned(u))

    # -- adjoint -----------------------------------------------------------------------------
    def adjoint_step(self, i, u, u_next, lam_next, grad):
        dt, nu = self.dt, self.nu
        P0, P1, P2, _w3 = self._stages(u)
        a = self.grid.owned(lam_next).copy()
        lam = a / 3.0
        t, g2 = self._rhs_adjoint(P2, self.grid.padded(lam_next), nu)
        b = (2.0 / 3.0) * (a + dt * t)
        lam += 0.75 * b
        t, g1 = self._rhs_adjoint(P1, self._pad(b), nu)
        c = 0.25 * (b + dt * t)
        t, g0 = self._rhs_adjoint(P0, self._pad(c), nu)
        lam += c + dt * t
        scalar_add(self.comm, grad["nu"], dt * ((2.0 / 3.0) * g2 + 0.25 * g1 + g0))
        return self.grid.vec_from(lam)

    def initial_adjoint(self, lam0, grad):
        grad["u0"].axpy(1.0, lam0)

    # -- tangent linear ----------------------------------------------------------------------
    def initial_tangent(self, dcontrols):
        return dcontrols["u0"].copy()

    def tangent_step(self, i, u, u_next, du, dcontrols):
        dt, nu = self.dt, self.nu
        dnu = scalar_value(self.comm, dcontrols["nu"])
        P0, P1, P2, _w3 = self._stages(u)
        D0 = self.grid.padded(du)
        d0 = D0[self.grid.inner]
        d1 = d0 + dt * self._rhs_tangent(P0, D0, nu, dnu)
        d2 = 0.75 * d0 + 0.25 * (d1 + dt * self._rhs_tangent(P1, self._pad(d1), nu, dnu))
        d3 = d0 / 3.0 + (2.0 / 3.0) * (d2 + dt * self._rhs_tangent(P2, self._pad(d2), nu, dnu))
        return self.grid.vec_from(d3)

    # -- snapshots ---------------------------------------------------------------------------
    def control_layout(self):
        return {"u0": self.grid.layout(), "nu": scalar_layout(self.comm)}

    def control_arrays(self, controls):
        return {"u0": self.grid.owned(controls["u0"]).copy(), "nu": scalar_array(self.comm, controls["nu"])}

    def describe(self):
        return {"model": self.name, "grid": "x".join(map(str, self.grid.sizes_xyz)), "steps": self.n_steps,
                "dt": self.dt, "nu": self.default_nu_value, "advection": "central", "scheme": "SSP-RK3"}
