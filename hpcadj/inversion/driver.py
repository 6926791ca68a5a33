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

from ..imports import is_number, mpi, petsc
from ..models.base import begin_evaluation
from ..telemetry.jsonlog import dumps, iso_time, peak_rss_bytes
from .cache import EvaluationCache
from .iterates import IterateError, IterateStore
from .problem import TaoProblem
from .space import ControlSpace, Scaling, Tikhonov
from ..adjoint.products import plan_products, product_options
from ..collective import any_rank
from ..telemetry.energy import EnergyMeter
from .newton import HessianShell

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
        value = nxt if nxt is not None and (not nxt.startswith("-") or is_number(nxt)) else ""
        pairs.append((key, value))
        i += 2 if value else 1
    return pairs


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
        """Run TAO from the start (or the last durable iterate) to convergence, the cap or a stop."""
        self.check()
        begin_evaluation(self.model)  # the identity's step count is no earlier evaluation's
        space = ControlSpace(self.controls, self.invert)
        store = IterateStore(self.run_dir, self.model, self.identity()) if self.run_dir else None
        start = self._open_store(store)
        x = space.pack(start.controls)
        scale = self._scaling(space)
        if scale is not None:
            scale.to_y(x)
        reg = Tikhonov(float(self.weight), space.pack(self.reference if self.reference is not None else self.controls))
        cache = self._open_cache(space, start.owned)
        t_start = time.perf_counter()
        self._mark = {"t": t_start, "forward": 0, "adjoint": 0, "naive": 0, "meter": self._meter()}
        problem = TaoProblem(space, cache, reg, scale, self._stop_check(t_start))
        accepted = _Accepted(self, problem, start, store)
        tao = self._tao(problem, x, accepted, start.done)
        shell = self._hessian(tao, space) if tao.getType() in NEWTON_TYPES else None
        status, reason = self._run(tao, cache, shell, self.max_it - start.done)
        final = (problem.controls(tao.getSolution()) if status != "stopped" else
                 store.load(self.controls)[1] if store is not None and start.history else problem.controls(x))
        tao.destroy()
        self._close_meter()
        counts = {**cache.counts(), **(shell.counts() if shell else {}),
                  "failed_evaluations": problem.trials.failed, "seconds": time.perf_counter() - t_start}
        return _result(status, reason, accepted.last_or_start(), final, start, counts, self.removed)

    def _open_store(self, store) -> _Start:
        """Where the solve starts, from the run directory: a resumed inversion's last durable iterate,
        or a fresh one created there (the starting controls without a run directory)."""
        start = _Start([], 0, None, self.controls, None)
        self.removed = []
        if store is None:
            return start
        try:
            if self.resume and store.recorded():
                state, start.controls = store.load(self.controls)
                start.history, start.done = list(state["history"]), int(state["iteration"])
                start.resumed_from = start.done
            elif self.primary:  # a resume stopped before its first iterate starts afresh
                store.create(resuming=self.resume)
            start.owned = store.own_levels(self.checkpointing, self.resume, write=self.primary)
        except IterateError as exc:
            raise InversionError(str(exc)) from None
        return start

    def _scaling(self, space):
        """The :class:`~.space.Scaling` of ``scaling``, or None without one (InversionError if unusable)."""
        try:
            return Scaling(space, self.scaling) if self.scaling else None
        except ValueError as exc:
            raise InversionError(str(exc)) from None

    def _open_cache(self, space, owned):
        """The evaluations, their levels named after the run directory's run (``owned``); a resume
        first removes what a killed evaluation left."""
        cache = self.evaluations(self.model, space, self._held(space), policy=self.policy)
        if owned is not None and hasattr(cache, "run_id"):
            cache.run_id = owned["run_id"]
            if self.resume:
                self.removed = cache.remove_left(owned)
        self._cache, self._energy = cache, None
        return cache

    def _tao(self, problem, x, monitor, done: int):
        """TAO set up for ``problem`` from ``x``: bounds, the iterations left, tolerances, the monitor
        and this solve's ``-tao_*`` options (InversionError if they choose an unbounded type)."""
        tao = problem.tao(self.comm, self.tao_type, x)
        if self.bounds:
            problem.set_bounds(tao, self.bounds)
        tao.setMaximumIterations(max(self.max_it - done, 0))
        tol = {k: v for k, v in zip(("gatol", "grtol", "gttol"), self.tolerances) if v is not None}
        if tol:
            tao.setTolerances(**tol)
        tao.setMonitor(monitor)
        self._set_from_options(tao)
        if self.bounds and tao.getType() not in BOUNDED_TYPES:
            raise InversionError(f"bounds need a bounded method ({', '.join(BOUNDED_TYPES)}); -tao_type chose "
                                 f"{tao.getType()}")
        return tao

    def _set_from_options(self, tao) -> None:
        """``tao.setFromOptions()`` with ``tao_options`` in PETSc's database for this call only."""
        database = petsc().Options()
        for key, value in self.tao_options:
            database.setValue(key, value)
        try:
            tao.setFromOptions()
        finally:
            for key, _value in self.tao_options:
                database.delValue(key)

    @staticmethod
    def _run(tao, cache, shell, left: int) -> tuple[str, int]:
        """TAO's solve over the ``left`` iterations: (status, TAO's converged reason); the kept
        evaluations and the products go however it ends."""
        try:
            if left > 0:
                tao.solve()
            reason = int(tao.getConvergedReason())
        except StopInversion:
            return "stopped", 0
        finally:
            cache.drop()  # a kept first sweep's levels (files included) go with the solve
            if shell is not None:
                shell.close()
        return ("converged" if reason > 0 else "max_it" if reason == -2 or left <= 0 else "diverged"), reason

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
        from ..restart.rundir import products_run_id

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
        def check():
            asked = bool(self.should_stop()) if self.should_stop is not None else False
            late = self.time_limit is not None and time.perf_counter() - t_start > self.time_limit
            if any_rank(self.comm, asked or late):
                raise StopInversion("stop requested")
        return check

    def _meter(self):
        """The energy meter, restarted for the next iterate (one meter: its node communicator is
        split once per solve, not once per iterate)."""
        if getattr(self, "_energy", None) is None:
            self._energy = EnergyMeter(self.comm, interval_s=None, nvml=False)
        self._energy.start()
        return self._energy

    def _close_meter(self) -> None:
        if self._energy is not None:
            self._energy.node_comm.Free()
            self._energy = None

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

        parent = os.path.dirname(os.path.abspath(self.log))
        os.makedirs(parent, exist_ok=True)
        with open(self.log, "a") as fh:
            fh.write(dumps({"time": iso_time(time.time()), **record}) + "\n")


