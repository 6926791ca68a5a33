"""2-D Gray-Scott reaction-diffusion, periodic square of side L, backward Euler solved by PETSc SNES.

    u_t = Du lap u - u v^2 + F (1 - u),    v_t = Dv lap v + u v^2 - (F + k) v.

Nodes x_j = j h, h = L/N, on a DMDA with dof 2 (u, v interleaved); 5-point Laplacian. One step solves
G(w) = w - w_i - dt R(w; F, k) = 0 by Newton (SNES newtonls, initial guess w_i itself, so a step is a
pure function of w_i) to ||G|| <= max(1e-12 ||G(w_i)||, 1e-13). The residual is one compiled loop
(:mod:`hpcadj.models.kernels.grayscott`). The Jacobian J(w) = I - dt (D lap + K(w)), K the pointwise
2x2 reaction Jacobian, comes in two forms (``jacobian=``, or the PETSc option
``-grayscott_jacobian stencil|assembled``):

- **stencil** (default): a PETSc shell matrix whose product (and transposed product) is one
  compiled stencil loop over x's halo and the linearisation point w, preconditioned by Jacobi
  (a shell PC dividing by J's diagonal, made per point from w). It stores nothing: no matrix in
  the model's working set.
- **assembled**: an AIJ matrix (six entries a row; only the 2x2 point blocks are rewritten per Newton
  iteration, in place) with block Jacobi/ILU(0) (PETSc's default for a parallel AIJ, which its
  Gray-Scott tutorials ex5/ex5adj run with), the factor built once per step at w_i
  (``-grayscott_snes_lag_preconditioner 100``; the Jacobian itself is exact at every iteration). It
  holds about 20 states more (matrix and factor), and any of PETSc's preconditioners can be chosen
  for it (``-grayscott_pc_type gamg``, ...), which a much finer grid (J's conditioning grows with
  dt D / h^2) may want.

Each Newton system is solved by BiCGStab to a relative residual of 1e-5 (inexact Newton: still 3
iterations to 1e-12). At 512^2 a step takes 18-19 BiCGStab iterations with Jacobi and 9 with ILU(0)
in the same time (Jacobi's apply costs a tenth of ILU's; experiments/kernels/grayscott.py).
BiCGStab rather than GMRES: as fast here (two products an iteration) with 7 work vectors instead of
one per iteration of a restart cycle.

Adjoint of step i, at w_{i+1} (which the driver supplies): solve J(w_{i+1})^T mu = lambda_{i+1}
(``KSPSolveTranspose`` with the same operator: the stencil loop with K transposed, or the assembled
matrix with its ILU factor applied transposed); then lambda_i = mu and dJ/dF += dt <dR/dF, mu>,
dJ/dk += dt <dR/dk, mu> (one compiled pass). The tangent solves J(w_{i+1}) dw_{i+1} = dw_i + dt
(dR/dF dF + dR/dk dk). Both solve to a relative residual of 1e-12 (``ksp_rtol``; 12-14 iterations with
Jacobi at 512^2), so the dot-product test is limited by those solves (bound promised: 1e-10).

Purity and rank invariance: every solve starts from the same guess (w_i, or zero) with a
preconditioner of the matrix it solves with (the stencil's Jacobi reads the linearisation point
itself; the assembled matrix's factor is rebuilt for every adjoint and tangent solve and the lag
counter restarts with each SNES solve), so a recomputed step is bitwise the first. The operator and
Jacobi are pointwise/stencil (the same on any decomposition), but the Krylov dot products are
reduced across ranks (and block Jacobi/ILU differs with the decomposition), so across rank counts
states and gradients agree to the solver tolerances, not bitwise (tests ask 1e-10 relative on 2 and 3
ranks against 1).

Controls: ``u0`` (initial (u, v), shape (ny, nx, 2)), ``F`` and ``k`` (scalars). Objective: the
final-time pattern strength J = 1/2 h^2 sum v_n^2.

Working set (per rank, in states; see :meth:`GrayScottModel.working_set_states`), stencil Jacobian:
held from construction on about 5 (the SNES residual Vec, the DMDA's local Vec and scatters, the
halo buffers, allocator slack); from the first step on 11 more, BiCGStab's work vectors (7, one KSP
shared by the Newton, tangent and adjoint solves) and newtonls's (4); the copy of u0 (1) and an
adjoint step's solution (1). experiments/memory_budget measured 25.4 / 25.6 states at 512^2 on 1 / 2
ranks for the whole 3-slot gradient (the target: <= 30), of which the driver's share is 9.
The assembled Jacobian adds the matrix (six values and six int32 columns a row with PETSc's row
arrays, about 10) and its ILU(0) factor with its solve work vector (about 10): 49.9 / 52.0 measured.
"""

