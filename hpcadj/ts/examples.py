"""PETSc's adjoint tutorials as petsc4py TS set-ups, each wrapped as a :class:`~hpcadj.ts.TSStepper`.

- :func:`vanderpol`: petsc4py's van der Pol demo (PETSc ``ts/tutorials/ex20adj.c``): RHS form for
  RK, implicit form for θ methods; the parameter is μ.
- :func:`mass_ode`: ``ts/tutorials/ex23fwdadj.c``, c x' = b x with the parameter c in the mass
  matrix (IJacobianP); x(T) = a exp(bT/c).
- :func:`grayscott`: ``advection-diffusion-reaction/ex5adj.c``, Gray–Scott on a periodic 2-D DMDA
  with two components; the parameter is the feed rate γ (a scalar).

Each ``make_*`` builds the TS as a user would (``setFromOptions()`` last, so ``-ts_type``,
``-ts_dt`` and the prefix's options apply) and returns the TS with what the stepper needs; the
``*_stepper`` factories return the stepper itself, the form ``hpcadj run --model`` accepts.
"""

from __future__ import annotations

import math

import numpy as np

from ..imports import petsc
from .stepper import TSStepper


def _fresh_preconditioner(ts, comm) -> None:
    """On more than one rank, a Jacobi preconditioner and tight Krylov tolerances for a dense Jacobian.

    PETSc's default there, block Jacobi, factors the diagonal block that ``MatGetDiagonalBlock`` of a
    MATMPIDENSE makes once, sharing the matrix's array; its state never changes with the values (PETSc
    3.18 mpidense.c), so the factor stays the first matrix's. GMRES then iterates with a stale
    preconditioner down to its tolerance, and the result depends on which matrix came first: the
    gradient differs from ``TSAdjointSolve``'s on another TS by the Krylov tolerance (2e-4 relative
    for van der Pol at GMRES's default 1e-5). Jacobi reads the diagonal at every set-up. Options
    given by the user (``setFromOptions``, after this) still win.
    """
    if comm.size > 1:
        ksp = ts.getSNES().getKSP()
        ksp.getPC().setType("jacobi")
        ksp.setTolerances(rtol=1e-14, atol=1e-16)


def _half_norm2(u) -> float:
    return 0.5 * u.dot(u)


def _identity_copy(u):
    return u.copy()


