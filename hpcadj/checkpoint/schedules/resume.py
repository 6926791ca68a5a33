"""Re-planning the rest of a gradient from whatever survived: a restart, a corrupt or lost snapshot.

The state to resume from is: the forward frontier (how far the first sweep got), lambda at step m
if the reverse sweep had begun, and the snapshots still valid on the levels ("retained"). The
driver holds u_0, rebuilt from the controls. The rest is cut into segments between retained
snapshots, processed from the top down; each segment [a, b] is an ordinary checkpointing problem of
b - a steps started from u_a, planned with the ``auto`` schedule (a mixed run: a mixed plan) on the
slots the lower retained snapshots leave free, and shifted by a. A segment that cannot be planned (no free slot) is merged
with the one below it. Pure: no I/O, the same stream on every rank.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from .actions import Action, Adjoint, AdjointData, Advance, EndForward, EndReverse, Free, Move, Restore, Store, StoreData
from .base import ScheduleError
from .costs import OpCosts


def shift(action: Action, offset: int) -> Action:
    """The same action with every step number moved by ``offset``."""
    if isinstance(action, Advance):
        return Advance(action.n0 + offset, action.n1 + offset)
    if isinstance(action, Adjoint):
        return Adjoint(action.n1 + offset, action.n0 + offset)
    if isinstance(action, AdjointData):
        return AdjointData(action.n1 + offset, action.n0 + offset, action.level)
    if isinstance(action, (Store, Restore, Free, StoreData)):
        return type(action)(action.n + offset, action.level)
    if isinstance(action, Move):
        return Move(action.n + offset, action.src, action.dst)
    return action


def residual_plan(n_steps: int, capacities: Sequence[int], retained: Mapping[int, int], *,
                  lam_step: int | None, costs: OpCosts | None = None, segment=None,
                  slot_units: Sequence[int] | None = None) -> Iterator[Action]:
    """Actions that finish the gradient from a resumed state.

    Parameters
    ----------
    n_steps : int
        n, the number of steps of the whole problem.
    capacities : sequence of int
        Slots per level, including those the retained snapshots occupy.
    retained : mapping step -> level
        Valid snapshots to reuse (steps below ``lam_step`` when it is set). Others must have been
        freed by the caller.
    lam_step : int or None
        m when lambda_m is known (reverse sweep under way; the forward sweep is complete); None when
        the forward sweep must (re)reach u_n first, with its ``EndForward`` seeding lambda_n.
    costs : OpCosts, optional
        Costs the segment plans minimise.
    segment : callable, optional
        ``segment(steps, free) -> Schedule``: the plan of one segment with ``free`` capacity per level
        (default: ``auto``).
    slot_units : sequence of int, optional
        The capacity one snapshot takes on each level (default 1: capacities in slots; a mixed plan's
        level counts bytes in units).

    The driver must hold u_0 (and only u_0) when the stream starts.
    """
    from . import make_schedule

    if segment is None:
        def segment(steps, free):
            return make_schedule("auto", steps, free, costs=costs.for_levels(len(free)) if costs else None)
    capacities = [int(c) for c in capacities]
    units = list(slot_units) if slot_units is not None else [1] * len(capacities)
    retained = dict(retained)
    top = n_steps if lam_step is None else lam_step
    if any(step >= top for step in retained):
        raise ScheduleError(f"retained snapshots {sorted(s for s in retained if s >= top)} lie at or "
                            f"beyond step {top}")

    def used(level):
        return units[level] * sum(1 for lv in retained.values() if lv == level)

    for level in range(len(capacities)):
        if used(level) > capacities[level]:
            raise ScheduleError(f"level {level} holds more retained snapshots than its capacity")
    if 0 not in retained and top > 0:  # lambda_0 known: nothing left to recompute
        free = [lv for lv, cap in enumerate(capacities) if cap - used(lv) >= units[lv]]
        if not free:
            raise ScheduleError("no free slot to keep u_0: nothing fits")
        retained[0] = free[0]
        yield Store(0, free[0])
    bases = sorted(retained, reverse=True)
    seed_forward = lam_step is None
    b = top
    i = 0
    while b > 0:
        a = bases[i]
        below = bases[i + 1:]
        free = list(capacities)
        for step in below:
            free[retained[step]] -= units[retained[step]]
        try:
            sub = list(segment(b - a, free).actions())
        except ScheduleError:
            if not below:
                raise ScheduleError("no plan fits the slots left for the rest of the gradient") from None
            yield Free(a, retained[a])
            i += 1
            continue
        yield from _segment(a, retained[a], sub, seed_forward)
        seed_forward = False
        b = a
        i += 1
    yield EndReverse()


def _segment(a: int, base_level: int, sub: list[Action], keep_end_forward: bool) -> Iterator[Action]:
    """Restore u_a, hand its slot to the segment plan (reused when the plan stores u_a there)."""
    yield Restore(a, base_level)
    body = [shift(x, a) for x in sub if not isinstance(x, EndReverse)]
    if not keep_end_forward:
        body = [x for x in body if not isinstance(x, EndForward)]
    if body and body[0] == Store(a, base_level):
        body = body[1:]
    else:
        yield Free(a, base_level)
    yield from body


class Residual:
    """:func:`residual_plan` as a schedule object (``n_steps``, ``capacities``, ``actions()``)."""

    name = "residual"

    def __init__(self, n_steps: int, capacities: Sequence[int], retained: Mapping[int, int], *,
                 lam_step: int | None, costs: OpCosts | None = None, segment=None,
                 slot_units: Sequence[int] | None = None, stores_data: bool = False):
        self.n_steps = int(n_steps)
        self.capacities = tuple(int(c) for c in capacities)
        self.retained = dict(retained)
        self.lam_step = lam_step
        self.costs = costs
        self.segment, self.slot_units = segment, slot_units
        #: its segments hold and store steps' adjoint data (a mixed run's)
        self.stores_data = stores_data
        list(self.actions())  # plan once now: impossible inputs raise ScheduleError here

    def actions(self) -> Iterator[Action]:
        return residual_plan(self.n_steps, self.capacities, self.retained, lam_step=self.lam_step,
                             costs=self.costs, segment=self.segment, slot_units=self.slot_units)
