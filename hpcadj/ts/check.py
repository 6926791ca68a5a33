"""PETSc's own answer on the same TS: ``TSSolve`` + ``TSAdjointSolve`` with the memory trajectory.

The oracle hpcadj's TS gradients are tested against, and a check a user can run on their own TS
(on a second instance with its own DM: the one wrapped by a :class:`~hpcadj.ts.TSStepper` keeps
its callbacks in its DM).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _capi


@dataclass
class PetscGradient:
    J: float
    lam0: object          # dJ/du0, a Vec
    mu: object            # dJ/dp (PETSc's mu), a Vec, or None
    steps: int


def tsadjoint_gradient(ts, u0, n_steps: int | None, final, parameters=None) -> PetscGradient:
    """Solve from ``u0`` for ``n_steps`` steps (None: the TS's own end), then ``TSAdjointSolve``.

    ``final`` is the (value, gradient) pair of the final-time term; ``parameters`` a Vec laid out
    as the TS's JacobianP columns (its gradient comes back as ``mu``), or None.
    """
    _capi.use_memory_trajectory(ts)          # store-all in RAM, no directory left behind
    if n_steps is not None:
        ts.setMaxSteps(n_steps)
    u = u0.copy()
    ts.solve(u)
    value, gradient = final
    J = value(u)                     # before the adjoint: TSAdjointSolve leaves the solution Vec changed
    lam = gradient(u)
    steps = ts.getStepNumber()
    mu = None
    if parameters is not None:
        mu = parameters.duplicate()
        mu.set(0.0)
        ts.setCostGradients([lam], [mu])
    else:
        ts.setCostGradients([lam])
    ts.adjointSolve()
    return PetscGradient(J, lam, mu, steps)
