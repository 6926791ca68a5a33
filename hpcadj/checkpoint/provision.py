"""Provisioning: from a model's layout, the budgets, the node and the costs to the levels and the plan.

:func:`provision` decides everything a run's storage needs, in one pass read top to bottom:

1. budgets -> slots: each level with a budget, its slots at the raw snapshot size;
2. the compression probe: each compressed level's slot bytes, size curve and codec seconds
   (a resumed run keeps the slot bytes it recorded);
3. the whole-process memory budget (``--memory``, ``$HPCADJ_MEMORY``, SLURM's): what the model, the
   driver's states, staging and codecs need, the RAM slots the rest leaves, and whether the node holds
   the budget (:mod:`~.memory_fit`);
4. compressed levels: byte budgets -> slots of the encoded size; a compressed RAM level a byte pool;
5. the cost profile: given, or measured briefly when the plan needs one; codec seconds added;
6. the pool's slots searched up at the probed sizes (:func:`~.compression.pooled_capacity`);
7. the plan, simulated and checked (levels it never uses, extreme recomputation), and its predicted
   makespan with the durable points of a restartable run; a raw RAM level whose slots' first touch
   costs more than the recomputation they save gets fewer (:func:`_fill_priced`);
8. a model that declares its adjoint data: store-all and auto take a mixed plan where it is cheaper
   (:mod:`~hpcadj.checkpoint.mixed_choice`);
9. without a memory budget, whether the node holds the plan chosen: its predicted peak, a mixed
   plan's RAM counted at its restart states' and steps' data's own sizes.

The result, :class:`PlannedRun`, is immutable: each level's class, slots, codec and bytes, the memory
plan, the profile and the plan. The session opens the levels it names and runs its plan. Collective.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .budget import parse_budget
from .manager import level_slots, make_plan, profile_for
from .memory import DEFAULT_MODEL_STATES, MemoryPlan
from .memory_fit import ALLOCATOR_SLACK_BYTES, check_unbudgeted, fit_memory  # noqa: F401 (tests import the slack)
from .options import Checkpointing, ConfigError, fmt_bytes, load_costs
from .schedules import CostProfile, Multilevel, min_forward_steps, simulate
from .storage.base import LevelError
from ..snapshot import FieldLayout, layout_bytes
from ..imports import mpi
from .schedules.online_plans import make_online_plan

#: schedules that keep every snapshot on one level: a second budget given with them is never used
ONE_LEVEL_SCHEDULES = ("store-all", "revolve", "online")
#: forward evaluations per step above which a plan is warned about (store-all makes 1, revolve with
#: 2 slots on 100 steps 8.5, one slot on 100 steps 49.5)
SLOW_RECOMPUTE_FACTOR = 10.0


@dataclass(frozen=True)
class PlannedRun:
    """What provisioning decided: the levels (fastest first), the plan and its predicted cost.

    ``plans`` name each level's kind, slots and, when compressed, its codec and slot or pool bytes;
    ``probes`` what the compression probe measured per compressed level; ``profile`` the costs the
    plan was made with (codec seconds included), ``costs`` the ones given or measured, to pass as
    ``Checkpointing(costs=...)`` to later runs of the same set-up; ``memory`` the
    :class:`~hpcadj.checkpoint.memory.MemoryPlan` the RAM slots were sized with (None without a
    memory budget); ``summary`` the simulated plan (None for an online plan, whose n is unknown).
    """

    plans: tuple
    schedule: object
    profile: CostProfile
    summary: object                 # the plan's simulated summary (forward steps, writes per level)
    predicted_s: float              # predicted makespan, durable points included
    predicted_durable_s: float = 0.0
    memory: MemoryPlan | None = None
    probes: dict = field(default_factory=dict)
    notes: tuple = ()
    warnings: tuple = ()
    costs: CostProfile | None = None  # the profile given or measured, before codec seconds: reusable


    @property
    def lossy(self) -> bool:
        return any(p.codec.lossy for p in self.probes.values())


@dataclass(frozen=True)
class Resuming:
    """What a resumed run's directory fixes for provisioning: its compressed levels' codecs and slot
    bytes as recorded (None: nothing recorded, the run starts afresh) and the rank count that wrote
    them."""

    compression: dict | None
    ranks: int


@dataclass(frozen=True)
class Declared:
    """A run known by its sizes alone, provisioned as a model would be (no step is taken).

    ``layout`` and ``controls`` are snapshot layouts (a model's own, or one field of so many bytes:
    :meth:`of_bytes`); ``states`` the working set in snapshot-equivalents; ``compressed_bytes`` one
    compressed snapshot's bytes on the largest rank, standing in for the compression probe; ``sized``
    False when no byte count is known (budgets then count slots only); ``data`` the layout of a
    step's adjoint data the model declares (None: none) and ``recomputes_in_adjoint`` its flag, so the
    plan may mix restart states and data as the model's run would; ``relative_advance_step``,
    ``relative_data_step`` and ``advance_objective`` the model's (``Stepper``), which price the choice
    of a mixed plan as the model's run would. Used by ``hpcadj plan`` and the Hessian products.
    """

    comm: object
    n_steps: int
    layout: dict
    controls: dict
    states: float = DEFAULT_MODEL_STATES
    compressed_bytes: int | None = None
    sized: bool = True
    data: dict | None = None
    recomputes_in_adjoint: bool = False
    name: str = "declared"
    relative_advance_step: float | None = None
    relative_data_step: float = 0.0
    advance_objective: bool = False

    @classmethod
    def of_bytes(cls, comm, n_steps: int, snapshot_bytes: int | None, states: float = DEFAULT_MODEL_STATES,
                 **options) -> "Declared":
        """One field of ``snapshot_bytes`` on every rank (the controls as large), or, with None, a
        run whose snapshot size is unknown."""
        nbytes = int(snapshot_bytes or 1)
        layout = {"state": FieldLayout((nbytes * comm.size,), (nbytes * comm.rank,), (nbytes,), "uint8")}
        return cls(comm, n_steps, layout, layout, states, sized=snapshot_bytes is not None, **options)

    @classmethod
    def of_model(cls, model, n_steps: int | None = None, states: float | None = None, **options) -> "Declared":
        """``model``'s layouts and working set (or ``states``), over ``n_steps`` (default its own)."""
        return cls(model.comm, model.n_steps if n_steps is None else n_steps, model.snapshot_layout(),
                   model.control_layout(), float(model.working_set_states()) if states is None else states,
                   data=model.adjoint_data_layout(), recomputes_in_adjoint=bool(model.recomputes_in_adjoint),
                   name=model.name, relative_advance_step=model.relative_advance_step,
                   relative_data_step=model.relative_data_step, advance_objective=bool(model.advance_objective),
                   **options)

    def snapshot_layout(self) -> dict:
        return self.layout

    def control_layout(self) -> dict:
        return self.controls

    def working_set_states(self) -> float:
        return self.states

    def adjoint_data_layout(self) -> dict | None:
        return self.data


