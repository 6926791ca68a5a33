"""Resuming a run from its directory: the newest durable point that checks out, and the residual plan."""

from __future__ import annotations

from ..fieldio import CorruptFile
from ..runstate import ResumePoint
from ..checkpoint.schedules.resume import Residual
from ..checkpoint.storage.base import LevelError
from ..checkpoint.storage.survey import survey
from .rundir import RunDirectory, RunDirError


def resume_point(rundir: RunDirectory, model, controls, levels, costs=None, online=None, mixed=None):
    """The residual plan and :class:`ResumePoint` that continue the run recorded in ``rundir``.

    ``levels`` are the run's levels reopened on their existing snapshots; every snapshot not used
    (not listed durable in the manifest, not valid on every rank, or beyond the resume point) is
    discarded from them. Returns ``(plan, point)``; ``point`` is None when nothing durable exists
    (the run starts over with its ordinary plan). ``online`` is the run's online plan
    (:class:`~hpcadj.checkpoint.schedules.online_plans.OnlinePlan`): a first sweep of unknown length
    continues with its residual (:meth:`OnlinePlan.resumed`). ``mixed`` is the run's mixed plan
    (:class:`~hpcadj.checkpoint.schedules.mixed.Mixed`): its residual segments are mixed plans too.
    """
    manifest = rundir.manifest
    record = manifest.get("adaptive_steps")
    if record is not None and hasattr(model, "load_step_record"):
        model.load_step_record(record)  # replay the accepted steps exactly
    n = model.n_steps  # None: adaptive steps not yet at t_final, the first sweep continues online
    generations = [m for m in (manifest, rundir.previous) if m is not None]
    listed = [{step for m in generations for step in m.get("snapshots", {}).get(level.name, [])}
              for level in levels]
    valid = {}
    for index, left in enumerate(survey(levels, rundir.comm, flush=False, listed=listed, discard=False)):
        for step in left.steps:
            valid.setdefault(step, index)
    point = _reverse_point(rundir, model, controls, generations, n)
    if point is not None:
        top = point.lam_step
    else:
        forward = {}
        for m in reversed(generations):  # the current generation's J wins where both list a step
            forward.update({int(k): J for k, J in m.get("forward_points", {}).items() if int(k) in valid})
        frontier = _forward_file_point(rundir, model, generations, levels, valid)
        if frontier is not None and frontier[0] > max(forward, default=-1):
            s, J, index = frontier
            valid[s] = index
            forward[s] = J
        if forward:
            s = max(forward)
            point = ResumePoint(frontier=s, J=forward[s])
            top = s + 1
    keep = {step: index for step, index in valid.items() if point is not None and step < top}
    for index, level in enumerate(levels):
        for step in sorted(level.valid_steps()):
            if keep.get(step) != index:
                level.discard(step)
    if point is None:
        return None, None
    capacities = [level.capacity for level in levels]
    if n is None:
        if online is None:
            raise RunDirError("this run's step count is unknown until it ends (adaptive steps): "
                              "resume it with --schedule online")
        return online.resumed(capacities, keep, costs=costs), point
    if mixed is not None:
        return mixed.resumed(capacities, keep, lam_step=point.lam_step, costs=costs), point
    return Residual(n, capacities, keep, lam_step=point.lam_step, costs=costs), point


def _verified(rundir: RunDirectory, generations, file_key: str, step_key: str, read, what: str):
    """Yield ``(durable, step, payload)`` for each generation, newest first, whose durable point names
    a ``file_key`` file that ``read(name) -> (step, *payload)`` verifies and whose step is the one the
    manifest records under ``step_key``; each that does not check out is reported in ``rundir.faults``."""
    for m in generations:
        durable = m.get("durable") or {}
        name = durable.get(file_key)
        if not name:
            continue
        try:
            step, *payload = read(name)
            if step != durable.get(step_key):
                raise CorruptFile(f"{name} holds step {step}, the manifest says {durable.get(step_key)}")
        except (CorruptFile, OSError, KeyError) as exc:
            rundir.faults.append(f"durable {what} state of step {durable.get(step_key)} unusable "
                                 f"({exc}): falling back to an older durable point")
            continue
        yield durable, step, payload


def _reverse_point(rundir: RunDirectory, model, controls, generations, n: int):
    """The newest reverse-sweep durable point whose adjoint file checks out, else None."""
    for durable, lam_step, (lam, grad) in _verified(
            rundir, generations, "adjoint", "lam_step",
            lambda name: rundir.read_adjoint(model, controls, name), "adjoint"):
        return ResumePoint(frontier=n, J=durable["J"], lam_step=lam_step, lam=lam, grad=grad)
    return None


def _forward_file_point(rundir: RunDirectory, model, generations, levels, valid):
    """The newest forward state written at an interval that checks out, placed in a level slot.

    Returns ``(step, J, level index)`` or None. The state goes into the level with the most free
    slots (those not taken by ``valid`` snapshots), so the residual plan can restore it.
    """
    for durable, step, (snapshot,) in _verified(rundir, generations, "forward", "frontier",
                                                lambda name: rundir.read_state(model, name), "forward"):
        free = [level.capacity - sum(1 for i in valid.values() if i == index)
                for index, level in enumerate(levels)]
        index = max(range(len(levels)), key=lambda i: (free[i], -i))
        if free[index] < 1 or step in valid:
            return None
        try:
            levels[index].write(step, snapshot)
            levels[index].flush()
        except LevelError as exc:
            rundir.faults.append(f"durable forward state of step {step} could not be placed ({exc})")
            return None
        return step, durable["J"], index
    return None