@dataclass
class _Start:
    """Where a solve starts: the accepted iterates' records so far (the monitor appends to them),
    how many, the iterate resumed from (None: fresh), its controls and the record of the
    evaluations' level files in the run directory."""

    history: list
    done: int
    resumed_from: int | None
    controls: dict
    owned: dict | None


class _Accepted:
    """TAO's monitor: each accepted iterate recorded, made durable (by the primary group), logged
    and passed to ``on_iteration``; a resumed solve's iterate 0 is the stored one, already done."""

    def __init__(self, inversion: Inversion, problem: TaoProblem, start: _Start, store):
        self.inversion, self.problem, self.start, self.store = inversion, problem, start, store
        self.last = None

    def __call__(self, tao) -> None:
        its, f, gnorm, _cnorm, step, _reason = tao.getSolutionStatus()
        if self.start.resumed_from is not None and its == 0:
            return
        inv, x = self.inversion, self.problem.physical(tao.getSolution())
        record = inv._record(self.start.done + its, x, f, gnorm, step, self.problem.reg)
        record.update({"removed": list(inv.removed)} if its == 1 and inv.removed else {})  # logged once
        self.start.history.append(record)
        self.last = record
        if self.store is not None and inv.primary:
            controls = self.problem.space.unpack(x)
            self.store.save(record["iteration"], controls, record, self.start.history)
            for vec in controls.values():
                vec.destroy()
        inv._write_log(record)
        if inv.on_iteration is not None:
            inv.on_iteration(record)

    def last_or_start(self) -> dict:
        """The last accepted iterate's record: this solve's, a resumed one's, or the start's (NaN)."""
        if self.last is not None:
            return self.last
        if self.start.history:
            return self.start.history[-1]
        return {"iteration": self.start.done, "J": math.nan, "misfit": math.nan, "regularization": math.nan,
                "grad_norm": math.nan}


def _result(status: str, reason: int, last: dict, final: dict, start: _Start, counts: dict,
            removed: list) -> InversionResult:
    return InversionResult(status, reason, last["iteration"], last["J"], last["misfit"], last["regularization"],
                           last["grad_norm"], final, start.history, counts, start.resumed_from, removed)


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
    return mpi().MAX
