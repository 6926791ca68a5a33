"""``--schedule mixed``: restart states and steps' adjoint data planned in one RAM byte budget.

For a model that declares its adjoint data (:meth:`~hpcadj.models.base.Stepper.adjoint_data_layout`)
the RAM level's budget becomes bytes B (the budget given, or whole restart states of it) and
:class:`~hpcadj.checkpoint.schedules.mixed.Mixed` chooses per step between a restart state of r bytes
and the step's data of d bytes (the largest rank's, so every rank makes the same plan). One RAM
level only, no compression. With a run directory the durable points are those of any plan (forward
states at an interval, lambda in the reverse sweep); data slots live in RAM only and a resumed run
rebuilds them by recomputation (:meth:`~hpcadj.checkpoint.schedules.mixed.Mixed.resumed`).
"""

from __future__ import annotations

from dataclasses import replace
from math import gcd

from ..snapshot import layout_bytes
from .budget import parse_budget
from .schedules import Mixed, ScheduleError, simulate
from .schedules.revolve import min_forward_steps


def _refuse(text: str):
    from .provision import ConfigError

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


def mixed_run(model, controls, plans, ck, profile, memory, probes, notes, warnings, durability):
    """The PlannedRun of ``--schedule mixed`` over ``plans`` (one RAM level); the session has refused a
    model whose declared data disagree with what its adjoint step reads (``refuse_untrusted_data``)."""
    from .provision import PlannedRun, recompute_warning

    if len(plans) != 1 or plans[0].kind != "ram" or probes or plans[0].codec is not None:
        _refuse("plans one uncompressed RAM level: give --ram alone (or no budget)")
    n = model.n_steps
    r, d = mixed_sizes(model)
    text = ck.budgets.get("ram")
    given = parse_budget(text) if text is not None and memory is None else None
    if given is not None and given.nbytes is not None:
        budget = given.nbytes
    elif memory is not None and text is None and memory.ram_slots_fit is not None:
        budget = memory.ram_slots_fit * r   # what --memory leaves, not capped at n - 1 restart states
    elif text is None and memory is None:
        budget = max(n - 1, 1) * max(r, d)  # no budget: every step's data (or state) is kept
    else:
        budget = plans[0].slots * r
    unit = gcd(r, d)
    try:
        schedule = Mixed(n, [budget // unit], state_size=r // unit, data_size=d // unit,
                         states_suffice=not recomputes(model))
    except ScheduleError as exc:
        least = str(exc).rsplit(" ", 1)[-1]
        _refuse(f"with --ram {text if text is not None else budget}: restart states of {r} bytes and step "
                f"data of {d} bytes per rank cannot reverse {n} steps; the least that would do is "
                f"{int(least) * unit}B")
    plan = replace(plans[0], slots=max(budget // r, 1))
    summary = simulate(schedule.actions(), n, [budget // unit], profile.vector("time"),
                       sizes=(r // unit, d // unit))
    peak = replace(summary, peak=[-(-p * unit // r) for p in summary.peak])
    text = recompute_warning(summary.forward_steps, n, "this plan")
    if text:
        warnings.append(text)
    predicted = profile.predicted_seconds(peak)
    durable_s = durability(schedule, (plan,), profile, predicted) if durability is not None else 0.0
    return PlannedRun((plan,), schedule, profile, summary, predicted + durable_s, durable_s, memory, probes,
                      tuple(notes), tuple(warnings), profile)


def mixed_summary(comm, planned, driver) -> dict:
    """``run --json``'s ``mixed`` object: restart and data writes, their bytes per rank, and the forward
    steps saved against revolve's plan with the same bytes in restart states."""
    schedule, summary = planned.schedule, planned.summary
    r, d = mixed_sizes(driver.stepper)
    n, unit = schedule.n_steps, r // schedule.sizes[0]
    budget = schedule.capacities[0] * unit
    states = budget // r
    today = n if states >= n - 1 else min_forward_steps(n, max(states, 1))
    if recomputes(driver.stepper):
        today += n  # each adjoint step from states re-runs its step: a forward step the plan does not count
    data = driver.data_stats()
    return {"budget_bytes": budget, "restart_bytes": r, "data_bytes": d,
            "restart_writes": sum(summary.writes), "data_writes": data["writes"],
            "data_bytes_written": comm.allreduce(data["bytes_written"]), "peak_data_slots": data["peak_slots"],
            "peak_bytes": summary.peak[0] * unit, "forward_steps_states_only": today,
            "forward_steps_saved": today - driver.result.forward_steps}
