"""Mixed plans: restart states and steps' adjoint data planned in a RAM byte budget.

``--schedule mixed`` asks for one; store-all and auto take one where it is cheaper (mixed_choice.py).

For a model that declares its adjoint data (:meth:`~hpcadj.models.base.Stepper.adjoint_data_layout`)
the RAM level's budget becomes bytes B (the budget given, or whole restart states of it) and
:class:`~hpcadj.checkpoint.schedules.mixed.Mixed` chooses per step between a restart state of r bytes
and the step's data of d bytes (the largest rank's, so every rank makes the same plan). With node-local
or HDF5 levels beside RAM, :class:`~hpcadj.checkpoint.schedules.mixed_levels.MixedLevels` keeps today's
multi-level plan on them and plans every RAM chain between their states that way. The file levels may
be compressed (their slots are then counted at the encoded size, as for any plan); RAM may not yet. With a run directory the durable points are those of any plan (forward
states at an interval, lambda in the reverse sweep); data slots live in RAM only and a resumed run
rebuilds them by recomputation (:meth:`~hpcadj.checkpoint.schedules.mixed.Mixed.resumed`).
"""

from __future__ import annotations

from dataclasses import replace
from math import gcd

from ..snapshot import layout_bytes
from .budget import parse_budget
from .memory import DATA_DRIVER_STATES
from .options import ConfigError
from .schedules import Mixed, ScheduleError, simulate
from .schedules.mixed_levels import MixedLevels
from .schedules.revolve import min_forward_steps


def _refuse(text: str):
    raise ConfigError(f"--schedule mixed {text}")


def mixed_sizes(model) -> tuple[int, int]:
    """(r, d): bytes of a restart state and of a step's data on the largest rank."""
    from ..imports import mpi

    layout = model.adjoint_data_layout() if hasattr(model, "adjoint_data_layout") else None
    if not hasattr(model, "adjoint_data_layout"):
        _refuse("needs the model itself (its adjoint data's size): run it with hpcadj run")
    if layout is None:
        _refuse(f"needs a model that declares its adjoint data; {model.name!r} declares none "
                f"(use auto, revolve or store-all)")
    comm = model.comm
    r = comm.allreduce(layout_bytes(model.snapshot_layout()), op=mpi().MAX)
    d = comm.allreduce(layout_bytes(layout), op=mpi().MAX)
    return int(r), int(d)


def recomputes(model) -> bool:
    """Whether the model's adjoint step from states re-runs the step for what it reads (RK stages):
    its plans then reverse a step only from its data (``states_suffice=False``)."""
    return bool(getattr(model, "recomputes_in_adjoint", False))


def mixed_budget(model, plans, ck, memory) -> int:
    """The RAM level's bytes B for a mixed plan: the budget given, what ``--memory`` leaves, whole
    restart states of a slot count, or (no budget) every step's data or state."""
    r, d = mixed_sizes(model)
    text = ck.budgets.get("ram")
    given = parse_budget(text) if text is not None and memory is None else None
    if given is not None and given.nbytes is not None:
        return given.nbytes
    if memory is not None and text is None and memory.ram_slots_fit is not None:
        # what --memory leaves, not capped at n - 1 restart states, less the states data plans hold more
        return max(memory.ram_slots_fit - DATA_DRIVER_STATES, 0) * r
    if text is None and memory is None:
        return max(model.n_steps - 1, 1) * max(r, d)  # no budget: every step's data (or state) is kept
    return plans[0].slots * r


