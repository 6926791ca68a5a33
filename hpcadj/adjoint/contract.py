"""Check a Stepper against its contract, property by property (``hpcadj check``).

A model that breaks the contract still runs: a step that scales its input in place gives the right
J and a wrong gradient. :func:`check_contract` exercises a few steps of the model and reports, per
property, PASSED, FAILED, WARNING or NOT CHECKED with a short reason:

- ``step_pure``: ``step(i, u)`` from the same u_i gives bitwise the same u_{i+1} every time (no
  counter, cache or reused Krylov guess), in another order than the first sweep's;
- ``inputs_untouched``: ``step``, ``tangent_step`` and ``adjoint_step`` leave the Vecs they are given
  as they were (a checkpoint shares their memory) and ``step`` returns a new Vec;
- ``snapshot_round_trip``: ``restore(snapshot(u))`` is u bitwise, the snapshot matches
  ``snapshot_layout()``, and stepping from the restored state gives the same next state;
- ``adjoint_transpose``: per step, <lambda, T du> = <A lambda, du> for the state and for each
  control p (<lambda, T_p dp> = <dJ/dp contribution, dp>), and the same for the initial step
  (NOT CHECKED for a model without a tangent step, ``has_tangent = False``);
- ``adjoint_difference``: for a model without a tangent step, the same products with central
  differences of ``step`` in place of the tangent (the best of a few difference sizes);
- ``parameters_used``: a control that does not enter the initial state, changed a little, changes
  the first step where the adjoint step predicts a visible change (:mod:`hpcadj.adjoint.probes`);
- ``describe``: JSON, the same on every rank, and different for a second configuration (only when
  one is given: ``variant``; otherwise NOT CHECKED);
- ``working_set``: the declared ``working_set_states()`` against the peak resident memory a few
  steps and adjoint steps add, per state (VmHWM; under-declared fails, over-declared warns, a state
  too small for RSS to resolve warns and says so);
- ``advance``: a model's own ``advance(i, u, k)`` against k calls of ``step``, bitwise, for runs
  around its time tile depth (:func:`check_advance`; NOT CHECKED for a model without one).
- ``adjoint_data``: the adjoint step run from a model's declared adjoint data gives lambda_i and dJ/dp
  bitwise as from u_i (:mod:`hpcadj.adjoint.data_check`; NOT CHECKED for a model that declares none).

Collective: call it on every rank; every rank returns the same report.
"""

from __future__ import annotations

import gc
import json
import os
from dataclasses import dataclass, field

import numpy as np

from ..collective import Agreement, allgather, first_of, first_problem
from ..snapshot import layout_bytes
from .data_check import check_adjoint_data
from .guards import checksum, finite
from .probes import adjoint_properties
from ..checkpoint.memory import model_states
from ..imports import petsc
from ..models.base import Stepper
from .verify import random_direction

PROPERTIES = ("step_pure", "inputs_untouched", "snapshot_round_trip", "adjoint_transpose", "adjoint_difference",
              "parameters_used", "describe", "working_set", "advance", "adjoint_data")
PASSED, FAILED, WARNING, NOT_CHECKED = "PASSED", "FAILED", "WARNING", "NOT CHECKED"

#: per-step dot products must agree to this relative mismatch (or the model's dot_product_tolerance)
DOT_TOLERANCE = 1e-8
#: resident-memory noise a measurement cannot resolve (allocator rounding, MPI and PETSc buffers)
RSS_NOISE_BYTES = 16 * 2 ** 20
#: a measurement whose noise exceeds this many states is too coarse to judge
NOISY_STATES = 8.0


@dataclass
class PropertyResult:
    """One property's verdict: ``status`` PASSED, FAILED, WARNING or NOT CHECKED, and why."""

    name: str
    status: str
    reason: str
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"status": self.status, "reason": self.reason, **({"details": self.details} if self.details else {})}


