"""Many shots: an objective summed over shots that differ only in their source and receivers, each
shot run on a sub-communicator of the job's ranks, the sum's gradient exchanged in one collective.

The job's ranks are cut into groups of ``ranks_per_shot`` consecutive ranks in node order (ranks
sorted by their node, nodes by their lowest rank), so a group lies on one node whenever a node's
rank count is a multiple of ``ranks_per_shot``. Shot ``k`` runs on group ``k mod G`` (G groups);
a group with several shots runs them one after another. Every group holds the same controls and
runs the same TAO (:class:`~.driver.Inversion`) on its own communicator: each evaluation ends with
every group's per-shot J and gradient gathered over the ranks of equal place in their groups
(one ``Allgather``) and summed by each rank **in shot order**, J = (J_0 + J_1) + J_2 + … and the
same for each entry of the gradient, so the sum is bitwise the one of the shots run one after
another and added in order, on every rank of every group, and TAO moves alike in all groups.

Each shot's session has its own levels: node-local files under ``<local dir>/shot-KKK/`` and its
own HDF5 file ``<pfs file stem>-shotKKK.h5``; the plan comes from one cost profile shared by all,
calibrated once (by shot 0) when none is given. Under the ``"keep"`` policy an objective-only
evaluation keeps, in each group, one shot's first-sweep levels for the gradient at the same
controls. Only group 0 writes the run directory and the log; the energy and peak memory it logs
are the whole job's.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace

import numpy as np

from .cache import Evaluation, EvaluationCache, control_hash
from .driver import Inversion, InversionError
from ..adjoint.session import ConfigError, GradientSession
from ..buffers import release_idle_buffers
from ..checkpoint.storage import resolve_local_dir
from ..collective import any_rank
from ..imports import mpi, petsc
from ..models.base import SolverError
from ..telemetry.energy import EnergyMeter
from .iterates import STATE


class ShotLayoutError(InversionError):
    """A shot layout the job's ranks cannot run (one line)."""


def shot_positions(n_shots: int, span=(0.15, 0.85)) -> list[float]:
    """Shot k's source at the middle of the k-th of ``n_shots`` equal parts of ``span`` (the wave
    model's receivers' line): evenly along the surface, never on the line's ends."""
    lo, hi = span
    return [lo + (k + 0.5) * (hi - lo) / n_shots for k in range(n_shots)]


def check_layout(size: int, n_shots, ranks_per_shot) -> None:
    """ShotLayoutError unless ``n_shots`` >= 1 shots of ``ranks_per_shot`` ranks fit ``size`` ranks."""
    if not (isinstance(n_shots, int) and n_shots >= 1):
        raise ShotLayoutError(f"--shots must be a whole number >= 1, got {n_shots}")
    if not (isinstance(ranks_per_shot, int) and ranks_per_shot >= 1):
        raise ShotLayoutError(f"--ranks-per-shot must be a whole number >= 1, got {ranks_per_shot}")
    if ranks_per_shot > size:
        raise ShotLayoutError(f"--ranks-per-shot {ranks_per_shot}: more ranks per shot than the job's {size} "
                              f"rank(s)")
    if size % ranks_per_shot:
        raise ShotLayoutError(f"--ranks-per-shot {ranks_per_shot} does not divide the job's {size} ranks: "
                              f"run a multiple of {ranks_per_shot} ranks")