def recompute_warning(forward_steps: int, n_steps: int, what: str) -> str | None:
    """The warning for ``what`` evaluating ``forward_steps`` forward steps for ``n_steps``, when
    that exceeds :data:`SLOW_RECOMPUTE_FACTOR` per step (None otherwise)."""
    factor = forward_steps / max(n_steps or 0, 1)
    if factor <= SLOW_RECOMPUTE_FACTOR:
        return None
    return (f"{what} evaluates {forward_steps} forward steps for {n_steps} (recompute factor {factor:.1f}): "
            f"the run will take about {factor:.0f} times as long as one with room for every state; raise "
            f"--ram/--disk/--pfs")


def provision(model, controls, checkpointing: Checkpointing, *, config=None, baseline_bytes: int = 0,
              resuming: Resuming | None = None, durability=None) -> PlannedRun:
    """The levels and the plan for a gradient of ``model`` under ``checkpointing`` (collective).

    Parameters
    ----------
    model : Stepper or Declared
        Its layouts size the levels; the compression probe and a calibration take a few steps of a
        model. A :class:`Declared` run takes none: its ``compressed_bytes`` stand in for the probe
        and the default costs for a calibration.
    controls : dict
        name -> PETSc Vec, for the probe's and calibration's steps.
    checkpointing : Checkpointing
        Budgets, memory, compression, schedule and costs.
    config : CheckpointConfig, optional
        Where the file levels live (default ``checkpointing.config()``; a resumed run's says so).
    baseline_bytes : int
        The process's resident set before the model was built (the memory budget's starting point).
    resuming : Resuming, optional
        A resumed run's recorded compression (its slot bytes are kept).
    durability : callable, optional
        ``durability(schedule, plans, profile, makespan_s) -> seconds`` the run's durable points add.

    Raises :class:`ConfigError` (the same on every rank) when no run can use the configuration.
    """
    config = config or checkpointing.config()
    if model.n_steps is None:
        return _online(model, checkpointing, config)
    comm, ck, n = model.comm, checkpointing, model.n_steps
    notes, warnings = [], []
    layout = model.snapshot_layout()

    # 1. budgets -> slots, at the raw snapshot size
    try:
        plans = level_slots(config, layout, comm, n)
    except ValueError as exc:  # a run of unknown size has no snapshot bytes to name
        raise ConfigError(str(exc) if getattr(model, "sized", True) else str(exc).split(" (one snapshot")[0]) from None

    # 2. the compression probe (RAM's too: a memory budget may add a RAM level)
    names = {p.name for p in plans} | {"ram"}
    codecs = {k: v for k, v in ck.codecs().items() if k in names}
    probes, codec_rss = _probe(model, controls, codecs, ck.compress_probe_steps, n)

    # 3. the whole-process memory budget: RAM slots from what the rest leaves
    memory, plans, reshaped, predicted_memory = fit_memory(model, plans, ck, probes, baseline_bytes + codec_rss,
                                                           notes)

    # 4. compressed levels: slots of the encoded size; a compressed RAM level a byte pool
    probes = {k: v for k, v in probes.items() if any(p.name == k for p in plans)}
    if resuming is not None and resuming.compression is not None:
        probes = _recorded(probes, resuming, comm)
    for name, found in probes.items():
        if found.codec.lossy:
            notes.append(f"LOSSY checkpoints on level {name} ({found.codec.spec}, absolute pointwise bound): "
                         f"the gradient is approximate")
    plans, search = _compressed(plans, ck, probes, memory, comm)

    # 5. the cost profile
    store_all = all(b is None for b in ck.budgets.values()) and not reshaped
    name = ck.schedule or ("store-all" if store_all else "auto")
    profile = load_costs(ck.costs)
    if profile is None and name in ("auto", "multilevel", "mixed") and len(plans) > 1:
        if isinstance(model, Declared):
            notes.append("no --costs profile given: the default costs plan it (a run calibrates briefly)")
        else:
            profile = _calibrated(model, controls, plans, config)
            notes.append("no --costs profile given: calibrated step and level costs briefly")
    profile = costs = profile_for(plans, profile)
    if probes:
        from .compression import adjusted_profile

        profile = adjusted_profile(costs, plans, probes)

    # 6. the pool's slots at the probed sizes
    if search:
        plans, memory = _grown_pool(model, plans, probes, profile, name, ck.minimize, memory, notes)

    if name == "mixed":  # restart states and steps' adjoint data in one RAM byte budget
        from .mixed_plan import mixed_run

        planned = mixed_run(model, controls, plans, ck, profile, memory, probes, notes, warnings, durability)
        return _node_checked(model, planned, predicted_memory)

    # 7. the plan, checked, and its predicted cost (RAM slots beyond what repays their first touch left)
    given, base_notes, base_warnings = plans, list(notes), list(warnings)
    try:
        plans = _fill_priced(plans, name, n, profile, ck.minimize, notes)
        schedule = make_plan(name, n, plans, profile, ck.minimize)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    summary = _checked(name, schedule, plans, profile, ck, notes, warnings, resuming is not None)
    predicted = profile.predicted_seconds(summary)
    durable_s = durability(schedule, plans, profile, predicted) if durability is not None else 0.0
    planned = PlannedRun(tuple(plans), schedule, profile, summary, predicted + durable_s, durable_s, memory, probes,
                         tuple(notes), tuple(warnings), costs)
    if name in ("store-all", "auto") and _adjoint_data(model) is not None:
        from .mixed_choice import with_data  # 8. a model that declares its adjoint data: mixed where cheaper

        planned = with_data(planned, model, controls, name, given, ck, memory, durability, base_notes,
                            base_warnings)
    return _node_checked(model, planned, predicted_memory)