@dataclass
class ContractReport:
    """Every property's result; ``passed`` unless one FAILED (WARNING and NOT CHECKED pass)."""

    model: dict
    ranks: int
    steps: int
    properties: list

    @property
    def passed(self) -> bool:
        return all(p.status != FAILED for p in self.properties)

    def __getitem__(self, name: str) -> PropertyResult:
        for p in self.properties:
            if p.name == name:
                return p
        raise KeyError(name)

    def as_dict(self) -> dict:
        return {"model": self.model, "ranks": self.ranks, "steps": self.steps, "passed": self.passed,
                "properties": {p.name: p.as_dict() for p in self.properties}}

    def lines(self) -> list[str]:
        """The report for a terminal: one line per property, then PASSED or FAILED."""
        out = [f"hpcadj check: {self.model.get('model', '?')} on {self.ranks} rank(s), {self.steps} step(s)"]
        for p in self.properties:
            out.append(f"  {p.name:<20} {p.status:<11} {p.reason}")
        out.append("  PASSED" if self.passed else "  FAILED")
        return out


def _same(a, b) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _array(vec) -> np.ndarray:
    return vec.getArray(readonly=True).copy()


def _fresh(like, values):
    """A new Vec shaped like ``like`` holding ``values`` (this rank's block)."""
    vec = like.duplicate()
    vec.setArray(values)
    return vec


def _max_diff(a, b) -> float:
    with np.errstate(invalid="ignore", over="ignore"):
        return float(np.max(np.abs(a - b))) if a.size else 0.0


