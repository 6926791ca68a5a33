"""Execute a plan without physics: the test oracle for every schedule, and the plan summary.

The simulator holds *labels* instead of states: a working state or a slot holds the step number
whose state it really contains, computed from the actions (``Advance`` produces labels n0+1..n1 from
the label it starts from). It applies the driver's exact working-state rule
(:class:`~.actions.WorkingStates`) and raises :class:`PlanError` as soon as the plan is wrong:

- an action needs a state that is not held, or reads a slot never written (or already freed);
- a level holds more than its capacity, or a slot is written twice;
- an adjoint step runs twice, out of reverse order, before ``EndForward`` or on a wrong state, or
  from data (``AdjointData``) that are not the data of its step;
- ``EndForward`` is not reached exactly once with u_n held, or ``EndReverse`` comes before every
  adjoint step ran or while a level still holds a snapshot, or anything follows ``EndReverse``.

Capacities are slots unless ``sizes = (state, data)`` is given: then a restart state occupies
``state`` units of its level and a step's adjoint data ``data`` units (bytes, say). It counts
forward-step evaluations (and the runs of them a driver hands to a model's advance,
``actions.advance_runs``), writes and reads per level (a ``Move`` is one read on its source and one
write on its destination; data separately), peak occupancy per level, and the predicted makespan.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .actions import (Action, Adjoint, AdjointData, Advance, EndForward, EndReverse, Free, Move, PlanError,
                      Restore, Store, StoreData, WorkingStates, advance_runs)
from .costs import OpCosts


@dataclass
class PlanSummary:
    """What a plan does: counts per operation and level, and its predicted cost."""

    steps: int
    capacities: tuple[int, ...]
    forward_steps: int = 0
    adjoint_steps: int = 0
    actions: int = 0
    writes: list[int] = field(default_factory=list)
    reads: list[int] = field(default_factory=list)
    peak: list[int] = field(default_factory=list)
    predicted: float | None = None
    sizes: tuple[int, int] = (1, 1)
    data_writes: list[int] = field(default_factory=list)
    data_adjoints: int = 0
    #: (m, first sweep) -> how many runs of m steps went to the model's advance
    advances: dict = field(default_factory=dict)

    @property
    def recompute_factor(self) -> float:
        """Forward evaluations per forward step (1.0: nothing recomputed)."""
        return self.forward_steps / self.steps

    def cost(self, costs: OpCosts) -> float:
        """Predicted makespan (or energy) of this plan under ``costs``; moving a step's data costs
        a state's I/O scaled by their sizes (each data item is written once and read once), and each
        step reversed from its data its capture and stand-in (``costs.data``)."""
        levels = costs.for_levels(len(self.capacities))
        scale = self.sizes[1] / self.sizes[0]
        return (levels.stepping(self.forward_steps, self.advances) + self.adjoint_steps * levels.adjoint
                + sum(w * c for w, c in zip(self.writes, levels.write))
                + sum(r * c for r, c in zip(self.reads, levels.read))
                + sum(w * scale * (cw + cr) for w, cw, cr in zip(self.data_writes, levels.write, levels.read))
                + self.data_adjoints * levels.data)


class Simulator:
    """Executes actions one at a time against ``n_steps`` and per-level ``capacities``."""

    def __init__(self, n_steps: int, capacities: Sequence[int], sizes: tuple[int, int] = (1, 1)):
        self.n = int(n_steps)
        self.capacities = tuple(int(c) for c in capacities)
        self.sizes = (int(sizes[0]), int(sizes[1]))
        if min(self.sizes) < 1:
            raise ValueError(f"sizes must be positive, got {sizes}")
        k = len(self.capacities)
        self.summary = PlanSummary(self.n, self.capacities, writes=[0] * k, reads=[0] * k, peak=[0] * k,
                                   sizes=self.sizes, data_writes=[0] * k)
        self.work: WorkingStates[int] = WorkingStates(0, 0)
        self.slots: list[dict[int, int]] = [{} for _ in range(k)]
        self.data: list[dict[int, int]] = [{} for _ in range(k)]
        self.forward_done = False
        self.reverse_done = False
        self.next_adjoint = self.n - 1
        self.frontier = 0  # the first sweep's furthest step, as the driver's

    @classmethod
    def resumed(cls, n_steps: int, capacities: Sequence[int], retained: dict[int, int],
                lam_step: int | None, sizes: tuple[int, int] = (1, 1)) -> "Simulator":
        """A simulator in the state a resumed driver starts from (see ``resume.residual_plan``):
        u_0 held, ``retained`` snapshots (step -> level) stored, lambda at ``lam_step`` if known."""
        sim = cls(n_steps, capacities, sizes)
        for step, level in retained.items():
            sim._level(level)[step] = step
        if lam_step is not None:
            sim.forward_done = True
            sim.next_adjoint = lam_step - 1
            sim.frontier = n_steps
        return sim

    def _level(self, level: int) -> dict[int, int]:
        if not 0 <= level < len(self.slots):
            raise PlanError(f"level {level} does not exist ({len(self.slots)} levels)")
        return self.slots[level]

    def used(self, level: int) -> int:
        """Occupied capacity of ``level`` (slots, or units of ``sizes``)."""
        return len(self.slots[level]) * self.sizes[0] + len(self.data[level]) * self.sizes[1]

    def _fit(self, level: int, size: int, what: str) -> None:
        if self.used(level) + size > self.capacities[level]:
            raise PlanError(f"level {level} is full ({self.used(level)} of {self.capacities[level]} used) "
                            f"storing {what}")

    def _put(self, level: int, n: int, label: int) -> None:
        slots = self._level(level)
        if n in slots:
            raise PlanError(f"u_{n} is already stored on level {level}")
        self._fit(level, self.sizes[0], f"u_{n}")
        slots[n] = label
        self.summary.writes[level] += 1
        self.summary.peak[level] = max(self.summary.peak[level], self.used(level))

    def _put_data(self, level: int, n: int, label: int) -> None:
        self._level(level)
        if n in self.data[level]:
            raise PlanError(f"the data of step {n} are already stored on level {level}")
        self._fit(level, self.sizes[1], f"the data of step {n}")
        self.data[level][n] = label
        self.summary.data_writes[level] += 1
        self.summary.peak[level] = max(self.summary.peak[level], self.used(level))

    def _adjoint_data(self, action: AdjointData) -> None:
        if action.level is None:
            label = self.work.get_data(action.n0)
        else:
            self._level(action.level)
            if action.n0 not in self.data[action.level]:
                raise PlanError(f"{action}: the data of step {action.n0} are not stored on level {action.level}")
            label = self.data[action.level].pop(action.n0)
        if label != action.n0:
            raise PlanError(f"{action} on the data of step {label}")
        self.work.data_adjoint_done(action.n0)
        self.summary.data_adjoints += 1

    def _take(self, level: int, n: int, remove: bool) -> int:
        slots = self._level(level)
        if n not in slots:
            raise PlanError(f"u_{n} is not stored on level {level}")
        self.summary.reads[level] += 1
        return slots.pop(n) if remove else slots[n]

    def execute(self, action: Action) -> None:
        """Apply one action, or raise PlanError saying why it cannot run."""
        if self.reverse_done:
            raise PlanError(f"{action} after EndReverse")
        self.summary.actions += 1
        if isinstance(action, Advance):
            self._advance(action)
        elif isinstance(action, Store):
            self._put(action.level, action.n, self.work.get(action.n))
        elif isinstance(action, StoreData):
            self._put_data(action.level, action.n, self.work.get_data(action.n))
        elif isinstance(action, Restore):
            self.work.restored(action.n, self._take(action.level, action.n, remove=False))
        elif isinstance(action, Move):
            label = self._take(action.src, action.n, remove=True)
            self._put(action.dst, action.n, label)
        elif isinstance(action, Free):
            self._free(action)
        elif isinstance(action, (Adjoint, AdjointData)):
            self._adjoint(action)
        elif isinstance(action, EndForward):
            self._end_forward()
        elif isinstance(action, EndReverse):
            self._end_reverse()
        else:
            raise PlanError(f"unknown action {action!r}")

    def _advance(self, action: Advance) -> None:
        if action.n1 > self.n:
            raise PlanError(f"{action} goes beyond u_{self.n}")
        start = self.work.get(action.n0)
        if start != action.n0:
            raise PlanError(f"{action} starts from a state labelled u_{start}")
        self.summary.forward_steps += action.n1 - action.n0
        beyond = any(k > action.n1 for k in self.work.steps())
        for run in advance_runs(action.n0, action.n1, self.frontier, beyond):
            self.summary.advances[run] = self.summary.advances.get(run, 0) + 1
        self.frontier = max(self.frontier, action.n1)
        last = start + action.n1 - action.n0 - 1
        self.work.advanced(action.n0, action.n1, last, last + 1, data=last)

    def _free(self, action: Free) -> None:
        slots = self._level(action.level)
        if action.n not in slots:
            raise PlanError(f"{action}: u_{action.n} is not stored on level {action.level}")
        del slots[action.n]

    def _adjoint(self, action: Adjoint | AdjointData) -> None:
        if not self.forward_done:
            raise PlanError(f"{action} before EndForward")
        if action.n0 != self.next_adjoint:
            raise PlanError(f"{action} out of order: adjoint step {self.next_adjoint} is next")
        if isinstance(action, AdjointData):
            self._adjoint_data(action)
        elif self.work.get(action.n0) != action.n0 or self.work.get(action.n1) != action.n1:
            raise PlanError(f"{action} on wrong states")
        else:
            self.work.adjoint_done(action.n0)
        self.next_adjoint -= 1
        self.summary.adjoint_steps += 1

    def _end_forward(self) -> None:
        if self.forward_done:
            raise PlanError("EndForward twice")
        if self.work.get(self.n) != self.n:
            raise PlanError("EndForward without u_n held")
        self.forward_done = True

    def _end_reverse(self) -> None:
        if self.next_adjoint != -1:
            raise PlanError(f"EndReverse before adjoint step {self.next_adjoint}")
        left = [(lv, sorted(s)) for lv, s in enumerate(self.slots) if s]
        left += [(lv, "data", sorted(s)) for lv, s in enumerate(self.data) if s]
        if left:
            raise PlanError(f"EndReverse with snapshots still stored: {left}")
        self.reverse_done = True

    def result(self, costs: OpCosts | None = None) -> PlanSummary:
        """The summary of a complete plan (PlanError if it did not reach EndReverse)."""
        if not self.reverse_done:
            raise PlanError("the plan ended without EndReverse")
        if costs is not None:
            self.summary.predicted = self.summary.cost(costs)
        return self.summary


def simulate(actions: Iterable[Action], n_steps: int, capacities: Sequence[int],
             costs: OpCosts | None = None, sizes: tuple[int, int] = (1, 1)) -> PlanSummary:
    """Run a whole plan through the simulator; return its summary (PlanError if it is wrong).
    ``sizes``: units of capacity a restart state and a step's adjoint data occupy (module docstring)."""
    sim = Simulator(n_steps, capacities, sizes)
    for action in actions:
        sim.execute(action)
    return sim.result(costs)


def simulate_online(schedule, n_steps: int, costs: OpCosts | None = None) -> PlanSummary:
    """Drive an online schedule (``step()`` per forward step, then ``finish()``) to ``n_steps``.

    The schedule learns that the forward sweep is over only when ``finish()`` is called; each
    ``step()`` must end with exactly one ``Advance(i, i + 1)``.
    """
    sim = Simulator(n_steps, schedule.capacities)
    for i in range(n_steps):
        batch = list(schedule.step())
        if not batch or batch[-1] != Advance(i, i + 1) or any(isinstance(a, Advance) for a in batch[:-1]):
            raise PlanError(f"online step {i} must end with the one action Advance({i}, {i + 1}), got {batch}")
        for action in batch:
            sim.execute(action)
    for action in schedule.finish():
        sim.execute(action)
    return sim.result(costs)