# -- van der Pol --------------------------------------------------------------------------------
class VanDerPol:
    """u0' = u1, u1' = μ((1 - u0²) u1 - u0): the state lives on rank 0 of ``comm``."""

    def __init__(self, comm, mu: float = 10.0, implicit: bool = False, prefix: str | None = None):
        PETSc = petsc()
        self.mu = mu
        self.comm = comm
        own = 2 if comm.rank == 0 else 0
        self.u0 = PETSc.Vec().createMPI((own, 2), comm=comm)
        arr = self.u0.getArray()
        if own:
            arr[0] = 2.0
            arr[1] = -2.0 / 3.0 + 10.0 / (81.0 * mu) - 292.0 / (2187.0 * mu * mu)
        self.p = PETSc.Vec().createMPI((1 if comm.rank == 0 else 0, 1), comm=comm)
        self.p.set(mu)
        ts = PETSc.TS().create(comm=comm)
        if prefix:
            ts.setOptionsPrefix(prefix)
        ts.setProblemType(PETSc.TS.ProblemType.NONLINEAR)
        J = PETSc.Mat().createDense([(own, 2), (own, 2)], comm=comm)
        J.setUp()
        Jp = PETSc.Mat().createDense([(own, 2), (1 if comm.rank == 0 else 0, 1)], comm=comm)
        Jp.setUp()
        self._mats = (J, Jp)
        if implicit:
            ts.setType(PETSc.TS.Type.CN)
            ts.setIFunction(self._ifunction, self.u0.duplicate())
            ts.setIJacobian(self._ijacobian, J)
            ts.setIJacobianP(self._ijacobianp, Jp)
        else:
            ts.setType(PETSc.TS.Type.RK)
            ts.setRKType("4")
            ts.setRHSFunction(self._rhs, self.u0.duplicate())
            ts.setRHSJacobian(self._rhsjacobian, J)
            ts.setRHSJacobianP(self._rhsjacobianp, Jp)
        ts.setTime(0.0)
        ts.setTimeStep(0.001)
        ts.setMaxTime(0.5)
        ts.setMaxSteps(50)
        ts.setExactFinalTime(PETSc.TS.ExactFinalTime.MATCHSTEP)
        ts.getSNES().setTolerances(rtol=1e-14, atol=1e-14)
        _fresh_preconditioner(ts, comm)
        ts.setFromOptions()
        self.ts = ts

    def set_mu(self, p) -> None:
        self.mu = self.comm.bcast(float(p.getArray(readonly=True)[0]) if self.comm.rank == 0 else None)

    def _rhs(self, ts, t, u, f):
        a, b = u.getArray(readonly=True), f.getArray()
        if len(a):
            b[0] = a[1]
            b[1] = self.mu * ((1.0 - a[0] * a[0]) * a[1] - a[0])

    def _rhsjacobian(self, ts, t, u, A, B):
        a = u.getArray(readonly=True)
        if len(a):
            A[0, 0], A[0, 1] = 0.0, 1.0
            A[1, 0] = -self.mu * (2.0 * a[1] * a[0] + 1.0)
            A[1, 1] = self.mu * (1.0 - a[0] * a[0])
        A.assemble()
        return True

    def _rhsjacobianp(self, ts, t, u, C):
        a = u.getArray(readonly=True)
        if len(a):
            C[0, 0] = 0.0
            C[1, 0] = (1.0 - a[0] * a[0]) * a[1] - a[0]
        C.assemble()
        return True

    def _ifunction(self, ts, t, u, udot, f):
        a, d, b = u.getArray(readonly=True), udot.getArray(readonly=True), f.getArray()
        if len(a):
            b[0] = d[0] - a[1]
            b[1] = d[1] - self.mu * ((1.0 - a[0] * a[0]) * a[1] - a[0])

    def _ijacobian(self, ts, t, u, udot, shift, A, B):
        a = u.getArray(readonly=True)
        if len(a):
            A[0, 0], A[0, 1] = shift, -1.0
            A[1, 0] = self.mu * (2.0 * a[1] * a[0] + 1.0)
            A[1, 1] = shift - self.mu * (1.0 - a[0] * a[0])
        A.assemble()
        return True

    def _ijacobianp(self, ts, t, u, udot, shift, C):
        a = u.getArray(readonly=True)
        if len(a):
            C[0, 0] = 0.0
            C[1, 0] = a[0] - (1.0 - a[0] * a[0]) * a[1]
        C.assemble()
        return True

    def stepper(self, n_steps: int | None = None) -> TSStepper:
        """J = ½|u_n|², controls u0 and μ."""
        return TSStepper(self.ts, self.u0, n_steps, parameters={"mu": self.p}, apply_parameters=self.set_mu,
                         final=(_half_norm2, _identity_copy), name="vanderpol")


def vanderpol_stepper(comm, args=None) -> TSStepper:
    """``--model hpcadj.ts.examples:vanderpol_stepper``: implicit (CN) unless ``-ts_type rk``."""
    opts = petsc().Options()
    implicit = opts.getString("ts_type", "cn") != "rk"
    return VanDerPol(comm, implicit=implicit).stepper(getattr(args, "steps", None))


