"""The stepper seam: the abstract class a PETSc time stepper implements to get checkpointed gradients.

The contract (what each method must do and when the driver calls it; pure steps, states never
changed in place, every call collective) is written once, in docs/api.md, "The Stepper contract";
docs/architecture.md (Seam 1) gives its reasons. The docstrings below say what each method returns.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping

from ..snapshot import Snapshot, SnapshotLayout, layout_global_bytes

Controls = dict  # name -> PETSc.Vec


class SolverError(RuntimeError):
    """A model's linear or nonlinear solver failed to converge (e.g. a time step far too large for
    Newton). Raised by :meth:`Stepper.step` and friends; the command line reports it in one line."""


def begin_evaluation(model):
    """Start an evaluation of ``model`` at new controls: a model with adaptive steps
    (:class:`~hpcadj.models.adaptive.AdaptiveSteps`) begins an empty step sequence, returned for the
    evaluation to keep; None for fixed steps."""
    begin = getattr(model, "begin_evaluation", None)
    return begin() if begin is not None else None


class Stepper(abc.ABC):
    """A distributed time stepper with its exact discrete adjoint (contract: docs/api.md).

    Attributes
    ----------
    name : str
        Registry name (``hpcadj run --model NAME``).
    comm : mpi4py communicator
        The communicator the DMDA is distributed over.
    n_steps : int
        Number of time steps n (states u_0 .. u_n).
    dt : float or None
        The fixed time step, or None for a model without a clock (or one overriding :meth:`time`).

    Building a model from command-line options is not part of this contract: that is the job of
    a command-line adapter (:mod:`hpcadj.cli.models`).
    """

    name: str = "abstract"
    dt: float | None = None
    #: whether :meth:`adjoint_step` reads ``u_next``. A scheme whose adjoint recomputes what it
    #: needs from u_i alone (explicit RK) sets False: the driver then lets u_{i+1} go before the
    #: step (it passes None), one state less at the adjoint step's peak.
    adjoint_reads_next: bool = True
    #: whether :meth:`adjoint_step` re-runs the step from u_i for what it reads (RK stages): a mixed
    #: plan (``--schedule mixed``) then reverses the model's steps only from their adjoint data
    recomputes_in_adjoint: bool = False

    # -- controls ---------------------------------------------------------------------------
    @abc.abstractmethod
    def default_controls(self) -> Controls:
        """Fresh Vecs holding the default controls."""

    @abc.abstractmethod
    def set_controls(self, controls: Mapping) -> None:
        """Use these controls for every following step (copies them; rebuilds operators)."""

    @abc.abstractmethod
    def initial_state(self):
        """u_0 built from the current controls (a new Vec)."""

    # -- forward ----------------------------------------------------------------------------
    @abc.abstractmethod
    def step(self, i: int, u):
        """Return u_{i+1} (a new Vec) from u_i; pure in ``(i, u)``."""

    #: whether :meth:`advance` can evaluate the objective inside (``objective=True``); the first
    #: sweep hands runs of steps to it only then, recomputation always
    advance_objective: bool = False

    def has_own_advance(self) -> bool:
        """Whether the model overrides :meth:`advance` (calibration then prices its runs)."""
        return type(self).advance is not Stepper.advance

    def advance(self, i: int, u, k: int, objective: bool = False):
        """Return u_{i+k} from u_i: k steps whose intermediate states nobody reads, bitwise equal to k
        calls of :meth:`step` (docs/models.md, "Advances"); with ``objective`` the pair (u_{i+k},
        [J_{i+1}, .., J_{i+k}]), each bitwise :meth:`objective`'s. The default loops :meth:`step`; a
        model overrides it to time-tile. The input is the caller's (never changed, never destroyed)."""
        terms = []
        for j in range(i, i + k):
            u = self.step(j, u)
            if objective:
                terms.append(self.objective(j + 1, u))
        return (u, terms) if objective else u

    @abc.abstractmethod
    def objective(self, i: int, u) -> float:
        """Contribution J_i(u_i) of state i to the objective (0.0 where there is none)."""

    @abc.abstractmethod
    def objective_gradient(self, i: int, u):
        """dJ_i/du_i as a new Vec, or ``None`` when state i does not enter the objective."""

    def add_objective_gradient(self, i: int, u, lam) -> None:
        """Add dJ_i/du_i into ``lam`` in place (the driver's lambda_i, after the adjoint step).

        The default adds :meth:`objective_gradient`'s Vec. A model whose dJ_i/du_i touches a few
        points (receivers) overrides it to add just those: no full-size Vec and ``axpy`` per step.
        Collective; write through ``lam.getArray()`` on every rank (docs/architecture.md: stale norms).
        """
        dj = self.objective_gradient(i, u)
        if dj is not None:
            lam.axpy(1.0, dj)

    # -- adjoint ----------------------------------------------------------------------------
    @abc.abstractmethod
    def adjoint_step(self, i: int, u, u_next, lam_next, grad: Controls):
        """Return lambda_i = (du_{i+1}/du_i)^T lambda_{i+1} (a new Vec).

        ``u_next`` is u_{i+1}, or None for a model that sets ``adjoint_reads_next = False``.

        Adds (du_{i+1}/dp)^T lambda_{i+1} into ``grad[p]`` for every parameter control p.
        The objective term dJ_i/du_i is added by the driver.
        """

    @abc.abstractmethod
    def initial_adjoint(self, lam0, grad: Controls) -> None:
        """Add (du_0/dc)^T lambda_0 into ``grad[c]`` for the controls that build u_0."""

    # -- tangent linear (for the dot-product test) -----------------------------------------
    @abc.abstractmethod
    def initial_tangent(self, dcontrols: Controls):
        """du_0 = (du_0/dc) dc for a control perturbation ``dcontrols``."""

    @abc.abstractmethod
    def tangent_step(self, i: int, u, u_next, du, dcontrols: Controls):
        """du_{i+1} = (du_{i+1}/du_i) du + (du_{i+1}/dp) dp."""

    # -- what a checkpoint holds ------------------------------------------------------------
    @abc.abstractmethod
    def snapshot_layout(self) -> SnapshotLayout:
        """Global natural-ordered shape and this rank's block of every snapshot field."""

    @abc.abstractmethod
    def snapshot(self, u) -> Snapshot:
        """This rank's owned blocks of state ``u`` in natural axis order.

        Views into ``u`` are fine and save copies: states are never modified in place once a step
        returned them (the adjoint reads them later too), so a level may write the views as they
        are, after its write returned; the views keep the Vec's memory alive until then.
        """

    @abc.abstractmethod
    def restore(self, snapshot: Snapshot):
        """A new state Vec from this rank's blocks (inverse of :meth:`snapshot`)."""

    @abc.abstractmethod
    def control_layout(self) -> SnapshotLayout:
        """Global shape and this rank's block of every control field (for gradient files)."""

    @abc.abstractmethod
    def control_arrays(self, controls: Controls) -> Snapshot:
        """This rank's owned blocks of control-shaped Vecs (gradients included)."""

    # -- description ------------------------------------------------------------------------
    def time(self, i: int) -> float | None:
        """Simulated time of state i, stored with its snapshot: ``i * dt`` for a model with a fixed
        step ``dt``, None for one without a clock. A model with varying steps overrides it."""
        return None if self.dt is None else i * self.dt

    def describe(self) -> dict:
        """Facts for summaries, logs and a run directory's identity (``model``, ``steps``, ``dt``, ...).

        The default holds what the base class knows: the name, n, dt and the snapshot fields' global
        shapes. A resume also checks the trajectory itself, so a setting left out here (a velocity)
        is still caught; listing it names it in the refusal.
        """
        shape = {name: list(f.global_shape) for name, f in sorted(self.snapshot_layout().items())}
        return {"model": self.name, "steps": self.n_steps, "dt": self.dt, "shape": shape}

    def working_set_states(self) -> float:
        """The model's own peak memory per rank, in state-equivalents (one snapshot's bytes here).

        Count everything the model allocates and holds at its peak beside the driver's states:
        operators (a matrix by its bytes), Krylov/SNES work vectors and preconditioner data,
        persistent scratch, its copies of the controls, and the transients of its largest step
        or adjoint step (padded halo copies, numpy temporaries). Not counted here: the states and
        lambda the driver holds, the caller's controls and the gradient, checkpoint slots and
        staging buffers (:func:`hpcadj.checkpoint.memory.plan_memory` adds those).

        Used to predict a run's memory and to size RAM slots from a whole-process budget. The
        default, 32, is conservative for a matrix-based implicit solver in 3-D; a model that does
        not override it still works, it only leaves fewer slots than it could. Override it with a
        count (measured peak RSS minus baseline, per state, less the driver's share, is a good check;
        see ``experiments/memory_budget``).
        """
        return 32.0

    def snapshot_bytes(self) -> int:
        """Bytes of one snapshot over all ranks."""
        return layout_global_bytes(self.snapshot_layout())

    # -- adjoint data (optional): what the adjoint step reads, stored instead of a restart state --
    #: what store-all and auto price, in forward steps, where the cost profile has no measured figure
    #: (the default profile; ``hpcadj calibrate`` measures both): a step of a run handed to the
    #: model's own :meth:`advance` (None: a single step's) and a step reversed from its adjoint data
    #: beyond its adjoint step (capture and stand-in)
    relative_advance_step: float | None = None
    relative_data_step: float = 0.0

    def adjoint_data_layout(self) -> SnapshotLayout | None:
        """The layout of one step's *adjoint data* (what :meth:`adjoint_step` reads of u_i), or None:
        the model declares none and is planned with restart states only."""
        return None

    def adjoint_data(self, i: int, u, u_next) -> Snapshot:
        """Step i's adjoint data, captured right after the step from its input u_i and output u_{i+1}:
        this rank's blocks, copies (a view would keep the whole state alive)."""
        raise NotImplementedError

    def adjoint_data_state(self, i: int, data: Snapshot):
        """A stand-in for u_i built from step i's data alone: :meth:`adjoint_step` (with u_next None)
        and :meth:`add_objective_gradient` given it must return bitwise what they return given u_i."""
        raise NotImplementedError


