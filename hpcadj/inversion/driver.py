"""The inversion loop: PETSc TAO (lmvm, blmvm, bqnls, nls, bntr) over checkpointed gradient sessions.

TAO asks for f, g or both at packed controls; every request goes through an
:class:`~.cache.EvaluationCache`, so a control whose bytes equal the last one evaluated costs
nothing. Each accepted iterate is logged (JSON lines) and, with a run directory, made durable
(:class:`~.iterates.IterateStore`). A stop request (a signal flag, a time limit) ends the solve at
the end of the current evaluation; resuming continues from the last accepted iterate with TAO's
history fresh (petsc4py exposes no LMVM state): a resumed inversion is bitwise the inversion
started afresh at that iterate with the iterations left.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, replace

from ..models.base import begin_evaluation
from ..telemetry.jsonlog import peak_rss_bytes
from .cache import EvaluationCache
from .iterates import IterateError, IterateStore
from .space import ControlSpace, Scaling, Tikhonov

#: TAO types the inversion drives; the Newton types get H v through a shell matrix
TAO_TYPES = ("lmvm", "blmvm", "bqnls", "nls", "bntr")
NEWTON_TYPES = ("nls", "bntr")
BOUNDED_TYPES = ("blmvm", "bqnls", "bntr")
#: packed control vectors a Newton type allocates beside the products (bntr's L-BFGS preconditioner
#: keeps 5 pairs, the Krylov solver and the trust region some 6 more): kept free of a budget's slots
TAO_VECTORS = 16


def option_pairs(tokens) -> list[tuple[str, str]]:
    """``["-tao_ls_type", "armijo", "-tao_view"]`` as ``[("-tao_ls_type", "armijo"), ("-tao_view", "")]``."""
    pairs, i = [], 0
    while i < len(tokens):
        key = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        value = nxt if nxt is not None and (not nxt.startswith("-") or _number(nxt)) else ""
        pairs.append((key, value))
        i += 2 if value else 1
    return pairs


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class InversionError(ValueError):
    """A configuration or run directory no inversion can use: one line, nothing done or lost."""


class StopInversion(Exception):
    """Raised inside TAO's callback when a stop was requested: the solve ends after this evaluation."""


@dataclass
class InversionResult:
    """How the inversion ended: ``status`` ``"converged"``, ``"max_it"``, ``"diverged"`` or ``"stopped"``."""

    status: str
    reason: int
    iterations: int                 # accepted iterates beyond the start, resumed ones included
    J: float
    misfit: float
    regularization: float
    grad_norm: float
    controls: dict                  # name -> Vec at the last accepted iterate
    history: list = field(default_factory=list)
    counts: dict = field(default_factory=dict)
    resumed_from: int | None = None
    removed: list = field(default_factory=list)  # what a killed evaluation left, removed by this resume