def _node_checked(model, planned: PlannedRun, predicted) -> PlannedRun:
    """``planned``, once the node holds it: without a memory budget, its predicted peak with the RAM
    bytes this plan holds (a budget was checked as it was fitted)."""
    if planned.memory is None:
        check_unbudgeted(model, predicted, planned)
    return planned


def _adjoint_data(model):
    """The layout of a step's adjoint data ``model`` declares, or None."""
    declared = getattr(model, "adjoint_data_layout", None)
    return declared() if declared is not None else None


def _mpi_max():
    return mpi().MAX


def _online(model, ck: Checkpointing, config) -> PlannedRun:
    """The plan of a run whose n is unknown until it ends (adaptive steps): an online plan.

    Store-all (no budget) keeps up to the model's step bound in RAM; costs come from --costs or
    the defaults (a calibration would take steps of the model, deciding its sequence early).
    """
    name = ck.schedule or "online"
    if name not in ("online", "mixed"):
        raise ConfigError(f"--schedule {name} needs the number of steps, which adaptive steps decide as the "
                          f"run goes: use --schedule online")
    if ck.memory is not None or ck.codecs():
        raise ConfigError("adaptive steps (unknown n) do not combine with --memory or --compress yet")
    try:
        plans = level_slots(config, model.snapshot_layout(), model.comm, model.steps.max_steps)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    profile = profile_for(plans, load_costs(ck.costs))
    store_all = all(b is None for b in ck.budgets.values())
    if name == "mixed":  # restart states forward, steps' data in the reverse sweep
        from .mixed_plan import mixed_online

        schedule = mixed_online(model, plans, ck, profile.vector(ck.minimize), store_all)
    else:
        schedule = make_online_plan([p.slots for p in plans], profile.vector(ck.minimize), done=model.done,
                                    store_all=store_all)
    notes = ("the online plan keeps whole restart states: adaptive steps keep steps' adjoint data only when "
             "asked (--schedule mixed)",) if name == "online" and _adjoint_data(model) is not None else ()
    return PlannedRun(tuple(plans), schedule, profile, None, float("nan"), notes=notes, costs=profile)