class ShotLayout:
    """Which ranks run which shots: ``shot_comm`` (this rank's group), ``cross_comm`` (the ranks of
    equal place in every group, ordered by group), ``group``, ``n_groups``, ``shots`` (this group's,
    in order) and ``slots`` (the most shots any group runs). Collective over ``comm``."""

    def __init__(self, comm, n_shots: int, ranks_per_shot: int = 1):
        check_layout(comm.size, n_shots, ranks_per_shot)
        self.comm, self.n_shots, self.ranks_per_shot = comm, n_shots, ranks_per_shot
        hosts = comm.allgather(mpi().Get_processor_name())
        node = {}
        for host in hosts:
            node.setdefault(host, len(node))
        order = sorted(range(comm.size), key=lambda r: (node[hosts[r]], r))
        place = order.index(comm.rank)
        self.group, self.member = divmod(place, ranks_per_shot)
        self.n_groups = comm.size // ranks_per_shot
        self.shot_comm = comm.Split(self.group, self.member)
        self.cross_comm = comm.Split(self.member, self.group)
        self.shots = list(range(self.group, n_shots, self.n_groups))
        self.slots = math.ceil(n_shots / self.n_groups)
        groups = [order[g * ranks_per_shot:(g + 1) * ranks_per_shot] for g in range(self.n_groups)]
        self.group_hosts = [sorted({hosts[r] for r in ranks}) for ranks in groups]
        self.nodes = len(node)

    def owner(self, shot: int) -> tuple[int, int]:
        """(group, slot) of shot ``shot``."""
        return shot % self.n_groups, shot // self.n_groups

    def describe(self) -> dict:
        return {"shots": self.n_shots, "ranks_per_shot": self.ranks_per_shot, "shot_groups": self.n_groups,
                "nodes": self.nodes, "groups_across_nodes": sum(len(h) > 1 for h in self.group_hosts)}

    def free(self) -> None:
        for comm in (self.shot_comm, self.cross_comm):
            if comm is not None:
                comm.Free()
        self.shot_comm = self.cross_comm = None


def _agree(comm, problem: str | None, error=InversionError) -> None:
    """The same error on every rank of ``comm`` if any rank has a problem (the first one's)."""
    found = [p for p in comm.allgather(problem) if p]
    if found:
        raise error(found[0])


class ShotProblem:
    """This group's shot models seen as one model by :class:`~.driver.Inversion`: the controls'
    layout and defaults are the first model's (every shot's are alike), ``describe()`` holds what all
    shots share, the shot count, the ranks per shot and what differs per shot (``per_shot``), the same
    on every rank; not how groups lie on nodes, so a resume may run on other nodes."""

    def __init__(self, layout: ShotLayout, factory):
        self.layout, self.comm = layout, layout.shot_comm
        self.models, problem = {}, None
        try:
            for shot in layout.shots or [0]:  # a group without shots keeps shot 0's for the layout
                self.models[shot] = factory(self.comm, shot)
        except (ValueError, SolverError) as exc:
            problem = str(exc)
        _agree(layout.comm, problem)
        first = self.models[min(self.models)]
        self.template = first
        self.n_steps = first.n_steps
        mine = [(shot, self.models[shot].describe()) for shot in layout.shots] if layout.member == 0 else []
        described = sorted(d for part in layout.comm.allgather(mine) for d in part)
        common = {k: v for k, v in described[0][1].items()
                  if all(d.get(k) == v for _s, d in described)}
        self._describe = {**common, "shots": layout.n_shots, "ranks_per_shot": layout.ranks_per_shot,
                          "per_shot": [{k: v for k, v in d.items() if k not in common} for _s, d in described]}
        steps = {d.get("steps") for _s, d in described}
        if len(steps) > 1:
            raise InversionError(f"the shots' models differ in their number of steps ({sorted(map(str, steps))}): "
                                 f"shots share one plan")

    def describe(self) -> dict:
        return dict(self._describe)

    def __getattr__(self, name):  # controls, layouts, snapshots: the first model's (alike in every shot)
        return getattr(self.template, name)


class KeptShots:
    """What an objective-only evaluation under the ``"keep"`` policy keeps in one shot group: its
    last shot's paused session (levels and held states) with the forward steps of its first sweep,
    and the controls (destroyed with it)."""

    def __init__(self, controls: dict):
        self.controls = controls
        self.sessions: dict[int, tuple[object, int]] = {}  # shot -> (paused GradientSession, steps)
        self.dirs: list[str] = []  # the shots' own node-local directories, removed when left empty

    def close(self) -> None:
        """Discard every kept session's levels and states, then the controls."""
        sessions, self.sessions = self.sessions, {}
        for session, _steps in sessions.values():
            session.close()
        for vec in self.controls.values():
            vec.destroy()
        self.controls = {}
        for path in self.dirs:
            try:
                os.rmdir(path)
            except OSError:
                pass
        self.dirs = []


