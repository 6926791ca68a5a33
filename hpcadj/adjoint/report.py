"""What a gradient session reports: the ``run --json`` object, the log's run record, the gradient file.

Built from what the run did (the result, the driver's counts, each level's statistics) and what it
was set up with (the :class:`~hpcadj.checkpoint.provision.PlannedRun`); seconds are the slowest
rank's, bytes summed over the ranks; a function given ``comm`` is collective over it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from ..checkpoint.schedules import PlanSummary
from ..imports import mpi
from ..telemetry.jsonlog import peak_rss_bytes


@dataclass
class Outcome:
    """How a solve ended: ``status`` "complete" (``result`` and ``info`` set), "stopped" or "failed"
    (``message`` says why); :meth:`GradientSession.forward` ends "paused" (``result.J`` set)."""

    status: str
    result: object = None
    info: dict = field(default_factory=dict)
    message: str = ""


#: phases summed in the summary (seconds, the slowest rank's)
PHASES = ("forward", "recompute", "adjoint", "io_wait")


def run_summary(model, comm, result, wall_s: float) -> dict:
    """The run's facts as the ``run --json`` object (``grid`` null for a model whose describe() has none)."""
    norms = {name: result.gradient[name].norm() for name in sorted(result.gradient)}
    out = {"grid": None, **model.describe(), "ranks": comm.size, "J": result.J,
           "grad_norm": norms.get("u0", next(iter(norms.values()))),
           "forward_steps": result.forward_steps, "recomputed_steps": result.recomputed_steps,
           "adjoint_steps": result.adjoint_steps, "snapshot_bytes": model.snapshot_bytes(),
           "wall_s": wall_s}
    for name, value in norms.items():
        if name != "u0":
            out[f"grad_{name}_norm"] = value
    out["grad_norms"] = norms
    return out


def level_summary(comm, plans, levels) -> list[dict]:
    """Per level: counts, bytes and seconds (bytes summed over ranks, seconds the slowest rank's)."""
    MPI = mpi()
    out = []
    for plan, level in zip(plans, levels):
        s = level.stats
        out.append({"name": plan.name, "kind": plan.kind, "slots": plan.slots, "writes": s.writes,
                    "reads": s.reads, "bytes_written": comm.allreduce(s.bytes_written),
                    "bytes_read": comm.allreduce(s.bytes_read),
                    "write_s": comm.allreduce(s.write_s, op=MPI.MAX),
                    "read_s": comm.allreduce(s.read_s, op=MPI.MAX),
                    "wait_s": comm.allreduce(s.wait_s, op=MPI.MAX), "peak_slots": s.peak_slots})
    return out


def executed_summary(planned, model, result, levels, driver):
    """The plan's summary, or for an online plan (its n unknown when it was planned) what the run
    executed: its forward and adjoint steps and advanced runs, each level's writes, reads and peak."""
    if planned.summary is not None or model.n_steps is None:
        return planned.summary

    k = len(planned.plans)
    return PlanSummary(model.n_steps, tuple(p.slots for p in planned.plans), forward_steps=result.forward_steps,
                       adjoint_steps=result.adjoint_steps, writes=[lv.stats.writes for lv in levels],
                       reads=[lv.stats.reads for lv in levels], peak=[lv.stats.peak_slots for lv in levels],
                       data_writes=[0] * k, advances=dict(getattr(driver, "advance_counts", {})))


def predicted_makespan(planned, model, result, levels, driver) -> float:
    """The plan's predicted makespan; an online plan's prices what the run executed."""
    if planned.summary is not None or model.n_steps is None:
        return planned.predicted_s
    return planned.profile.predicted_seconds(executed_summary(planned, model, result, levels, driver))


def advance_summary(comm, planned, driver, summary) -> dict | None:
    """The runs handed to the model's advance: what the plan (``summary``) predicted
    (``advance_seconds``) and what the run measured (``measured`` seconds, the slowest rank's,
    ``measured_runs``, ``measured_steps``); None when neither the profile prices advances nor the
    run made any."""
    predicted = planned.profile.advance_seconds(summary)
    measured = comm.allreduce(driver.advance_s, op=mpi().MAX)
    if predicted is None and not driver.advance_runs:
        return None
    return {**(predicted or {}), "measured": measured, "measured_runs": driver.advance_runs,
            "measured_steps": driver.advance_steps}