def _probe(model, controls, codecs: dict, probe_steps, n: int) -> tuple[dict, int]:
    """The compression probe of ``codecs`` (a declared run's compressed bytes in its place) and the
    resident bytes the codecs keep once used."""
    from .compression import Probe, codec_footprint, margin, probe, slot_bytes

    if not codecs:
        return {}, 0
    rss = codec_footprint(codecs, model.snapshot_layout())
    if isinstance(model, Declared):
        if model.compressed_bytes is None or not model.sized:
            raise ConfigError("--compress needs --compressed-bytes (one compressed snapshot's bytes on one rank) "
                              "and --snapshot-bytes")
        raw = model.comm.allreduce(layout_bytes(model.layout), op=_mpi_max())
        found = int(model.compressed_bytes)
        return {name: Probe(codec=codec, slot_bytes=slot_bytes(found, codec, raw), probed_bytes=found,
                            raw_bytes=raw, sizes=(), margin=margin(codec), cap_bytes=raw, encode_s=0.0,
                            decode_s=0.0) for name, codec in codecs.items()}, rss
    try:
        return probe(model, controls, codecs, model.comm, probe_steps), rss
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _recorded(probes: dict, resuming: Resuming, comm) -> dict:
    """A resumed run's compressed levels keep the codec and slot bytes its manifest recorded."""
    recorded = resuming.compression
    now = {k: v.codec.spec for k, v in probes.items()}
    then = {k: v["codec"] for k, v in recorded.items()}
    if then != now:
        raise ConfigError(f"--resume with other compression than the run recorded ({then or 'none'}, now "
                          f"{now or 'none'}): resume with the run's --compress options")
    if resuming.ranks == comm.size:  # the attached levels' slots as written
        return {k: replace(v, slot_bytes=int(recorded[k]["slot_bytes"])) if k in recorded else v
                for k, v in probes.items()}
    if "pfs" in recorded:
        raise ConfigError(f"the compressed HDF5 level holds one encoded block per rank of the {resuming.ranks} "
                          f"rank(s) that wrote it: resume on {resuming.ranks} rank(s) (another rank count "
                          f"needs an uncompressed --pfs level)")
    return probes