class ShotEvaluations(EvaluationCache):
    """J and dJ/dm summed over the shots, at the packed controls of ``space``: an
    :class:`~.cache.EvaluationCache` (one entry, keyed by the controls' bytes and the configuration)
    whose entries are computed over every shot.

    The objective-only policies are the single shot's, per shot group: ``"keep"`` runs the group's
    last shot's first sweep and keeps its levels (its own node-local directory and HDF5 file), the
    group's other shots forward sweeps first, so a group holds one shot's levels, as one session
    would, and a gradient at the same key runs that shot's reverse sweep (first, freeing them) and
    the other shots' whole sessions; ``"gradient"`` runs the whole sessions; ``"forward"`` forward
    sweeps only. Any other key discards every group's kept levels first.
    ``forward_steps``, ``adjoint_steps`` and the counts are totals over all shots. Collective over
    the layout's whole communicator.
    """

    def __init__(self, problem: ShotProblem, space, checkpointing=None, *, policy: str = "keep"):
        super().__init__(problem, space, checkpointing, policy=policy)
        self.problem, self.layout = problem, problem.layout
        self._session_steps = 0

    def _naive_objective_steps(self, e: Evaluation) -> int:
        return (self.problem.n_steps or 0) * self.layout.n_shots

    # -- one evaluation over every shot ----------------------------------------------------------
    def _compute(self, x, key: str, gradient: bool) -> Evaluation:
        mode = "gradient" if gradient else "keep" if self.policy == "keep" else "forward"
        return self._over_shots(x, key, mode)

    def _reverse(self, x, entry: Evaluation) -> Evaluation:
        """The gradient at the kept entry's key: the kept shots' reverse sweeps from their levels.

        The kept controls are hashed again first, in every group: if any group's changed in place
        since the first sweeps, every group's levels are discarded and whole sessions run."""
        kept = entry.session
        changed = control_hash(self.comm, kept.controls, self.configuration) != entry.key
        if any_rank(self.layout.comm, changed):
            self.drop()
            self.notes.append("a kept first sweep's controls changed in place: its levels were discarded")
            self.entry = self._over_shots(x, entry.key, "gradient")
            return self.entry
        entry.session, self.entry = None, None
        try:
            self.entry = self._over_shots(x, entry.key, "reverse", kept, seconds=entry.seconds)
        finally:
            kept.close()
        return self.entry

    def _discard(self, entry: Evaluation) -> None:
        kept, entry.session = entry.session, None
        kept.close()

    def _over_shots(self, x, key: str, mode: str, kept: KeptShots | None = None,
                    seconds: float = 0.0) -> Evaluation:
        """Every shot of this group evaluated as ``mode`` says ("gradient": whole sessions; "keep":
        the last shot's first sweep kept, forward sweeps for the others; "reverse": the reverse sweep
        of ``kept`` and whole sessions for the others; "forward": forward sweeps), then J and the
        gradient summed over all groups in shot order."""
        t0 = time.perf_counter() - seconds
        layout = self.layout
        gradient = mode in ("gradient", "reverse")
        n_local = int(self.space.offsets[-1])
        values = np.zeros((layout.slots, n_local)) if gradient else None
        shots = layout.shots
        mine = {"J": [None] * len(shots), "forward": 0, "adjoint": 0, "session_forward": 0, "problem": None,
                "notes": [], "runs": dict.fromkeys(("session", "kept", "reverse", "forward"), 0)}
        controls = self.space.unpack(x) if mode != "reverse" else kept.controls
        keeping = KeptShots(controls) if mode == "keep" else None
        # "keep": the group's last shot is kept, the others' sweeps run first and hold nothing;
        # "reverse": the kept shot's reverse sweep first, freeing its levels before whole sessions
        order = list(enumerate(shots))
        if mode == "reverse":
            order.sort(key=lambda item: item[1] not in kept.sessions)
        try:
            session = None
            if mode in ("gradient", "keep") and self.checkpointing.costs is None:
                session = self._calibrate(controls)
                if session is not None and mode == "keep" and len(shots) > 1:
                    session.close()  # shot 0 is not the group's kept shot: a forward sweep serves it
                    session = None
            for slot, shot in order:
                first = session if slot == 0 else None
                if mode == "gradient" or (mode == "reverse" and shot not in kept.sessions):
                    J, fwd, adj = self._shot_gradient(shot, controls, values[slot], first)
                    mine["session_forward"] += fwd
                    run = "session"
                elif mode == "reverse":
                    session_of, counted = kept.sessions.pop(shot)
                    J, fwd, adj = self._shot_gradient(shot, controls, values[slot], session_of)
                    mine["session_forward"] += fwd
                    fwd -= counted
                    run = "reverse"
                elif mode == "keep" and slot == len(shots) - 1:
                    (J, fwd), adj, run = self._shot_kept(shot, controls, keeping, first), 0, "kept"
                else:
                    J, fwd, adj, run = self._shot_forward(shot, controls), self.problem.n_steps, 0, "forward"
                mine["J"][slot] = J
                mine["forward"] += fwd
                mine["adjoint"] += adj
                mine["runs"][run] += 1
        except Exception as exc:  # noqa: BLE001 - agreed below, raised alike on every rank of every group
            mine["problem"] = exc
        finally:
            if mode not in ("keep", "reverse"):
                for vec in controls.values():
                    vec.destroy()
        mine["notes"] = list(self.notes)
        gathered = layout.cross_comm.allgather({**mine, "problem": _describe_error(mine["problem"])})
        failed = [g["problem"] for g in gathered if g["problem"]]
        if failed:
            if keeping is not None:
                keeping.close()
            _raise_agreed(mine["problem"], failed)
        J = None
        for k in range(layout.n_shots):
            g, s = layout.owner(k)
            J = gathered[g]["J"][s] if J is None else J + gathered[g]["J"][s]
        packed = None
        if gradient:
            everything = np.empty((layout.n_groups, layout.slots, n_local))
            layout.cross_comm.Allgather(values, everything)
            total = everything[0, 0].copy()
            for k in range(1, layout.n_shots):
                total += everything[layout.owner(k)]
            packed = self.space.new()
            packed.getArray()[:] = total
        fwd = sum(g["forward"] for g in gathered)
        adj = sum(g["adjoint"] for g in gathered)
        runs = {k: sum(g["runs"][k] for g in gathered) for k in mine["runs"]}
        for g in gathered:
            self.notes.extend(n for n in g["notes"] if n not in self.notes)
        if gradient:
            self.sessions += runs["session"] + runs["reverse"]
            self._session_steps = sum(g["session_forward"] for g in gathered)
        self.forward_sweeps += runs["forward"]
        self.kept_sweeps += runs["kept"]
        self.reverse_from_kept += runs["reverse"]
        self.forward_steps += fwd
        self.adjoint_steps += adj
        return Evaluation(key, J, packed, fwd, adj, time.perf_counter() - t0, session=keeping)

    def _calibrate(self, controls):
        """Shot 0's session planned first (calibrating the costs when its plan needs them) and its
        profile handed to every group: one profile, one plan for all shots. Shot 0's session, to run."""
        layout, session, profile, problem = self.layout, None, None, None
        if layout.group == 0:
            try:
                release_idle_buffers()  # as before every session (see _shot_gradient)
                session = GradientSession(self.problem.models[0], self._checkpointing(0), controls=controls,
                                           run_id=self.run_id)
                planned = session.plan()  # the costs before codec seconds, to plan the other shots with
                profile = planned.costs
            except Exception as exc:  # noqa: BLE001 - agreed over every group
                problem = exc
        found = [p for p in layout.comm.allgather(_describe_error(problem)) if p]
        if found:
            _raise_agreed(problem, found)
        profile = layout.comm.bcast(profile, root=0)
        self.checkpointing = replace(self.checkpointing, costs=profile)
        if session is not None:
            self.notes.extend(n for n in session.notes if n not in self.notes)
        return session

    def _checkpointing(self, shot: int):
        """Shot ``shot``'s own levels: node-local files under ``shot-KKK/``, its own HDF5 file."""
        ck = self.checkpointing
        changes = {}
        if ck.disk is not None:
            changes["local_dir"] = os.path.join(resolve_local_dir(ck.local_dir), f"shot-{shot:03d}")
        if ck.pfs_file:
            stem, ext = os.path.splitext(ck.pfs_file)
            changes["pfs_file"] = f"{stem}-shot{shot:03d}{ext or '.h5'}"
        return replace(ck, **changes)

    def remove_left(self, record: dict) -> list[str]:
        """What a killed evaluation left of this group's shots (each shot's node-local directory and
        HDF5 file, named by ``record``'s run id), removed. Collective over the group."""
        removed = []
        for shot in self.layout.shots:
            ck = self._checkpointing(shot)
            removed += super().remove_left(record, local_dir=ck.local_dir, pfs_file=ck.pfs_file)
        return removed

    def _shot_gradient(self, shot: int, controls: dict, out, session=None) -> tuple[float, int, int]:
        """Shot ``shot``'s checkpointed session: its packed gradient into ``out``; (J, forward steps,
        adjoint steps)."""
        ck = self._checkpointing(shot)
        if session is None:
            # the pools of this rank's shot models still hold the last session's RAM slots: freed
            # here, else the new session's baseline counts them and --memory refuses it
            release_idle_buffers()
            session = GradientSession(self.problem.models[shot], ck, controls=controls, run_id=self.run_id)
        outcome = session.solve()
        if outcome.status != "complete":
            raise SolverError(f"shot {shot}: gradient session {outcome.status}: {outcome.message}")
        self.notes.extend(n for n in session.notes if n not in self.notes)
        result = outcome.result
        packed = self.space.pack(result.gradient)
        out[:] = packed.getArray(readonly=True)
        packed.destroy()
        for vec in result.gradient.values():
            vec.destroy()
        if ck.local_dir and ck.local_dir != self.checkpointing.local_dir:
            try:
                os.rmdir(ck.local_dir)  # only when the session left it empty
            except OSError:
                pass
        return result.J, result.forward_steps, result.adjoint_steps

    def _shot_kept(self, shot: int, controls: dict, keeping: KeptShots, session=None) -> tuple[float, int]:
        """Shot ``shot``'s first sweep with its plan's stores, the session kept in ``keeping`` for a
        reverse sweep; (J, forward steps)."""
        ck = self._checkpointing(shot)
        if ck.local_dir and ck.local_dir != self.checkpointing.local_dir:
            keeping.dirs.append(ck.local_dir)
        if session is None:
            release_idle_buffers()  # as before every session (see _shot_gradient)
            session = GradientSession(self.problem.models[shot], ck, controls=controls, run_id=self.run_id)
        try:
            outcome = session.forward()
        except BaseException:
            session.close()
            raise
        if outcome.status != "paused":
            raise SolverError(f"shot {shot}: gradient session {outcome.status}: {outcome.message}")
        keeping.sessions[shot] = (session, outcome.result.forward_steps)
        self.notes.extend(n for n in session.notes if n not in self.notes)
        return outcome.result.J, outcome.result.forward_steps

    def _shot_forward(self, shot: int, controls: dict) -> float:
        """Shot ``shot``'s J from one forward sweep, accumulated as the session accumulates it."""
        model = self.problem.models[shot]
        model.set_controls(controls)
        u = model.initial_state()
        J = 0.0
        J += model.objective(0, u)
        for i in range(model.n_steps):
            u = model.step(i, u)
            J += model.objective(i + 1, u)
        u.destroy()
        petsc().garbage_cleanup(self.comm)
        return J

    def counts(self) -> dict:
        return {**super().counts(), **self.layout.describe()}


