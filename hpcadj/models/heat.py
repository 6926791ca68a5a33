"""Heat equation u_t = div(kappa grad u) on the unit square/cube, Dirichlet u = 0, theta-scheme.

Interior nodes x_i = (i+1)h, h = 1/(N+1) per axis; 5-point (7-point) finite differences with face
diffusivities kappa_{i+1/2} = (kappa_i + kappa_{i+1})/2, and kappa at a boundary face taken from
the interior node, so kappa = const gives exactly kappa times the standard Laplacian. One step solves
(I - theta dt L) u_{i+1} = (I + (1 - theta) dt L) u_i. Only A = I - theta dt L is assembled: the
right-hand side operator follows from it, B u = (u - (1 - theta) A u) / theta (B = I for theta = 1).
L is symmetric, so the adjoint step solves with the same matrix and applies the same B. Each solve is CG with a Jacobi preconditioner (the same on any rank count) to a
relative residual of 1e-13, far below the 1e-10 the dot-product and rank-invariance checks demand;
the initial guess is always zero, so a step is a pure function of its input.

A is never assembled: it is a PETSc shell matrix whose product is one compiled stencil loop
(:mod:`hpcadj.models.kernels.heat`) over the halo-exchanged input and a ghosted copy of kappa. Its
entries and their summation order are those of the AIJ matrix it replaced, so A x, every state
and the gradient are bitwise what they were with the assembled matrix (tests/mpi/ranks/test_heat.py
compares the two products). :meth:`HeatModel.assemble_matrix` still assembles A, for the PETSc TS
oracle (:mod:`hpcadj.models.heat_ts`) and that test.

Objective: J = 1/2 h^d sum over observed steps i of ||u_i - d_i||^2; by default only the final state
is observed, against d = 0.

Working set (per rank, in states of 8 bytes per grid point; see :meth:`HeatModel.working_set_states`):
the ghosted kappa (1; an AIJ matrix would be 9 states in 2-D, 12 in 3-D), CG's 3 work
vectors and the Jacobi diagonal (4), the copy of u0 (1), two scratch Vecs (2), the DMDA's ghosted
local Vec (1); the adjoint step's d/dkappa is one compiled loop over the owned blocks and the
halo faces of w and mu (it made padded copies of both: 2).
"""

from __future__ import annotations

import atexit
import math
import weakref

import numpy as np

from ..imports import petsc
from .adaptive import AdaptiveSteps, StepSequence
from .base import SolverError, Stepper
from .dmda import Grid
from .observations import Observations


_LIVE: "weakref.WeakSet[HeatModel]" = weakref.WeakSet()
_HOOKED = False


def _release_all() -> None:
    """At exit, before PETSc finalizes: free every live model's shell operators.

    A shell matrix still alive when the interpreter tears its modules down (a model held in a
    script's globals) crashed the process after PetscFinalize under mpirun (petsc4py 3.18).
    """
    for model in list(_LIVE):
        model._release()


class _Stencil:
    """Context of the shell matrix A = I + weight L(kappa): its product and diagonal, matrix-free.

    ``kappa`` is the ghosted local block of kappa (flat, read-only); the input's halo goes through
    the DMDA's local Vec, so a product holds nothing beyond the output. 2-D grids run the 3-D loop
    with a leading axis of one point and no faces.
    """

    def __init__(self, grid, kappa, h, weight: float):
        lead = 3 - grid.dim
        gshape = (1,) * lead + tuple(grid.gshape)
        self.grid, self.kappa, self.weight = grid, kappa, float(weight)
        self.args = (np.array((1,) * lead + tuple(grid.shape), dtype=np.int64),
                     np.array((gshape[1] * gshape[2], gshape[2], 1), dtype=np.int64),
                     np.array((0,) * lead + tuple(s - g for s, g in zip(grid.start, grid.gstart)), dtype=np.int64),
                     np.array((True,) * lead + tuple(s == 0 for s in grid.start)),
                     np.array((True,) * lead + tuple(s + m == n for s, m, n in
                                                     zip(grid.start, grid.shape, grid.global_shape))),
                     lead, np.array((1.0,) * lead + tuple(a ** 2 for a in h)))

    def mult(self, mat, x, y):
        from .kernels.heat import apply

        local = self.grid._local
        self.grid.da.globalToLocal(x, local)
        apply(local.getArray(readonly=True), self.kappa, *self.args, self.weight, y.getArray(), False)

    def getDiagonal(self, mat, d):
        from .kernels.heat import apply

        apply(self.kappa, self.kappa, *self.args, self.weight, d.getArray(), True)