class Inversion:
    """Minimise J(m) + w/2 |m − m_ref|² over the controls named in ``invert`` with TAO.

    ``bounds`` maps an inverted control to ``(low, high)`` (None for no bound on that side; needs
    blmvm, bqnls or bntr); ``regularization`` is w (default 0), ``reference`` the m_ref controls (default:
    the starting controls); ``max_it`` caps the accepted iterates in all (resumes included);
    ``gatol``/``grtol``/``gttol`` are TAO's tolerances (None: TAO's defaults). Every ``-tao_*``
    option in PETSc's options database applies on top (``setFromOptions``). ``run_dir`` makes
    accepted iterates durable, ``resume`` continues from the last one; ``should_stop`` (polled after
    every evaluation) or ``time_limit`` seconds stop the solve with status ``"stopped"``; ``log``
    is a JSON-lines file of one record per accepted iterate; ``policy`` the cache's objective-only
    policy; ``tao_options`` (``["-tao_ls_type", "armijo"]``) are put in PETSc's options database for
    this solve only (a process whose PETSc was initialised earlier never saw its command line's).
    ``evaluations`` replaces :class:`~.cache.EvaluationCache` (:mod:`.shots` sums shots), and
    ``primary`` False leaves the run directory's writes to another group of ranks (a shot group).
    ``scaling`` maps inverted controls to positive weights s (:class:`~.space.Scaling`: TAO steps in
    m / s, a diagonal preconditioner; not with nls or bntr; ``grad_norm`` is then the scaled one's).
    Collective over the model's communicator.
    """

    def __init__(self, model, invert, checkpointing=None, *, controls=None, bounds=None,
                 regularization: float = 0.0, reference=None, tao_type: str = "lmvm", max_it: int = 50,
                 gatol=None, grtol=None, gttol=None, run_dir=None, resume: bool = False,
                 should_stop=None, time_limit=None, log=None, policy: str = "keep", on_iteration=None,
                 tao_options=None, evaluations=None, primary: bool = True, gauss_newton: bool = True,
                 scaling=None):
        self.model, self.comm = model, model.comm
        self.invert = [invert] if isinstance(invert, str) else list(invert)
        self.checkpointing = checkpointing
        self.controls = controls if controls is not None else model.default_controls()
        self.bounds = dict(bounds or {})
        self.weight = regularization
        self.reference = reference
        self.tao_type, self.max_it = tao_type, max_it
        self.tolerances = (gatol, grtol, gttol)
        self.run_dir, self.resume = run_dir, resume
        self.should_stop, self.time_limit = should_stop, time_limit
        self.log, self.policy, self.on_iteration = log, policy, on_iteration
        self.tao_options = option_pairs(tao_options or [])
        self.evaluations = evaluations or EvaluationCache  # (model, space, checkpointing, policy=): shots.py's
        self.primary = primary  # False: a shot group mirroring group 0, which alone writes run_dir
        self.gauss_newton = gauss_newton  # nls/bntr: Gauss-Newton products (else the exact Hessian)
        self.scaling = dict(scaling or {})

    def identity(self) -> dict:
        """What makes two inversions the same one (a resume must match it)."""
        return {"model": self.model.describe(), "invert": self.invert, "tao_type": self.effective_tao_type(),
                "bounds": {k: list(v) for k, v in sorted(self.bounds.items())},
                "regularization": self.weight, **({"scaling": sorted(self.scaling)} if self.scaling else {})}

    def effective_tao_type(self) -> str:
        """The type TAO will use: a ``-tao_type`` among ``tao_options`` or in PETSc's options database
        (``setFromOptions`` applies it over ``tao_type``), else ``tao_type``."""
        from ..imports import petsc

        given = [value for key, value in self.tao_options if key == "-tao_type" and value]
        return given[-1] if given else petsc().Options().getString("tao_type", self.tao_type)

    def check(self) -> None:
        """InversionError for options no inversion can use, before any work (same on every rank)."""
        unknown = [n for n in self.invert if n not in self.controls]
        if not self.invert or unknown:
            raise InversionError(f"--invert {','.join(unknown) or '(nothing)'}: the model's controls are "
                                 f"{', '.join(sorted(self.controls))}")
        if self.tao_type not in TAO_TYPES:
            raise InversionError(f"--tao {self.tao_type}: choose one of {', '.join(TAO_TYPES)}")
        for name, pair in self.bounds.items():
            if name not in self.invert:
                raise InversionError(f"--bounds {name}: not an inverted control ({', '.join(self.invert)})")
            low, high = pair
            if any(v is not None and math.isnan(v) for v in pair):
                raise InversionError(f"--bounds {name}: a bound is NaN")
            if low is not None and high is not None and not low < high:
                raise InversionError(f"--bounds {name}: the lower bound {low:g} must be below the upper "
                                     f"bound {high:g}")
        if self.bounds and self.tao_type not in BOUNDED_TYPES:
            raise InversionError(f"bounds need a bounded method (--tao {' or '.join(BOUNDED_TYPES)}); "
                                 f"{self.tao_type} ignores them")
        if self.scaling and self.tao_type in NEWTON_TYPES:
            raise InversionError(f"a scaling needs a quasi-Newton method (lmvm, blmvm, bqnls), not {self.tao_type}")
        if not (isinstance(self.weight, (int, float)) and math.isfinite(self.weight) and self.weight >= 0):
            raise InversionError(f"the regularisation weight must be >= 0, got {self.weight}")
        if not (isinstance(self.max_it, int) and self.max_it >= 0):
            raise InversionError(f"the iteration cap must be a whole number >= 0, got {self.max_it}")
        for name, tol in zip(("gatol", "grtol", "gttol"), self.tolerances):
            if tol is not None and not (math.isfinite(tol) and tol >= 0):
                raise InversionError(f"--{name} must be >= 0, got {tol}")
        if self.time_limit is not None and not (self.time_limit > 0):
            raise InversionError(f"--time-limit must be a positive number of seconds, got {self.time_limit}")
        if self.resume and not self.run_dir:
            raise InversionError("--resume needs --run-dir DIR (the inversion to continue)")

    # -- solve -----------------------------------------------------------------------------
    def solve(self) -> InversionResult:
        from ..imports import petsc

        self.check()
        PETSc = petsc()
        begin_evaluation(self.model)  # the identity's step count is no earlier evaluation's
        space = ControlSpace(self.controls, self.invert)
        store = IterateStore(self.run_dir, self.model, self.identity()) if self.run_dir else None
        history, done, resumed_from, start, owned = self._open_store(store)
        x = space.pack(start)
        try:
            scale = Scaling(space, self.scaling) if self.scaling else None
        except ValueError as exc:
            raise InversionError(str(exc)) from None
        m_work = space.new() if scale is not None else None

        def physical(xv):  # TAO's point as the model's controls m (s ⊙ y under a scaling)
            return scale.to_m(xv, m_work) if scale is not None else xv

        if scale is not None:
            scale.to_y(x)
        reference = space.pack(self.reference) if self.reference is not None else space.pack(self.controls)
        reg = Tikhonov(float(self.weight), reference)
        cache = self.evaluations(self.model, space, self._held(space), policy=self.policy)
        if owned is not None and hasattr(cache, "run_id"):  # the evaluations' levels are this run's
            cache.run_id = owned["run_id"]
            if self.resume:  # what a killed evaluation left goes before any evaluation
                self.removed = cache.remove_left(owned)
        self._cache, self._space, self._energy = cache, space, None
        t_start = time.perf_counter()
        self._mark = {"t": t_start, "forward": 0, "adjoint": 0, "naive": 0, "meter": self._meter()}
        stop = self._stop_check(t_start)
        trials = _Trials(cache)

        def objective(tao, xv):
            mv = physical(xv)
            e = trials.evaluate(cache.objective, mv)
            f = e.J + reg.value(mv) if e is not None else math.inf
            stop()
            return f

        def gradient_into(xv, g):
            """g = the gradient at TAO's point xv (in y under a scaling); returns the objective there."""
            mv = physical(xv)
            e = trials.evaluate(cache.gradient, mv)
            if e is None:  # a failed trial: TAO backtracks from an infinite objective
                g.set(math.nan)
                return math.inf
            e.gradient.copy(g)
            reg.add_gradient(mv, g)
            if scale is not None:
                scale.gradient(g)
            return e.J + reg.value(mv)

        def gradient(tao, xv, g):
            gradient_into(xv, g)
            stop()

        def objective_gradient(tao, xv, g):
            f = gradient_into(xv, g)
            stop()
            return f

        tao = PETSc.TAO().create(comm=self.comm)
        tao.setType(self.tao_type)
        tao.setObjective(objective)
        tao.setGradient(gradient, space.new())
        tao.setObjectiveGradient(objective_gradient, space.new())
        tao.setSolution(x)
        if self.bounds:
            lower = space.fill({k: v[0] for k, v in self.bounds.items() if v[0] is not None}, PETSc.NINFINITY)
            upper = space.fill({k: v[1] for k, v in self.bounds.items() if v[1] is not None}, PETSc.INFINITY)
            if scale is not None:
                scale.to_y(lower)
                scale.to_y(upper)
            tao.setVariableBounds((lower, upper))
        tao.setMaximumIterations(max(self.max_it - done, 0))
        tol = {k: v for k, v in zip(("gatol", "grtol", "gttol"), self.tolerances) if v is not None}
        if tol:
            tao.setTolerances(**tol)
        state = {"last": None}

        def monitor(t):
            its, f, gnorm, _cnorm, step, _reason = t.getSolutionStatus()
            if resumed_from is not None and its == 0:
                return  # the stored iterate itself: already recorded and durable
            record = self._record(done + its, physical(t.getSolution()), f, gnorm, step, reg)
            history.append(record)
            state["last"] = record
            if store is not None and self.primary:
                controls = space.unpack(physical(t.getSolution()))
                store.save(record["iteration"], controls, record, history)
                for vec in controls.values():
                    vec.destroy()
            self._write_log(record)
            if self.on_iteration is not None:
                self.on_iteration(record)

        tao.setMonitor(monitor)
        database = PETSc.Options()
        for key, value in self.tao_options:
            database.setValue(key, value)
        try:
            tao.setFromOptions()
        finally:
            for key, _value in self.tao_options:
                database.delValue(key)
        if self.bounds and tao.getType() not in BOUNDED_TYPES:
            raise InversionError(f"bounds need a bounded method ({', '.join(BOUNDED_TYPES)}); -tao_type chose "
                                 f"{tao.getType()}")
        shell = self._hessian(tao, space) if tao.getType() in NEWTON_TYPES else None
        status = None
        try:
            if self.max_it - done > 0:
                tao.solve()
            reason = int(tao.getConvergedReason())
        except StopInversion:
            status, reason = "stopped", 0
        finally:
            cache.drop()  # a kept first sweep's levels (files included) go with the solve
            if shell is not None:
                shell.close()
        if status is None:
            status = ("converged" if reason > 0 else "max_it" if reason == -2 or self.max_it - done <= 0
                      else "diverged")
        last = state["last"] or (history[-1] if history else None)
        if last is None:  # stopped before the first iterate was accepted: the start
            last = {"iteration": done, "J": math.nan, "misfit": math.nan, "regularization": math.nan,
                    "grad_norm": math.nan}
        final = space.unpack(physical(tao.getSolution())) if status != "stopped" else (
            store.load(self.controls)[1] if store is not None and history else space.unpack(physical(x)))
        tao.destroy()
        if self._energy is not None:
            self._energy.node_comm.Free()
            self._energy = None
        return InversionResult(status, reason, last["iteration"], last["J"], last["misfit"],
                               last["regularization"], last["grad_norm"], final, history,
                               {**cache.counts(), **(shell.counts() if shell else {}),
                                "failed_evaluations": trials.failed,
                                "seconds": time.perf_counter() - t_start}, resumed_from, self.removed)

    def _open_store(self, store):
        """(history, iterates done, resumed-from, starting controls, the record of the evaluations'
        level files) from the run directory: a resumed inversion's, or a fresh one created there."""
        history, done, resumed_from, start, owned = [], 0, None, self.controls, None
        self.removed = []
        if store is None:
            return history, done, resumed_from, start, owned
        try:
            if self.resume and store.recorded():
                state, start = store.load(self.controls)
                history, done = list(state["history"]), int(state["iteration"])
                resumed_from = done
            elif self.primary:  # a resume stopped before its first iterate starts afresh
                store.create(resuming=self.resume)
            owned = store.own_levels(self.checkpointing, self.resume, write=self.primary)
        except IterateError as exc:
            raise InversionError(str(exc)) from None
        return history, done, resumed_from, start, owned

    def _held(self, space):
        """The checkpointing every evaluation and product runs under: a measured baseline (held for
        the whole inversion) grows by TAO's own vectors, which live beside every session."""
        ck = self.checkpointing
        if ck is None or ck.memory_baseline is None:
            return ck
        reserve = TAO_VECTORS * space.vec.getLocalSize() * space.vec.getArray().itemsize
        return replace(ck, memory_baseline=int(ck.memory_baseline) + reserve)

    def _hessian(self, tao, space):
        """H v products (hpcadj.inversion.newton.HessianShell) as TAO's Hessian, for nls and bntr:
        planned before TAO starts (a budget no product fits is refused here), and held."""
        from ..adjoint.products import plan_products, product_options
        from ..restart.rundir import products_run_id
        from .newton import HessianShell

        options = product_options(self.checkpointing)
        held = self._held(space)
        # TAO's Krylov and quasi-Newton vectors grow while the products live (in a held baseline)
        reserve = TAO_VECTORS * space.vec.getLocalSize() * space.vec.getArray().itemsize
        try:
            plan = plan_products(self.model, gauss_newton=self.gauss_newton, **(
                {"reserve": reserve} if held is None or held.memory_baseline is None
                else {"baseline": held.memory_baseline}), **options)
        except ValueError as exc:
            raise InversionError(f"-tao_type {tao.getType()}: {exc}") from None
        cache, budgeted = self._cache, plan.memory is not None
        run_id = getattr(cache, "run_id", None)  # a run directory's: a resume removes what products left
        options = {"local_dir": options.get("local_dir"), "run_id": products_run_id(run_id) if run_id else None}
        shell = HessianShell(self.model, space, gauss_newton=self.gauss_newton, regularization=float(self.weight),
                             prepare=(lambda: _drop_kept(cache)) if budgeted else None, plan=plan, **options)
        if budgeted:
            _release_before_evaluations(cache, shell)
        tao.setHessian(shell.point, shell.matrix())
        pc = tao.getKSP().getPC()
        if pc.getType() in (None, "", "ilu", "icc", "lu", "cholesky", "bjacobi", "jacobi", "asm"):
            pc.setType("none")  # a shell matrix has no entries to factor (bntr's lmvm PC is kept)
        return shell

    def _stop_check(self, t_start: float):
        from ..collective import any_rank

        def check():
            asked = bool(self.should_stop()) if self.should_stop is not None else False
            late = self.time_limit is not None and time.perf_counter() - t_start > self.time_limit
            if any_rank(self.comm, asked or late):
                raise StopInversion("stop requested")
        return check

    def _meter(self):
        """The energy meter, restarted for the next iterate (one meter: its node communicator is
        split once per solve, not once per iterate)."""
        from ..telemetry.energy import EnergyMeter

        if getattr(self, "_energy", None) is None:
            self._energy = EnergyMeter(self.comm, interval_s=None, nvml=False)
        self._energy.start()
        return self._energy

    def _record(self, iteration: int, x, f: float, gnorm: float, step: float, reg) -> dict:
        """One accepted iterate's telemetry: J, its terms, ‖g‖, step, steps, seconds and joules."""
        cache, mark = self._cache, self._mark
        entry = cache.entry
        key = cache.key(x)
        misfit = entry.J if entry is not None and entry.key == key else None
        energy = mark["meter"].stop().get("rapl", {})
        now = time.perf_counter()
        record = {"event": "iteration", "iteration": iteration, "J": f, "misfit": misfit,
                  "regularization": reg.value(x), "grad_norm": gnorm, "step": step,
                  "forward_steps": cache.forward_steps - mark["forward"],
                  "adjoint_steps": cache.adjoint_steps - mark["adjoint"],
                  "naive_forward_steps": cache.naive_forward_steps - mark["naive"],
                  "seconds": now - mark["t"], "joules": energy.get("joules"),
                  "energy_source": energy.get("source", "unavailable"), "controls_hash": key,
                  "ranks": self.comm.size * int(cache.counts().get("shot_groups", 1)),
                  "max_rss_bytes": self.comm.allreduce(peak_rss_bytes(), op=_max_op())}
        self._mark = {"t": now, "forward": cache.forward_steps, "adjoint": cache.adjoint_steps,
                      "naive": cache.naive_forward_steps, "meter": self._meter()}
        return record

    def _write_log(self, record: dict) -> None:
        if self.log is None or self.comm.rank != 0:
            return
        from ..telemetry.jsonlog import dumps, iso_time

        parent = os.path.dirname(os.path.abspath(self.log))
        os.makedirs(parent, exist_ok=True)
        with open(self.log, "a") as fh:
            fh.write(dumps({"time": iso_time(time.time()), **record}) + "\n")