def _describe_error(exc) -> tuple[str, str] | None:
    return None if exc is None else (type(exc).__name__, str(exc))


def _raise_agreed(own, found: list) -> None:
    """Raise this rank's own error, else the first failing group's as the same kind (one line)."""
    if own is not None:
        raise own
    kind, text = found[0]
    kinds = {"ConfigError": ConfigError, "SolverError": SolverError, "InversionError": InversionError,
             "ValueError": ValueError, "MemoryError": MemoryError}
    raise kinds.get(kind, RuntimeError)(text)


class GroupInversion(Inversion):
    """One shot group's :class:`~.driver.Inversion` whose telemetry is the whole job's: the energy
    meter spans every group's ranks (one reader per node, the nodes' counters combined in one
    ``allgather``: a node's RAPL counts every group on it once), and ``max_rss_bytes`` is the
    largest of all ranks. Collective over the layout's whole communicator, as TAO moves alike in
    every group."""

    def __init__(self, problem: ShotProblem, *args, **kwargs):
        super().__init__(problem, *args, **kwargs)
        self.job_comm = problem.layout.comm

    def _meter(self):
        if getattr(self, "_energy", None) is None:
            self._energy = EnergyMeter(self.job_comm, interval_s=None, nvml=False)
        self._energy.start()
        return self._energy

    def _record(self, *args, **kwargs) -> dict:
        record = super()._record(*args, **kwargs)
        record["ranks"] = self.job_comm.size
        record["max_rss_bytes"] = self.job_comm.allreduce(record["max_rss_bytes"], op=mpi().MAX)
        return record


