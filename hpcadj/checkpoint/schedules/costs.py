"""Cost model for planning: what one forward step, one adjoint step, one write and one read cost.

A :class:`CostProfile` holds measured (or default) costs in two units — seconds and joules — so the
planners can minimise either: :meth:`CostProfile.vector` turns it into an :class:`OpCosts`, the
generic per-operation cost vector every planner and the simulator take. Minimising energy instead
of time is only a matter of passing ``profile.vector("energy")``.

Predicted makespan of a plan (docs/architecture.md, multi-level plans)::

    forward_evaluations * forward + n * adjoint + sum_k writes_k * write_k + sum_k reads_k * read_k

Asynchronous levels: each level has an ``overlap`` fraction in [0, 1], the share of a write that
hides behind computation (a background I/O thread draining a buffer while the next steps run).
The model charges ``write_k * (1 - overlap_k)`` per write; reads stay synchronous (the adjoint
waits for them). ``overlap = 0`` (the default) is the synchronous H-Revolve model. This is
optimistic when writes come faster than the compute they hide behind; a storage level that
measures its real hidden fraction should record it here.

Advances: a run of m >= 2 consecutive steps whose intermediate states nobody needs goes to the
model's own ``advance`` (docs/architecture.md, Seam 1); a time-tiled one costs less per step than
single steps. ``OpCosts.advance = (fixed, per_step)`` prices such a run ``fixed + m * per_step``
(:meth:`OpCosts.run`), measured by calibration for models with an advance of their own
(:class:`AdvanceCost`); without it (older profiles, models without their own advance) a run costs m
forward steps, so their plans are unchanged. Which runs a plan's ``Advance`` hands over is
``actions.advance_runs``; the simulator prices each so (the first sweep's only where
``advance_first``, the model's ``advance_objective``), the multi-level DP prices every advance of
its table as a recomputation's.

Adjoint data: a step reversed from its data (mixed plans, mixed.py) copies them twice, once out of
the step's states (capture) and once into the stand-in state its adjoint step reads. ``OpCosts.data``
prices that per step reversed from data (``CostProfile.data_s``, measured by calibration for a model
that declares adjoint data); 0 without it, so plans without data and older profiles price as before.

First touch: a slot's memory is new to the process the first time the slot is filled (a RAM level
holds states by reference; the model's next state then needs fresh pages). ``LevelCost.fill_s``,
measured by calibration, is that one-off cost per slot; the predicted makespan adds ``peak_k *
fill_k`` for every level (:meth:`CostProfile.fill_seconds`); provisioning weighs it by the RAM slots
it gives a plan (``provision._fill_priced``: each candidate count as its planner predicts it), the planners
themselves do not.

Default costs (used when no profile is given; relative, not measured): forward step 1 s, adjoint
step 2 s; RAM write/read 0.01 s, node-local disk 0.2 / 0.2 s, parallel file system 1.0 / 1.0 s.
Energy defaults assume a 100 W node for compute and the same for I/O waits (joules = 100 * seconds),
labelled ``source = "model"``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...levelkinds import LEVEL_NAMES
from .actions import MIN_ADVANCE, Advance, Move, Restore, Store

#: default seconds per snapshot (write, read) for the standard levels, fastest first
DEFAULT_LEVEL_SECONDS = {"ram": (0.01, 0.01), "disk": (0.2, 0.2), "pfs": (1.0, 1.0)}
DEFAULT_FORWARD_S = 1.0
DEFAULT_ADJOINT_S = 2.0
DEFAULT_WATTS = 100.0


@dataclass(frozen=True)
class OpCosts:
    """The generic per-operation cost vector planners minimise (any unit, all non-negative)."""

    forward: float
    adjoint: float
    write: tuple[float, ...]
    read: tuple[float, ...]
    #: (fixed, per step) of a run of m >= MIN_ADVANCE steps handed to the model's advance; None: m steps
    advance: tuple[float, float] | None = None
    #: whether the first sweep hands runs to the advance too (else only recomputation does)
    advance_first: bool = False
    #: a step reversed from its adjoint data: their capture after the step and the stand-in state
    data: float = 0.0

    def __post_init__(self):
        if len(self.write) != len(self.read):
            raise ValueError("write and read costs need one entry per level")
        values = (self.forward, self.adjoint, *self.write, *self.read, *(self.advance or ()), self.data)
        if any(not (v >= 0) or v == float("inf") for v in values):
            raise ValueError(f"costs must be finite and non-negative, got {values}")
        object.__setattr__(self, "write", tuple(float(w) for w in self.write))
        object.__setattr__(self, "read", tuple(float(r) for r in self.read))
        if self.advance is not None:
            object.__setattr__(self, "advance", (float(self.advance[0]), float(self.advance[1])))

    def run(self, m: int) -> float:
        """What m consecutive forward steps handed to the model's advance at once cost (m single
        steps below MIN_ADVANCE or without an advance model)."""
        if self.advance is None or m < MIN_ADVANCE:
            return m * self.forward
        return self.advance[0] + m * self.advance[1]

    def stepping(self, forward_steps: int, runs: dict) -> float:
        """``forward_steps`` forward steps of which ``runs[(m, first)]`` runs of m went to the advance
        (first: in the first sweep, priced as an advance only with ``advance_first``)."""
        total = forward_steps * self.forward
        if self.advance is None:
            return total
        for (m, first), count in sorted(runs.items()):
            if self.advance_first or not first:
                total += count * (self.run(m) - m * self.forward)
        return total

    @property
    def levels(self) -> int:
        return len(self.write)

    def for_levels(self, k: int) -> "OpCosts":
        """The same costs for the first ``k`` levels (levels beyond the profile are an error)."""
        if k > self.levels:
            raise ValueError(f"cost profile has {self.levels} levels, the plan needs {k}")
        return OpCosts(self.forward, self.adjoint, self.write[:k], self.read[:k], self.advance, self.advance_first,
                       self.data)


@dataclass
class LevelCost:
    """Costs of one storage level, per snapshot."""

    name: str
    write_s: float
    read_s: float
    write_j: float | None = None
    read_j: float | None = None
    overlap: float = 0.0
    #: seconds to fault in one slot's fresh memory, paid the first time each slot is filled
    fill_s: float = 0.0

    def __post_init__(self):
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"level {self.name}: overlap must be in [0, 1], got {self.overlap}")
        if not (isinstance(self.fill_s, (int, float)) and 0.0 <= self.fill_s < float("inf")):
            raise ValueError(f"level {self.name}: fill_s must be a non-negative number, got {self.fill_s!r}")


@dataclass
class AdvanceCost:
    """The model's own advance, measured: a run of m >= 2 steps costs ``fixed_s + m * step_s``
    (a least-squares line through ``runs``: [m, seconds per advance] as measured)."""

    fixed_s: float
    step_s: float
    #: the first sweep hands runs to it too (the model's ``advance_objective``)
    first: bool = False
    #: the time tile depth it was measured with, if the model has one
    depth: int | None = None
    runs: list = field(default_factory=list)

    def __post_init__(self):
        for value in (self.fixed_s, self.step_s):
            if not (isinstance(value, (int, float)) and 0.0 <= value < float("inf")):
                raise ValueError(f"bad cost profile: advance fixed_s and step_s must be non-negative numbers, "
                                 f"got {value!r}")


@dataclass
class CostProfile:
    """Measured or default costs of a model on a machine, in seconds and joules (JSON-serialisable)."""

    forward_s: float = DEFAULT_FORWARD_S
    adjoint_s: float = DEFAULT_ADJOINT_S
    levels: list[LevelCost] = field(default_factory=list)
    forward_j: float | None = None
    adjoint_j: float | None = None
    source: str = "model"
    #: the documented default profile: its "seconds" are relative units (a forward step is 1), not measured
    relative: bool = False
    #: the model's own advance (None: a run of m steps costs m forward steps)
    advance: AdvanceCost | None = None
    #: seconds of a step reversed from its adjoint data: capture and stand-in (None: not measured)
    data_s: float | None = None

    @classmethod
    def default(cls, n_levels: int = 3) -> "CostProfile":
        """The documented default profile for the first ``n_levels`` of ram, disk, pfs."""
        if not 1 <= n_levels <= len(LEVEL_NAMES):
            raise ValueError(f"default profile has 1 to {len(LEVEL_NAMES)} levels, asked {n_levels}")
        levels = [LevelCost(name, *DEFAULT_LEVEL_SECONDS[name]) for name in LEVEL_NAMES[:n_levels]]
        return cls(levels=levels, source="model", relative=True)

    def vector(self, minimize: str = "time") -> OpCosts:
        """Per-operation costs in seconds (``time``) or joules (``energy``), overlap applied to writes."""
        adv = self.advance
        first = bool(adv and adv.first)
        if minimize == "time":
            return OpCosts(self.forward_s, self.adjoint_s,
                           tuple(lv.write_s * (1.0 - lv.overlap) for lv in self.levels),
                           tuple(lv.read_s for lv in self.levels),
                           (adv.fixed_s, adv.step_s) if adv else None, first, self.data_s or 0.0)
        if minimize == "energy":
            watts = DEFAULT_WATTS

            def joules(j, s):
                return j if j is not None else watts * s

            # an advance draws the power a forward step does
            power = self.forward_j / self.forward_s if self.forward_j is not None and self.forward_s > 0 else watts
            return OpCosts(joules(self.forward_j, self.forward_s), joules(self.adjoint_j, self.adjoint_s),
                           tuple(joules(lv.write_j, lv.write_s) for lv in self.levels),
                           tuple(joules(lv.read_j, lv.read_s) for lv in self.levels),
                           (power * adv.fixed_s, power * adv.step_s) if adv else None, first,
                           power * (self.data_s or 0.0))
        raise ValueError(f"minimize must be 'time' or 'energy', got {minimize!r}")

    def fill_seconds(self, peak_slots) -> float:
        """One-off first-touch seconds of a plan that fills ``peak_slots[k]`` slots of level k."""
        return sum(p * lv.fill_s for p, lv in zip(peak_slots, self.levels))

    def predicted_seconds(self, summary) -> float:
        """A simulated plan's predicted makespan (a PlanSummary): its priced operations in seconds
        plus the first touch of every slot it fills."""
        return summary.cost(self.vector("time")) + self.fill_seconds(summary.peak)

    def advance_seconds(self, summary) -> dict | None:
        """The runs a simulated plan hands to the model's advance, as ``run --json`` and ``plan --json``
        report them: ``runs``, ``steps``, their ``predicted`` seconds and the seconds of the same steps
        taken one by one (``as_single_steps``); None without an advance model or a summary."""
        costs = self.vector("time")
        if costs.advance is None or summary is None:
            return None
        priced = {(m, first): c for (m, first), c in summary.advances.items() if costs.advance_first or not first}
        steps = sum(m * c for (m, _), c in priced.items())
        return {"runs": sum(priced.values()), "steps": steps,
                "predicted": sum(c * costs.run(m) for (m, _), c in sorted(priced.items())),
                "as_single_steps": steps * costs.forward}

    def predicted(self, makespan: float) -> dict:
        """A predicted makespan as reported (``run --json``, ``plan --json``): ``predicted_s`` in seconds,
        or null and ``predicted_relative`` (units of a default forward step) for the default profile."""
        return {"predicted_s": None if self.relative else makespan,
                "predicted_relative": makespan if self.relative else None}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "CostProfile":
        try:
            levels = [LevelCost(**lv) for lv in data.get("levels", [])]
            advance = data.get("advance")
            if advance is not None and not isinstance(advance, dict):
                raise ValueError(f"bad cost profile: advance must be an object, got {advance!r}")
            advance = AdvanceCost(**advance) if advance is not None else None
            rest = {k: v for k, v in data.items() if k not in ("levels", "advance")}
            profile = cls(levels=levels, advance=advance, **rest)
        except TypeError as exc:
            raise ValueError(f"bad cost profile: {exc}") from None
        for value in (profile.forward_s, profile.adjoint_s, *(() if profile.data_s is None else (profile.data_s,))):
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"bad cost profile: step times must be non-negative numbers, got {value!r}")
        return profile

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "CostProfile":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read cost profile {path}: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"cost profile {path} must be a JSON object")
        return cls.from_dict(data)


def default_costs(n_levels: int) -> OpCosts:
    """The default time costs for ``n_levels`` levels (ram, disk, pfs)."""
    return CostProfile.default(n_levels).vector("time")


def price_actions(actions, costs: OpCosts) -> float:
    """The forward steps, writes and reads of an action list under ``costs`` (adjoint steps left out:
    every plan of a given n has the same n of them), each Advance priced as one run of a
    recomputation (:meth:`OpCosts.run`: reverse-sweep plans hold the state beyond it). A Move is a read on its source and a write on
    its destination, as the simulator counts it."""
    total = 0.0
    for a in actions:
        if isinstance(a, Advance):
            total += costs.run(a.n1 - a.n0)
        elif isinstance(a, Store):
            total += costs.write[a.level]
        elif isinstance(a, Restore):
            total += costs.read[a.level]
        elif isinstance(a, Move):
            total += costs.read[a.src] + costs.write[a.dst]
    return total