class _Checker:
    """State shared by the property checks of one model."""

    def __init__(self, model, controls, steps, seed, tolerance):
        self.model, self.comm, self.steps = model, model.comm, steps
        self.controls, self.seed = controls, seed
        self.tolerance = tolerance
        self.touched: str | None = None   # the first input changed, this rank
        self.states: list = []            # u_0 .. u_K as returned by the first sweep
        self.arrays: list = []            # their values right after they were made
        self.pure = True                  # step_pure passed (else a restored state's step proves nothing)
        self.overflow: str | None = None  # the first non-finite state of the first sweep, this rank

    def note_touched(self, text: str) -> None:
        self.touched = self.touched or text

    def call(self, what: str, fn, *inputs):
        """``fn()`` with each named input's checksum compared before and after."""
        model = self.model
        before = [checksum(model, vec) for _, vec in inputs if vec is not None]
        out = fn()
        after = [checksum(model, vec) for _, vec in inputs if vec is not None]
        for (name, vec), b, a in zip([i for i in inputs if i[1] is not None], before, after):
            if a != b:
                self.note_touched(f"{what} changed its input {name}")
            if out is vec:
                self.note_touched(f"{what} returned its input {name} instead of a new Vec")
        return out

    def state(self, i):
        return _fresh(self.states[0], self.arrays[i])

    # -- the first sweep ------------------------------------------------------------------------
    def sweep(self) -> None:
        model = self.model
        model.set_controls(self.controls)
        u = model.initial_state()
        self.states, self.arrays = [u], [_array(u)]
        for i in range(self.steps):
            u = self.call(f"step({i}, u)", lambda: model.step(i, u), (f"u_{i}", u))
            self.states.append(u)
            self.arrays.append(_array(u))
            if self.overflow is None and not finite([u]):
                self.overflow = f"step({i}, u_{i}) produced a non-finite value (inf or NaN) in u_{i + 1}"

    def step_pure(self) -> PropertyResult:
        model, local = self.model, None
        calls = [(i, 2) for i in range(self.steps)] + [(self.steps - 1, 3)]
        for i, nth in calls:
            out = model.step(i, self.state(i))
            got = out.getArray(readonly=True)
            if local is None and not _same(got, self.arrays[i + 1]):
                local = (f"step({i}, u_{i}) gave a different u_{i + 1} on call {nth} (largest difference "
                         f"{_max_diff(got, self.arrays[i + 1]):.3g}): it must be a pure function of (i, u), "
                         f"with no counter, cache or reused Krylov guess")
        problem = first_problem(self.comm, local)
        if problem:
            self.pure = False
            return PropertyResult("step_pure", FAILED, problem)
        return PropertyResult("step_pure", PASSED, f"{len(calls)} repeated steps bitwise equal to the first sweep's")

    def inputs_untouched(self) -> PropertyResult:
        problem = first_problem(self.comm, self.touched)
        if problem:
            return PropertyResult("inputs_untouched", FAILED,
                                  f"{problem}: the driver's Vecs are shared with checkpoints, never change them")
        return PropertyResult("inputs_untouched", PASSED,
                              "step, tangent_step and adjoint_step left their inputs bitwise as given")

    def snapshot_round_trip(self) -> PropertyResult:
        model = self.model
        layout = model.snapshot_layout()
        local = None
        for i in sorted({0, self.steps}):
            u = self.state(i)
            snap = model.snapshot(u)
            if set(snap) != set(layout):
                local = local or (f"snapshot() has fields {sorted(snap)}, snapshot_layout() "
                                  f"declares {sorted(layout)}")
                continue
            for name, block in snap.items():
                if tuple(np.shape(block)) != tuple(layout[name].shape):
                    local = local or (f"snapshot field {name!r} has shape {tuple(np.shape(block))}, its layout "
                                      f"says {tuple(layout[name].shape)}")
            if local:
                continue
            copies = {name: np.array(block, copy=True) for name, block in snap.items()}
            back = model.restore(copies)
            if not _same(back.getArray(readonly=True), self.arrays[i]):
                again = model.snapshot(back)
                lost = [name for name in sorted(copies) if not _same(again[name], copies[name])]
                local = local or (f"restore(snapshot(u_{i})) is not u_{i}: "
                                  + (f"field(s) {', '.join(lost)} come back different" if lost else
                                     "the snapshot leaves part of the state out"))
                continue
            if i < self.steps and self.pure:
                out = model.step(i, back)
                if not _same(out.getArray(readonly=True), self.arrays[i + 1]):
                    local = local or f"stepping from the restored u_{i} gives a different u_{i + 1}"
        problem = first_problem(self.comm, local)
        if problem:
            return PropertyResult("snapshot_round_trip", FAILED, problem)
        return PropertyResult("snapshot_round_trip", PASSED,
                              f"fields {', '.join(sorted(layout))} restore bitwise; steps from restored states match")

    # -- the adjoint against the tangent --------------------------------------------------------
    def _random_state(self, rng, like):
        return _fresh(like, rng.uniform(-1.0, 1.0, like.getLocalSize()))

    def _zero_controls(self):
        out = {name: vec.duplicate() for name, vec in self.controls.items()}
        for vec in out.values():
            vec.set(0.0)
        return out

    def adjoint_transpose(self) -> PropertyResult:
        model, tol = self.model, self.tolerance
        rng = np.random.default_rng(self.seed + 7919 * self.comm.rank)
        direction = random_direction(model, self.controls, self.seed)
        reads_next = getattr(model, "adjoint_reads_next", True)
        worst, failures = 0.0, []

        def compare(where, lhs, rhs, scale):
            nonlocal worst
            mismatch = abs(lhs - rhs) / max(abs(lhs), abs(rhs), 1e-6 * scale, 1e-300)
            worst = max(worst, mismatch)
            if not mismatch <= tol:
                failures.append(f"{where}: tangent {lhs:.6e}, adjoint {rhs:.6e} (relative mismatch "
                                f"{mismatch:.1e} > {tol:.0e})")

        for i in sorted({0, self.steps - 1}):
            u, un = self.state(i), self.state(i + 1)
            lam = self._random_state(rng, u)
            du = self._random_state(rng, u)
            for part in [None, *sorted(self.controls)]:
                dc = self._zero_controls()
                if part is None:
                    dx = du
                else:
                    dx = du.duplicate()
                    dx.set(0.0)
                    direction[part].copy(dc[part])
                t = self.call(f"tangent_step({i})", lambda: model.tangent_step(i, u, un, dx, dc),
                              (f"u_{i}", u), (f"u_{i + 1}", un), ("du", dx))
                grad = self._zero_controls()
                a = self.call(f"adjoint_step({i})",
                              lambda: model.adjoint_step(i, u, un if reads_next else None, lam, grad),
                              (f"u_{i}", u), (f"u_{i + 1}", un), (f"lambda_{i + 1}", lam))
                lhs = lam.dot(t)
                if part is None:
                    rhs, scale = a.dot(du), lam.norm() * t.norm()
                    compare(f"step {i}, the state", lhs, rhs, max(scale, a.norm() * du.norm()))
                else:
                    rhs = grad[part].dot(dc[part])
                    scale = max(lam.norm() * t.norm(), grad[part].norm() * dc[part].norm())
                    compare(f"step {i}, control {part!r}", lhs, rhs, scale)
        lam0 = self._random_state(rng, self.states[0])
        for part in sorted(self.controls):
            dc = self._zero_controls()
            direction[part].copy(dc[part])
            t = model.initial_tangent(dc)
            grad = self._zero_controls()
            model.initial_adjoint(lam0, grad)
            compare(f"initial state, control {part!r}", lam0.dot(t), grad[part].dot(dc[part]),
                    max(lam0.norm() * t.norm(), grad[part].norm() * dc[part].norm()))
        details = {"worst_relative_mismatch": worst, "tolerance": tol}
        if failures:
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            return PropertyResult("adjoint_transpose", FAILED,
                                  f"adjoint_step is not the transpose of tangent_step at {failures[0]}{more}", details)
        return PropertyResult("adjoint_transpose", PASSED,
                              f"per-step dot products agree (worst relative mismatch {worst:.1e} <= {tol:.0e})",
                              details)