def mixed_run(model, controls, plans, ck, profile, memory, probes, notes, warnings, durability):
    """The PlannedRun of ``--schedule mixed`` over ``plans`` (RAM first; node-local and HDF5 levels
    hold restart states); the session has refused a model whose declared data disagree with what its
    adjoint step reads (``refuse_untrusted_data``)."""
    from .provision import PlannedRun, recompute_warning

    if plans[0].kind != "ram":
        _refuse("keeps steps' data in RAM: give --ram (or --memory) beside the other levels")
    if "ram" in probes or plans[0].codec is not None:
        _refuse("does not compress its RAM slots (restart states and steps' data) yet: compress the file "
                "levels only (--compress-disk, --compress-pfs)")
    n = model.n_steps
    r, d = mixed_sizes(model)
    text = ck.budgets.get("ram")
    budget = mixed_budget(model, plans, ck, memory)
    unit = gcd(r, d)
    units = [budget // unit] + [p.slots * (r // unit) for p in plans[1:]]
    try:
        if len(plans) == 1:
            schedule = Mixed(n, units, state_size=r // unit, data_size=d // unit,
                             states_suffice=not recomputes(model))
        else:
            schedule = MixedLevels(n, [budget // unit, *(p.slots for p in plans[1:])], r // unit, d // unit,
                                   costs=profile.vector(ck.minimize), states_suffice=not recomputes(model))
    except ScheduleError as exc:
        if len(plans) > 1:
            raise ConfigError(f"--schedule mixed: {exc}") from None
        least = str(exc).rsplit(" ", 1)[-1]
        _refuse(f"with --ram {text if text is not None else budget}: restart states of {r} bytes and step "
                f"data of {d} bytes per rank cannot reverse {n} steps; the least that would do is "
                f"{int(least) * unit}B")
    plans = (replace(plans[0], slots=max(budget // r, 1)), *plans[1:])
    summary = simulate(schedule.actions(), n, units, profile.vector("time"), sizes=(r // unit, d // unit))
    text = recompute_warning(summary.forward_steps, n, "this plan")
    if text:
        warnings.append(text)
    predicted = predicted_seconds(profile, summary, unit, r)
    durable_s = durability(schedule, plans, profile, predicted) if durability is not None else 0.0
    return PlannedRun(plans, schedule, profile, summary, predicted + durable_s, durable_s, memory, probes,
                      tuple(notes), tuple(warnings), profile)


def predicted_seconds(profile, summary, unit: int, r: int) -> float:
    """A mixed plan's predicted makespan under ``profile``: its operations as simulated in units of
    ``unit`` bytes, the first touch of its peak in restart states of ``r`` bytes (``fill_s`` is per slot)."""
    return profile.predicted_seconds(replace(summary, peak=[-(-p * unit // r) for p in summary.peak]))


def mixed_online(model, plans, ck, costs, store_all: bool):
    """The online plan of ``--schedule mixed`` with adaptive steps: the online planner's restart states
    in the first sweep, the cheaper of its reverse sweep and a mixed one at the end
    (:class:`~hpcadj.checkpoint.schedules.online_mixed.OnlineMixed`)."""
    from .schedules.online_mixed import online_mixed_factory
    from .schedules.online_plans import OnlinePlan, online_factory

    if plans[0].kind != "ram":
        _refuse("keeps steps' data in RAM: give --ram beside the other levels")
    r, d = mixed_sizes(model)
    text = ck.budgets.get("ram")
    given = parse_budget(text) if text is not None else None
    budget = given.nbytes if given is not None and given.nbytes is not None else plans[0].slots * r
    unit = gcd(r, d)
    slots = [p.slots for p in plans]
    factory = online_mixed_factory(online_factory(slots, costs, store_all), budget // unit, (r // unit, d // unit),
                                   not recomputes(model), costs)
    plan = OnlinePlan(factory(slots), done=model.done, factory=factory)
    plan.stores_data = True
    return plan


def states_only_forward_steps(schedule, stepper) -> int:
    """Forward steps of today's plan with the same bytes in restart states: revolve over RAM's whole
    states (store-all where n - 1 fit), or today's multi-level plan over the same levels; plus one a
    step where each adjoint step from states re-runs its step (not counted by the plan)."""
    n = schedule.n_steps
    if isinstance(schedule, MixedLevels):
        slots = schedule.slots()
        today = simulate(schedule.today.actions(), n, slots).forward_steps
    else:
        states = schedule.capacities[0] // schedule.sizes[0]
        today = n if states >= n - 1 else min_forward_steps(n, max(states, 1))
    return today + (n if recomputes(stepper) else 0)


def plan_summary(model, planned) -> dict:
    """A mixed plan's RAM level as ``hpcadj plan`` and ``run --json`` report it: the most restart states
    and steps' data held there at once, their bytes per rank, its peak bytes, and the plan's forward
    steps against today's plan of restart states in the same bytes (the recomputation it saves; an
    adaptive run's: its online planner's own reverse sweep after the same first sweep)."""
    schedule = planned.schedule
    r, d = mixed_sizes(model)
    planner = getattr(schedule, "planner", None)
    if planner is not None:  # an adaptive run's online plan, as it streamed it (n known once it ran)
        actions, unit = planner.executed(), r // planner.sizes[0]
        summary = simulate(actions, planner.position, planner.units(), sizes=planner.sizes)
        budget, today = planner.ram_units * unit, planner.states_forward_steps
    else:
        actions, unit, summary = schedule.actions(), r // schedule.sizes[0], planned.summary
        budget, today = schedule.capacities[0] * unit, states_only_forward_steps(schedule, model)
    held, most = {"restart": 0, "data": 0}, {"restart": 0, "data": 0}
    for action in actions:
        kind = type(action).__name__
        if kind in ("Store", "Free") and action.level == 0:
            held["restart"] += 1 if kind == "Store" else -1
        elif kind == "StoreData" or (kind == "AdjointData" and action.level is not None):
            held["data"] += 1 if kind == "StoreData" else -1
        most = {k: max(most[k], held[k]) for k in most}
    info = {"budget_bytes": budget, "restart_bytes": r, "data_bytes": d,
            "restart_slots": most["restart"], "data_slots": most["data"], "restart_writes": sum(summary.writes),
            "data_writes": sum(summary.data_writes), "peak_bytes": summary.peak[0] * unit,
            "forward_steps": summary.forward_steps, "forward_steps_states_only": today,
            "forward_steps_saved": today - summary.forward_steps}
    if planner is not None:
        info["reverse_sweep"] = planner.chosen  # "mixed", or "states": the online planner's own
    return info


def mixed_summary(comm, planned, driver) -> dict:
    """``run --json``'s ``mixed`` object: the plan's (:func:`plan_summary`) with what the run did: its
    data writes, their bytes over all ranks, the most data slots it held, the forward steps it saved.
    None for a resumed adaptive run (its residual plan streamed, not the online plan provisioned)."""
    planner = getattr(planned.schedule, "planner", None)
    if planner is not None and planner.chosen is None:
        return None
    info = plan_summary(driver.stepper, planned)
    data = driver.data_stats()
    info.update(data_writes=data["writes"], data_bytes_written=comm.allreduce(data["bytes_written"]),
                peak_data_slots=data["peak_slots"], forward_steps=driver.result.forward_steps,
                forward_steps_saved=info["forward_steps_states_only"] - driver.result.forward_steps)
    return info
