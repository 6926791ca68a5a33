"""Store-all and auto for a model that declares its adjoint data: a mixed plan where it is cheaper.

Store-all is the cheapest complete plan: every step's adjoint data where they are smaller than a
restart state (wave: u^i, one field, not the pair) or where an adjoint step from states re-runs its
step (RK: the stages), when the data of every step fit the budget; else restart states, as for any
model. Under auto with one uncompressed RAM level the mixed plan in the same bytes
(:mod:`~hpcadj.checkpoint.mixed_plan`) is simulated beside the plan of restart states alone and the
cheaper taken: predicted makespan, then forward steps (a model that recomputes pays a forward step
more per adjoint step from states). Both are priced alike (:func:`choice_profile`): runs handed to
the model's own advance by their length (a time-tiled run of m steps costs less than m single
steps), and each step reversed from its data by the copies it makes (capture and stand-in), as the
profile measured them or, where it did not (the default profile), as the model declares them. A run directory, several levels or compression keep restart
states, with a note (``--schedule mixed`` plans data there where it can). The session checks the
model's declared data whenever a mixed plan is chosen
(:func:`~hpcadj.adjoint.data_check.refuse_untrusted_data`).
"""

from __future__ import annotations

from dataclasses import replace
from math import gcd

from . import mixed_plan
from .schedules.costs import AdvanceCost
from ..telemetry.progress import format_bytes as fmt_bytes

#: the mixed planner's table cells (steps² x budget units, x4 where states suffice: its flags) above
#: which auto keeps restart states rather than wait for the table (3e8: 1-2 s of CPU on a 2-core VM)
MIXED_TABLE_MAX_CELLS = 3e8


def _noted(planned, text: str):
    return replace(planned, notes=planned.notes + (text,))


def _why_not(plans, probes, durability) -> str | None:
    """What keeps store-all and auto from weighing a mixed plan here (None: nothing)."""
    found = [what for what, there in (("a run directory", durability is not None),
                                      ("several levels", len(plans) != 1 or plans[0].kind != "ram"),
                                      ("compression", bool(probes) or any(p.codec for p in plans))) if there]
    return " and ".join(found) or None


def choice_profile(profile, model):
    """``profile`` as the choice prices both plans: what it does not measure taken from the model's
    own figures in forward steps (``relative_advance_step``: a step of its own advance, for a model
    that has one; ``relative_data_step``: a step reversed from its data beyond its adjoint step)."""
    advance, data_s = profile.advance, profile.data_s
    relative = getattr(model, "relative_advance_step", None)
    if advance is None and relative is not None:
        advance = AdvanceCost(fixed_s=0.0, step_s=relative * profile.forward_s,
                              first=bool(getattr(model, "advance_objective", False)))
    if data_s is None:
        data_s = float(getattr(model, "relative_data_step", 0.0)) * profile.forward_s
    return replace(profile, advance=advance, data_s=data_s)


def with_data(today, model, controls, name: str, plans, ck, memory, durability, notes, warnings):
    """The plan of ``name`` (store-all or auto) for ``model``, which declares its adjoint data:
    ``today`` (restart states alone, planned over ``plans``) or a mixed plan, with a note saying
    which and why. ``notes`` and ``warnings`` are the run's before either plan was made."""
    why = _why_not(plans, today.probes, durability)
    if why:
        return _noted(today, f"{name} keeps whole restart states: it weighs steps' adjoint data on one "
                             f"uncompressed RAM level without a run directory only, not with {why} "
                             f"(--schedule mixed asks for them, but for compressed RAM)")
    n = model.n_steps
    r, d = mixed_plan.mixed_sizes(model)
    recomputing = mixed_plan.recomputes(model)
    if n < 2 or (d >= r and not recomputing):  # no step's data are cheaper to keep than its state
        return today
    budget = mixed_plan.mixed_budget(model, plans, ck, memory)
    fits = budget >= (n - 1) * d
    if name == "store-all" and not fits:
        return _noted(today, f"store-all keeps restart states: the adjoint data of every step ({n - 1} x "
                             f"{fmt_bytes(d)} per rank) do not fit in {fmt_bytes(budget)}")
    priced = choice_profile(today.profile, model)
    today_steps = today.summary.forward_steps + (n if recomputing else 0)
    today_s = priced.predicted_seconds(today.summary) + (n * priced.forward_s if recomputing else 0.0)
    if name == "auto" and today_steps <= n:
        return today  # restart states alone already take every step once
    unit = gcd(r, d)
    cells = n * n * min(budget // unit, (n - 1) * d // unit) * (1 if recomputing else 4)
    if not fits and cells > MIXED_TABLE_MAX_CELLS:
        return _noted(today, f"auto keeps restart states: a mixed plan of {n} steps in {fmt_bytes(budget)} per "
                             f"rank takes a table of {cells:.2g} cells to find (more than {MIXED_TABLE_MAX_CELLS:.0e})")
    mixed = mixed_plan.mixed_run(model, controls, plans, ck, today.profile, memory, today.probes, list(notes),
                                 list(warnings), durability)
    steps = mixed.summary.forward_steps
    if name == "store-all":
        kept = "stages" if recomputing else "adjoint data"
        return _noted(mixed, f"store-all keeps every step's {kept} ({fmt_bytes(d)} per rank) rather than its "
                             f"restart state ({fmt_bytes(r)}): {steps} forward steps against {today_steps}, "
                             f"peak {fmt_bytes(mixed.summary.peak[0] * unit)} against {fmt_bytes((n - 1) * r)}")
    mixed_s = mixed_plan.predicted_seconds(priced, mixed.summary, unit, r)
    compared = (f"{steps} forward steps and {mixed.summary.data_adjoints} reversed from their data (predicted "
                f"{mixed_s:.4g}) against {today_steps} ({today_s:.4g}) with restart states alone in "
                f"{fmt_bytes(budget)} per rank")
    if (mixed_s, steps) < (today_s, today_steps):
        return _noted(replace(mixed, profile=priced, predicted_s=mixed_s), f"auto chose a mixed plan: {compared}")
    return _noted(replace(today, profile=priced, predicted_s=priced.predicted_seconds(today.summary)),
                  f"auto kept restart states: {compared}")
