"""When a run makes its progress durable: the driver's observer and its predicted cost."""

from __future__ import annotations

import time

from ..runstate import RunObserver
from ..levelkinds import DURABLE_KINDS
from .rundir import RunDirectory
from ..checkpoint.schedules.actions import Advance, EndForward, Store
from ..checkpoint.storage.base import LevelError
from ..checkpoint.storage.survey import survey

#: the mean time between failures ``--durable-interval auto`` assumes for a job (seconds)
DEFAULT_MTBF_S = 4 * 3600.0


def young_daly_interval(cost_s: float, mtbf_s: float = DEFAULT_MTBF_S) -> float:
    """Young's optimal checkpoint interval sqrt(2 C M) for a durable point costing ``cost_s``."""
    return (2.0 * max(cost_s, 1e-6) * mtbf_s) ** 0.5


def predicted_durable_seconds(schedule, plans, profile, every: int, interval: float | None,
                              makespan_s: float, mtbf_s: float = DEFAULT_MTBF_S) -> float:
    """What making progress durable adds to a plan's predicted makespan (seconds).

    Counts the durable points the plan triggers: every ``every``-th store on a node-local or HDF5
    level at the first sweep's frontier, one every ``every`` adjoint steps, and one per ``interval``
    of ``makespan_s`` (Young's interval for ``None``). Each costs a write and a read-back (the
    checksums) of one snapshot on the dearest durable level of ``profile``, the HDF5 one when present.
    """
    kinds = [p.kind for p in plans]
    costs = {lv.name: lv for lv in profile.levels}
    durable = [costs[p.name] for p in plans if p.kind in DURABLE_KINDS and p.name in costs]
    point_s = max((lv.write_s + lv.read_s for lv in durable), default=0.0)
    frontier, stores = 0, 0
    for action in schedule.actions():
        if isinstance(action, EndForward):
            break
        if isinstance(action, Advance):
            frontier = max(frontier, action.n1)
        elif isinstance(action, Store) and action.n == frontier and kinds[action.level] in DURABLE_KINDS:
            stores += 1
    step_points = stores // max(1, every) + schedule.n_steps // max(1, every)
    seconds = interval if interval is not None else young_daly_interval(point_s, mtbf_s)
    timed_points = int(makespan_s // seconds) if seconds > 0 else 0
    return (step_points + timed_points) * point_s


class Durability(RunObserver):
    """The driver's durability observer: records durable points in the run directory.

    Forward sweep: J is remembered for each snapshot stored on a durable level at the frontier;
    every ``every`` such stores (and at a stop) the durable levels are flushed and the manifest
    lists the snapshots and J at each. Besides, once ``interval`` seconds have passed since the
    last durable point, the state at the frontier itself is written to ``forward-<k>.h5`` (a
    plan whose stores near the frontier all go to RAM otherwise left a kill late in the sweep to
    redo most of it). ``interval=None`` is Young's interval sqrt(2 C M) from the measured cost C
    of a durable point and ``mtbf_s`` M. Reverse sweep: every ``every`` adjoint steps, or
    ``interval`` seconds, lambda and the gradient so far are written, then the manifest.
    ``seconds`` and ``points`` say what durability cost.
    """

    def __init__(self, rundir: RunDirectory, model, levels, every: int = 10,
                 interval: float | None = None, mtbf_s: float = DEFAULT_MTBF_S):
        self.rundir = rundir
        self.model = model
        self.levels = levels
        self.every = max(1, int(every))
        self.fixed_interval = interval
        self.mtbf_s = float(mtbf_s)
        self.seconds = 0.0
        self.points = 0
        self._cost = None
        self._last = time.perf_counter()
        self._since = 0
        self._forward_J: dict[int, float] = {}

    @property
    def interval(self) -> float:
        """Seconds between time-driven durable points (Young's interval until one was measured:
        the first comes after a minute)."""
        if self.fixed_interval is not None:
            return self.fixed_interval
        return 60.0 if self._cost is None else young_daly_interval(self._cost, self.mtbf_s)

    def _due(self) -> bool:
        """Whether the interval has passed, agreed by rank 0's clock (every rank acts alike)."""
        due = time.perf_counter() - self._last >= self.interval
        return bool(self.rundir.comm.bcast(due, root=0))

    def _timed(self, fn) -> None:
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        self._cost = t1 - t0
        self.seconds += self._cost
        self.points += 1
        self._last = t1

    def _durable_snapshots(self) -> dict:
        """Flush the durable levels and list their complete snapshots (the same on every rank)."""
        out = {}
        for level in self.levels:
            if level.kind in DURABLE_KINDS:
                left, = survey([level], self.rundir.comm, discard=False)
                if left.failed:
                    # every rank leaves together; the driver re-plans around the failed level
                    raise left.error or LevelError(f"{level.name}: a write failed on another rank")
                out[level.name] = sorted(left.steps)
        return out

    def _record(self, durable: dict) -> None:
        m = self.rundir.manifest
        m["snapshots"] = self._durable_snapshots()
        stored = {step for steps in m["snapshots"].values() for step in steps}
        m["forward_points"] = {str(step): J for step, J in self._forward_J.items() if step in stored}
        m["durable"] = durable
        record = getattr(self.model, "step_record", lambda: None)()
        if record is not None:  # adaptive steps: the accepted dt sequence so far, replayed on resume
            m["adaptive_steps"] = record
        self.rundir.save()

    def stored(self, step: int, level, J: float) -> None:
        """After a store at the frontier: a durable point every ``every`` durable stores."""
        self._forward_J[step] = J  # kept for any level: a Move may carry the snapshot to a durable one
        if level.kind not in DURABLE_KINDS:
            return
        self._since += 1
        if self._since >= self.every:
            self._since = 0
            self._timed(lambda: self._record({"phase": "forward"}))

    def moved(self, step: int, level) -> None:
        """A first-sweep snapshot moved to ``level`` (online multi-level plans store fast, then move
        down): a durable store like :meth:`stored` when it lands on a durable level."""
        if level.kind in DURABLE_KINDS and step in self._forward_J:
            self.stored(step, level, self._forward_J[step])

    def advanced(self, step: int, state, J: float) -> None:
        """After a first-sweep Advance: the frontier state made durable once the interval passed."""
        n = self.model.n_steps  # None while adaptive steps have not reached t_final
        if (n is not None and step >= n) or not self._due():
            return

        def write():
            name = self.rundir.write_state(self.model, step, state, J)
            self._record({"phase": "forward", "forward": name, "frontier": step, "J": J})

        self._timed(write)

    def adjoint(self, step: int, lam, grad: dict, J: float, force: bool = False) -> None:
        """After an adjoint step: lambda and the gradient so far, every ``every`` steps or interval."""
        self._since += 1
        if not force and self._since < self.every and step != 0 and not self._due():
            return
        self._since = 0

        def write():
            name = self.rundir.write_adjoint(self.model, step, lam, grad)
            self._record({"phase": "reverse", "J": J, "lam_step": step, "adjoint": name})

        self._timed(write)

    def stopping(self, step: int | None, lam, grad: dict, J: float) -> None:
        """Make everything durable before a requested stop."""
        if step is not None:
            self.adjoint(step, lam, grad, J, force=True)
        else:
            self._record({"phase": "forward"})
        self.rundir.manifest["status"] = "stopped"
        self.rundir.save()

    def finished(self) -> None:
        self.rundir.manifest["status"] = "complete"
        self.rundir.save()