def _compressed(plans, ck: Checkpointing, probes: dict, memory: MemoryPlan | None, comm):
    """Each compressed level's plan with its codec and slots of the encoded size; the RAM level a
    byte pool. Returns ``(plans, search)``, ``search`` True when the pool's slots may grow past the
    worst probed size's (a byte budget, or one the memory budget set)."""
    out, search = [], False
    for p in plans:
        found = probes.get(p.name)
        if found is None:
            out.append(p)
            continue
        p = replace(p, codec=found.codec, slot_bytes=found.slot_bytes, margin=found.margin)
        text = ck.budgets.get(p.name)
        if p.kind != "ram":
            if text is not None:  # a byte budget buys slots of the encoded size; slots stay slots
                per = found.slot_bytes * (comm.size if p.kind == "pfs" else 1)
                p = replace(p, slots=max(p.slots, parse_budget(text).to_slots(per)))
            out.append(p)
            continue
        budget = parse_budget(text) if text is not None else None
        if memory is not None:  # what the memory budget leaves for RAM slots
            pool = memory.budget_bytes - memory.fixed_bytes
            if budget is not None and budget.nbytes is not None:
                pool = min(pool, budget.nbytes)
            search = budget is None or budget.nbytes is not None
        elif budget is not None and budget.nbytes is not None:
            pool, search = budget.nbytes, True
        else:
            pool, search = p.slots * found.slot_bytes, False
        if search:  # worst-case slots within the pool (a raw slot count may exceed them)
            slots = (max(1, min(p.slots, int(pool) // found.slot_bytes)) if memory is not None
                     else int(pool) // found.slot_bytes)
            p = replace(p, slots=slots)
        out.append(replace(p, pool_bytes=int(pool)))
    return out, search


def _calibrated(model, controls, plans, config) -> CostProfile:
    """Step and level costs measured briefly on these levels (ConfigError if a level is unusable)."""
    from .calibrate import calibrate

    try:
        profile = calibrate(model, controls, model.comm, plans, config, repeats=2, brief=True)
    except (OSError, LevelError) as exc:  # an unusable local directory or HDF5 file
        raise ConfigError(f"cannot measure the levels' costs (give --costs PROFILE.json to skip it): "
                          f"{exc}") from None
    profile.source = "calibrated"
    return profile


def _grown_pool(model, plans, probes: dict, profile, name: str, minimize: str, memory, notes: list):
    """The RAM pool's slots raised to what its bytes hold at the probed sizes (see
    :func:`~hpcadj.checkpoint.compression.pooled_capacity`); the memory plan says so."""
    from .compression import pooled_capacity

    index = next(i for i, p in enumerate(plans) if p.pool_bytes is not None)
    pool, found = plans[index], probes[plans[index].name]

    def planner(candidate):
        return make_plan(name, model.n_steps, candidate, profile, minimize)

    slots = pooled_capacity(plans, index, pool.pool_bytes, found.sizes, found.margin, planner, name,
                            model.n_steps, found.cap_bytes)
    if slots > pool.slots:
        notes.append(f"compressed RAM pool {fmt_bytes(pool.pool_bytes)}: {slots} slots at the probed sizes "
                     f"(worst-case slots: {pool.slots})")
    if memory is not None:
        memory = replace(memory, ram_slot_bytes=pool.pool_bytes, detail={**memory.detail, "ram_slots": slots})
    return [replace(p, slots=slots) if i == index else p for i, p in enumerate(plans)], memory


#: schedules whose plans change with the RAM slots they are given, and the most steps for which the
#: slots are searched with the multi-level DP (one DP per candidate; revolve's count is closed-form)
FILL_PRICED_SCHEDULES = ("auto", "revolve", "multilevel")
FILL_SEARCH_MAX_STEPS = 5000
#: each candidate slot count is this fraction of the previous one
FILL_SEARCH_RATIO = 0.85


def _fill_priced(plans, name: str, n: int, profile: CostProfile, minimize: str, notes: list):
    """The RAM level's slots lowered to the count whose plan costs least with the first touch of
    every slot it fills (``LevelCost.fill_s``, measured by calibration) priced in: a slot more saves
    recomputation and costs a slot's fresh pages. Each candidate is priced as its planner predicts
    it (revolve: the binomial minimum of forward steps; the multi-level DP: its table's makespan)
    plus ``slots * fill_s``; candidates from the given slots down by :data:`FILL_SEARCH_RATIO`, then
    every count between the best's neighbours (ties keep more slots). Unchanged without a measured
    first touch."""
    ram = next((i for i, p in enumerate(plans) if p.kind == "ram" and p.codec is None), None)
    if ram is None or name not in FILL_PRICED_SCHEDULES or minimize != "time":
        return plans
    fill = profile.levels[ram].fill_s
    given = plans[ram].slots
    costs = profile.vector("time")
    caps = [p.slots for p in plans]
    binomial = name == "revolve" or (name == "auto" and sum(1 for c in caps if c > 0) <= 1
                                     and costs.advance is None)
    if not fill > 0 or given <= 2 or (not binomial and n > FILL_SEARCH_MAX_STEPS):
        return plans

    def cost(slots):
        if binomial:
            return min_forward_steps(n, slots) * costs.forward + slots * fill
        return Multilevel(n, caps[:ram] + [slots] + caps[ram + 1:], costs).predicted + slots * fill

    candidates, s = [], given
    while s >= 2 and s not in candidates:
        candidates.append(s)
        s = min(s - 1, int(s * FILL_SEARCH_RATIO))
    priced = {c: cost(c) for c in candidates}
    best = min(candidates, key=lambda c: (priced[c], -c))
    k = candidates.index(best)  # then every count between the best's neighbours
    for c in range(candidates[k + 1] + 1 if k + 1 < len(candidates) else 2,
                   candidates[k - 1] if k > 0 else given):
        priced.setdefault(c, cost(c))
    best = min(priced, key=lambda c: (priced[c], -c))
    if best == given:
        return plans
    notes.append(f"RAM level: {best} of its {given} slots used: filling more (first touch {fill * 1e3:.1f} ms a "
                 f"slot) costs more than the recomputation they save")
    return [replace(p, slots=best) if i == ram else p for i, p in enumerate(plans)]


def _checked(name, schedule, plans, profile, ck: Checkpointing, notes: list, warnings: list, resuming: bool):
    """Simulate the plan; refuse or note levels it never writes, warn about extreme recomputation."""
    summary = simulate(schedule.actions(), schedule.n_steps, [p.slots for p in plans], profile.vector("time"))
    unused = [p for p, writes in zip(plans, summary.writes) if writes == 0]
    budgets = {level: (text if text is not None else f"{p.slots} (slots the memory budget leaves)")
               for level, text in ck.budgets.items() for p in plans if p.name == level}
    if unused and name in ONE_LEVEL_SCHEDULES:
        used = [p.name for p, writes in zip(plans, summary.writes) if writes] or [plans[0].name]
        flags = ", ".join(f"--{p.name} {budgets[p.name]}" for p in unused)
        raise ConfigError(f"--schedule {name} keeps its snapshots on one level ({used[0]}), so {flags} "
                          f"would never be used: drop it, or use --schedule auto or multilevel")
    for p in unused if not resuming else ():  # a resume re-plans: this plan is not the one run
        notes.append(f"level {p.name} (--{p.name} {budgets[p.name]}) holds no snapshot in this plan: "
                     f"the planner found it not worth its cost")
    text = recompute_warning(summary.forward_steps, schedule.n_steps, "this plan")
    if text:
        warnings.append(text)
    return summary