# -- ex23fwdadj: a parameter in the mass matrix ---------------------------------------------------
class MassODE:
    """c x' = b x, x(0) = a; the parameter is c (IJacobianP = x')."""

    def __init__(self, comm, a: float = 2.0, b: float = 4.0, c: float = 3.0, dt: float = 0.001,
                 t_final: float = 1.0):
        PETSc = petsc()
        self.comm, self.a, self.b, self.c = comm, a, b, c
        own = 1 if comm.rank == 0 else 0
        self.u0 = PETSc.Vec().createMPI((own, 1), comm=comm)
        self.u0.set(a)
        self.p = self.u0.duplicate()
        self.p.set(c)
        J = PETSc.Mat().createDense([(own, 1), (own, 1)], comm=comm)
        J.setUp()
        Jp = PETSc.Mat().createDense([(own, 1), (own, 1)], comm=comm)
        Jp.setUp()
        self._mats = (J, Jp)
        ts = PETSc.TS().create(comm=comm)
        ts.setType(PETSc.TS.Type.BEULER)
        ts.setIFunction(self._ifunction, self.u0.duplicate())
        ts.setIJacobian(self._ijacobian, J)
        ts.setIJacobianP(self._ijacobianp, Jp)
        ts.setTime(0.0)
        ts.setTimeStep(dt)
        ts.setMaxTime(t_final)
        ts.setMaxSteps(int(round(t_final / dt)))
        ts.setExactFinalTime(PETSc.TS.ExactFinalTime.MATCHSTEP)
        ts.getSNES().setTolerances(rtol=1e-14, atol=1e-14)
        _fresh_preconditioner(ts, comm)
        ts.setFromOptions()
        self.ts = ts

    def set_c(self, p) -> None:
        self.c = self.comm.bcast(float(p.getArray(readonly=True)[0]) if self.comm.rank == 0 else None)

    def _ifunction(self, ts, t, x, xdot, f):
        # getArray on every rank, also where it is empty: it marks f changed, and a rank that skipped it
        # would reuse f's cached norm and leave the SNES's next reduction to the other ranks (MPI_ERR_TRUNCATE)
        out = f.getArray()
        if len(out):
            out[0] = self.c * xdot.getArray(readonly=True)[0] - self.b * x.getArray(readonly=True)[0]

    def _ijacobian(self, ts, t, x, xdot, shift, A, B):
        if self.comm.rank == 0:
            A[0, 0] = self.c * shift - self.b
        A.assemble()
        return True

    def _ijacobianp(self, ts, t, x, xdot, shift, C):
        if self.comm.rank == 0:
            C[0, 0] = xdot.getArray(readonly=True)[0]
        C.assemble()
        return True

    def exact(self, t: float) -> float:
        return self.a * math.exp(self.b * t / self.c)

    def stepper(self) -> TSStepper:
        """J = x(T): its gradient is dx(T)/da (u0) and dx(T)/dc."""
        def value(u):
            return self.comm.bcast(float(u.getArray(readonly=True)[0]) if self.comm.rank == 0 else None)

        def gradient(u):
            g = u.duplicate()
            g.set(1.0)
            return g

        return TSStepper(self.ts, self.u0, parameters={"c": self.p}, apply_parameters=self.set_c,
                         final=(value, gradient), name="ex23fwdadj")


