"""Any online planner (step()/finish() protocol) as an ordinary action stream the driver executes.

``Driver.run`` consumes ``schedule.n_steps`` and ``schedule.actions()``; :class:`OnlinePlan` feeds it
the planner's batches lazily, one ``step()`` per forward step, and calls ``finish()`` only when the
sweep is over, so the planner never learns n early. ``done(i)`` (default: ``i == n_steps``) is asked
before step i; it must give the same answer on every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .actions import Action
from .base import ScheduleError


class OnlinePlan:
    """Streams ``planner``'s plan for ``n_steps`` steps, ``finish()`` once ``done`` says so."""

    def __init__(self, planner, n_steps: int, done: Callable[[int], bool] | None = None):
        if n_steps < 1:
            raise ScheduleError(f"steps must be >= 1, got {n_steps}")
        self.planner = planner
        self.n_steps = int(n_steps)
        self.capacities = tuple(planner.capacities)
        self.name = getattr(planner, "name", "online")
        self.done = done if done is not None else (lambda i: i >= self.n_steps)
        self._used = False

    def actions(self) -> Iterator[Action]:
        if self._used:
            raise ScheduleError("an online plan streams once: its planner's decisions are made as it goes")
        self._used = True
        i = 0
        while i == 0 or not self.done(i):
            yield from self.planner.step()
            i += 1
        yield from self.planner.finish()

    def __iter__(self) -> Iterator[Action]:
        return self.actions()
