"""A user's own petsc4py TS as an hpcadj :class:`~hpcadj.models.base.Stepper`.

hpcadj drives the TS one step at a time (``restartStep()`` then ``step()`` from a restored state,
time, step number and dt) and runs PETSc's own ``TSAdjointStep`` for the reverse sweep, after placing
in the TS what that step reads: u_{i+1} in the solution Vec, the method's stages, t_{i+1}, a negative
dt and the step number. PETSc's trajectory is never filled; hpcadj's plans and levels hold the states.

Stages: for θ-endpoint methods (Crank–Nicolson, backward Euler) they are u_i and u_{i+1}, which the
driver holds: they are copied in (``TSGetStages``), nothing is recomputed. θ-midpoint's one stage X
is the Newton solution from which TSStep made u_{i+1} = u_i + (X - u_i)/θ: it is reconstructed as
u_i + θ (u_{i+1} - u_i), equal to X up to round-off (the gradient to ~1e-13 relative, not bitwise).
RK methods declare their stages as the step's adjoint data (:mod:`hpcadj.ts.stages`): a plan that
keeps them (``--schedule mixed``) reverses the step from them; from a state alone the step is re-run
from u_i before the adjoint step, an adjoint step then costing one forward step more (the cost the
planner uses comes from timing :meth:`TSStepper.adjoint_step` itself, ``hpcadj calibrate``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping

import numpy as np

from ..checkpoint.options import ConfigError
from ..models.adaptive import AdaptiveSteps, StepSequence
from ..models.base import SolverError, Stepper
from ..snapshot import FieldLayout
from ..imports import petsc
from . import _capi, preflight
from .stages import StageData

CONTROL_U0 = "u0"

#: DM handle -> the wrapped TS using it (petsc4py keeps TS callbacks in the DM: one TS per DM)
_BY_DM: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()


class TSRefused(ConfigError):
    """The TS uses something hpcadj cannot drive step by step (one line, says what and why)."""


def _version() -> tuple[int, int, int]:
    return tuple(petsc().Sys.getVersion())[:3]


def _version_text(v) -> str:
    return ".".join(str(x) for x in v)


class TSStepper(StageData, AdaptiveSteps, Stepper):
    """Checkpointed gradients of a user's TS from PETSc's own adjoint, one step at a time.

    Parameters
    ----------
    ts : petsc4py TS
        Configured by the user (type, functions, Jacobians, ``setFromOptions()``); its time and time
        step at construction are t_0 and dt (the first trial dt of an adaptive TS).
    u0 : Vec
        The initial state; the control ``"u0"`` (its gradient is λ_0).
    n_steps : int, optional
        Number of steps of a fixed-step TS (default: the TS's max steps), each of exactly dt: the
        TS's max time is not used (``TSSolve`` with MATCHSTEP may trim a last step to land on it).
    parameters : {name: Vec}, optional
        At most one: the parameter Vec p of the TS's (I/RHS)JacobianP, whose columns it indexes
        (PETSc's μ). A field or a scalar alike: a Vec laid out as JacobianP's columns.
    apply_parameters : callable(Vec), optional
        Called with a copy of p whenever the controls change, so the user's callbacks use it. Without
        it, each new value is written into the Vec given in ``parameters``: callbacks reading that
        Vec need nothing more.
    final : (value(u) -> float, gradient(u) -> Vec), optional
        The final-time term of J and its derivative (value the same on every rank).
    every_step : (value(i, t, u) -> float, gradient(i, t, u) -> Vec or None), optional
        A term at every state u_0 .. u_n (gradient None where state i does not enter J).
    t_final : float, optional
        For an adaptive TS (a TSAdapt other than 'none'): the end time (default: the TS's max time).
    working_set_extra : float
        States the user's own objects hold beyond those the TS knows (its Jacobians, stages, solvers
        are counted), e.g. numpy temporaries of the callbacks: part of what ``--memory`` plans for.
    """

    name = "ts"
    #: no tangent-linear step: ``hpcadj gradcheck`` runs the Taylor test only
    has_tangent = False

    def __init__(self, ts, u0, n_steps: int | None = None, *, parameters: Mapping | None = None,
                 apply_parameters: Callable | None = None, final=None, every_step=None,
                 t_final: float | None = None, name: str | None = None, max_steps: int | None = None,
                 working_set_extra: float = 8.0):
        PETSc = petsc()
        self.ts = ts
        self.comm = ts.getComm().tompi4py()
        if name:
            self.name = name
        if final is None and every_step is None:
            raise TSRefused("give the objective: final=(value, gradient) and/or every_step=(value, gradient)")
        self._final, self._every = final, every_step
        parameters = dict(parameters or {})
        if len(parameters) > 1:
            raise TSRefused("PETSc's adjoint has one parameter Vec (the JacobianP columns): give at most one")
        if CONTROL_U0 in parameters:
            raise TSRefused(f"{CONTROL_U0!r} names the initial state; call the parameter something else")
        self._pname = next(iter(parameters), None)
        self._p0 = parameters.get(self._pname)     # the user's Vec: new values are written here
        self._p_initial = None                     # its value at construction (the default control)
        self._apply = apply_parameters
        self._u0 = u0
        self._refuse_unsupported()
        self._claim_dm()                    # before this TS is touched: a second TS on a DM breaks the first
        problem = preflight.check_layouts(self)
        if problem:
            raise TSRefused(problem)
        self.ts_type = ts.getType()
        self._endpoint = self._theta_endpoint()
        self._midpoint = self.ts_type in ("theta", "cn", "beuler") and not self._endpoint
        self._theta = float(ts.getTheta()) if self._midpoint else None
        self.adjoint_reads_next = self._endpoint or self._midpoint
        ts.setErrorIfStepFails(False)
        ts.setExactFinalTime(PETSc.TS.ExactFinalTime.MATCHSTEP)
        # TSAdjointStep segfaults without a trajectory; ts.step() never fills it, so it stores nothing,
        # and the memory type, unlike PETSc's default, leaves no TS-data-* directory behind
        _capi.use_memory_trajectory(ts)
        ts.setSolution(u0.copy())
        ts.setUp()
        self._init_stage_data()
        self._refuse_version_specific()
        if self._pname is not None:
            self._p_initial = self._p0.copy()
        self.t0 = float(ts.getTime())
        self._dt0 = float(ts.getTimeStep())
        if not self._dt0 > 0:
            raise TSRefused(f"the TS's time step must be positive at the start, got {self._dt0} "
                            f"(a TS after adjointSolve keeps a negative one: call ts.setTimeStep(dt))")
        self._adaptive_type = _capi.adapt_type(ts)
        if self._adaptive_type == "none":
            self.steps = None
            self.dt = self._dt0
            self.n_steps = int(n_steps if n_steps is not None else ts.getMaxSteps())
            if self.n_steps < 1:
                raise TSRefused(f"number of steps must be >= 1, got {self.n_steps}")
            self._times = [self.t0]
        else:
            self.dt = None
            self.n_steps = None
        self._sol = u0.duplicate()          # the TS's solution Vec during adjoint steps
        self._template = self._plain_vec(u0)
        self._last_taken = None             # the step the TS took last (θ's estimate continues from it)
        self._controls = None
        if not working_set_extra >= 0:
            raise TSRefused(f"working_set_extra must be >= 0 states, got {working_set_extra}")
        self._extra = float(working_set_extra)
        self._working = self._working_set()  # collective: counted here, where every rank is
        self._preflight()
        if self._adaptive_type != "none":
            self.steps = self._step_sequence(t_final, max_steps or int(ts.getMaxSteps()))

    @staticmethod
    def _plain_vec(u0):
        """A Vec laid out as u0 without its DM: its duplicates share its layout and cost no collective
        call, where a DMDA Vec's are made by the DM (a new layout: an allreduce and an allgather each).
        Over an array never written: its pages are never touched, it holds no memory."""
        PETSc = petsc()
        array = np.empty(u0.getLocalSize(), dtype=PETSc.ScalarType)
        return PETSc.Vec().createWithArray(array, size=(u0.getLocalSize(), u0.getSize()),
                                           bsize=u0.getBlockSize(), comm=u0.getComm())

    def _fresh_vec(self):
        """A new Vec laid out as the state, with the state's DM (``getDM``), made without a collective call:
        every state a step or a restore makes, λ of each adjoint step, the stand-in of a step reversed
        from its data."""
        vec = self._template.duplicate()
        dm = self.ts.getDM()
        if dm is not None and dm.handle:
            vec.setDM(dm)
        return vec

    # -- checks ----------------------------------------------------------------------------
    def _preflight(self) -> None:
        """The objective, PETSc's step and adjoint step, the parameter's reach: refused before any run."""
        problem = preflight.check_objective(self, self._u0) or preflight.dry_run(self)
        if problem:
            raise TSRefused(problem)

    def _step_sequence(self, t_final, max_steps: int) -> StepSequence:
        """The record of an adaptive TS's steps, up to its end time, refused where it cannot get there."""
        kind = self._adaptive_type
        end = float(t_final if t_final is not None else self.ts.getMaxTime())
        if not np.isfinite(end) or end >= 1e300:
            raise TSRefused(f"an adaptive TS (TSAdapt {kind}) needs an end time: give -ts_max_time T (or "
                            f"ts.setMaxTime(T), or t_final=T); its steps are decided until t reaches it")
        if not end > self.t0:
            raise TSRefused(f"the end time {end:g} of the adaptive TS (TSAdapt {kind}) is not after its start "
                            f"time {self.t0:g}: give -ts_max_time T > {self.t0:g}")
        dt_max = _capi.adapt_step_limits(self.ts)[1]
        if max_steps * dt_max < end - self.t0:
            raise TSRefused(f"the adaptive TS cannot reach t = {end:g} in {max_steps} steps of at most "
                            f"{dt_max:g} (-ts_adapt_dt_max): give -ts_max_steps N with N >= "
                            f"{int(np.ceil((end - self.t0) / dt_max))}")
        return StepSequence(end - self.t0, max_steps)

    def _claim_dm(self) -> None:
        dm = self.ts.getDM()
        if dm is None:
            return
        other = _BY_DM.get(dm.handle)
        if other is not None and other.handle and other.handle != self.ts.handle:
            raise TSRefused("another TS already runs on this DM: petsc4py keeps a TS's callbacks in its DM, so "
                            "a second TS on it (and its destruction) breaks the first; give each TS its own DM")
        _BY_DM[dm.handle] = self.ts

    def _refuse_unsupported(self) -> None:
        ts = self.ts
        # getNumEvents() dereferences a missing event handler on PETSc 3.18; petsc4py keeps the callbacks
        if {"__eventhandler__", "__indicator__"} & set(ts.getDict() or {}):
            raise TSRefused("the TS has events (TSSetEventHandler): hpcadj's step-by-step adjoint cannot "
                            "reach them; remove them")
        if ts.getQuadratureTS()[1].handle:
            raise TSRefused("the TS has a quadrature TS (an integral cost): hpcadj's step-by-step adjoint cannot "
                            "reach it; give the integrand as every_step terms")
        if ts.getType() == "arkimex" and _version() < (3, 19, 0):
            raise TSRefused(f"PETSc {_version_text(_version())} has no adjoint for TS type arkimex "
                            f"(PETSc 3.19 has one): choose another -ts_type")

    def _refuse_version_specific(self) -> None:
        if self.ts_type != "rk" or self._pname is None or _version() >= (3, 21, 4):
            return
        weights = _capi.rk_weights(self.ts)
        if any(b == 0.0 for b in weights):
            raise TSRefused(f"PETSc {_version_text(_version())}'s RK adjoint gives wrong parameter gradients for "
                            f"tableau {self.ts.getRKType()} (a zero weight; fixed in PETSc 3.21.4): choose another "
                            f"-ts_rk_type")

    def _theta_endpoint(self) -> bool:
        """θ-endpoint (CN, backward Euler): the stages are u_i and u_{i+1}."""
        if self.ts_type not in ("theta", "cn", "beuler"):
            return False
        return bool(self.ts.getThetaEndpoint()) or self.ts.getTheta() == 1.0

    @property
    def recomputes_in_adjoint(self) -> bool:
        """True where an adjoint step from the states re-runs the forward step for its stages (RK and other
        non-θ types); from the stages kept as adjoint data (:mod:`hpcadj.ts.stages`) it does not."""
        return not (self._endpoint or self._midpoint)

    @property
    def adjoint_stages(self) -> str:
        """How an adjoint step gets its stages: 'filled' (θ-endpoint: u_i and u_{i+1} copied in),
        'reconstructed' (θ-midpoint: X = u_i + θ (u_{i+1} - u_i), round-off from TSStep's X) or
        'recomputed' (RK: the step re-run from u_i, unless a plan kept its stages as adjoint data)."""
        return "filled" if self._endpoint else "reconstructed" if self._midpoint else "recomputed"

    # -- controls ----------------------------------------------------------------------------
    def default_controls(self):
        controls = {CONTROL_U0: self._u0.copy()}
        if self._pname is not None:
            controls[self._pname] = self._p_initial.copy()
        return controls

    def set_controls(self, controls: Mapping) -> None:
        self._controls = {k: v.copy() for k, v in controls.items()}
        if self._pname is not None:
            self._apply_parameter(self._controls[self._pname])

    def _apply_parameter(self, value) -> None:
        """Hand the parameter to the user's callbacks: ``apply_parameters``, else into their own Vec."""
        if self._apply is not None:
            self._apply(value.copy())
        else:
            value.copy(self._p0)

    def initial_state(self):
        return self._controls[CONTROL_U0].copy()

    # -- clock -------------------------------------------------------------------------------
    def time(self, i: int) -> float | None:
        if self.steps is not None:
            return None if self.steps.time(i) is None else self.t0 + self.steps.time(i)
        while len(self._times) <= i:  # TSStep's clock: t += dt, step after step
            self._times.append(self._times[-1] + self.dt)
        return self._times[i]

    def _dt(self, i: int) -> float:
        return self.dt if self.steps is None else self.steps.dt(i)

    def begin_evaluation(self):
        """A new evaluation: an empty step sequence, and no previous step for θ's estimate to continue."""
        self._last_taken = None
        return super().begin_evaluation()

    # -- forward -----------------------------------------------------------------------------
    def _take_step(self, i: int, x, dt: float, replay: bool = True, restart: bool = True,
                   t: float | None = None) -> None:
        """One ``TSStep`` from x = u_i at t_i (or ``t``) with ``dt``; a replay of an adaptive TS accepts
        it as it is. ``restart`` False continues from the TS's previous step (θ's error estimate reads it)."""
        ts = self.ts
        if self._adaptive_type != "none":
            _capi.set_always_accept(ts, replay)
        ts.setSolution(x)
        ts.setTime(self.time(i) if t is None else t)
        ts.setTimeStep(dt)
        ts.setStepNumber(i)
        if restart:
            ts.restartStep()
        self._last_taken = i
        self._stages_changed()
        ts.step()
        reason = ts.getConvergedReason()
        if reason < 0:
            raise SolverError(f"TS step {i} at t = {self.time(i):.6g} (dt = {dt:.3g}) failed: "
                              f"{_reason_name(reason)}")

    def _probe_step(self, u0, dt: float):
        """Step 0 from u0 with ``dt`` (accepted as it is), outside any run: a new Vec."""
        x = u0.copy()
        self._take_step(0, x, dt, t=self.t0)
        return x

    def step(self, i: int, u):
        x = self._fresh_vec()       # not u.copy(): a DMDA Vec's copy makes a new layout (two collectives)
        u.copy(x)
        if self.steps is not None and not self.steps.known(i):
            self._first_adaptive_step(i, u, x)
        else:
            self._take_step(i, x, self._dt(i))
        self._stages_taken(i, x)
        return x

    def _first_adaptive_step(self, i: int, u, x) -> None:
        """Decide dt_i with the user's TSAdapt; record it so every later step replays it.

        θ's error estimate reads the previous step, so there the deciding step continues from it
        (no restart) and the step is then re-taken from u_i, restarted, at the chosen dt: the stored
        state is the one every replay computes (a first-sweep step costs two). An RK method's
        embedded estimate needs no history: its step is re-taken only when the TSAdapt rejected tries.
        """
        trial = self.steps.proposal if self.steps.proposal is not None else self._dt0
        dt, last = self._clip(i, trial)
        rejections = self.ts.getStepRejections()
        history = self.ts_type in ("theta", "cn", "beuler")
        self._take_step(i, x, dt, replay=False, restart=not (history and self._last_taken == i - 1))
        proposal = float(self.ts.getTimeStep())
        if history or self.ts.getStepRejections() > rejections:
            if self.ts.getStepRejections() > rejections:
                # the TSAdapt shrank the step: its dt is known only as t_{i+1} - t_i
                dt, last = self._clip(i, self.ts.getTime() - self.time(i))
            u.copy(x)
            self._take_step(i, x, dt)
        self._accepted(i, dt, last, proposal)

    def _clip(self, i: int, dt: float) -> tuple[float, bool]:
        """The recorded sequence's step from the TSAdapt's dt; a SolverError (one line) where it cannot go on."""
        try:
            return self.steps.clip(i, dt)
        except ValueError:
            if i + 1 >= self.steps.max_steps:
                raise SolverError(f"the adaptive TS needs more than its {self.steps.max_steps} max steps to reach "
                                  f"t = {self.t0 + self.steps.t_final:g} (at t = {self.time(i):.6g}, dt = "
                                  f"{dt:.3g}): give a larger -ts_max_steps") from None
            raise SolverError(f"the TSAdapt's step at t = {self.time(i):.6g} collapsed to dt = {dt:g}: loosen "
                              f"-ts_rtol/-ts_atol or check the TS") from None

    # -- objective ---------------------------------------------------------------------------
    def _is_final(self, i: int) -> bool:
        return self.done(i)

    def objective(self, i: int, u) -> float:
        J = 0.0
        if self._every is not None:
            J += float(self._every[0](i, self.time(i), u))
        if self._final is not None and self._is_final(i):
            J += float(self._final[0](u))
        return J

    def objective_gradient(self, i: int, u):
        total = None
        if self._every is not None:
            total = self._every[1](i, self.time(i), u)
        if self._final is not None and self._is_final(i):
            g = self._final[1](u)
            total = g if total is None else total + g
        return total

    # -- adjoint -----------------------------------------------------------------------------
    def adjoint_step(self, i: int, u, u_next, lam_next, grad):
        lam = self._fresh_vec()
        lam_next.copy(lam)
        self._adjoint(i, self.time(i), self.time(i + 1), self._dt(i), u, u_next, lam,
                      grad[self._pname] if self._pname is not None else None)
        return lam

    def _adjoint(self, i: int, t_i: float, t_next: float, dt: float, u, u_next, lam, mu) -> None:
        """PETSc's ``TSAdjointStep`` from t_next back to t_i: λ in ``lam`` (in place), μ added to ``mu``."""
        ts = self.ts
        stored = None           # (stage handles, the arrays placed in them) when reversing from stored stages
        if self._endpoint:
            u_next.copy(self._sol)
            ts.setSolution(self._sol)
            stages = _capi.stage_handles(ts)
            _capi.vec_copy_into(u, stages[0])
        elif self._midpoint:
            # TSAdjointStep_Theta (midpoint) reads the stage X and u_{i+1} only: it recovers u_i from them
            u_next.copy(self._sol)
            ts.setSolution(self._sol)
            stage = u_next.copy()
            stage.axpby(1.0 - self._theta, self._theta, u)      # θ u_{i+1} + (1 - θ) u_i
            _capi.vec_copy_into(stage, _capi.stage_handles(ts)[0])
        else:
            stored = self._stored_stages(i, u)
            if stored is None:
                u.copy(self._sol)
                self._take_step(i, self._sol, dt, t=t_i)
        ts.setTime(t_next)
        ts.setTimeStep(t_i - t_next)
        ts.setStepNumber(i + 1)
        if mu is not None:
            ts.setCostGradients([lam], [mu])
        else:
            ts.setCostGradients([lam])
        try:
            ts.adjointStep()
        finally:
            if stored is not None:
                _capi.reset_stages(stored[0])

    def initial_adjoint(self, lam0, grad) -> None:
        grad[CONTROL_U0].axpy(1.0, lam0)

    # -- tangent linear: not offered (PETSc's TSForward would be the route) -------------------
    def initial_tangent(self, dcontrols):
        raise NotImplementedError("a TS model has no tangent-linear step here: use the Taylor test")

    def tangent_step(self, i, u, u_next, du, dcontrols):
        raise NotImplementedError("a TS model has no tangent-linear step here: use the Taylor test")

    # -- snapshots ---------------------------------------------------------------------------
    def _layout_of(self, vec) -> FieldLayout:
        dm = self.ts.getDM()
        if dm is not None and dm.getType() == "da" and vec.getSize() == self._u0.getSize():
            dof = dm.getDof()
            sizes = dm.getSizes()[::-1]                  # natural order: slowest axis first
            corners = dm.getCorners()
            start = tuple(corners[0][::-1])
            shape = tuple(corners[1][::-1])
            comp = (dof,) if dof > 1 else ()
            return FieldLayout(tuple(sizes) + comp, start + (0,) * len(comp), shape + comp)
        lo, hi = vec.getOwnershipRange()
        return FieldLayout((vec.getSize(),), (lo,), (hi - lo,))

    def snapshot_layout(self):
        return {"u": self._layout_of(self._u0)}

    def snapshot(self, u):
        return {"u": u.getArray(readonly=True).reshape(self._layout_of(u).shape)}

    def restore(self, snapshot):
        vec = self._fresh_vec()
        vec.getArray()[...] = np.asarray(snapshot["u"]).reshape(-1)
        return vec

    def control_layout(self):
        layout = {CONTROL_U0: self._layout_of(self._u0)}
        if self._pname is not None:
            layout[self._pname] = self._layout_of(self._p_initial)
        return layout

    def control_arrays(self, controls):
        layouts = self.control_layout()
        return {k: controls[k].getArray(readonly=True).reshape(layouts[k].shape).copy() for k in layouts}

    # -- description -------------------------------------------------------------------------
    def describe(self) -> dict:
        info = {"model": self.name, "steps": self.n_steps, "ts_type": self.ts_type, "dt": self.dt,
                "adjoint_stages": self.adjoint_stages,
                "petsc": _version_text(_version())}
        if self.ts_type == "rk":
            info["rk_type"] = self.ts.getRKType()
        if self.ts_type in ("theta", "cn", "beuler"):
            info.update(theta=float(self.ts.getTheta()), theta_endpoint=bool(self.ts.getThetaEndpoint()))
        if self._adaptive_type != "none":
            info.update(self._adapt_description())
        dm = self.ts.getDM()
        if dm is not None and dm.getType() == "da":
            info["grid"] = "x".join(str(s) for s in dm.getSizes())
        return self._describe_steps(info)

    def _adapt_description(self) -> dict:
        """Everything that decides an adaptive step, as flat ``adapt_*`` keys (a resume names the one
        that changed): the first trial dt, the TS's tolerances, the TSAdapt's settings, and the
        ``-ts_adapt_*`` options given (those without a getter, e.g. the DSP filter; not the monitor)."""
        rtol, atol = self.ts.getTolerances()
        info = {"adapt_dt0": self._dt0,
                "adapt_rtol": rtol if isinstance(rtol, float) else "vector",
                "adapt_atol": atol if isinstance(atol, float) else "vector"}
        info.update({f"adapt_{k}": v for k, v in _capi.adapt_settings(self.ts).items()})
        given = f"{self.ts.getOptionsPrefix() or ''}ts_adapt_"
        for key, value in sorted(petsc().Options().getAll().items()):
            if key.startswith(given) and "monitor" not in key:
                info.setdefault(f"adapt_{key[len(given):]}", value)
        return info

    def working_set_states(self) -> float:
        """What this TS holds beside hpcadj's states, in states: see :meth:`_working_set`."""
        return self._working["states"]

    def _working_set(self) -> dict:
        """Count, per rank, what the TS and its solvers allocate, in state-equivalents (largest rank).

        Vectors: the adapter's three (the TS's solution, an adjoint step's, its copy of u0), an RK method's 3 s + 3
        (stages, their right-hand sides, the adjoint's per-stage λ and work), a θ method's 8 (its own
        and its adjoint's) plus the SNES's 5 and the KSP's (GMRES: restart + 4; another Krylov
        method: 10) where the method is implicit; 16 for another TS type. Matrices, in their bytes
        on this rank: the Jacobian (and a distinct preconditioning matrix), the JacobianP, and where
        the method solves with the Jacobian the preconditioner's factor (ILU/ICC/block Jacobi: one
        more of the preconditioning matrix; LU/Cholesky: five). Plus ``working_set_extra`` for the
        user's own Vecs and the temporaries of the callbacks. Measured against real runs in
        experiments/ts_adapter (working_set.py).
        """
        PETSc = petsc()
        ts = self.ts
        state = max(self._u0.getLocalSize(), 1) * np.dtype(PETSc.ScalarType).itemsize
        parts = {"adapter": 3.0}
        implicit = self.ts_type in ("theta", "cn", "beuler", "bdf", "alpha", "alpha2", "glle", "arkimex",
                                    "rosw", "irk", "radau5", "dirk")
        if self.ts_type == "rk":
            parts["stages"] = 3.0 * len(_capi.stage_handles(ts)) + 3.0
        elif self.ts_type in ("theta", "cn", "beuler"):
            parts["stages"] = 8.0
        else:
            parts["stages"] = 16.0
        mats = {}
        jac = ts.getIJacobian() if ts.getIJacobian()[0] is not None else ts.getRHSJacobian()
        for mat in jac[:2]:
            if mat is not None and mat.handle:
                mats[mat.handle] = _capi.mat_local_bytes(mat.handle)
        pmat = jac[1] if jac[1] is not None and jac[1].handle else jac[0]
        parts["jacobian"] = sum(mats.values()) / state
        parts["jacobian_p"] = _capi.mat_local_bytes(_capi.rhs_jacobian_p(ts)) / state
        if self._p0 is not None and not parts["jacobian_p"]:
            parts["jacobian_p"] = float(min(self._p0.getSize(), 8))   # IJacobianP: no getter in petsc4py
        if implicit:
            ksp = ts.getSNES().getKSP()
            kind = ksp.getType() or "gmres"
            if kind in ("gmres", "fgmres", "lgmres", "dgmres", "pgmres"):
                restart = _capi.gmres_restart(ksp) if ksp.getType() else 30
                krylov = (2 if kind == "fgmres" else 1) * restart + 4
            else:
                krylov = 10
            parts["snes_ksp"] = 5.0 + krylov
            pc = ksp.getPC().getType() or "ilu"
            pbytes = _capi.mat_local_bytes(pmat.handle) if pmat is not None and pmat.handle else 0
            factor = {"ilu": 1, "icc": 1, "bjacobi": 1, "asm": 1.5, "lu": 5, "cholesky": 5}.get(pc, 0)
            parts["factor"] = factor * pbytes / state
        parts["user"] = float(self._extra)
        states = sum(parts.values())
        states = self.comm.allreduce(states, op=_mpi_max())
        return {"states": states, "parts": {k: round(v, 2) for k, v in parts.items()}}


def _mpi_max():
    from ..imports import mpi

    return mpi().MAX


def _reason_name(reason: int) -> str:
    PETSc = petsc()
    for key, value in vars(PETSc.TS.ConvergedReason).items():
        if value == reason and not key.startswith("_"):
            return key.lower()
    return f"reason {reason}"
