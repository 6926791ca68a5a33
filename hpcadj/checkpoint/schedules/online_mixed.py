"""Mixed plans for adaptive steps (n unknown until the first sweep ends): an online plan of restart
states forward, a mixed reverse sweep.

The first sweep is an ordinary online planner's (online_plans.py: binomial on one level, the greedy
or cascade over several), with RAM counted in whole restart states of its byte budget. At ``finish()``
n is known and the stored states are the bases of the reverse sweep: step n - 1 is reversed on the
held states, then the rest is cut at the stored states into mixed plans in the bytes each segment
leaves (as a resumed mixed run, :meth:`Mixed.resumed` / :meth:`MixedLevels.resumed`), which may keep
steps' adjoint data between them. Both reverse sweeps (the planner's own and the mixed one) are
simulated from the first sweep's end and the one with fewer forward steps is streamed, so the plan
never takes more forward steps than today's online plan. A model whose steps must run again for their
data (``states_suffice=False``) keeps the planner's own reverse sweep.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence

from .actions import Action, Adjoint, EndForward, Free, Move, PlanError, Store
from .base import ScheduleError
from .mixed import Mixed
from .mixed_levels import MixedLevels
from .simulate import Simulator


class OnlineMixed:
    """step()/finish() planner: ``inner``'s first sweep, then the cheaper of its reverse sweep and a
    mixed one (module docstring). ``ram_units``: RAM's budget in units of ``sizes`` = (r, d); the
    other levels' capacities are ``inner``'s slots."""

    name = "online-mixed"

    def __init__(self, inner, ram_units: int, sizes: tuple[int, int], states_suffice: bool = True, costs=None):
        self.inner = inner
        self.slots = tuple(inner.capacities)
        self.capacities = self.slots
        self.ram_units = int(ram_units)
        self.sizes = (int(sizes[0]), int(sizes[1]))
        self.states_suffice = states_suffice
        self.costs = costs
        self.first_sweep: list[Action] = []
        self.position = 0  # steps planned so far: n once the sweep is over
        self.stored: dict[int, int] = {}
        #: which reverse sweep was streamed: "mixed" or the planner's ("states"); None before finish
        self.chosen: str | None = None
        #: the reverse sweep streamed, and the forward steps of the planner's own plan (after finish)
        self.reverse: list[Action] = []
        self.states_forward_steps: int | None = None

    def units(self) -> list[int]:
        """Capacities in units on every level (RAM's bytes; the others' slots of restart states)."""
        return [self.ram_units, *(c * self.sizes[0] for c in self.slots[1:])]

    def step(self) -> list[Action]:
        batch = list(self.inner.step())
        for action in batch:
            if isinstance(action, Store):
                self.stored[action.n] = action.level
            elif isinstance(action, Free):
                self.stored.pop(action.n, None)
            elif isinstance(action, Move):
                self.stored[action.n] = action.dst
        self.first_sweep += batch
        self.position += 1
        return batch

    def _mixed_reverse(self, n: int) -> list[Action]:
        """EndForward, step n - 1 on the held states, then mixed segments between the stored states."""
        r, d = self.sizes
        if len(self.slots) == 1:
            plan = Mixed(n, [self.ram_units], r, d, True)
        else:
            plan = MixedLevels(n, [self.ram_units, *self.slots[1:]], r, d, self.costs, True)
        rest = plan.resumed(list(self.slots), self.stored, lam_step=n - 1, costs=self.costs)
        return [EndForward(), Adjoint(n, n - 1), *rest.actions()]

    def _forward_steps(self, n: int, reverse: list[Action]) -> int:
        sim = Simulator(n, self.units(), self.sizes)
        for action in [*self.first_sweep, *reverse]:
            sim.execute(action)
        return sim.result().forward_steps

    def executed(self) -> list[Action]:
        """The whole plan as streamed (after finish): the first sweep and the reverse sweep chosen."""
        return [*self.first_sweep, *self.reverse]

    def finish(self) -> Iterator[Action]:
        n = self.position
        if self.states_suffice and n > 1 and 0 in self.stored:
            try:
                own = list(copy.deepcopy(self.inner).finish())
                mixed = self._mixed_reverse(n)
                self.states_forward_steps = self._forward_steps(n, own)
                cheaper = self._forward_steps(n, mixed) < self.states_forward_steps
            except (PlanError, ScheduleError):
                cheaper = False
            if cheaper:
                self.chosen, self.reverse = "mixed", mixed
                yield from mixed
                return
        self.chosen, self.reverse = "states", list(self.inner.finish())
        if self.states_forward_steps is None:
            self.states_forward_steps = self._forward_steps(n, self.reverse)
        yield from self.reverse


def online_mixed_factory(factory: Callable[[Sequence[int]], object], ram_units: int, sizes: tuple[int, int],
                         states_suffice: bool, costs=None) -> Callable[[Sequence[int]], OnlineMixed]:
    """``caps -> OnlineMixed`` over ``factory``'s planner of those slots; RAM keeps its bytes beyond its
    whole restart states (a resumed run's planner gets fewer slots, and the bytes of those)."""
    r = sizes[0]
    spare = ram_units % r

    def make(caps):
        return OnlineMixed(factory(list(caps)), caps[0] * r + spare, sizes, states_suffice, costs)
    return make
