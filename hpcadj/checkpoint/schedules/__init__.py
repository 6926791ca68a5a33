"""Checkpoint plans: pure action streams for the driver (no MPI, no I/O, no numpy).

Use :func:`make_schedule` (what ``hpcadj run --schedule NAME`` and ``hpcadj plan`` call)::

    plan = make_schedule("multilevel", n_steps, capacities=[8, 64, 1024], costs=profile.vector("time"))
    for action in plan.actions(): ...

Names: ``store-all``, ``periodic``, ``revolve``, ``multilevel``, ``online``, and ``auto`` (revolve on
one level, multilevel on two or more; on one level with ``costs`` that price advances, the cheaper
of the two as simulated). ``capacities`` are slots per level, fastest level first.
``mixed`` (restart states or steps' adjoint data, mixed.py) takes ``state_size=``, ``data_size=`` and
``states_suffice=``, with ``capacities`` in the sizes' unit; ``--schedule mixed`` sizes them from the
model (checkpoint/mixed_plan.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from .actions import (Action, Adjoint, AdjointData, Advance, EndForward, EndReverse, Free, Move, PlanError,
                      Restore, Store, StoreData, WorkingStates)
from .base import Schedule, ScheduleError
from .costs import CostProfile, LevelCost, OpCosts, default_costs
from .multilevel import Multilevel
from .online import OnlineFixed, OnlineSchedule, online_bound
from .online_plans import online_factory
from .periodic import Periodic
from .revolve import Revolve, min_forward_steps
from .mixed import Mixed
from .simulate import PlanSummary, Simulator, simulate, simulate_online
from .storeall import StoreAll, store_all_slots

SCHEDULES = ("auto", "store-all", "periodic", "revolve", "multilevel", "online", "mixed")
#: schedules make_schedule builds whose plans the driver does not run yet
PLAN_ONLY = ()


def make_schedule(name: str, n_steps: int | None, capacities: Sequence[int], costs: OpCosts | None = None,
                  **options):
    """The schedule ``name`` for ``n_steps`` over levels with ``capacities`` slots.

    ``costs`` (default: :func:`default_costs`) matter to ``multilevel`` (and ``auto`` on several
    levels) and to ``online`` on several levels. ``online`` with ``n_steps=None`` returns the
    step()/finish() planner an ``--adaptive`` run uses (:func:`~.online_plans.online_factory`: binomial
    on one level, the priced greedy on several); with a number it is an ordinary plan. ``options``
    go to the schedule's constructor (``level=``, ``period=``, ``exact=``). Raises ScheduleError for
    impossible inputs.
    """
    capacities = [int(c) for c in capacities]
    if name == "online" and n_steps is None:
        if costs is None:
            costs = default_costs(len(capacities))
        return online_factory(capacities, costs, **options)(capacities)
    if n_steps is None:
        raise ScheduleError(f"schedule {name!r} needs the number of steps")
    if name == "auto":
        one = sum(1 for c in capacities if c > 0) <= 1
        if one and costs is not None and costs.advance is not None:
            # advances priced: the DP weighs them but prices the first sweep's as recomputations,
            # so the binomial plan can still be the cheaper one as run
            plans = (Revolve(n_steps, capacities, **options), Multilevel(n_steps, capacities, costs, **options))
            return min(plans, key=lambda plan: simulate(plan.actions(), n_steps, capacities, costs).predicted)
        name = "revolve" if one else "multilevel"
    if name == "store-all":
        if "level" not in options:
            need = store_all_slots(n_steps)
            fits = [i for i, c in enumerate(capacities) if c >= need]
            if not fits:
                raise ScheduleError(f"store-all needs {need} slots on one level for {n_steps} steps, "
                                    f"the largest has {max(capacities, default=0)}")
            options["level"] = fits[0]
        return StoreAll(n_steps, capacities, **options)
    if name == "periodic":
        return Periodic(n_steps, capacities, **options)
    if name == "revolve":
        return Revolve(n_steps, capacities, **options)
    if name == "multilevel":
        return Multilevel(n_steps, capacities, costs, **options)
    if name == "online":
        return OnlineFixed(n_steps, capacities, **options)
    if name == "mixed":
        return Mixed(n_steps, capacities, **options)
    raise ScheduleError(f"unknown schedule {name!r} (choose from {', '.join(SCHEDULES + PLAN_ONLY)})")


__all__ = [
    "Action", "Adjoint", "AdjointData", "Advance", "EndForward", "EndReverse", "Free", "Move", "PlanError", "Restore", "Store",
    "StoreData", "WorkingStates", "Schedule", "ScheduleError", "CostProfile", "LevelCost", "OpCosts", "default_costs",
    "Mixed", "Multilevel", "OnlineFixed", "OnlineSchedule", "online_bound", "Periodic", "Revolve", "min_forward_steps",
    "PlanSummary", "Simulator", "simulate", "simulate_online", "StoreAll", "store_all_slots", "SCHEDULES", "PLAN_ONLY",
    "make_schedule",
]