class HeatModel(AdaptiveSteps, Stepper):
    """Linear diffusion with controls ``u0`` (initial field) and ``kappa`` (node diffusivity)."""

    name = "heat"
    default_dt = 1e-4
    default_steps = 100
    ksp_rtol = 1e-13
    default_tolerance = 1e-4
    #: adaptive runs keep at most this many step sizes' operators (a matrix and CG each)
    OPERATOR_CACHE = 6

    def __init__(self, comm, grid=(64, 64), n_steps: int = 100, dt: float = 1e-4, theta: float = 0.5,
                 observations: Observations | None = None, adaptive: bool = False,
                 t_final: float | None = None, tolerance: float | None = None):
        if adaptive and (t_final is None or observations is not None):
            raise ValueError("--adaptive takes --t-final T and observes the final state only (no --observations)")
        if tolerance is not None and not (tolerance > 0 and math.isfinite(tolerance)):
            raise ValueError(f"--tolerance must be a positive number, got {tolerance}")
        self.steps = StepSequence(t_final) if adaptive else None
        self.tolerance = float(tolerance) if tolerance is not None else self.default_tolerance
        if adaptive:
            n_steps = 1  # unknown until t_final is reached; checks below use 1
        if n_steps < 1:
            raise ValueError(f"steps must be >= 1, got {n_steps}")
        if not dt > 0 or not math.isfinite(dt):
            raise ValueError(f"dt must be positive, got {dt}")
        if not 0.5 <= theta <= 1.0:
            raise ValueError(f"theta must lie in [0.5, 1], got {theta}")
        self.comm = comm
        self.n_steps = None if adaptive else int(n_steps)
        self.dt = float(dt)  # adaptive: the first trial step
        self.theta = float(theta)
        self.grid = Grid(comm, tuple(grid))
        self.h = self.grid.spacing()
        if not math.isfinite(self.dt * sum(4.0 / h ** 2 for h in self.h)):
            raise ValueError(f"dt {dt} is too large for this grid: dt/h^2 overflows")
        self.cell_volume = float(np.prod(self.h))
        if adaptive:
            self.observations, self._targets = None, {}
        else:
            self.observations = observations or Observations.final_state_zero(self.n_steps)
            self.observations.check(self.n_steps, self.grid.global_shape)
            # d = 0 (no observation file) is kept as None, not as a block of zeros
            self._targets = {i: (None if self.observations.path is None
                                 else self.observations.target_block(i, self.grid))
                             for i in self.observations.steps}
        self._operators: dict = {}  # adaptive: (dt, theta) -> (A, KSP), oldest first
        self._kappa = None  # the ghosted local block of kappa, flat and read-only (what A reads)
        self._ksp = self._make_ksp()
        self._u0 = None
        self._work: dict = {}
        self.A = None
        from . import kernels

        self._halo = kernels.Halo(self.grid, slots=2)  # the adjoint's halos of w and mu
        lead = 3 - self.grid.dim
        self._geometry = ((1,) * lead + tuple(self.grid.shape),
                          np.array((True,) * lead + tuple(s == 0 for s in self.grid.start)),
                          np.array((True,) * lead + tuple(s + m == n for s, m, n in
                                                          zip(self.grid.start, self.grid.shape,
                                                              self.grid.global_shape))),
                          lead, np.array((1.0,) * lead + tuple(a ** 2 for a in self.h)))

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
            # in place, term by term: no full-grid temporaries beside the block
            block[...] = np.sin(np.pi * x) * np.sin(np.pi * y)
            block *= np.sin(np.pi * z)
            second = 0.5 * np.sin(3 * np.pi * x) * np.sin(2 * np.pi * y)
            block += second * np.sin(np.pi * z)
        kappa = self.grid.create_vec()
        kappa.set(1.0)
        return {"u0": u0, "kappa": kappa}

    def set_controls(self, controls):
        # copies: the caller may change its Vecs later (kappa as the ghosted block A reads)
        if self.A is not None:  # free the old operator, u0 and CG's work vectors first
            self.A = self._u0 = self._kappa = None
            self._ksp.reset()
            for _A, ksp in self._operators.values():
                ksp.destroy()
            self._operators = {}
            petsc().garbage_cleanup(self.comm)  # collective, like set_controls itself
        self._u0 = controls["u0"].copy()
        self.grid.da.globalToLocal(controls["kappa"], self.grid._local)
        self._kappa = self.grid._local.getArray(readonly=True).copy()
        self._kappa.flags.writeable = False
        self.A = self._shell(self.dt, self.theta)
        global _HOOKED
        if not _HOOKED:  # registered after PETSc's own exit hook, so it runs before it
            atexit.register(_release_all)
            _HOOKED = True
        _LIVE.add(self)
        self._ksp.setOperators(self.A)
        self._ksp.setUp()

    def initial_state(self):
        return self._u0.copy()

    def _release(self) -> None:
        """Destroy the solvers' hold on the shell operators and the operators themselves."""
        self._ksp.reset()
        for A, ksp in self._operators.values():
            ksp.destroy()
            A.destroy()
        self._operators = {}
        if self.A is not None:
            self.A.destroy()
            self.A = None

    def working_set_states(self) -> float:
        """The ghosted kappa A reads (1), CG + Jacobi (4), u0 (1), scratch (2), the DMDA's ghosted
        local Vec and scatter indices (3), allocator slack (SLACK: experiments/memory_budget
        measured 24.5-24.7 states for a whole 3-slot gradient, 9 of them the driver's, at 128^3
        and 1024^2 on 1 and 2 ranks); 1 more per observed state from a file (its targets are held)."""
        observed = sum(1.0 for t in self._targets.values() if t is not None)
        # adaptive: up to OPERATOR_CACHE more step sizes' CG work and Jacobi diagonals
        extra = self.OPERATOR_CACHE * 4.0 if self.steps is not None else 0.0
        return 1.0 + 4.0 + 1.0 + 2.0 + 3.0 + self.SLACK + observed + extra

    #: states the measured peak lies above the count of what is held (allocator, PETSc's small objects)
    SLACK = 5.0

    # -- operators ---------------------------------------------------------------------------
    def _faces(self, kappa_padded):
        """Yield (neighbour slice, inside mask, face diffusivity / h^2) for every face of every node."""
        kp = kappa_padded[self.grid.inner]
        for axis, _direction, nb, inside in self.grid.neighbours():
            face = np.where(inside, 0.5 * (kp + kappa_padded[nb]), kp)
            yield nb, inside, face / self.h[axis] ** 2

    #: owned points per assembly slab (whole axis-0 planes; at least one plane)
    ASSEMBLY_SLAB_POINTS = 1 << 16

    def _shell(self, dt: float, theta: float):
        """A = I - theta dt L(kappa) of the current kappa as a shell matrix (nothing assembled)."""
        PETSc = petsc()
        n = int(np.prod(self.grid.shape))
        N = int(np.prod(self.grid.global_shape))
        mat = PETSc.Mat().createPython(((n, N), (n, N)), comm=self.comm,
                                       context=_Stencil(self.grid, self._kappa, self.h, -theta * dt))
        mat.setUp()
        return mat

    def assemble_matrix(self, kappa, dt: float | None = None, theta: float | None = None):
        """A = I - theta dt L(kappa) as a parallel AIJ matrix, preallocated by the DMDA: what the
        shell operator applies, for the PETSc TS oracle and the tests (steps never assemble it).

        Rows go in slabs of axis-0 planes (``setValuesRCV``; a -1 column, outside the domain, is
        skipped), so the transient beside A is the padded kappa and index arrays and one slab's rows.
        """
        PETSc = petsc()
        grid = self.grid
        weight = -(self.theta if theta is None else theta) * (self.dt if dt is None else dt)
        kappa_padded = grid.padded(kappa)
        lg = grid.padded_indices()
        inner = grid.inner
        mat = grid.da.createMatrix()
        mat.setOption(PETSc.Mat.Option.NEW_NONZERO_ALLOCATION_ERR, True)
        faces = list(grid.neighbours())
        ncols = 1 + len(faces)
        plane = int(np.prod(grid.shape[1:], dtype=np.int64))
        per_slab = max(1, self.ASSEMBLY_SLAB_POINTS // max(plane, 1))
        m0 = grid.shape[0]
        for k0 in range(0, m0, per_slab):
            k1 = min(m0, k0 + per_slab)
            npts = (k1 - k0) * plane
            cut = lambda a: a[k0:k1]  # a slab of an owned-shaped view
            kp = cut(kappa_padded[inner])
            cols = np.empty((npts, ncols), dtype=PETSc.IntType)
            vals = np.empty((npts, ncols))
            diag = np.zeros(kp.shape)
            cols[:, 0] = cut(lg[inner]).reshape(npts)
            for j, (axis, _direction, nb, inside) in enumerate(faces, start=1):
                inside = inside[k0:k1] if axis == 0 else inside
                face = np.where(inside, 0.5 * (kp + cut(kappa_padded[nb])), kp) / self.h[axis] ** 2
                diag -= face
                cols[:, j] = np.where(inside, cut(lg[nb]), -1).reshape(npts)
                vals[:, j] = np.where(inside, weight * face, 0.0).reshape(npts)
            vals[:, 0] = (1.0 + weight * diag).reshape(npts)
            mat.setValuesRCV(cols[:, :1], cols, vals, addv=PETSc.InsertMode.INSERT_VALUES)
        mat.assemble()
        return mat

    def _apply_b(self, u, out, A=None, theta: float | None = None):
        """out = B u = (u - (1 - theta) A u) / theta = (I + (1 - theta) dt L) u."""
        A = self.A if A is None else A
        theta = self.theta if theta is None else theta
        if theta == 1.0:
            u.copy(out)
            return out
        A.mult(u, out)
        out.aypx(-(1.0 - theta), u)
        out.scale(1.0 / theta)
        return out

    def _operator(self, dt: float, theta: float | None = None):
        """(A, KSP) of a step of size ``dt`` (the constructed one for the first dt and theta).

        Adaptive runs make the others on first use and keep the latest ``OPERATOR_CACHE`` of them
        (a shell matrix and CG with its Jacobi diagonal each); an evicted one is made again
        identically (bitwise the same operator), costing time only.
        """
        theta = self.theta if theta is None else theta
        if dt == self.dt and theta == self.theta:
            return self.A, self._ksp
        key = (dt, theta)
        entry = self._operators.pop(key, None)
        if entry is None:
            A = self._shell(dt, theta)
            ksp = self._make_ksp()
            ksp.setOperators(A)
            ksp.setUp()
            entry = (A, ksp)
            if len(self._operators) >= self.OPERATOR_CACHE:
                oldest = next(iter(self._operators))
                self._operators.pop(oldest)[1].destroy()
        self._operators[key] = entry  # most recent last
        return entry

    def _step_with(self, u, dt: float, theta: float | None = None):
        """u_{i+1} from u_i by a theta-step of size ``dt``."""
        A, ksp = self._operator(dt, theta)
        rhs = self._apply_b(u, self._scratch("rhs", u), A, theta)
        return self._solve(rhs, ksp=ksp)

    def _step_dt(self, i: int) -> float:
        return self.dt if self.steps is None else self.steps.dt(i)

    def _first_step(self, i: int, u):
        """Decide dt_i (adaptive, first sweep): TSAdapt-like accept/reject on an embedded estimate.

        The estimate is the largest difference between the theta step and a step of the same size
        with the companion weight (backward Euler for theta < 1, Crank-Nicolson for theta = 1), a
        collective max norm. Above ``tolerance`` the step is rejected and halved; an accepted step
        with an estimate below tolerance / 4 doubles the next trial (the estimate is O(dt^2)).
        Trial sizes stay on the ladder dt * 2^k, so few operators are assembled.
        """
        PETSc = petsc()
        companion = 1.0 if self.theta < 1.0 else 0.5
        trial = self.steps.proposal or self.dt
        while True:
            dt, last = self.steps.clip(i, trial)
            u_next = self._step_with(u, dt)
            estimate = self._step_with(u, dt, companion)
            estimate.axpy(-1.0, u_next)
            error = estimate.norm(PETSc.NormType.INFINITY)
            if error <= self.tolerance:
                break
            trial = 0.5 * trial
        self._accepted(i, dt, last, 2.0 * trial if error <= 0.25 * self.tolerance else trial)
        return u_next

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

    def _solve(self, rhs, x=None, ksp=None):
        """x = A^-1 rhs, in a new Vec unless ``x`` is given."""
        ksp = self._ksp if ksp is None else ksp
        x = rhs.duplicate() if x is None else x
        x.set(0.0)
        ksp.solve(rhs, x)
        reason = ksp.getConvergedReason()
        if reason < 0:
            raise SolverError(f"heat: KSP diverged (reason {reason})")
        # x stayed at its zero guess for a non-zero rhs only when the residual norm underflowed
        # (an absurd dt: sum of squares below 1e-308); its zero would pass for a solution
        if ksp.getIterationNumber() == 0 and rhs.norm(petsc().NormType.INFINITY) > 0:
            raise SolverError(f"heat: KSP stopped at its zero initial guess for a non-zero right-hand side "
                              f"(its residual norm underflowed: dt {self.dt:g} is far too large)")
        return x

    # -- forward -----------------------------------------------------------------------------
    def step(self, i, u):
        if self.steps is not None:
            if not self.steps.known(i):
                return self._first_step(i, u)
            return self._step_with(u, self.steps.dt(i))
        rhs = self._apply_b(u, self._scratch("rhs", u))
        return self._solve(rhs)

    def _observed(self, i: int) -> bool:
        return i == self.n_steps if self.steps is not None else i in self._targets

    def objective(self, i, u):
        if not self._observed(i):
            return 0.0
        target = self._targets.get(i)
        diff = self.grid.owned(u) if target is None else self.grid.owned(u) - target
        local = 0.5 * self.cell_volume * float(np.dot(diff.ravel(), diff.ravel()))
        return self.comm.allreduce(local)

    def objective_gradient(self, i, u):
        target = self._targets.get(i)
        if not self._observed(i):
            return None
        diff = self.grid.owned(u) if target is None else self.grid.owned(u) - target
        return self.grid.vec_from(self.cell_volume * diff)

    # -- adjoint -----------------------------------------------------------------------------
    def _w(self, u, u_next, scratch="w"):
        """The theta-weighted state at which the step's operator acts."""
        w = self._scratch(scratch, u)
        u.copy(w)
        w.scale(1.0 - self.theta)
        w.axpy(self.theta, u_next)
        return w

    def adjoint_step(self, i, u, u_next, lam_next, grad):
        dt = self._step_dt(i)
        A, ksp = self._operator(dt)
        # solved from a copy: the KSP keeps a reference to its right-hand side until its next
        # solve, and lambda_{i+1} is freed right after this step (the driver's count relies on it)
        rhs = self._scratch("rhs", lam_next)
        lam_next.copy(rhs)
        mu = self._solve(rhs, self._scratch("mu", lam_next), ksp=ksp)
        lam = self._apply_b(mu, mu.duplicate(), A)
        # the rhs scratch is free again: w goes there (no third scratch Vec); one compiled loop
        # over the owned blocks and the halo faces of w and mu (no padded copies)
        from .kernels.heat import kappa_gradient

        w = self._w(u, u_next, scratch="rhs")
        shape3, lo_wall, hi_wall, first, h2 = self._geometry
        kappa_gradient(w.getArray(readonly=True).reshape(shape3), mu.getArray(readonly=True).reshape(shape3),
                       self._faces3(w, 0), self._faces3(mu, 1), lo_wall, hi_wall, first, h2, dt,
                       grad["kappa"].getArray().reshape(shape3))
        return lam

    def _faces3(self, vec, slot: int) -> tuple:
        """The six halo faces of ``vec`` as 2-D arrays of the 3-D-embedded block (a 2-D grid's
        leading axis has none: placeholders the loop never reads)."""
        faces = self._halo.faces(vec, slot)
        if self.grid.dim == 3:
            return faces
        from .kernels import readonly

        none = readonly(np.zeros((1, 1)))
        return (none, none) + tuple(f.reshape(1, -1) for f in faces)

    def initial_adjoint(self, lam0, grad):
        grad["u0"].axpy(1.0, lam0)

    # -- tangent linear ----------------------------------------------------------------------
    def initial_tangent(self, dcontrols):
        return dcontrols["u0"].copy()

    def tangent_step(self, i, u, u_next, du, dcontrols):
        dt = self._step_dt(i)
        A, ksp = self._operator(dt)
        rhs = self._apply_b(du, self._scratch("rhs", du), A)
        dl_w = self._apply_l(self.grid.padded(dcontrols["kappa"]), self.grid.padded(self._w(u, u_next)))
        self.grid.owned(rhs)[...] += dt * dl_w
        return self._solve(rhs, ksp=ksp)

    # -- second order (Hessian actions, hpcadj.adjoint.hessian) ------------------------------
    def add_objective_hessian(self, i, u, du, dlam):
        """dlam += d^2 J_i/du^2 du = h^d du on observed steps."""
        if self._observed(i):
            self.grid.owned(dlam)[...] += self.cell_volume * self.grid.owned_view(du)

    def hessian_adjoint_step(self, i, u, u_next, du, du_next, lam_next, dlam_next, dcontrols, grad, hgrad):
        """(lambda_i, dlambda_i) and dJ/dkappa, (H v)_kappa contributions of step i.

        With mu = A^-1 lambda_{i+1} (as in :meth:`adjoint_step`), differentiating the adjoint step in
        (u, kappa) along (du, dkappa): dmu = A^-1 (dlambda_{i+1} + theta dt L(dkappa) mu),
        dlambda_i = B dmu + (1 - theta) dt L(dkappa) mu, (H v)_kappa += dt d/dkappa <dmu, L w> +
        dt d/dkappa <mu, L dw> (L is linear in kappa and the step linear in u: no other terms).
        """
        if self.steps is not None:
            raise ValueError("heat: Hessian actions need fixed steps")
        dt, theta = self.dt, self.theta
        lam = self.adjoint_step(i, u, u_next, lam_next, grad)
        mu = self._work["mu"].copy()  # adjoint_step's A^-1 lambda_{i+1}
        l_dk_mu = self._apply_l(self.grid.padded(dcontrols["kappa"]), self.grid.padded(mu))
        rhs = dlam_next.copy()
        self.grid.owned(rhs)[...] += (theta * dt) * l_dk_mu
        dlam = self.adjoint_step(i, u, u_next, rhs, hgrad)
        self.grid.owned(dlam)[...] += ((1.0 - theta) * dt) * l_dk_mu
        from .kernels.heat import kappa_gradient

        dw = self._w(du, du_next, scratch="rhs")
        shape3, lo_wall, hi_wall, first, h2 = self._geometry
        kappa_gradient(dw.getArray(readonly=True).reshape(shape3), mu.getArray(readonly=True).reshape(shape3),
                       self._faces3(dw, 0), self._faces3(mu, 1), lo_wall, hi_wall, first, h2, dt,
                       hgrad["kappa"].getArray().reshape(shape3))
        return lam, dlam

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
        info = {"model": self.name, "grid": "x".join(map(str, self.grid.sizes_xyz)),
                "steps": self.n_steps, "dt": self.dt, "theta": self.theta}
        if self.steps is not None:
            info.update(tolerance=self.tolerance, dt0=self.dt)
        return self._describe_steps(info)
