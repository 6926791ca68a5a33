"""The gradient driver: executes a checkpoint plan with a stepper and a hierarchy of storage levels.

One executor dispatches on the action type (``functools.singledispatchmethod``); the plan decides
*when* states are stored, the stepper decides *what* a snapshot holds, the levels decide *where*.
"""

from __future__ import annotations

import gc
import itertools
import math
import os
import signal
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import singledispatchmethod

from ..checkpoint.schedules.actions import (Adjoint, AdjointData, Advance, EndForward, EndReverse, Free, Move,
                                            PlanError, Restore, Store, StoreData, WorkingStates)
from ..checkpoint.schedules.base import ScheduleError
from ..checkpoint.schedules.resume import residual_plan
from ..checkpoint.storage.base import LevelError, LevelFault
from ..checkpoint.storage.survey import survey
from ..collective import detail, problems
from ..telemetry import Telemetry
from ..models.base import SolverError
from ..runstate import ResumePoint
from ..snapshot import layout_bytes
from .advances import AdvanceRuns
from .data_actions import DataActions
from .garbage import GarbageCleanups
from .guards import InputModified, NonFinite, checksum, finite
from ..imports import mpi


INJECT_KILL = "HPCADJ_INJECT_KILL"
INJECT_DELAY = "HPCADJ_TEST_STEP_DELAY"


def _injected_kill(rank: int) -> tuple[int | None, int | None]:
    """Fault injection for tests: ``HPCADJ_INJECT_KILL=RANK:K`` kills that rank (SIGKILL) after
    action K, ``RANK:frontier=S`` once the first sweep has reached step S. Returns (K, S)."""
    spec = os.environ.get(INJECT_KILL)
    if not spec:
        return None, None
    target, after = spec.split(":")
    if int(target) != rank:
        return None, None
    if after.startswith("frontier="):
        return None, int(after.split("=")[1])
    return int(after), None


@contextmanager
def _where(where: str):
    """Prefix a model's SolverError with where in the run it happened (its type is kept)."""
    try:
        yield
    except (InputModified, NonFinite):
        raise
    except SolverError as exc:
        exc.args = (f"{where}: {exc.args[0] if exc.args else type(exc).__name__}", *exc.args[1:])
        raise


class StopRequested(Exception):
    """The run was asked to stop (SIGTERM/SIGUSR1); its state was made durable first."""


class Unrecoverable(RuntimeError):
    """A storage fault left no way to finish the gradient (nothing fits): a clear error, no result."""


@dataclass
class GradientResult:
    """J, dJ/d(control) for every control, and what it cost in step evaluations."""

    J: float
    gradient: dict
    forward_steps: int = 0
    recomputed_steps: int = 0
    adjoint_steps: int = 0
    level_stats: list = field(default_factory=list)

    @property
    def first_sweep_steps(self) -> int:
        return self.forward_steps - self.recomputed_steps