def log_record(record: dict, model, checkpointing, planned, resumed: bool) -> dict:
    """The log's ``run.json``: ``record`` (the caller's facts) and the run's set-up."""
    ck = checkpointing
    out = {**record, **model.describe(), "schedule": planned.schedule.name, "minimize": ck.minimize,
           "levels": [{"name": p.name, "kind": p.kind, "capacity": p.slots} for p in planned.plans],
           "snapshot_bytes": model.snapshot_bytes(), "budgets": ck.budgets, "async_io": ck.async_io,
           "resumed": resumed}
    if planned.probes:  # compressed levels, and whether the gradient is approximate
        out["compression"] = {k: v.codec.spec for k, v in planned.probes.items()}
        out["lossy"] = planned.lossy
    if planned.schedule.name == "mixed" and planned.summary is not None:  # data and restart slots, planned
        from ..checkpoint.mixed_plan import plan_summary

        out["mixed"] = plan_summary(model, planned)
    return out


def completed_info(model, comm, result, wall_s: float, planned, checkpointing, levels, *, driver,
                   faults: list, durability, restartable: bool, resumed: bool) -> dict:
    """The ``run --json`` object of a complete run (``driver``: the one that ran it), but for what
    :func:`finish_info` adds."""
    profile = planned.profile
    info = run_summary(model, comm, result, wall_s)
    info.update(actions=driver.actions_done, faults=list(faults))
    if durability is not None:
        info["durable"] = {"points": durability.points,
                           "seconds": comm.allreduce(durability.seconds, op=mpi().MAX),
                           "interval_s": durability.interval}
    if restartable:
        info["predicted_durable_s"] = planned.predicted_durable_s
        # the trajectory fingerprint's steps (hpcadj.restart.trajectory_fingerprint), beside forward_steps
        info["run_dir_check"] = {"forward_steps": 1, "adjoint_steps": 1}
    if planned.memory is not None:
        info["memory"] = {**planned.memory.as_dict(), "source": planned.memory.detail["source"]}
    predicted = predicted_makespan(planned, model, result, levels, driver)
    info.update(schedule=planned.schedule.name, minimize=checkpointing.minimize, **profile.predicted(predicted),
                costs_source=profile.source, levels=level_summary(comm, planned.plans, levels), resumed=resumed)
    advance = advance_summary(comm, planned, driver, executed_summary(planned, model, result, levels, driver))
    if advance is not None:
        info["advance_s"] = advance
    if planned.schedule.name == "mixed" or getattr(planned.schedule, "stores_data", False):
        from ..checkpoint.mixed_plan import mixed_summary

        mixed = mixed_summary(comm, planned, driver)
        if mixed is not None:
            info["mixed"] = mixed
    if planned.probes:
        from ..checkpoint.compression import summary

        info["compression"] = summary(comm, levels)
        info["lossy"] = any(c["lossy"] for c in info["compression"].values())
    return info


def finish_info(info: dict, comm, phase_s: dict, notes: list[str]) -> None:
    """Add the phase totals (slowest rank), the peak resident set (largest rank) and the notes."""
    info["phase_s"] = {k: comm.allreduce(phase_s.get(k, 0.0), op=mpi().MAX) for k in PHASES}
    info["peak_rss_bytes"] = comm.allreduce(peak_rss_bytes(), op=mpi().MAX)
    if notes:
        info["notes"] = list(notes)


def write_gradient(path: str, comm, model, result, planned=None) -> None:
    """The gradients as global natural-ordered datasets ``grad_<control>`` (parallel HDF5); one from
    compressed (maybe lossy) checkpoints says so in its attributes."""
    from ..fieldio import write_fields

    layouts = {f"grad_{k}": v for k, v in model.control_layout().items()}
    arrays = {f"grad_{k}": v for k, v in model.control_arrays(result.gradient).items()}
    attrs = {"J": result.J, "model": model.name, "steps": model.n_steps}
    probes = planned.probes if planned is not None else {}
    if probes:
        attrs["compression"] = ",".join(f"{k}={v.codec.spec}" for k, v in probes.items())
        attrs["lossy"] = planned.lossy
    write_fields(path, comm, layouts, arrays, attrs=attrs)


def stop_message(driver, restart, resume_hint: str | None) -> str:
    """Where the run stopped, and how to continue it (``resume_hint``: what the caller calls)."""
    if driver.lam_step is None:
        where = f"stopped in the forward sweep at step {driver.frontier}"
    else:
        where = f"stopped in the reverse sweep at adjoint step {driver.lam_step}"
    if restart is None:
        return f"{where}; nothing was made durable (no run directory): a new solve starts over"
    hint = resume_hint or f"GradientSession(..., restart=Restart({restart.run_dir!r}, resume=True))"
    return f"{where}; state is durable in {restart.run_dir}; continue with {hint}"