class SecondOrderSteps:
    """Optional methods a Stepper adds for Hessian-vector products (:mod:`hpcadj.adjoint.hessian`).

    A model need not inherit this class; the composite second-order stepper looks the methods up.
    ``add_objective_hessian`` alone gives the Gauss-Newton product; ``hessian_adjoint_step`` too
    gives the exact (Newton) one.
    """

    def add_objective_hessian(self, i: int, u, du, dlam) -> None:
        """Add (d^2 J_i/du_i^2) du into ``dlam`` in place (nothing where state i is not observed)."""
        raise NotImplementedError

    def hessian_adjoint_step(self, i: int, u, u_next, du, du_next, lam_next, dlam_next, dcontrols: Controls,
                             grad: Controls, hgrad: Controls):
        """Return (lambda_i, dlambda_i) of step i, adding dJ/dp into ``grad`` and (H v)_p into ``hgrad``.

        lambda_i and ``grad`` are exactly :meth:`Stepper.adjoint_step`'s. dlambda_i =
        (du_{i+1}/du_i)^T dlambda_{i+1} + D[(du_{i+1}/du_i)^T lambda_{i+1}], D the derivative along
        (du_i, dcontrols) (and du_{i+1}, for a scheme whose adjoint reads u_{i+1}); ``hgrad`` gets
        (du_{i+1}/dp)^T dlambda_{i+1} + D[(du_{i+1}/dp)^T lambda_{i+1}]. ``u_next``/``du_next`` are
        None for a model with ``adjoint_reads_next = False``.
        """
        raise NotImplementedError
