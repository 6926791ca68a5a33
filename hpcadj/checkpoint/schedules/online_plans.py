"""Any online planner (step()/finish() protocol) as an ordinary action stream the driver executes.

``Driver.run`` consumes ``schedule.actions()``; :class:`OnlinePlan` feeds it the planner's batches
lazily, one ``step()`` per forward step, and calls ``finish()`` only when the sweep is over, so the
planner never learns n early. ``done(i)`` (default: ``i == n_steps``) is asked before step i, once
step i - 1 has run (an adaptive model decides there whether u_i is the final state); it must give
the same answer on every rank. ``n_steps`` is None when the number of steps is unknown.

:meth:`OnlinePlan.resumed` continues a first sweep from the snapshots that survived (a restart, a
storage fault) without knowing n either: see :class:`OnlineResidual`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from .actions import Action, Adjoint, Advance, EndForward, EndReverse, Free, Restore, Store
from .base import ScheduleError
from .resume import residual_plan, shift


class OnlinePlan:
    """Streams ``planner``'s plan until ``done`` says the sweep is over, then its ``finish()``.

    ``factory(capacities)`` builds a fresh planner of the same kind (needed by :meth:`resumed`;
    default ``type(planner)(capacities)``).
    """

    def __init__(self, planner, n_steps: int | None = None, done: Callable[[int], bool] | None = None,
                 factory: Callable[[Sequence[int]], object] | None = None):
        if n_steps is None and done is None:
            raise ScheduleError("an online plan needs the number of steps or a done(i) test")
        if n_steps is not None and n_steps < 1:
            raise ScheduleError(f"steps must be >= 1, got {n_steps}")
        self.planner = planner
        self.n_steps = None if n_steps is None else int(n_steps)
        self.capacities = tuple(planner.capacities)
        self.name = getattr(planner, "name", "online")
        self.done = done if done is not None else (lambda i: i >= self.n_steps)
        self.factory = factory or (lambda capacities: type(planner)(capacities))
        self._used = False

    online = True

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

    def resumed(self, capacities: Sequence[int], retained: Mapping[int, int], costs=None) -> "OnlineResidual":
        """The rest of this run from the ``retained`` snapshots (step -> level), n still unknown."""
        return OnlineResidual(self.factory, capacities, retained, self.done, costs=costs, name=self.name)


class OnlineResidual:
    """A first sweep of unknown length continued from retained snapshots, then the reverse sweep.

    The newest retained snapshot u_b is restored and handed to a fresh online planner on the slots
    the older ones leave free; it runs the sweep from b on (shifted by b) until ``done``, and its
    reverse sweep down to lambda_b. The older snapshots then serve the rest, as in an ordinary
    restart (:func:`~.resume.residual_plan` with lambda_b known). u_0 (which the driver holds when the
    stream starts) is stored first where no retained snapshot holds it. Nothing retained: a fresh
    online plan from u_0.
    """

    online = True
    n_steps = None

    def __init__(self, factory, capacities: Sequence[int], retained: Mapping[int, int],
                 done: Callable[[int], bool], costs=None, name: str = "online"):
        self.factory = factory
        self.capacities = tuple(int(c) for c in capacities)
        self.retained = dict(retained)
        self.done = done
        self.costs = costs
        self.name = f"{name}-residual"
        for level in range(len(self.capacities)):
            if sum(1 for lv in self.retained.values() if lv == level) > self.capacities[level]:
                raise ScheduleError(f"level {level} holds more retained snapshots than its capacity")

    def resumed(self, capacities, retained, costs=None) -> "OnlineResidual":
        return OnlineResidual(self.factory, capacities, retained, self.done, costs=costs, name=self.name[:-9])

    def actions(self) -> Iterator[Action]:
        caps, retained = list(self.capacities), dict(self.retained)
        if not retained:
            yield from OnlinePlan(self.factory(caps), done=self.done).actions()
            return
        base = max(retained)
        below = {step: lv for step, lv in retained.items() if step < base}
        if base > 0 and 0 not in below:
            used = [sum(1 for lv in retained.values() if lv == k) for k in range(len(caps))]
            free = [k for k in range(len(caps)) if caps[k] > used[k]]
            if not free:
                raise ScheduleError("no free slot to keep u_0: nothing fits")
            below[0] = free[0]
            yield Store(0, free[0])
        inner_caps = [c - sum(1 for lv in below.values() if lv == k) for k, c in enumerate(caps)]
        yield Restore(base, retained[base])
        yield Free(base, retained[base])
        planner = self.factory(inner_caps)
        i = base
        while i == base or not self.done(i):
            for action in planner.step():
                yield shift(action, base)
            i += 1
        for action in planner.finish():
            if below and isinstance(action, EndReverse):
                continue
            yield shift(action, base)
        if below:
            yield from residual_plan(i, caps, below, lam_step=base, costs=self.costs)


class OnlineStoreAll:
    """Online store-all on one level: u_{i-1} stored before step i, so n forward evaluations and no
    planning cost per step (the greedy binomial planner's step cost grows with its slots)."""

    name = "online-store-all"

    def __init__(self, capacities: Sequence[int]):
        self.capacities = tuple(int(c) for c in capacities)
        self.level = next((k for k, c in enumerate(self.capacities) if c > 0), None)
        if self.level is None:
            raise ScheduleError("store-all needs at least one slot")
        self.position = 0
        self.finished = False

    def step(self) -> list[Action]:
        i = self.position
        if i >= self.capacities[self.level] + 1:
            raise ScheduleError(f"store-all holds {self.capacities[self.level]} snapshots: step {i} does not fit")
        self.position = i + 1
        return ([Store(i - 1, self.level)] if i >= 1 else []) + [Advance(i, i + 1)]

    def finish(self) -> Iterator[Action]:
        if self.finished or self.position < 1:
            raise ScheduleError("finish() twice or before any step")
        self.finished = True
        n, lv = self.position, self.level
        yield EndForward()
        for i in reversed(range(n)):
            if i != n - 1:  # u_{n-1} is still a working state after the forward sweep
                yield Restore(i, lv)
            yield Adjoint(i + 1, i)
            if i < n - 1:
                yield Free(i, lv)
        yield EndReverse()


def online_factory(capacities: Sequence[int], costs=None, store_all: bool = False, **options):
    """``caps -> planner``: the step()/finish() planner of a run over ``capacities`` whose n is unknown,
    chosen once (a resumed plan keeps its kind): binomial on one level
    (:class:`~.online_binomial.OnlineBinomial`); over several, the priced greedy
    (:class:`~.online_greedy.OnlineGreedyMultilevel`) with ``costs``, else the cascade
    (:class:`~.online_multilevel.OnlineMultilevel`); ``store_all``: every state on the first level
    (:class:`OnlineStoreAll`). ``options`` go to the planner's constructor (``level=``: binomial
    on that level)."""
    from .online_binomial import OnlineBinomial
    from .online_greedy import OnlineGreedyMultilevel
    from .online_multilevel import OnlineMultilevel

    if store_all:
        return lambda caps: OnlineStoreAll(caps, **options)
    if sum(1 for c in capacities if c > 0) <= 1 or "level" in options:
        return lambda caps: OnlineBinomial(caps, **options)
    if costs is not None:
        return lambda caps: OnlineGreedyMultilevel(caps, costs, **options)
    return lambda caps: OnlineMultilevel(caps, **options)


def make_online_plan(capacities: Sequence[int], costs=None, done: Callable[[int], bool] | None = None,
                     n_steps: int | None = None, store_all: bool = False) -> OnlinePlan:
    """The online plan over ``capacities`` (:func:`online_factory`'s planner) as the action stream the
    driver executes."""
    factory = online_factory(capacities, costs, store_all)
    return OnlinePlan(factory(list(capacities)), n_steps, done=done, factory=factory)