# -- ex5adj: Gray–Scott on a periodic 2-D DMDA ----------------------------------------------------
class GrayScott:
    """u_t = D1 Δu − uv² + γ(1 − u), v_t = D2 Δv + uv² − (γ + κ)v on [0, 2.5)², periodic; dof 2.

    RHS form (RK and θ alike) with an assembled AIJ Jacobian; the parameter is γ (RHSJacobianP).
    """

    D1, D2, kappa = 8.0e-5, 4.0e-5, 0.06

    def __init__(self, comm, m: int = 64, gamma: float = 0.024, dt: float = 0.5, ts_type: str = "cn",
                 prefix: str | None = None):
        PETSc = petsc()
        self.comm, self.gamma, self.m = comm, gamma, m
        da = PETSc.DMDA().create(dim=2, dof=2, sizes=(m, m), boundary_type=("periodic", "periodic"),
                                 stencil_type="star", stencil_width=1, comm=comm)
        da.setUp()
        self.da = da
        (xs, xe), (ys, ye) = da.getRanges()
        self.xs, self.xm, self.ys, self.ym = xs, xe - xs, ys, ye - ys
        h = 2.5 / m
        self.s = 1.0 / (h * h)
        self._local = da.createLocalVec()
        self.u0 = da.createGlobalVec()
        self._initial(h)
        self.p = PETSc.Vec().createMPI((1 if comm.rank == 0 else 0, 1), comm=comm)
        self.p.set(gamma)
        self.J = da.createMatrix()
        self.J.setOption(PETSc.Mat.Option.NEW_NONZERO_ALLOCATION_ERR, True)
        self._csr = self._pattern()
        nloc = self.u0.getLocalSize()
        self.Jp = PETSc.Mat().createDense([(nloc, self.u0.getSize()), (1 if comm.rank == 0 else 0, 1)], comm=comm)
        self.Jp.setUp()
        ts = PETSc.TS().create(comm=comm)
        if prefix:
            ts.setOptionsPrefix(prefix)
        ts.setDM(da)
        ts.setProblemType(PETSc.TS.ProblemType.NONLINEAR)
        ts.setEquationType(PETSc.TS.EquationType.ODE_EXPLICIT)
        ts.setType(ts_type)
        if ts_type == "rk":
            ts.setRKType("4")
        ts.setRHSFunction(self._rhs, self.u0.duplicate())
        ts.setRHSJacobian(self._rhsjacobian, self.J, self.J)
        ts.setRHSJacobianP(self._rhsjacobianp, self.Jp)
        ts.setTime(0.0)
        ts.setTimeStep(dt)
        ts.setMaxTime(200.0)
        ts.setMaxSteps(10)
        ts.setExactFinalTime(PETSc.TS.ExactFinalTime.MATCHSTEP)
        snes = ts.getSNES()
        snes.setTolerances(rtol=1e-12, atol=1e-14)
        snes.getKSP().setTolerances(rtol=1e-14, atol=1e-16)
        ts.setFromOptions()
        self.ts = ts

    def _initial(self, h: float) -> None:
        j = np.arange(self.ys, self.ys + self.ym)[:, None] * h
        i = np.arange(self.xs, self.xs + self.xm)[None, :] * h
        inside = (i >= 1.0 - 1e-12) & (i <= 1.5 + 1e-12) & (j >= 1.0 - 1e-12) & (j <= 1.5 + 1e-12)
        v = np.where(inside, np.sin(4 * np.pi * i) ** 2 * np.sin(4 * np.pi * j) ** 2 / 4.0, 0.0)
        w = self.u0.getArray().reshape(self.ym, self.xm, 2)
        w[..., 1] = v
        w[..., 0] = 1.0 - 2.0 * v

    def set_gamma(self, p) -> None:
        self.gamma = self.comm.bcast(float(p.getArray(readonly=True)[0]) if self.comm.rank == 0 else None)

    def _ghosted(self, u) -> np.ndarray:
        self.da.globalToLocal(u, self._local)
        (gxs, gys), (gxm, gym) = self.da.getGhostCorners()
        return self._local.getArray(readonly=True).reshape(gym, gxm, 2), self.xs - gxs, self.ys - gys

    def _rhs(self, ts, t, u, f):
        g, ox, oy = self._ghosted(u)
        c = g[oy:oy + self.ym, ox:ox + self.xm]
        lap = (g[oy:oy + self.ym, ox - 1:ox - 1 + self.xm] + g[oy:oy + self.ym, ox + 1:ox + 1 + self.xm]
               + g[oy - 1:oy - 1 + self.ym, ox:ox + self.xm] + g[oy + 1:oy + 1 + self.ym, ox:ox + self.xm]
               - 4.0 * c) * self.s
        uu, vv = c[..., 0], c[..., 1]
        uv2 = uu * vv * vv
        out = f.getArray().reshape(self.ym, self.xm, 2)
        out[..., 0] = self.D1 * lap[..., 0] - uv2 + self.gamma * (1.0 - uu)
        out[..., 1] = self.D2 * lap[..., 1] + uv2 - (self.gamma + self.kappa) * vv

    def _pattern(self):
        """CSR structure of the Jacobian: per row the point itself (u, v), then its four neighbours."""
        (gxs, gys), (gxm, gym) = self.da.getGhostCorners()
        lg = self.da.getLGMap()
        ox, oy = self.xs - gxs, self.ys - gys
        jj, ii = np.meshgrid(np.arange(self.ym) + oy, np.arange(self.xm) + ox, indexing="ij")

        def gidx(dj, di, comp):
            return lg.apply((((jj + dj) * gxm + (ii + di)) * 2 + comp).ravel().astype(petsc().IntType))

        cols = []
        for comp in (0, 1):
            cols.append(np.stack([gidx(0, 0, 0), gidx(0, 0, 1), gidx(0, -1, comp), gidx(0, 1, comp),
                                  gidx(-1, 0, comp), gidx(1, 0, comp)], axis=1))
        npts = self.xm * self.ym
        J = np.stack(cols, axis=1).reshape(npts * 2, 6)  # rows ordered (point, component)
        indptr = np.arange(0, 6 * 2 * npts + 1, 6, dtype=petsc().IntType)
        return indptr, J.ravel().astype(petsc().IntType)

    def _rhsjacobian(self, ts, t, u, A, B):
        c = u.getArray(readonly=True).reshape(self.ym, self.xm, 2)
        uu, vv = c[..., 0].ravel(), c[..., 1].ravel()
        n = uu.size
        vals = np.empty((n, 2, 6))
        vals[:, 0, 0] = -4.0 * self.D1 * self.s - vv * vv - self.gamma
        vals[:, 0, 1] = -2.0 * uu * vv
        vals[:, 0, 2:] = self.D1 * self.s
        vals[:, 1, 0] = vv * vv
        vals[:, 1, 1] = -4.0 * self.D2 * self.s + 2.0 * uu * vv - (self.gamma + self.kappa)
        vals[:, 1, 2:] = self.D2 * self.s
        indptr, cols = self._csr
        A.zeroEntries()
        A.setValuesCSR(indptr, cols, vals.ravel(), addv=False)
        A.assemble()
        return True

    def _rhsjacobianp(self, ts, t, u, C):
        c = u.getArray(readonly=True).reshape(self.ym, self.xm, 2)
        col = np.empty((self.ym, self.xm, 2))
        col[..., 0] = 1.0 - c[..., 0]
        col[..., 1] = -c[..., 1]
        C.zeroEntries()
        rstart, rend = C.getOwnershipRange()
        rows = np.arange(rstart, rend, dtype=petsc().IntType)
        C.setValues(rows, np.zeros(1, dtype=petsc().IntType), col.reshape(-1, 1))
        C.assemble()
        return True

    def objective(self):
        """J = ½ h² |v_n|² over the domain (a final-time term), as (value, gradient)."""
        h2 = (2.5 / self.m) ** 2

        def value(u):
            w = u.getArray(readonly=True).reshape(-1, 2)[:, 1]
            return self.comm.allreduce(float(0.5 * h2 * np.dot(w, w)))

        def gradient(u):
            g = u.duplicate()
            a = g.getArray().reshape(-1, 2)
            a[:, 0] = 0.0
            a[:, 1] = h2 * u.getArray(readonly=True).reshape(-1, 2)[:, 1]
            return g

        return value, gradient

    def stepper(self, n_steps: int | None = None) -> TSStepper:
        """Beyond what the TS holds: the Jacobian's CSR pattern (3.5 states), the ghosted local Vec, u0 and
        the RHS Vec, the DMDA's scatters, the Jacobian callback's temporaries (7) and the RHS's (4): 24
        with slack (experiments/ts_adapter: 11-15 states above the TS's own count measured)."""
        return TSStepper(self.ts, self.u0, n_steps, parameters={"gamma": self.p}, apply_parameters=self.set_gamma,
                         final=self.objective(), name="ex5adj", working_set_extra=24.0)


def grayscott_stepper(comm, args=None) -> TSStepper:
    """``--model hpcadj.ts.examples:grayscott_stepper``: ``--grid M`` (M×M), ``--steps``, PETSc options."""
    grid = getattr(args, "grid", None)
    m = int(str(grid).split("x")[0]) if grid else 32
    ts_type = petsc().Options().getString("ts_type", "cn")
    return GrayScott(comm, m=m, ts_type=ts_type).stepper(getattr(args, "steps", None))