from __future__ import annotations

import math

import numpy as np

from ..imports import petsc
from .base import SolverError, Stepper
from . import kernels
from .common import ComponentSnapshots, scalar_add, scalar_array, scalar_layout, scalar_value, scalar_vec
from .dmda import Grid
gs_kernels = kernels.lazy("grayscott")


class _AssembledJacobian:
    """J(w) = I - dt (D lap + K(w)) as a PETSc AIJ matrix over CSR arrays this object holds.

    Each row (p, c) has six entries: its diagonal, its coupling to the other component at p, and
    its four neighbours -dt D_c / h^2 (constant, written once). Only the point-diagonal 2x2 blocks
    depend on w: :meth:`set_state` rewrites them in place by a compiled loop (the matrix was made
    with ``createAIJWithArrays``, which keeps our arrays rather than copying them) and bumps the
    matrix state, so a preconditioner refactors. Entries are set, never summed: the same values
    on any decomposition.
    """

    def __init__(self, model):
        PETSc = petsc()
        grid = model.grid
        lg = grid.padded_indices()
        my, mx = grid.shape
        n = my * mx * 2
        N = int(np.prod(grid.global_shape)) * grid.dof
        probe = grid.create_vec()
        rstart, rend = probe.getOwnershipRange()
        probe.destroy()
        if not np.array_equal(lg[1:-1, 1:-1].ravel(), np.arange(rstart, rend)):
            raise AssertionError("grayscott: DMDA owned indices are not the rank's contiguous range")
        dt = model.dt
        ihy2, ihx2 = (1.0 / h ** 2 for h in model.h)
        table = np.zeros((2, 8))  # value of entry kind e (0-5; 7 = unused slot) in a row of component c
        table[:, 2:4] = (-dt * model.diffusion * ihy2)[:, None]
        table[:, 4:6] = (-dt * model.diffusion * ihx2)[:, None]
        # two compiled passes (count, fill): nothing beyond the CSR arrays themselves
        counts = np.empty(n, dtype=np.int64)
        gs_kernels.count_local(lg, rstart, rend, counts)
        diag_ptr, off_ptr = (np.zeros(n + 1, dtype=PETSc.IntType) for _ in range(2))
        np.cumsum(counts, out=diag_ptr[1:])
        np.cumsum(6 - counts, out=off_ptr[1:])
        del counts
        diag_cols = np.empty(int(diag_ptr[-1]), dtype=PETSc.IntType)
        off_cols = np.empty(int(off_ptr[-1]), dtype=PETSc.IntType)
        self.values = np.empty(int(diag_ptr[-1]), dtype=PETSc.ScalarType)
        off_values = np.empty(int(off_ptr[-1]), dtype=PETSc.ScalarType)
        gs_kernels.fill_csr(lg, rstart, rend, table, diag_ptr, diag_cols, self.values, off_ptr, off_cols,
                            off_values)
        self.diag_ptr, self.diag_cols = diag_ptr, diag_cols  # the Mat's own arrays (not copied)
        del lg
        csr = (diag_ptr, diag_cols, self.values)
        if grid.comm.size > 1:
            csr = (csr, (off_ptr, off_cols, off_values))
        self.mat = PETSc.Mat().createAIJWithArrays(((n, N), (n, N)), csr, comm=grid.comm)
        self.mat.assemble()

    def release(self) -> None:
        """The matrix keeps its values: nothing refers to the linearisation point."""

    def prepare(self, ksp, rhs, scratch) -> None:
        """Make ``ksp``'s preconditioner factor the (just set) matrix afresh.

        SNES's preconditioner lag leaves reuse set on the PC and on block Jacobi's inner KSP. PETSc's
        bjacobi hands the outer flag down to its block only in a forward apply (not in a transposed
        one), so one forward apply here refactors the block; without it an adjoint solve applied the
        factor of whichever Newton matrix came last (impure, caught by the tests).
        """
        ksp.setOperators(self.mat, self.mat)
        pc = ksp.getPC()
        pc.setReusePreconditioner(False)
        ksp.setUp()
        pc.apply(rhs, scratch)

    def set_state(self, model, w: np.ndarray) -> None:
        """Write J(w)'s point blocks at the owned block ``w`` (collective: bumps the Mat state)."""
        gs_kernels.jacobian_values(w, model.dt, model.diag_lap, model.F, model.k, self.diag_ptr,
                                   self.diag_cols, self.values)
        self.mat.assemble()


