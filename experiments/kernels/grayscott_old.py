"""The previous grayscott model (main at d90d350: shell Jacobian, Jacobi-preconditioned GMRES to 1e-14), kept to time it and check gradients against it (experiments/kernels/grayscott.py).

Original docstring: 2-D Gray-Scott reaction-diffusion, periodic square of side L, backward Euler solved by PETSc SNES.

    u_t = Du lap u - u v^2 + F (1 - u),    v_t = Dv lap v + u v^2 - (F + k) v.

Nodes x_j = j h, h = L/N, on a DMDA with dof 2 (u, v interleaved); 5-point Laplacian. One step solves
G(w) = w - w_i - dt R(w; F, k) = 0 by Newton (SNES newtonls, initial guess w_i itself, so a step is a
pure function of w_i) to ||G|| <= max(1e-12 ||G(w_i)||, 1e-13). The Jacobian
J(w) = I - dt (D lap + K(w)), K the pointwise 2x2 reaction Jacobian, is a shell matrix (exact, no
assembly); each linear solve is GMRES(10) (modified Gram-Schmidt) with Jacobi preconditioning (identical
on any rank count) to a relative residual of 1e-14. GMRES allocates a Krylov vector per iteration of
a restart cycle, so the restart length is the memory knob: GMRES(100), used before, held 30-45
state-sized vectors in each of the Newton and adjoint solvers at 512^2 (about 30 iterations a solve);
GMRES(10) takes about as many iterations (100 vs 96 a Newton solve, 27 vs 26 an adjoint solve at
512^2) and holds 12 (``-grayscott_ksp_gmres_restart`` etc. change it).

Adjoint of step i, at w_{i+1} (which the driver supplies): solve J(w_{i+1})^T mu = lambda_{i+1}; then
lambda_i = mu and dJ/dF += dt <dR/dF, mu>, dJ/dk += dt <dR/dk, mu>. The tangent solves
J(w_{i+1}) dw_{i+1} = dw_i + dt (dR/dF dF + dR/dk dk). Both linearise about the same computed w_{i+1},
so the dot-product test is limited by the 1e-14 linear solves only (measured 1e-14 to 1e-12; the
bound we promise is 1e-10); the Newton tolerance enters the Taylor test and rank invariance (Newton
reaches ||G|| ~ 1e-16 in 3 iterations here, and J and gradients agree across 1-3 ranks to 5e-16).

Controls: ``u0`` (initial (u, v), shape (ny, nx, 2)), ``F`` and ``k`` (scalars). Objective: the
final-time pattern strength J = 1/2 h^2 sum v_n^2.

Working set (per rank, in states; see :meth:`GrayScottModel.working_set_states`): two GMRES(10)
Krylov spaces in use in a gradient (Newton's, the adjoint's: 2 x 13), SNES newtonls's work vectors
and the residual Vec (6), the Jacobi diagonals (2), the copy of u0 (1), the DMDA's ghosted local Vec
(1), and one step's transients (w_i, the 2x2 reaction Jacobian = 2 states, the residual's padded copy
and temporaries: about 6). The reaction Jacobian and w_i live only during the solve that reads them.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from hpcadj.imports import petsc
from hpcadj.models.base import SolverError, Stepper
from hpcadj.models.common import ComponentSnapshots, laplacian, scalar_add, scalar_array, scalar_layout, scalar_value, scalar_vec
from hpcadj.models.dmda import Grid, parse_grid


class _Linearisation:
    """Python context of the shell Jacobian J(w) = I - dt (D lap + K(w)), or its transpose."""

    def __init__(self, model, transpose: bool = False):
        self.model = model
        self.transpose = transpose
        self.K = None

    def set_state(self, w: np.ndarray) -> None:
        """Reaction Jacobian K[..., i, j] = dR_i/dw_j at the owned block ``w``."""
        F, k = self.model.F, self.model.k
        u, v = w[..., 0], w[..., 1]
        K = np.empty(w.shape + (2,))
        K[..., 0, 0] = -v * v - F
        K[..., 0, 1] = -2.0 * u * v
        K[..., 1, 0] = v * v
        K[..., 1, 1] = 2.0 * u * v - (F + k)
        self.K = np.swapaxes(K, -1, -2) if self.transpose else K

    def apply(self, x) -> np.ndarray:
        grid, dt = self.model.grid, self.model.dt
        X = grid.padded(x)
        xi = X[grid.inner]
        reaction = np.einsum("...ij,...j->...i", self.K, xi)
        return xi - dt * (self.model.diffusion * laplacian(grid, X, self.model.h) + reaction)

    def mult(self, mat, x, y):
        self.model.grid.owned(y)[...] = self.apply(x)

    def getDiagonal(self, mat, d):
        model = self.model
        lap_diag = -sum(2.0 / h ** 2 for h in model.h)
        diag = 1.0 - model.dt * (model.diffusion * lap_diag + np.diagonal(self.K, axis1=-2, axis2=-1))
        model.grid.owned(d)[...] = diag


class GrayScottModel(ComponentSnapshots, Stepper):
    """Gray-Scott with backward Euler + SNES; controls ``u0`` (initial (u, v)), ``F`` and ``k``."""

    name = "grayscott_old"
    SNAPSHOT_FIELDS = ("u", "v")
    default_steps = 50
    default_dt = 1.0
    default_feed = 0.04
    default_kill = 0.06
    snes_rtol = 1e-12
    snes_atol = 1e-13
    ksp_rtol = 1e-14
    gmres_restart = 10

    def __init__(self, comm, grid=(64, 64), n_steps: int = 50, dt: float = 1.0, feed: float = 0.04,
                 kill: float = 0.06, length: float = 2.5, du: float = 2e-5, dv: float = 1e-5):
        if len(grid) != 2:
            raise ValueError(f"grayscott is 2-D, got a {len(grid)}-D grid")
        if min(grid) < 3:
            raise ValueError("grayscott needs at least 3 points per axis")
        if n_steps < 1:
            raise ValueError(f"steps must be >= 1, got {n_steps}")
        for label, value in (("dt", dt), ("length", length), ("Du", du), ("Dv", dv)):
            if not value > 0 or not math.isfinite(value):
                raise ValueError(f"{label} must be positive, got {value}")
        for label, value in (("feed rate F", feed), ("kill rate k", kill)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{label} must lie in [0, 1], got {value}")
        self.comm = comm
        self.n_steps = int(n_steps)
        self.dt = float(dt)
        self.length = float(length)
        self.default_feed_value, self.default_kill_value = float(feed), float(kill)
        self.grid = Grid(comm, tuple(grid), periodic=True, dof=2)
        self.h = tuple(self.length * h for h in self.grid.spacing())
        self.cell_volume = float(np.prod(self.h))
        self.diffusion = np.array([du, dv])
        self.F, self.k = self.default_feed_value, self.default_kill_value
        self._controls = None
        self._base = None
        self._newton = _Linearisation(self)
        self._forward_op = _Linearisation(self)
        self._adjoint_op = _Linearisation(self, transpose=True)
        self._snes = self._make_snes()
        self._ksp = self._make_ksp(self._forward_op, "gsold_tlm_")
        self._ksp_t = self._make_ksp(self._adjoint_op, "gsold_adj_")

    # -- PETSc solvers -----------------------------------------------------------------------
    def _shell(self, context):
        PETSc = petsc()
        n = self.grid.create_vec().getSizes()
        mat = PETSc.Mat().createPython((n, n), context, comm=self.comm)
        mat.setUp()
        return mat

    def _configure_ksp(self, ksp):
        ksp.setType("gmres")
        ksp.setGMRESRestart(self.gmres_restart)
        ksp.getPC().setType("jacobi")
        ksp.setTolerances(rtol=self.ksp_rtol, atol=1e-300, max_it=2000)

    def _make_ksp(self, context, prefix):
        PETSc = petsc()
        ksp = PETSc.KSP().create(comm=self.comm)
        ksp.setOperators(self._shell(context))
        self._configure_ksp(ksp)
        ksp.setOptionsPrefix(prefix)
        PETSc.Options().setValue(f"{prefix}ksp_gmres_modifiedgramschmidt", "")
        ksp.setFromOptions()
        return ksp

    def _make_snes(self):
        PETSc = petsc()
        snes = PETSc.SNES().create(comm=self.comm)
        snes.setType("newtonls")
        snes.setFunction(self._residual, self.grid.create_vec())
        jac = self._shell(self._newton)
        snes.setJacobian(self._jacobian, jac, jac)
        snes.setTolerances(rtol=self.snes_rtol, atol=self.snes_atol, stol=1e-300, max_it=50)
        self._configure_ksp(snes.getKSP())
        snes.setOptionsPrefix("gsold_")
        PETSc.Options().setValue("gsold_ksp_gmres_modifiedgramschmidt", "")
        snes.setFromOptions()
        return snes

    def _residual(self, snes, x, f):
        X = self.grid.padded(x)
        w = X[self.grid.inner]
        self.grid.owned(f)[...] = w - self._base - self.dt * self._reaction_diffusion(X)

    def _jacobian(self, snes, x, J, P):
        self._newton.set_state(self.grid.owned(x))
        J.assemble()  # a new matrix state makes the Jacobi preconditioner take the new diagonal

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("grayscott model")
        group.add_argument("--feed", type=float, default=None,
                           help=f"grayscott: feed rate F (default {cls.default_feed})")
        group.add_argument("--kill", type=float, default=None,
                           help=f"grayscott: kill rate k (default {cls.default_kill})")

    @classmethod
    def from_args(cls, comm, args) -> "GrayScottModel":
        feed = getattr(args, "feed", None)
        kill = getattr(args, "kill", None)
        return cls(comm, parse_grid(args.grid or "64x64"),
                   n_steps=args.steps if args.steps is not None else cls.default_steps,
                   dt=args.dt if args.dt is not None else cls.default_dt,
                   feed=cls.default_feed if feed is None else feed,
                   kill=cls.default_kill if kill is None else kill)

    # -- controls ----------------------------------------------------------------------------
    def default_controls(self):
        """u = 1 - g/2, v = g/4 (+ a small wave to break symmetry), g a Gaussian at the centre."""
        y, x = (self.length * c for c in self.grid.node_coordinates())
        side = self.length
        g = np.exp(-((x - 0.5 * side) ** 2 + (y - 0.5 * side) ** 2) / (2 * (0.1 * side) ** 2))
        u0 = self.grid.create_vec()
        w = self.grid.owned(u0)
        w[..., 0] = 1.0 - 0.5 * g
        w[..., 1] = 0.25 * g + 0.01 * (1 + np.sin(2 * np.pi * x / side) * np.cos(4 * np.pi * y / side))
        return {"u0": u0, "F": scalar_vec(self.comm, self.default_feed_value),
                "k": scalar_vec(self.comm, self.default_kill_value)}

    def set_controls(self, controls):
        self._controls = {name: vec.copy() for name, vec in controls.items()}
        self.F = scalar_value(self.comm, self._controls["F"])
        self.k = scalar_value(self.comm, self._controls["k"])

    def initial_state(self):
        return self._controls["u0"].copy()

    def working_set_states(self) -> float:
        """2 x 13 (GMRES(10) Newton and adjoint Krylov spaces) + 6 (SNES) + 2 (Jacobi) + 1 (u0)
        + 1 (ghosted local) + 15 (a step's transients and allocator slack: calibrated, the count of 6
        fell 8 states short of experiments/memory_budget's measurement)."""
        krylov = 2 * (self.gmres_restart + 3)
        return krylov + 6.0 + 2.0 + 1.0 + 1.0 + 15.0

    # -- the reaction-diffusion right-hand side ------------------------------------------------
    def _reaction_diffusion(self, X) -> np.ndarray:
        w = X[self.grid.inner]
        u, v = w[..., 0], w[..., 1]
        uvv = u * v * v
        out = self.diffusion * laplacian(self.grid, X, self.h)
        out[..., 0] += -uvv + self.F * (1.0 - u)
        out[..., 1] += uvv - (self.F + self.k) * v
        return out

    def _parameter_derivatives(self, w):
        """dR/dF and dR/dk on the owned block."""
        dF = np.stack([1.0 - w[..., 0], -w[..., 1]], axis=-1)
        dk = np.stack([np.zeros_like(w[..., 1]), -w[..., 1]], axis=-1)
        return dF, dk

    def _linear_solve(self, ksp, rhs):
        ksp.getOperators()[0].assemble()  # the shell's state changed: refresh the Jacobi diagonal
        x = rhs.duplicate()
        x.set(0.0)
        ksp.solve(rhs, x)
        reason = ksp.getConvergedReason()
        if reason < 0:
            raise SolverError(f"grayscott: linear solve diverged (reason {reason})")
        return x

    # -- forward -----------------------------------------------------------------------------
    def step(self, i, u):
        self._base = self.grid.owned(u).copy()
        x = u.copy()
        try:
            self._snes.solve(None, x)
        finally:  # nothing of this step stays alive: w_i and the reaction Jacobian go
            self._base = None
            self._newton.K = None
        reason = self._snes.getConvergedReason()
        if reason < 0:
            raise SolverError(f"grayscott: Newton failed at step {i} (SNES reason {reason})")
        return x

    def objective(self, i, u):
        if i != self.n_steps:
            return 0.0
        v = self.grid.owned(u)[..., 1]
        return self.comm.allreduce(0.5 * self.cell_volume * float(np.sum(v * v)))

    def objective_gradient(self, i, u):
        if i != self.n_steps:
            return None
        g = self.grid.create_vec()
        block = self.grid.owned(g)
        block[..., 0] = 0.0
        block[..., 1] = self.cell_volume * self.grid.owned(u)[..., 1]
        return g

    # -- adjoint -----------------------------------------------------------------------------
    def adjoint_step(self, i, u, u_next, lam_next, grad):
        w_next = self.grid.owned(u_next)
        self._adjoint_op.set_state(w_next)
        try:
            mu = self._linear_solve(self._ksp_t, lam_next)
        finally:
            self._adjoint_op.K = None
        m = self.grid.owned(mu)
        dF, dk = self._parameter_derivatives(w_next)
        scalar_add(self.comm, grad["F"], self.dt * float(np.sum(dF * m)))
        scalar_add(self.comm, grad["k"], self.dt * float(np.sum(dk * m)))
        return mu

    def initial_adjoint(self, lam0, grad):
        grad["u0"].axpy(1.0, lam0)

    # -- tangent linear ----------------------------------------------------------------------
    def initial_tangent(self, dcontrols):
        return dcontrols["u0"].copy()

    def tangent_step(self, i, u, u_next, du, dcontrols):
        w_next = self.grid.owned(u_next)
        dF, dk = self._parameter_derivatives(w_next)
        rhs = du.copy()
        self.grid.owned(rhs)[...] += self.dt * (scalar_value(self.comm, dcontrols["F"]) * dF
                                                + scalar_value(self.comm, dcontrols["k"]) * dk)
        self._forward_op.set_state(w_next)
        try:
            return self._linear_solve(self._ksp, rhs)
        finally:
            self._forward_op.K = None

    # -- snapshots ---------------------------------------------------------------------------
    def control_layout(self):
        layout = scalar_layout(self.comm)
        return {"u0": self.grid.layout(), "F": layout, "k": layout}

    def control_arrays(self, controls):
        return {"u0": self.grid.owned(controls["u0"]).copy(), "F": scalar_array(self.comm, controls["F"]),
                "k": scalar_array(self.comm, controls["k"])}

    def describe(self):
        return {"model": self.name, "grid": "x".join(map(str, self.grid.sizes_xyz)), "steps": self.n_steps,
                "dt": self.dt, "F": self.default_feed_value, "k": self.default_kill_value,
                "length": self.length, "Du": float(self.diffusion[0]), "Dv": float(self.diffusion[1])}
