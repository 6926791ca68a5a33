"""A user's 2-D Allen–Cahn TS, written as for ``TSAdjointSolve``: u_t = D Δu + k (u − u³) on the periodic
unit square, a DMDA (dof 1, star stencil), RHS function and assembled AIJ RHS Jacobian, the scalar k as
the parameter (RHSJacobianP), J = ½ h² |u_n|². RK4 by default (``-ts_type``/``-ts_rk_type`` apply).

``build(comm, args)`` is what ``hpcadj run --model experiments/mixed/allen_cahn.py:build`` takes
(``--grid M``, ``--steps``); :func:`make_ts` gives a second, independent TS for ``TSAdjointSolve``.
"""

from __future__ import annotations

import numpy as np

from hpcadj.imports import petsc

D, DT = 1.0e-4, 1.0e-3


def make_ts(comm, m: int = 128, k: float = 1.0, steps: int = 200):
    """(ts, u0, k Vec, set_k, objective): the user's TS on its own DMDA."""
    PETSc = petsc()
    da = PETSc.DMDA().create(dim=2, dof=1, sizes=(m, m), boundary_type=("periodic", "periodic"),
                             stencil_type="star", stencil_width=1, comm=comm)
    da.setUp()
    (xs, xe), (ys, ye) = da.getRanges()
    xm, ym = xe - xs, ye - ys
    (gxs, gys), (gxm, gym) = da.getGhostCorners()
    ox, oy = xs - gxs, ys - gys
    h = 1.0 / m
    s = D / (h * h)
    par = {"k": k}
    local = da.createLocalVec()

    def rhs(ts, t, u, f):
        da.globalToLocal(u, local)
        g = local.getArray(readonly=True).reshape(gym, gxm)
        c = g[oy:oy + ym, ox:ox + xm]
        lap = (g[oy:oy + ym, ox - 1:ox - 1 + xm] + g[oy:oy + ym, ox + 1:ox + 1 + xm]
               + g[oy - 1:oy - 1 + ym, ox:ox + xm] + g[oy + 1:oy + 1 + ym, ox:ox + xm] - 4.0 * c)
        f.getArray().reshape(ym, xm)[...] = s * lap + par["k"] * (c - c ** 3)

    lg = da.getLGMap()
    jj, ii = np.meshgrid(np.arange(ym) + oy, np.arange(xm) + ox, indexing="ij")

    def gidx(dj, di):
        return lg.apply(((jj + dj) * gxm + (ii + di)).ravel().astype(PETSc.IntType))

    cols = np.stack([gidx(0, 0), gidx(0, -1), gidx(0, 1), gidx(-1, 0), gidx(1, 0)], axis=1).ravel()
    indptr = np.arange(0, 5 * xm * ym + 1, 5, dtype=PETSc.IntType)
    A = da.createMatrix()
    A.setOption(PETSc.Mat.Option.NEW_NONZERO_ALLOCATION_ERR, True)

    def jacobian(ts, t, u, J, P):
        w = u.getArray(readonly=True)
        vals = np.empty((w.size, 5))
        vals[:, 0] = -4.0 * s + par["k"] * (1.0 - 3.0 * w * w)
        vals[:, 1:] = s
        J.setValuesCSR(indptr, cols, vals.ravel(), addv=False)
        J.assemble()
        return True

    rows = np.arange(*da.createGlobalVec().getOwnershipRange(), dtype=PETSc.IntType)
    Jp = PETSc.Mat().createDense([(xm * ym, m * m), (1 if comm.rank == 0 else 0, 1)], comm=comm)
    Jp.setUp()

    def jacobian_p(ts, t, u, C):
        w = u.getArray(readonly=True)
        C.setValues(rows, np.zeros(1, dtype=PETSc.IntType), (w - w ** 3).reshape(-1, 1))
        C.assemble()
        return True

    u0 = da.createGlobalVec()
    y = (np.arange(ys, ye) + 0.5)[:, None] * h
    x = (np.arange(xs, xe) + 0.5)[None, :] * h
    u0.getArray().reshape(ym, xm)[...] = 0.6 * np.sin(2 * np.pi * x) * np.sin(4 * np.pi * y) + 0.1 * np.cos(2 * np.pi * y)
    k_vec = PETSc.Vec().createMPI((1 if comm.rank == 0 else 0, 1), comm=comm)
    k_vec.set(k)
    ts = PETSc.TS().create(comm=comm)
    ts.setDM(da)
    ts.setType("rk")
    ts.setRKType("4")
    ts.setRHSFunction(rhs, u0.duplicate())
    ts.setRHSJacobian(jacobian, A, A)
    ts.setRHSJacobianP(jacobian_p, Jp)
    ts.setTimeStep(DT)
    ts.setMaxSteps(steps)
    ts.setMaxTime(1e6)
    ts.setFromOptions()

    def set_k(vec):
        par["k"] = comm.bcast(float(vec.getArray(readonly=True)[0]) if comm.rank == 0 else None)

    def value(u):
        return u.dot(u) * (0.5 * h * h)

    def gradient(u):
        return u * (h * h)

    return ts, u0, k_vec, set_k, (value, gradient)


def build(comm, args=None):
    """``hpcadj run --model experiments/mixed/allen_cahn.py:build --grid M --steps N``."""
    from hpcadj.ts import TSStepper

    grid = getattr(args, "grid", None)
    m = int(str(grid).split("x")[0]) if grid else 128
    steps = getattr(args, "steps", None) or 200
    ts, u0, k_vec, set_k, objective = make_ts(comm, m, steps=steps)
    return TSStepper(ts, u0, steps, parameters={"k": k_vec}, apply_parameters=set_k, final=objective,
                     name="allen_cahn")