class _StencilJacobian:
    """J(w) = I - dt (D lap + K(w)) as a PETSc shell matrix: each product one compiled stencil loop
    over x's owned block and halo faces (:func:`~hpcadj.models.kernels.grayscott.jacobian_mult`).

    Nothing is stored but a reference to the owned block of the linearisation point w, set before
    a solve and dropped after it (:meth:`release`), so the operator costs no memory of its own. The
    transposed product (the adjoint's solves) runs the same loop with K(w) transposed.
    """

    def __init__(self, model):
        PETSc = petsc()
        self.model = model
        self.point = None
        n = model.grid.shape[0] * model.grid.shape[1] * 2
        N = int(np.prod(model.grid.global_shape)) * 2
        self.mat = PETSc.Mat().createPython(((n, N), (n, N)), self, comm=model.comm)
        self.mat.setUp()

    def set_state(self, model, w: np.ndarray) -> None:
        """Linearise at the owned block ``w`` (held by reference until :meth:`release`)."""
        self.point = w

    def release(self) -> None:
        self.point = None

    def prepare(self, ksp, rhs, scratch) -> None:
        """Nothing to refactor: the preconditioner reads the linearisation point itself."""

    def mult(self, mat, x, y):
        self._product(x, y, False)

    def multTranspose(self, mat, x, y):
        self._product(x, y, True)

    def _product(self, x, y, transpose: bool) -> None:
        m = self.model
        gs_kernels.jacobian_mult(kernels.owned(m.grid, x), *m._halo.faces(x), self.point, m.dt, m.diffusion,
                                 m._ih2, m.F, m.k, transpose, kernels.owned(m.grid, y, readonly=False))


class _PointJacobi:
    """Jacobi preconditioner of :class:`_StencilJacobian` as a PETSc shell PC: y = x / diag J(w),
    the diagonal made per point from w (no Vec kept). The same on any decomposition, and its own
    transpose."""

    def __init__(self, jacobian: _StencilJacobian):
        self.jacobian = jacobian

    def apply(self, pc, x, y):
        m = self.jacobian.model
        gs_kernels.jacobi_apply(kernels.owned(m.grid, x), self.jacobian.point, m.dt, m.diag_lap, m.F, m.k,
                                kernels.owned(m.grid, y, readonly=False))

    applyTranspose = apply


