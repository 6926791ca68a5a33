"""The heat problem solved by PETSc's own TS (theta/CN, BEULER) and TSAdjoint: an independent oracle.

Same matrix L(kappa) as :class:`HeatModel`; the objective is the default one, J = 1/2 h^d ||u_n||^2, so
TSAdjoint is seeded with dJ/du_n = h^d u_n and returns dJ/du_0.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..imports import petsc


@dataclass
class TSResult:
    J: float
    grad_u0: object  # PETSc.Vec
    steps: int


def heat_ts_gradient(model, controls, trajectory: str = "memory", rtol: float = 1e-13) -> TSResult:
    """Solve ``model``'s heat problem with TS and differentiate it with TSAdjoint."""
    PETSc = petsc()
    model.set_controls(controls)
    # L = (B - I) / ((1 - theta) dt) is awkward for theta = 1; rebuild L from A: L = (I - A) / (theta dt)
    L = model.assemble_matrix(controls["kappa"])
    L.shift(-1.0)
    L.scale(-1.0 / (model.theta * model.dt))

    ts = PETSc.TS().create(comm=model.comm)
    ts.setProblemType(PETSc.TS.ProblemType.LINEAR)
    if model.theta == 1.0:
        ts.setType(PETSc.TS.Type.BEULER)
    else:
        ts.setType(PETSc.TS.Type.THETA)
        ts.setTheta(model.theta)
        ts.setThetaEndpoint(True)
    # implicit form F(t, u, u') = u' - L u, dF/du + shift dF/du' = shift I - L
    def ifunction(ts, t, u, udot, f):
        L.mult(u, f)
        f.aypx(-1.0, udot)

    def ijacobian(ts, t, u, udot, shift, jac, pre):
        L.copy(jac, structure=PETSc.Mat.Structure.SAME_NONZERO_PATTERN)
        jac.scale(-1.0)
        jac.shift(shift)
        return True

    jac = L.duplicate(copy=True)
    ts.setIFunction(ifunction, L.createVecLeft())
    ts.setIJacobian(ijacobian, jac, jac)
    ts.setTime(0.0)
    ts.setTimeStep(model.dt)
    ts.setMaxSteps(model.n_steps)
    ts.setMaxTime(model.n_steps * model.dt * 2)
    ts.setExactFinalTime(PETSc.TS.ExactFinalTime.MATCHSTEP)
    snes = ts.getSNES()
    snes.setType("ksponly")
    ksp = snes.getKSP()
    ksp.setType("cg")
    ksp.getPC().setType("jacobi")
    ksp.setTolerances(rtol=rtol, atol=1e-300, max_it=10000)
    ts.setSaveTrajectory()
    opts = PETSc.Options()
    opts["ts_trajectory_type"] = trajectory
    ts.setFromOptions()
    del opts["ts_trajectory_type"]

    u = model.initial_state()
    ts.solve(u)
    steps = ts.getStepNumber()
    J = model.objective(model.n_steps, u)
    lam = model.objective_gradient(model.n_steps, u)
    ts.setCostGradients(lam)
    ts.adjointSolve()
    ts.destroy()
    return TSResult(J=J, grad_u0=lam, steps=steps)
