"""Heat equation u_t = div(kappa grad u) on the unit square/cube, Dirichlet u = 0, theta-scheme.

Interior nodes x_i = (i+1)h, h = 1/(N+1) per axis; 5-point (7-point) finite differences with face
diffusivities kappa_{i+1/2} = (kappa_i + kappa_{i+1})/2, and kappa at a boundary face taken from
the interior node, so kappa = const gives exactly kappa times the standard Laplacian. One step solves
(I - theta dt L) u_{i+1} = (I + (1 - theta) dt L) u_i. L is symmetric, so the adjoint step solves with
the same matrix. Each solve is CG with a Jacobi preconditioner (the same on any rank count) to a
relative residual of 1e-13, far below the 1e-10 the dot-product and rank-invariance checks demand;
the initial guess is always zero, so a step is a pure function of its input.

Objective: J = 1/2 h^d sum over observed steps i of ||u_i - d_i||^2; by default only the final state
is observed, against d = 0.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from ..stack import petsc
from .base import SolverError, Stepper
from .dmda import Grid, parse_grid
from .observations import Observations


class HeatModel(Stepper):
    """Linear diffusion with controls ``u0`` (initial field) and ``kappa`` (node diffusivity)."""

    name = "heat"
    default_dt = 1e-4
    default_steps = 100
    ksp_rtol = 1e-13

    def __init__(self, comm, grid=(64, 64), n_steps: int = 100, dt: float = 1e-4, theta: float = 0.5,
                 observations: Observations | None = None):
        if n_steps < 1:
            raise ValueError(f"steps must be >= 1, got {n_steps}")
        if not dt > 0 or not math.isfinite(dt):
            raise ValueError(f"dt must be positive, got {dt}")
        if not 0.5 <= theta <= 1.0:
            raise ValueError(f"theta must lie in [0.5, 1], got {theta}")
        self.comm = comm
        self.n_steps = int(n_steps)
        self.dt = float(dt)
        self.theta = float(theta)
        self.grid = Grid(comm, tuple(grid))
        self.h = self.grid.spacing()
        if not math.isfinite(self.dt * sum(4.0 / h ** 2 for h in self.h)):
            raise ValueError(f"dt {dt} is too large for this grid: dt/h^2 overflows")
        self.cell_volume = float(np.prod(self.h))
        self.observations = observations or Observations.final_state_zero(self.n_steps)
        self.observations.check(self.n_steps, self.grid.global_shape)
        self._targets = {i: self.observations.target_block(i, self.grid) for i in self.observations.steps}
        self._ksp = self._make_ksp()
        self._controls = None
        self._work: dict = {}
        self.A = self.B = None

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("heat model")
        group.add_argument("--theta", type=float, default=None,
                           help="theta-scheme weight: 0.5 Crank-Nicolson (default), 1 backward Euler")
        group.add_argument("--observations", default=None, metavar="FILE.h5",
                           help="observed states: datasets 'steps' (k) and 'u' (k, [nz,] ny, nx); "
                                "default: the final state against 0")

    @classmethod
    def from_args(cls, comm, args) -> "HeatModel":
        sizes = parse_grid(args.grid or "64x64")
        n_steps = args.steps if args.steps is not None else cls.default_steps
        observations = Observations.from_file(args.observations) if args.observations else None
        return cls(comm, sizes, n_steps=n_steps, dt=args.dt if args.dt is not None else cls.default_dt,
                   theta=args.theta if args.theta is not None else 0.5, observations=observations)

    def _make_ksp(self):
        PETSc = petsc()
        ksp = PETSc.KSP().create(comm=self.comm)
        ksp.setType("cg")
        ksp.getPC().setType("jacobi")
        ksp.setTolerances(rtol=self.ksp_rtol, atol=1e-300, max_it=10000)
        ksp.setOptionsPrefix("heat_")
        ksp.setFromOptions()
        return ksp

    # -- controls ----------------------------------------------------------------------------
    def default_controls(self):
        coords = self.grid.node_coordinates()
        u0 = self.grid.create_vec()
        block = self.grid.owned(u0)
        if self.grid.dim == 2:
            y, x = coords
            block[...] = (np.sin(np.pi * x) * np.sin(np.pi * y)
                          + 0.5 * np.sin(3 * np.pi * x) * np.sin(2 * np.pi * y))
        else:
            z, y, x = coords
            block[...] = (np.sin(np.pi * x) * np.sin(np.pi * y) * np.sin(np.pi * z)
                          + 0.5 * np.sin(3 * np.pi * x) * np.sin(2 * np.pi * y) * np.sin(np.pi * z))
        kappa = self.grid.create_vec()
        kappa.set(1.0)
        return {"u0": u0, "kappa": kappa}

    def set_controls(self, controls):
        self._controls = {name: vec.copy() for name, vec in controls.items()}
        self.A, self.B = self._assemble(self._controls["kappa"])
        self._ksp.setOperators(self.A)
        self._ksp.setUp()

    def initial_state(self):
        return self._controls["u0"].copy()

    # -- operators ---------------------------------------------------------------------------
    def _faces(self, kappa_padded):
        """Yield (neighbour slice, inside mask, face diffusivity / h^2) for every face of every node."""
        kp = kappa_padded[self.grid.inner]
        for axis, _direction, nb, inside in self.grid.neighbours():
            face = np.where(inside, 0.5 * (kp + kappa_padded[nb]), kp)
            yield nb, inside, face / self.h[axis] ** 2

    def _assemble(self, kappa):
        """A = I - theta dt L(kappa) and B = I + (1 - theta) dt L(kappa) as parallel AIJ matrices."""
        PETSc = petsc()
        grid = self.grid
        nloc = int(np.prod(grid.shape))
        rows = grid.owned_global_indices().ravel()
        diag = np.zeros(grid.shape)
        cols, offs = [rows.reshape(grid.shape)], []
        for nb, inside, face in self._faces(grid.padded(kappa)):
            diag -= face
            cols.append(np.where(inside, grid._lg[nb], -1))
            offs.append(np.where(inside, face, 0.0))
        cols = np.stack([c.reshape(nloc) for c in cols], axis=1)
        lvals = np.stack([diag.reshape(nloc)] + [o.reshape(nloc) for o in offs], axis=1)
        keep = cols >= 0
        indptr = np.concatenate([[0], np.cumsum(keep.sum(axis=1))]).astype(PETSc.IntType)
        indices = cols[keep].astype(PETSc.IntType)
        identity = np.zeros_like(lvals)
        identity[:, 0] = 1.0
        size = ((nloc, None), (nloc, None))
        mats = []
        for weight in (-self.theta * self.dt, (1.0 - self.theta) * self.dt):
            values = (identity + weight * lvals)[keep]
            mat = PETSc.Mat().createAIJ(size=size, csr=(indptr, indices, values), comm=self.comm)
            mat.assemble()
            mats.append(mat)
        return mats

    def _apply_l(self, kappa_padded, w_padded) -> np.ndarray:
        """(L(kappa) w) on the owned block, matrix-free (L is linear in kappa)."""
        wp = w_padded[self.grid.inner]
        out = np.zeros(self.grid.shape)
        for nb, _inside, face in self._faces(kappa_padded):
            out += face * (w_padded[nb] - wp)
        return out

    def _scratch(self, name: str, like):
        """A work Vec kept across steps: a step that reuses one creates and destroys nothing."""
        vec = self._work.get(name)
        if vec is None:
            vec = self._work[name] = like.duplicate()
        return vec

    def _solve(self, rhs, x=None):
        """x = A^-1 rhs, in a new Vec unless ``x`` is given."""
        x = rhs.duplicate() if x is None else x
        x.set(0.0)
        self._ksp.solve(rhs, x)
        reason = self._ksp.getConvergedReason()
        if reason < 0:
            raise SolverError(f"heat: KSP diverged (reason {reason})")
        return x

    # -- forward -----------------------------------------------------------------------------
    def step(self, i, u):
        rhs = self._scratch("rhs", u)
        self.B.mult(u, rhs)
        return self._solve(rhs)

    def objective(self, i, u):
        target = self._targets.get(i)
        if target is None:
            return 0.0
        diff = self.grid.owned(u) - target
        local = 0.5 * self.cell_volume * float(np.dot(diff.ravel(), diff.ravel()))
        return self.comm.allreduce(local)

    def objective_gradient(self, i, u):
        target = self._targets.get(i)
        if target is None:
            return None
        return self.grid.vec_from(self.cell_volume * (self.grid.owned(u) - target))

    # -- adjoint -----------------------------------------------------------------------------
    def _w(self, u, u_next):
        """The theta-weighted state at which the step's operator acts."""
        w = self._scratch("w", u)
        u.copy(w)
        w.scale(1.0 - self.theta)
        w.axpy(self.theta, u_next)
        return w

    def adjoint_step(self, i, u, u_next, lam_next, grad):
        mu = self._solve(lam_next, self._scratch("mu", lam_next))
        lam = mu.duplicate()
        self.B.mult(mu, lam)
        w_pad = self.grid.padded(self._w(u, u_next))
        mu_pad = self.grid.padded(mu)
        wp, mp = w_pad[self.grid.inner], mu_pad[self.grid.inner]
        dkappa = np.zeros(self.grid.shape)
        for axis, _direction, nb, inside in self.grid.neighbours():
            # d(mu^T L w)/d kappa_p: half of each interior face, all of a boundary face
            share = np.where(inside, 0.5, 1.0) / self.h[axis] ** 2
            dkappa += share * (w_pad[nb] - wp) * (mp - mu_pad[nb])
        self.grid.owned(grad["kappa"])[...] += self.dt * dkappa
        return lam

    def initial_adjoint(self, lam0, grad):
        grad["u0"].axpy(1.0, lam0)

    # -- tangent linear ----------------------------------------------------------------------
    def initial_tangent(self, dcontrols):
        return dcontrols["u0"].copy()

    def tangent_step(self, i, u, u_next, du, dcontrols):
        rhs = self._scratch("rhs", du)
        self.B.mult(du, rhs)
        dl_w = self._apply_l(self.grid.padded(dcontrols["kappa"]), self.grid.padded(self._w(u, u_next)))
        self.grid.owned(rhs)[...] += self.dt * dl_w
        return self._solve(rhs)

    # -- snapshots ---------------------------------------------------------------------------
    def snapshot_layout(self):
        return {"u": self.grid.layout()}

    def snapshot(self, u):
        return {"u": self.grid.owned_view(u)}

    def restore(self, snapshot):
        return self.grid.vec_from(snapshot["u"])

    def control_layout(self):
        return {"u0": self.grid.layout(), "kappa": self.grid.layout()}

    def control_arrays(self, controls):
        return {name: self.grid.owned(vec).copy() for name, vec in controls.items()}

    def describe(self):
        return {"model": self.name, "grid": "x".join(map(str, self.grid.sizes_xyz)),
                "steps": self.n_steps, "dt": self.dt, "theta": self.theta}