class ShotInversion:
    """Minimise the sum over ``n_shots`` shots of their objectives (plus the Tikhonov term) with TAO,
    each shot's model built by ``factory(comm, shot)`` on a group of ``ranks_per_shot`` ranks of
    ``comm``. Every other keyword is :class:`~.driver.Inversion`'s (bounds, regularization, tao_type,
    max_it, tolerances, run_dir, resume, should_stop, time_limit, log, policy, tao_options, ...).
    ``solve()`` returns its :class:`~.driver.InversionResult`, the controls on this rank's group.
    Collective over ``comm``; bad layouts raise :class:`ShotLayoutError` before any work.
    """

    def __init__(self, comm, factory, n_shots: int, invert, checkpointing=None, *, ranks_per_shot: int = 1,
                 should_stop=None, time_limit=None, run_dir=None, resume: bool = False, log=None,
                 on_iteration=None, **options):
        check_layout(comm.size, n_shots, ranks_per_shot)
        self.comm, self.factory = comm, factory
        self.n_shots, self.ranks_per_shot = n_shots, ranks_per_shot
        self.invert, self.checkpointing = invert, checkpointing
        self.should_stop, self.time_limit = should_stop, time_limit
        self.run_dir, self.resume, self.log, self.on_iteration = run_dir, resume, log, on_iteration
        self.options = options
        self.layout: ShotLayout | None = None
        self.problem: ShotProblem | None = None
        self.evaluations: ShotEvaluations | None = None

    def solve(self):
        if self.time_limit is not None and not (self.time_limit > 0):
            raise InversionError(f"--time-limit must be a positive number of seconds, got {self.time_limit}")
        layout = self.layout = self.layout or ShotLayout(self.comm, self.n_shots, self.ranks_per_shot)
        problem = self.problem = self.problem or ShotProblem(layout, self.factory)
        self._check_run_dir()
        t_start = time.perf_counter()

        def should_stop() -> bool:  # agreed over every group: TAO stops after the same evaluation everywhere
            asked = bool(self.should_stop()) if self.should_stop is not None else False
            late = self.time_limit is not None and time.perf_counter() - t_start > self.time_limit
            return any_rank(layout.comm, asked or late)

        primary = layout.group == 0
        inversion = GroupInversion(problem, self.invert, self.checkpointing, run_dir=self.run_dir,
                                   resume=self.resume, should_stop=should_stop, log=self.log if primary else None,
                                   on_iteration=self.on_iteration if primary else None,
                                   evaluations=self._evaluations, primary=primary, **self.options)
        return inversion.solve()

    def _evaluations(self, *args, **kwargs) -> ShotEvaluations:
        self.evaluations = ShotEvaluations(*args, **kwargs)
        return self.evaluations

    def gradient(self, controls: dict):
        """The summed gradient of J (no regularisation) at ``controls`` (name -> Vec on this rank's
        group), packed: the last evaluation's when it was at these controls, else one more evaluation.
        Call after :meth:`solve`; collective over ``comm``."""
        space = self.evaluations.space
        x = space.pack(controls)
        g = self.evaluations.gradient(x).gradient.copy()
        x.destroy()
        return g

    def _check_run_dir(self) -> None:
        """A run directory's refusal (another inversion there, no --resume) made on every group alike:
        only group 0 writes it."""
        problem = None
        if self.run_dir and not self.resume and self.comm.rank == 0 and \
                os.path.exists(os.path.join(self.run_dir, STATE)):
            problem = (f"{self.run_dir} already holds an inversion ({STATE}): continue it with --resume, "
                       f"or choose another --run-dir")
        problem = self.comm.bcast(problem, root=0)
        if problem:
            raise InversionError(problem)

    def close(self) -> None:
        """Free the shot communicators (after the result's controls are no longer needed)."""
        if self.layout is not None:
            self.layout.free()