def _describe(model, variant) -> PropertyResult:
    comm = model.comm
    mine = model.describe()
    try:
        text = json.dumps(mine, sort_keys=True)
    except (TypeError, ValueError) as exc:
        return PropertyResult("describe", FAILED, f"describe() is not JSON ({exc}): run directories record it")
    if len(set(allgather(comm, text))) > 1:
        return PropertyResult("describe", FAILED, "describe() differs between ranks")
    if variant is None:
        return PropertyResult("describe", NOT_CHECKED,
                              "JSON and the same on every rank; whether it changes with a setting needs a second "
                              "configuration (variant=..., hpcadj check --vary '...')")
    other = variant if hasattr(variant, "describe") else variant()
    theirs = other.describe()
    try:
        other_text = json.dumps(theirs, sort_keys=True)
    except (TypeError, ValueError) as exc:
        return PropertyResult("describe", FAILED, f"the second configuration's describe() is not JSON ({exc})")
    if other_text == text:
        return PropertyResult("describe", FAILED,
                              f"describe() is {text} for both configurations: a run directory could not tell "
                              f"them apart (a resume would mix them)")
    keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    return PropertyResult("describe", PASSED, f"differs between the two configurations in {', '.join(keys)}")


# -- the working set --------------------------------------------------------------------------
def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise OSError(f"no {key} in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _release_memory(comm) -> None:
    """Free what can be freed before a baseline: cycles, parked PETSc objects, the heap's free pages."""
    gc.collect()
    petsc().garbage_cleanup(comm)
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _working_set(model, controls, factory, steps, tolerance) -> PropertyResult:
    """Peak RSS growth of ``steps`` steps and adjoint steps, less what the checker holds, per state."""
    comm = model.comm
    declared = model_states(model)
    state = layout_bytes(model.snapshot_layout())
    unusable = first_problem(comm, None if os.access("/proc/self/clear_refs", os.W_OK) else
                      "this system offers no peak-RSS reset (/proc/self/clear_refs)")
    if unusable:
        return PropertyResult("working_set", NOT_CHECKED, unusable)
    _release_memory(comm)
    baseline = _status_kib("VmRSS") * 1024
    _reset_peak()
    if factory is not None:
        m = factory()
        c = m.default_controls()
        m.set_controls(c)
        control_sets = 2                                  # the controls and the gradient
    else:
        m, c = model, controls
        control_sets = 1                                  # the gradient (the controls predate the baseline)
    u = m.initial_state()
    states = [u]
    for i in range(steps):
        u = m.step(i, u)
        states.append(u)
    lam = u.duplicate()
    lam.set(1.0)
    grad = {name: vec.duplicate() for name, vec in c.items()}
    for vec in grad.values():
        vec.set(0.0)
    reads_next = getattr(m, "adjoint_reads_next", True)
    for i in reversed(range(steps)):
        lam = m.adjoint_step(i, states[i], states[i + 1] if reads_next else None, lam, grad)
        states.pop()
    peak = _status_kib("VmHWM") * 1024
    held = (steps + 1 + 2) * state + control_sets * layout_bytes(m.control_layout())
    measured = (peak - baseline - held) / state if state else 0.0
    del m, c, u, states, lam, grad
    _release_memory(comm)
    rows = allgather(comm, (measured, state))
    measured = max(r[0] for r in rows)
    state = min(r[1] for r in rows)
    noise = RSS_NOISE_BYTES / state if state else float("inf")
    details = {"declared_states": declared, "measured_states": round(measured, 2),
               "state_bytes": state, "noise_states": round(noise, 2), "tolerance": tolerance,
               "mode": "factory" if factory is not None else "existing model (lower bound)"}
    figures = f"declared {declared:g}, measured {measured:.1f} states"
    if noise > NOISY_STATES:
        return PropertyResult("working_set", WARNING,
                              f"{figures}, but a state ({state} bytes per rank) is too small for RSS to resolve "
                              f"(noise ~{RSS_NOISE_BYTES >> 20} MiB = {noise:.0f} states): check at a grid of "
                              f">= {int(RSS_NOISE_BYTES / NOISY_STATES) >> 20} MiB a state per rank", details)
    if measured > declared * (1 + tolerance) + noise:
        return PropertyResult("working_set", FAILED,
                              f"under-declared: {figures} (tolerance {tolerance:.0%} + {noise:.1f} states of noise); "
                              f"working_set_states() must count everything the model holds, or a --memory "
                              f"budget is exceeded", details)
    if factory is not None and declared > measured * (1 + tolerance) + noise:
        return PropertyResult("working_set", WARNING,
                              f"over-declared: {figures}: safe, but a --memory budget leaves RAM slots unused",
                              details)
    scope = "" if factory is not None else " (a lower bound: pass factory= to see what construction allocates)"
    return PropertyResult("working_set", PASSED, f"{figures}, within {tolerance:.0%} + {noise:.1f} states{scope}",
                          details)


def check_contract(model, controls=None, *, steps: int = 3, variant=None, factory=None,
                   tolerance: float | None = None, memory_tolerance: float = 0.5,
                   seed: int = 2024) -> ContractReport:
    """Check ``model`` (a Stepper) against the Stepper contract; collective.

    Parameters
    ----------
    model : Stepper
        The model, as built for a run.
    controls : dict, optional
        name -> PETSc Vec (default: ``model.default_controls()``).
    steps : int
        Steps of the model exercised (at most its ``n_steps``); every check runs these few.
    variant : Stepper or callable, optional
        A model built with another constructor setting (or a zero-argument callable building one):
        ``describe()`` must differ between the two. Without it ``describe`` is NOT CHECKED.
    factory : callable, optional
        Builds a fresh model like ``model``; the working set is then measured from before
        construction (both bounds). Without it, from the existing model (under-declaration only).
    tolerance : float, optional
        Largest relative mismatch of the per-step dot products (default: the model's
        ``dot_product_tolerance`` or 1e-8, whichever is larger).
    memory_tolerance : float
        Relative tolerance of the working-set comparison (plus the measurement's noise).

    Returns a :class:`ContractReport`, the same on every rank. Raises ValueError for ``steps < 1``, and
    :class:`~hpcadj.collective.Unreachable` on ranks whose model raised while the other ranks wait in
    its collective calls (after the agreement's timeout: only ending the job is left).
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a whole number >= 1, got {steps!r}")
    if model.n_steps is not None:
        steps = min(steps, int(model.n_steps))
    if tolerance is None:
        tolerance = max(DOT_TOLERANCE, float(getattr(model, "dot_product_tolerance", 0.0)))
    comm = model.comm
    if controls is None:
        controls = model.default_controls()
    checker = _Checker(model, controls, steps, seed, tolerance)
    results: dict[str, PropertyResult] = {}
    agreement = Agreement(comm)  # bounded for a rank that raised while the others wait in the model

    def guarded(name, fn, fallback_status=FAILED):
        local = None
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - a model's own error is this property's verdict
            local, result = f"{type(exc).__name__}: {exc}", None
        problem = first_of(agreement.problems(local), comm.size)
        if problem:
            return PropertyResult(name, fallback_status, f"raised {problem}")
        return result

    swept = guarded("step_pure", lambda: checker.sweep() or PropertyResult("step_pure", PASSED, ""))
    overflow = first_problem(comm, checker.overflow) if swept.status != FAILED else None
    if swept.status == FAILED or overflow:
        reason = f"the first sweep {swept.reason}" if swept.status == FAILED else overflow
        results["step_pure"] = PropertyResult("step_pure", FAILED, reason)
        for name in ("snapshot_round_trip", "adjoint_transpose", "adjoint_difference", "parameters_used"):
            results[name] = PropertyResult(name, NOT_CHECKED, "the first sweep gave no finite states to check with")
    else:
        results["step_pure"] = guarded("step_pure", checker.step_pure)
        results["snapshot_round_trip"] = guarded("snapshot_round_trip", checker.snapshot_round_trip)
        results.update(adjoint_properties(checker, guarded))
    results["inputs_untouched"] = guarded("inputs_untouched", checker.inputs_untouched)
    results["describe"] = guarded("describe", lambda: _describe(model, variant))
    results["working_set"] = guarded("working_set",
                                     lambda: _working_set(model, controls, factory, steps, memory_tolerance))
    results["advance"] = guarded("advance", lambda: check_advance(model, controls))
    results["adjoint_data"] = guarded("adjoint_data", lambda: check_adjoint_data(model, controls))
    model.set_controls(controls)
    try:
        facts = model.describe()
        json.dumps(facts)
    except Exception:  # noqa: BLE001 - reported under "describe"
        facts = {"model": getattr(model, "name", type(model).__name__)}
    facts = dict(facts) if isinstance(facts, dict) else {"model": getattr(model, "name", "?")}
    facts.setdefault("model", getattr(model, "name", type(model).__name__))
    agreement.free()
    return ContractReport(model=facts, ranks=comm.size, steps=steps,
                          properties=[results[name] for name in PROPERTIES])


def check_advance(model, controls=None, *, start: int = 1, lengths=None) -> PropertyResult:
    """``advance``: the model's ``advance(i, u, k)`` from u_start against k calls of ``step``, bitwise
    on every rank, with its objective terms too where it evaluates them (``advance_objective``).

    ``lengths`` default: 1, 2, T - 1, T, T + 1 and 2T + 1 (T the model's ``tile_depth()``, 4 without
    one) within the model's steps. Collective; the same result on every rank."""
    if type(model).advance is Stepper.advance:
        return PropertyResult("advance", NOT_CHECKED, "the model has no advance of its own (the default loops step)")
    depth = int(model.tile_depth()) if hasattr(model, "tile_depth") else 4
    n = model.n_steps if model.n_steps is not None else start + 2 * depth + 2
    if lengths is None:
        lengths = (1, 2, depth - 1, depth, depth + 1, 2 * depth + 1)
    lengths = sorted({k for k in lengths if k >= 1 and start + k <= n})
    if not lengths:
        return PropertyResult("advance", NOT_CHECKED, f"the model runs too few steps ({n}) past u_{start}")
    model.set_controls(controls if controls is not None else model.default_controls())
    u = model.initial_state()
    for i in range(start):
        u = model.step(i, u)
    with_terms = bool(getattr(model, "advance_objective", False))
    wrong = None
    for k in lengths:
        stepped, terms = u, []
        for i in range(start, start + k):
            stepped = model.step(i, stepped)
            terms.append(model.objective(i + 1, stepped))
        got = model.advance(start, u, k, objective=with_terms)
        advanced, got_terms = got if with_terms else (got, terms)
        if not _same(_array(advanced), _array(stepped)):
            wrong = wrong or f"advance({start}, u, {k}) differs from {k} steps by up to " \
                             f"{_max_diff(_array(advanced), _array(stepped)):.3g}"
        elif got_terms != terms:
            wrong = wrong or f"advance({start}, u, {k}, objective=True) gives other objective terms than the steps"
    problem = first_problem(model.comm, wrong)
    if problem:
        return PropertyResult("advance", FAILED, problem)
    return PropertyResult("advance", PASSED, f"bitwise k steps for k = {', '.join(map(str, lengths))}"
                          + (f" (tile depth {depth})" if hasattr(model, "tile_depth") else ""))