class _Trials:
    """Evaluations as TAO sees them: a solver that fails at a control after the start's evaluation
    succeeded (a line-search trial that made κ negative, say) is an infinite objective there, so TAO
    backtracks; a failure at the start is the configuration's and is raised."""

    def __init__(self, cache):
        self.cache, self.started, self.failed = cache, False, 0

    def evaluate(self, request, x):
        """``request(x)``'s Evaluation, or None for a failed trial (agreed: a model's solver failure
        is raised on every rank alike)."""
        from ..models.base import SolverError

        try:
            e = request(x)
        except SolverError:
            if not self.started:
                raise
            self.cache.drop()
            self.failed += 1
            return None
        self.started = True
        return e


def _drop_kept(cache) -> None:
    """Discard the cache's kept first sweep (its levels and states), if any, before a product's
    forward sweep: under a whole-process budget the two do not fit together."""
    entry = getattr(cache, "entry", None)
    if entry is not None and getattr(entry, "session", None) is not None:
        cache.drop()


def _release_before_evaluations(cache, shell) -> None:
    """Make every objective or gradient request of ``cache`` that computes free the products' kept
    states first, so that under a whole-process budget a gradient session finds the room the
    products held (a request the cache answers from its entry keeps them)."""
    for name in ("objective", "gradient"):
        evaluate = getattr(cache, name)

        def released(x, _evaluate=evaluate, _gradient=name == "gradient"):
            entry = getattr(cache, "entry", None)
            if entry is None or entry.key != cache.key(x) or (_gradient and entry.gradient is None):
                shell.release()
            return _evaluate(x)
        setattr(cache, name, released)


def _max_op():
    from ..imports import mpi

    return mpi().MAX