class GrayScottModel(ComponentSnapshots, Stepper):
    """Gray-Scott with backward Euler + SNES; controls ``u0`` (initial (u, v)), ``F`` and ``k``."""

    name = "grayscott"
    SNAPSHOT_FIELDS = ("u", "v")
    default_steps = 50
    default_dt = 1.0
    default_feed = 0.04
    default_kill = 0.06
    snes_rtol = 1e-12
    snes_atol = 1e-13
    newton_ksp_rtol = 1e-5
    ksp_rtol = 1e-12
    lag_preconditioner = 100
    JACOBIANS = ("stencil", "assembled")
    #: ``hpcadj hesscheck``'s first Taylor step: beyond a few per cent of F and k the second-order
    #: remainder has left its asymptotic range
    hessian_taylor_eps = 0.05

    def __init__(self, comm, grid=(64, 64), n_steps: int = 50, dt: float = 1.0, feed: float = 0.04,
                 kill: float = 0.06, length: float = 2.5, du: float = 2e-5, dv: float = 1e-5,
                 jacobian: str | None = None):
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
        if jacobian is None:  # the PETSc option, as every solver knob of this model
            jacobian = petsc().Options().getString("grayscott_jacobian", "stencil")
        if jacobian not in self.JACOBIANS:
            raise ValueError(f"grayscott: the Jacobian is 'stencil' or 'assembled', got {jacobian!r}")
        self.jacobian = jacobian
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
        self._halo = kernels.Halo(self.grid)
        self._ih2 = np.array([1.0 / h ** 2 for h in self.h])
        self.diag_lap = self.dt * self.diffusion * (2.0 * self._ih2[0] + 2.0 * self._ih2[1])
        self._jac = _StencilJacobian(self) if jacobian == "stencil" else _AssembledJacobian(self)
        self._snes = self._make_snes()
        self._ksp = self._snes.getKSP()

    # -- PETSc solvers -----------------------------------------------------------------------
    def _make_snes(self):
        """Newton (newtonls) with BiCGStab: Jacobi on the stencil Jacobian, block Jacobi/ILU(0) on
        the assembled one (its factor lagged over a step's Newton iterations)."""
        PETSc = petsc()
        snes = PETSc.SNES().create(comm=self.comm)
        snes.setType("newtonls")
        snes.setFunction(self._residual, self.grid.create_vec())
        snes.setJacobian(self._linearise, self._jac.mat, self._jac.mat)
        snes.setTolerances(rtol=self.snes_rtol, atol=self.snes_atol, stol=1e-300, max_it=50)
        ksp = snes.getKSP()
        ksp.setType("bcgs")
        pc = ksp.getPC()
        if self.jacobian == "stencil":
            pc.setType("python")
            pc.setPythonContext(_PointJacobi(self._jac))
        else:
            pc.setType("bjacobi")
        ksp.setTolerances(rtol=self.newton_ksp_rtol, atol=1e-300, max_it=2000)
        snes.setOptionsPrefix("grayscott_")
        options = PETSc.Options()
        if self.jacobian == "assembled" and not options.hasName("grayscott_snes_lag_preconditioner"):
            options.setValue("grayscott_snes_lag_preconditioner", str(self.lag_preconditioner))  # no setter
        snes.setFromOptions()
        self._newton_rtol = ksp.getTolerances()[0]
        return snes

    def _residual(self, snes, x, f):
        faces = self._halo.faces(x)
        gs_kernels.residual(kernels.owned(self.grid, x), *faces, self._base, self.dt, self.diffusion,
                            self._ih2, self.F, self.k, kernels.owned(self.grid, f, readonly=False))

    def _linearise(self, snes, x, J, P):
        self._jac.set_state(self, kernels.owned(self.grid, x))

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
        """Stencil Jacobian: 5 (held from construction) + 7 (BiCGStab) + 4 (newtonls) + 1 (u0) + 1 (an
        adjoint step's solution) = 18, above the 16.4-16.6 measured; the assembled one adds its
        matrix and ILU factor, 44 against the 41-43 measured (module docstring)."""
        return 18.0 if self.jacobian == "stencil" else 44.0

    # -- the reaction-diffusion right-hand side ------------------------------------------------
    def _linear_solve(self, w, rhs, transpose: bool):
        """Solve J(w) x = rhs (or J(w)^T x = rhs) with the Newton solver's KSP, to ``ksp_rtol``."""
        self._jac.set_state(self, w)
        ksp = self._ksp
        x = rhs.duplicate()
        self._jac.prepare(ksp, rhs, x)
        ksp.setTolerances(rtol=self.ksp_rtol)
        try:
            (ksp.solveTranspose if transpose else ksp.solve)(rhs, x)
        finally:
            ksp.setTolerances(rtol=self._newton_rtol)
            self._jac.release()
        reason = ksp.getConvergedReason()
        if reason < 0:
            raise SolverError(f"grayscott: linear solve diverged (reason {reason})")
        return x

    # -- forward -----------------------------------------------------------------------------
    def step(self, i, u):
        self._base = kernels.owned(self.grid, u)
        x = u.copy()
        try:
            self._snes.solve(None, x)
        finally:
            self._base = None
            self._jac.release()
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
        w_next = kernels.owned(self.grid, u_next)
        mu = self._linear_solve(w_next, lam_next, transpose=True)
        dF, dk = gs_kernels.parameter_dots(w_next, kernels.owned(self.grid, mu))
        scalar_add(self.comm, grad["F"], self.dt * dF)
        scalar_add(self.comm, grad["k"], self.dt * dk)
        return mu

    def initial_adjoint(self, lam0, grad):
        grad["u0"].axpy(1.0, lam0)

    # -- tangent linear ----------------------------------------------------------------------
    def initial_tangent(self, dcontrols):
        return dcontrols["u0"].copy()

    def tangent_step(self, i, u, u_next, du, dcontrols):
        w_next = kernels.owned(self.grid, u_next)
        dF = scalar_value(self.comm, dcontrols["F"])
        dk = scalar_value(self.comm, dcontrols["k"])
        rhs = du.copy()
        r = self.grid.owned(rhs)
        r[..., 0] += self.dt * (dF * (1.0 - w_next[..., 0]))
        r[..., 1] += self.dt * (dF * -w_next[..., 1] + dk * -w_next[..., 1])
        return self._linear_solve(w_next, rhs, transpose=False)

    # -- second order (Hessian actions, hpcadj.adjoint.hessian) ------------------------------
    def add_objective_hessian(self, i, u, du, dlam):
        """dlam += d^2 J/du^2 du = h^2 (0, dv) at the final step."""
        if i == self.n_steps:
            self.grid.owned(dlam)[..., 1] += self.cell_volume * self.grid.owned_view(du)[..., 1]

    def hessian_adjoint_step(self, i, u, u_next, du, du_next, lam_next, dlam_next, dcontrols, grad, hgrad):
        """(lambda_i, dlambda_i), dJ/d(F, k) and their (H v) contributions of step i.

        With mu = J(w_{i+1})^-T lambda_{i+1} (= lambda_i), differentiating along (dw_{i+1}, dF, dk):
        dmu = J^-T (dlambda_{i+1} + dt dK^T mu), dK the derivative of the reaction Jacobian (pointwise),
        and (H v)_F += dt <dR/dF, dmu> + dt <(-du, -dv), mu>, (H v)_k += dt <dR/dk, dmu> - dt <dv, mu_v>.
        One transposed solve more than the gradient's.
        """
        dt = self.dt
        lam = self.adjoint_step(i, u, u_next, lam_next, grad)
        mu = self.grid.owned_view(lam)
        w = self.grid.owned_view(u_next)
        d = self.grid.owned_view(du_next)
        dF = scalar_value(self.comm, dcontrols["F"])
        dk = scalar_value(self.comm, dcontrols["k"])
        wu, wv, du_, dv = w[..., 0], w[..., 1], d[..., 0], d[..., 1]
        mu_u, mu_v = mu[..., 0], mu[..., 1]
        cross = 2.0 * (du_ * wv + wu * dv)
        rhs = dlam_next.copy()
        r = self.grid.owned(rhs)
        r[..., 0] += dt * ((-2.0 * wv * dv - dF) * mu_u + 2.0 * wv * dv * mu_v)
        r[..., 1] += dt * (-cross * mu_u + (cross - dF - dk) * mu_v)
        dlam = self.adjoint_step(i, u, u_next, rhs, hgrad)
        scalar_add(self.comm, hgrad["F"], -dt * float(np.sum(du_ * mu_u + dv * mu_v)))
        scalar_add(self.comm, hgrad["k"], -dt * float(np.sum(dv * mu_v)))
        return lam, dlam

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
                "length": self.length, "Du": float(self.diffusion[0]), "Dv": float(self.diffusion[1]),
                "jacobian": self.jacobian}