class Driver(AdvanceRuns, DataActions, GarbageCleanups):
    """Runs one forward + reverse sweep following ``schedule`` over ``levels`` (index = plan level).

    Parameters
    ----------
    stepper : Stepper
        The model.
    levels : sequence of Level
        Level k of the plan is ``levels[k]``.
    telemetry : Telemetry, optional
        Receives every phase (forward, recompute, adjoint, objective, store, restore, move, fault).
    costs : OpCosts, optional
        What re-plans after a storage fault minimise.
    observer : RunObserver, optional
        Told where the run stands (e.g. to make progress durable, :class:`~hpcadj.restart.Durability`);
        it may flush levels and raise LevelError, which the driver re-plans around.
    should_stop : callable, optional
        Polled after every Advance and Adjoint (one small allreduce each); when it returns True on
        any rank, the run stops on every rank.
    on_replan : callable, optional
        Called with the run's forward steps in all (done and planned) after each re-plan.
    """

    def __init__(self, stepper, levels, telemetry: Telemetry | None = None, progress=None, *,
                 costs=None, observer=None, should_stop=None, on_replan=None):
        self.stepper = stepper
        self.levels = list(levels)
        self.telemetry = telemetry or Telemetry(petsc_events=False)
        self.progress = progress
        self.costs = costs
        self.observer = observer
        self.should_stop = should_stop
        self.on_replan = on_replan
        self.comm = stepper.comm
        self.faults: list[str] = []
        self.actions_done = 0
        self._start_garbage(0)
        self._kill_after, self._kill_at_frontier = _injected_kill(self.comm.rank)
        # every rank splits a first-sweep advance where the kill strikes (their halo exchanges pair up)
        self._split_at = next((s for s in (_injected_kill(r)[1] for r in range(self.comm.size)) if s is not None),
                              None)
        self._step_delay = float(os.environ.get(INJECT_DELAY, 0.0))
        self._input_checks_left = 0

    def run(self, schedule, controls, resume: ResumePoint | None = None, *,
            pause_before_reverse: bool = False) -> GradientResult:
        """Execute every action of ``schedule`` with ``controls``; return J and the gradient.

        With ``resume`` the driver starts from that point (``schedule`` is then the residual plan).
        A snapshot found corrupt or missing, or a level that fails to write, makes the driver
        re-plan the rest from what is still valid; the gradient stays bitwise the same.
        With ``pause_before_reverse`` it stops before ``EndForward`` (``paused`` True, J complete,
        the snapshots and the states the plan holds kept): :meth:`proceed` runs the rest.
        """
        stepper = self.stepper
        stepper.set_controls(controls)
        self._controls, self._pause, self.paused = controls, pause_before_reverse, False
        self._check_steps(schedule)
        self.snapshot_bytes = layout_bytes(stepper.snapshot_layout())
        self._start_garbage(sum(field.global_nbytes for field in stepper.snapshot_layout().values()))
        self._data_layout, self._data_store = stepper.adjoint_data_layout(), {}
        self._data_nbytes = 0 if self._data_layout is None else layout_bytes(self._data_layout)
        self._hold_data = self._data_layout is not None and getattr(schedule, "stores_data", False)
        u0 = stepper.initial_state()
        self.work = WorkingStates(0, u0)
        self.grad = {name: vec.duplicate() for name, vec in controls.items()}
        for vec in self.grad.values():
            vec.set(0.0)
        self.result = GradientResult(J=0.0, gradient=self.grad)
        if resume is None:
            self.frontier, self.lam, self.lam_step = 0, None, None
            with self.telemetry.phase("objective", step=0):
                self.result.J += stepper.objective(0, u0)
            if self._agree_flags(0 if math.isfinite(self.result.J) and finite([u0]) else 2):
                raise NonFinite("the initial state u_0 (built from the controls) or its objective term holds "
                                "a non-finite value (inf or NaN); stopped, no gradient")
        else:
            self.frontier, self.result.J = resume.frontier, resume.J
            self.lam, self.lam_step = resume.lam, resume.lam_step
            if resume.grad is not None:
                for name, vec in resume.grad.items():
                    vec.copy(self.grad[name])
        self._frontier_J = {self.frontier: self.result.J}
        self._input_checks_left = self.INPUT_CHECKS
        self._finite_state = self.frontier  # the last first-sweep state checked finite
        self._start_advances()
        self._J_before = self.result.J
        self._finite_lambda = self.lam_step
        self.finished = False
        self.faults = []
        self.capacities = [level.capacity for level in self.levels]
        self.actions_done = 0
        return self._execute_stream(schedule.actions())

    def proceed(self) -> GradientResult:
        """Finish a run paused before its reverse sweep: the controls are set again (the model may
        have served another run meanwhile), then the actions left, EndForward first; no forward
        step of the first sweep is repeated."""
        if not self.paused:
            raise PlanError("proceed() needs a run paused before its reverse sweep")
        self.stepper.set_controls(self._controls)
        self._pause = self.paused = False
        return self._execute_stream(None)

    def _execute_stream(self, actions) -> GradientResult:
        automatic_gc = gc.isenabled()
        gc.disable()  # cycles are collected in plan order on this thread (see _collect_garbage)
        try:
            self._execute_all(actions)
        finally:
            if automatic_gc:
                gc.enable()
        self.result.level_stats = [level.stats for level in self.levels]
        return self.result

    def _check_steps(self, schedule) -> None:
        """n from the model: None while a model with adaptive steps has not reached its final time,
        which only an online plan (``schedule.online``, n_steps None) can follow; n is then set at
        EndForward. A plan with a number of steps must match the model's."""
        self.n = self.stepper.n_steps
        self._online = bool(getattr(schedule, "online", False))
        self._schedule = schedule
        if self.n is None and schedule.n_steps is not None:
            raise PlanError(f"plan is for {schedule.n_steps} steps, the model's step count is unknown until "
                            f"its run ends (adaptive steps): it needs an online plan")
        if schedule.n_steps is not None and schedule.n_steps != self.n:
            raise PlanError(f"plan is for {schedule.n_steps} steps, the model runs {self.n}")

    def _execute_all(self, actions) -> None:
        """Execute ``actions`` (None: the stream a pause left) until EndReverse, or up to EndForward
        when a pause was asked for (the stream then keeps it as its next action)."""
        execute = self.execute
        if actions is not None:
            self._stream = self._with_prefetch(actions)
        while not self.finished:
            try:
                for action in self._stream:
                    if self._pause and isinstance(action, EndForward):
                        self._stream = itertools.chain([action], self._stream)
                        self.paused = True
                        gc.collect()
                        self._collect_garbage(force=True)
                        return
                    execute(action)
                    self.actions_done += 1
                    if self._step_delay:
                        time.sleep(self._step_delay)
                    if self.actions_done == self._kill_after or (
                            self._kill_at_frontier is not None and self.lam_step is None
                            and self.frontier >= self._kill_at_frontier):
                        os.kill(os.getpid(), signal.SIGKILL)
                    if (self.should_stop is not None and isinstance(action, (Advance, Adjoint))
                            and not self.finished and self._agree(self.should_stop())):
                        if self.observer is not None:
                            self.observer.stopping(self.lam_step, self.lam, self.grad, self.result.J)
                        raise StopRequested(f"stopped at forward step {self.frontier}, "
                                            f"adjoint step {self.lam_step}")
                if not self.finished:
                    raise PlanError("the plan ended without EndReverse")
            except LevelError as fault:
                self._stream = self._with_prefetch(self._replan(fault))
        gc.collect()
        self._collect_garbage(force=True)

    def _agree(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is True on any rank."""
        return bool(self._agree_flags(1 if flag else 0))

    def _replan(self, fault: LevelError):
        """After a storage fault: keep the snapshots valid on every rank, plan the rest from them."""
        self.faults.append(str(fault))
        self.telemetry.record("fault", t0=time.time(), seconds=0.0, step=self.lam_step,
                              level=fault.level)
        retained, capacities = {}, []
        unknown_n = self.n is None  # first sweep of an adaptive run: continue it online
        top = (self.frontier + 1 if unknown_n else self.n) if self.lam_step is None else self.lam_step
        failed = {i for i, level in enumerate(self.levels) if fault.writing and fault.level == level.name
                  and not getattr(level, "shrinks_on_overflow", False)}  # it lowered its capacity instead
        survived = survey(self.levels, self.comm, failed=failed, keep=lambda step: step < top)
        for index, (level, left) in enumerate(zip(self.levels, survived)):
            for step in left.steps:
                retained[step] = index
            # a level that failed a write on any rank takes no new snapshots
            occupied = sum(1 for lv in retained.values() if lv == index)
            capacities.append(occupied if left.failed else min(self.capacities[index], level.capacity))
        self.capacities = capacities
        self.work = WorkingStates(0, self.stepper.initial_state())
        try:
            if unknown_n:
                return iter(self._schedule.resumed(capacities, retained, costs=self.costs).actions())
            plan = list(residual_plan(self.n, capacities, retained, lam_step=self.lam_step,
                                      costs=self.costs))
        except ScheduleError as exc:
            raise Unrecoverable(f"storage fault ({fault}) and no plan fits what is left: {exc}") from None
        if self.on_replan is not None:  # the run's forward steps in all, with this plan's
            self.on_replan(self.result.forward_steps + sum(a.n1 - a.n0 for a in plan if isinstance(a, Advance)))
        return iter(plan)

    LOOKAHEAD = 64
    #: first-sweep steps of a run whose input is checksummed before and after ``step()``
    INPUT_CHECKS = 3
    #: states and lambdas checked for inf/NaN every this many steps (and u_n, lambda_0 always): a
    #: check reads the whole state, ~10 % of a memory-bound step (wave 128^3), and inf/NaN persists
    FINITE_EVERY = 8

    def _agree_flags(self, flags: int) -> int:
        """The bitwise OR of every rank's ``flags``: one MPI_Allreduce of one integer (mpi4py's
        allreduce of a Python object is a reduction and two broadcasts)."""
        if self.comm is None or self.comm.size == 1:
            return flags
        import numpy as np

        out = np.zeros(1, dtype=np.int64)
        self.comm.Allreduce(np.array([int(flags)], dtype=np.int64), out, op=mpi().BOR)
        return int(out[0])

    def _first_sweep_step(self, i: int, u):
        """Step i of the first sweep, its objective term, and the guards: the input's checksum
        before and after ``step()`` (the first ``INPUT_CHECKS`` steps only) and every value of
        u_{i+1} and J_{i+1} finite; one agreement across ranks per step."""
        stepper = self.stepper
        checked = self._input_checks_left > 0
        if checked:
            self._input_checks_left -= 1
            before = checksum(stepper, u)
        u_next = stepper.step(i, u)
        J_i = stepper.objective(i + 1, u_next)
        if not (checked or (i + 1) % self.FINITE_EVERY == 0 or i + 1 == self.n):
            return u_next, J_i
        flags = 2 if not (math.isfinite(self.result.J + J_i) and finite([u_next])) else 0
        if checked and checksum(stepper, u) != before:
            flags |= 1
        flags = self._agree_flags(flags)
        if flags & 1:
            raise InputModified(f"step {i} changed its input u_{i} (step() must return a new Vec and "
                                f"leave the one it is given as it was: a checkpoint of u_{i} shares its "
                                f"memory); see 'hpcadj check'")
        if flags & 2:
            raise NonFinite(f"forward sweep: a non-finite value (inf or NaN) in u_{i + 1} or the objective "
                            f"after step {i}{self._since(i + 1, self._finite_state)}; stopped, no gradient")
        self._finite_state = i + 1
        return u_next, J_i

    def _since(self, step: int, last: int | None) -> str:
        """Where a non-finite value may have appeared first, when the last check was not the step before."""
        if last is None or abs(step - last) <= 1:
            return ""
        return f" (first seen here: u_{last} was the last checked finite; checked every {self.FINITE_EVERY} steps)"

    def _check_lambda(self, step: int, lam, what: str) -> None:
        """NonFinite on every rank if lambda_step holds inf or NaN on any rank (checked at lambda_n,
        lambda_0 and every ``FINITE_EVERY`` steps between)."""
        if step not in (0, self.n) and step % self.FINITE_EVERY:
            return
        if self._agree(not finite([lam])):
            since = self._since(step, self._finite_lambda).replace("u_", "lambda_")
            raise NonFinite(f"reverse sweep: {what} produced a non-finite value (inf or NaN) in "
                            f"lambda_{step}{since}; stopped, no gradient")
        self._finite_lambda = step

    def _with_prefetch(self, actions):
        """Yield the actions, first telling a level which snapshot the next Restore will read.

        The window is searched again only when the hinted Restore has run or a Store may have made
        the next one readable. Every rank sees the same stream, so prefetches (collective on a
        parallel-HDF5 level) are issued in the same order everywhere. Without an asynchronous level
        a prefetch does nothing, and the actions pass straight through.
        """
        if not any(level.async_io for level in self.levels):
            yield from actions
            return
        actions = iter(actions)
        if self._online and self.lam_step is None:
            # an online first sweep ends when the model says so: nothing may be read ahead of it
            for action in actions:
                yield action
                if isinstance(action, EndForward):
                    break
        window = deque(itertools.islice(actions, self.LOOKAHEAD))
        hinted = None
        while window:
            action = window.popleft()
            window.extend(itertools.islice(actions, 1))
            yield action
            if hinted is not None and action is not hinted and not isinstance(action, Store):
                continue
            hinted = None
            restore = next((a for a in window if isinstance(a, Restore)), None)
            if restore is None:
                continue
            touched = any(isinstance(a, (Store, Free, Move)) and a.n == restore.n
                          for a in itertools.takewhile(lambda a: a is not restore, window))
            if not touched and restore.n in self._level(restore.level):
                self.levels[restore.level].prefetch(restore.n)
                hinted = restore

    def _timed_io(self, phase: str, level, step: int, operation):
        """Run a level operation as ``phase`` and agree on its success across ranks.

        A failure on any rank raises LevelError on every rank (so all re-plan together); time
        blocked on the level is logged as io_wait.
        """
        waited = level.stats.wait_s
        error = None
        with self.telemetry.phase(phase, step=step, nbytes=self.snapshot_bytes, level=level.name):
            try:
                result = operation()
            except LevelError as exc:
                error, result = exc, None
        # a level whose failures are the same on every rank needs no agreement (the hot path)
        agree = level.failures_need_agreement
        if (self._agree(error is not None) if agree else error is not None):
            message = str(error) if error is not None else None
            if agree:
                failed = problems(self.comm, None if error is None else message or repr(error))
                if error is None:
                    message = f"{level.name}: step {step} failed on another rank: {detail(failed[:1])}"
            if error is not None and error.step is not None:
                step = error.step
            raise LevelFault(level.name, step, message, writing=error is not None and error.writing
                             or phase == "store") from error
        blocked = level.stats.wait_s - waited
        if blocked > 0:
            self.telemetry.record("io_wait", t0=time.time() - blocked, seconds=blocked, step=step,
                                  level=level.name)
        return result

    def _level(self, index: int):
        try:
            return self.levels[index]
        except IndexError:
            raise PlanError(f"plan uses level {index}, only {len(self.levels)} exist") from None

    @singledispatchmethod
    def execute(self, action) -> None:
        raise PlanError(f"unknown action {action!r}")

    @execute.register
    def _(self, action: Advance) -> None:
        u = self.work.get(action.n0)
        # While stepping, the driver holds only the state kept beyond n1 (the reverse sweep's) and
        # the step's input and output: u_{n0} lives on in ``u`` for the first step only, the state
        # held before it is not read again, and u_{n1-1} is kept for the last step only.
        beyond = [n for n in self.work.steps() if n > action.n1]
        self.work = WorkingStates(beyond[-1], self.work.get(beyond[-1])) if beyond else WorkingStates()
        previous = None
        k = action.n0
        while k < action.n1:
            # split the range at the frontier: steps beyond it are first-sweep, the rest recompute
            first = k >= self.frontier
            end = action.n1 if first else min(action.n1, self.frontier)
            with self.telemetry.phase("forward" if first else "recompute", step=k, steps=end - k):
                # the last step alone when u_{n1-1} is kept (nothing held beyond n1, or step data held)
                u, start = self._advance_run(k, end - 1 if end == action.n1 and not (beyond and not self._hold_data)
                                             else end, u, first)
                for i in range(start, end):
                    if i == action.n1 - 1:
                        previous = u
                    with _where(f"{'forward' if first else 'recomputed'} step {i}"):
                        if first:
                            self._J_before = self.result.J
                            u, J_i = self._first_sweep_step(i, u)
                            self.result.J += J_i
                        else:
                            u = self.stepper.step(i, u)
                    self._collect_garbage()
            self.result.forward_steps += end - k
            if not first:
                self.result.recomputed_steps += end - k
            else:
                self.frontier = end
                # J up to the two states held: an online plan stores u_{i-1} once u_i is reached
                self._frontier_J = {end - 1: self._J_before, end: self.result.J}
            if self.progress is not None:
                self.progress.forward(end - k, recompute=not first)
            k = end
        self.work.advanced(action.n0, action.n1, previous, u, data=self._data_source(previous, u))
        if self.observer is not None and self.lam_step is None and self.frontier == action.n1:
            self.observer.advanced(self.frontier, u, self.result.J)

    @execute.register
    def _(self, action: Store) -> None:
        level = self._level(action.level)
        self.trim_before_state_store()
        snapshot = self.stepper.snapshot(self.work.get(action.n))
        t = self.stepper.time(action.n)
        # states are never changed in place, so the level may write the snapshot's views as they are
        self._timed_io("store", level, action.n, lambda: level.write(action.n, snapshot, time=t, donate=True))
        if self.observer is not None and self.lam_step is None and action.n in self._frontier_J:
            self.observer.stored(action.n, level, self._frontier_J[action.n])

    @execute.register
    def _(self, action: Restore) -> None:
        level = self._level(action.level)
        snapshot = self._timed_io("restore", level, action.n, lambda: level.read(action.n))
        self.work.restored(action.n, self.stepper.restore(snapshot))

    @execute.register
    def _(self, action: Move) -> None:
        src, dst = self._level(action.src), self._level(action.dst)
        snapshot = self._timed_io("restore", src, action.n, lambda: src.read(action.n))
        self._timed_io("store", dst, action.n, lambda: dst.write(action.n, snapshot))
        src.free(action.n)
        if self.observer is not None and self.lam_step is None:
            self.observer.moved(action.n, dst)

    @execute.register
    def _(self, action: Free) -> None:
        self._level(action.level).free(action.n)

    @execute.register
    def _(self, action: EndForward) -> None:
        if self.n is None:  # an online plan's sweep ended: the model knows n now
            self.n = self.stepper.n_steps
        if self.frontier != self.n or self.n not in self.work:
            raise PlanError(f"EndForward before u_{self.n} was reached (frontier {self.frontier})")
        if self._finite_state != self.n and self._agree_flags(
                0 if math.isfinite(self.result.J) and finite([self.work.get(self.n)]) else 2):
            raise NonFinite(f"forward sweep: a non-finite value (inf or NaN) in u_{self.n} or the objective"
                            f"{self._since(self.n, self._finite_state)}; stopped, no gradient")
        lam = self.stepper.objective_gradient(self.n, self.work.get(self.n))
        if lam is None:
            lam = self.work.get(self.n).duplicate()
            lam.set(0.0)
        else:
            self._check_lambda(self.n, lam, f"the objective's gradient dJ_{self.n}/du_{self.n}")
        self.lam, self.lam_step = lam, self.n

    @execute.register
    def _(self, action: Adjoint) -> None:
        if self.lam_step != action.n1:
            raise PlanError(f"adjoint step {action.n0} needs lambda_{action.n1}, have lambda_{self.lam_step}")
        u, u_next = self.work.get(action.n0), self.work.get(action.n1)
        if not getattr(self.stepper, "adjoint_reads_next", True):  # u_{i+1} goes before the step
            u_next = None
            self.work.adjoint_done(action.n0)
            self._collect_garbage()
        with self.telemetry.phase("adjoint", step=action.n0, steps=1):
            with _where(f"adjoint step {action.n0}"):
                lam = self.stepper.adjoint_step(action.n0, u, u_next, self.lam, self.grad)
            # lambda_{i+1} and u_{i+1} are not read again: freed before dJ_i/du_i is made
            u_next = None
            self.lam, self.lam_step = lam, action.n0
            self.work.adjoint_done(action.n0)
            self._collect_garbage()
            self.stepper.add_objective_gradient(action.n0, u, lam)
            self._check_lambda(action.n0, lam, f"adjoint step {action.n0}")
        self._adjoint_done()

    def _adjoint_done(self) -> None:
        """An adjoint step's bookkeeping, whether it ran from states or from its data."""
        self.result.adjoint_steps += 1
        self._collect_garbage()
        if self.progress is not None:
            self.progress.adjoint(1)
        if self.observer is not None:
            self.observer.adjoint(self.lam_step, self.lam, self.grad, self.result.J)

    @execute.register
    def _(self, action: EndReverse) -> None:
        if self.lam_step != 0:
            raise PlanError(f"EndReverse with lambda_{self.lam_step}, not lambda_0")
        left = [(level.name, level.occupied) for level in self.levels + self._data_levels() if level.occupied]
        if left:
            raise PlanError(f"snapshots left stored at the end: {left}")
        self.stepper.initial_adjoint(self.lam, self.grad)
        bad = [name for name in sorted(self.grad) if not finite([self.grad[name]])]
        if self._agree(bool(bad)):
            names = sorted({name for names in self.comm.allgather(bad) for name in names})
            raise NonFinite(f"the gradient {', '.join(f'dJ/d{n}' for n in names)} holds a non-finite value "
                            f"(inf or NaN) after the reverse sweep; stopped, no gradient")
        self.finished = True

    @execute.register
    def _(self, action: StoreData) -> None:
        self.store_data(action)

    @execute.register
    def _(self, action: AdjointData) -> None:
        self.adjoint_from_data(action)
