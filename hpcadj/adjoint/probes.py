"""``hpcadj check``'s properties for a model without a tangent step, and for controls that must reach it.

- ``adjoint_difference``: <lambda, central difference of ``step(i, .)`` along du> against
  <adjoint_step(lambda), du>, per step exercised, for the state and each control (changed through
  ``set_controls``), and the initial state against ``initial_adjoint``;
- ``parameters_used``: each control that leaves the initial state as it is, changed by
  :data:`PROBE_CHANGE`, must change the first step where the adjoint step predicts a visible change
  (:func:`unread`, the rule a TS model also applies before its first step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..collective import problems

if TYPE_CHECKING:
    from .contract import PropertyResult

#: central differences must agree with the adjoint to this relative mismatch at the best size (a step
#: solved to a tolerance limits what a difference resolves)
DIFFERENCE_TOLERANCE = 1e-4
#: relative difference sizes tried, best first
DIFFERENCE_SIZES = (1e-3, 1e-4, 1e-2, 1e-6)
#: relative change of a control in the probe that it reaches the step
PROBE_CHANGE = 1e-3
#: the smallest predicted change of the step, relative to the state's 1-norm, the probe judges
PROBE_VISIBLE = 1e-6

PASSED, FAILED, NOT_CHECKED = "PASSED", "FAILED", "NOT CHECKED"


def _result(*args, **kw):
    from .contract import PropertyResult

    return PropertyResult(*args, **kw)


def _same(a, b) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def adjoint_properties(checker, guarded) -> dict:
    """adjoint_transpose where the model has a tangent step, else adjoint_difference; and
    parameters_used. ``guarded(name, fn)`` runs one property's check (its exception: FAILED)."""
    if getattr(checker.model, "has_tangent", True):
        return {"adjoint_transpose": guarded("adjoint_transpose", checker.adjoint_transpose),
                "adjoint_difference": _result("adjoint_difference", NOT_CHECKED, "adjoint_transpose checks the "
                                              "adjoint exactly, against the tangent step"),
                "parameters_used": guarded("parameters_used", lambda: parameters_used(checker))}
    out = {"adjoint_transpose": _result("adjoint_transpose", NOT_CHECKED, "the model has no tangent step "
                                        "(has_tangent = False): adjoint_difference checks the adjoint instead"),
           "adjoint_difference": guarded("adjoint_difference", lambda: adjoint_difference(checker))}
    out["parameters_used"] = guarded("parameters_used", lambda: parameters_used(checker))
    return out


def _shifted(vec, eps: float, direction):
    out = vec.copy()
    out.axpy(eps, direction)
    return out


def _size(vec) -> float:
    """The largest magnitude of ``vec`` on any rank, 1 for a zero Vec (a difference's scale)."""
    return vec.norm(_norm_type("NORM_INFINITY")) or 1.0


def _norm_type(name: str):
    from ..imports import petsc

    return getattr(petsc().NormType, name)


def _central(lam, make, exact: float, size: float) -> tuple[float, float]:
    """(relative mismatch, value) of <lam, (make(eps) - make(-eps)) / 2 eps> against ``exact`` at the
    best of :data:`DIFFERENCE_SIZES` (times ``size``), stopping at the first that agrees."""
    best = (float("inf"), float("nan"))
    for rel in DIFFERENCE_SIZES:
        eps = rel * size
        d = make(eps)
        d.axpy(-1.0, make(-eps))
        d.scale(1.0 / (2.0 * eps))
        diff = lam.dot(d)
        floor = 1e-6 * lam.norm() * d.norm()
        mismatch = abs(diff - exact) / max(abs(diff), abs(exact), floor, 1e-300)
        best = min(best, (mismatch, diff), key=lambda pair: pair[0])
        if mismatch <= DIFFERENCE_TOLERANCE:
            break
    return best


def adjoint_difference(checker) -> PropertyResult:
    """<lambda, (step(i, u + eps du) - step(i, u - eps du)) / 2 eps> against <adjoint_step(lambda), du>,
    per step exercised, for the state and each control (changed through ``set_controls``), and the
    initial state against ``initial_adjoint``."""
    from .verify import random_direction

    model, comm, controls = checker.model, checker.comm, checker.controls
    rng = np.random.default_rng(checker.seed + 7919 * comm.rank + 1)
    direction = random_direction(model, controls, checker.seed)
    reads_next = getattr(model, "adjoint_reads_next", True)
    worst, failures = 0.0, []

    def judge(where, mismatch, diff, exact):
        nonlocal worst
        worst = max(worst, mismatch)
        if not mismatch <= DIFFERENCE_TOLERANCE:
            failures.append(f"{where}: central difference {diff:.6e}, adjoint {exact:.6e} (relative mismatch "
                            f"{mismatch:.1e} > {DIFFERENCE_TOLERANCE:.0e})")

    try:
        for i in sorted({0, checker.steps - 1}):
            u, un = checker.state(i), checker.state(i + 1)
            lam, du = checker._random_state(rng, u), checker._random_state(rng, u)
            grad = checker._zero_controls()
            back = model.adjoint_step(i, u, un if reads_next else None, lam, grad)
            model.set_controls(controls)
            size = _size(u) / _size(du)
            mismatch, diff = _central(lam, lambda eps: model.step(i, _shifted(u, eps, du)), back.dot(du), size)
            judge(f"step {i}, the state", mismatch, diff, back.dot(du))
            for name in sorted(controls):
                def shifted_step(eps, name=name):
                    model.set_controls({**controls, name: _shifted(controls[name], eps, direction[name])})
                    return model.step(i, u)
                exact = grad[name].dot(direction[name])
                size = _size(controls[name]) / _size(direction[name])
                mismatch, diff = _central(lam, shifted_step, exact, size)
                judge(f"step {i}, control {name!r}", mismatch, diff, exact)
            model.set_controls(controls)
        lam0 = checker._random_state(rng, checker.states[0])
        grad = checker._zero_controls()
        model.initial_adjoint(lam0, grad)
        for name in sorted(controls):
            def shifted_start(eps, name=name):
                model.set_controls({**controls, name: _shifted(controls[name], eps, direction[name])})
                return model.initial_state()
            exact = grad[name].dot(direction[name])
            size = _size(controls[name]) / _size(direction[name])
            mismatch, diff = _central(lam0, shifted_start, exact, size)
            judge(f"initial state, control {name!r}", mismatch, diff, exact)
    finally:
        model.set_controls(controls)
    details = {"worst_relative_mismatch": worst, "tolerance": DIFFERENCE_TOLERANCE}
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        return _result("adjoint_difference", FAILED,
                              f"adjoint_step disagrees with central differences of step at {failures[0]}{more}",
                              details)
    return _result("adjoint_difference", PASSED,
                          f"adjoint products agree with central differences of step (worst relative mismatch "
                          f"{worst:.1e} <= {DIFFERENCE_TOLERANCE:.0e})", details)


def perturbed(comm, vec):
    """``vec`` changed by :data:`PROBE_CHANGE` of each entry (of the largest where an entry is zero)."""
    out = vec.copy()
    values = out.getArray()
    scale = _size(vec)
    values += PROBE_CHANGE * np.where(values != 0.0, np.abs(values), scale)
    return out


def unread(comm, base, other, predicted: float) -> bool:
    """The rule for a control the step does not read: the step from the changed control ``other`` is
    bitwise ``base`` where the adjoint predicts a change <1, delta u> of ``predicted``, above
    :data:`PROBE_VISIBLE` of the state's 1-norm (far above round-off and solver tolerances)."""
    moved = problems(comm, None if np.array_equal(other.getArray(readonly=True), base.getArray(readonly=True))
                     else "moved")
    return not moved and predicted > PROBE_VISIBLE * base.norm(_norm_type("NORM_1"))


def parameters_used(checker) -> PropertyResult:
    """Each control that leaves the initial state as it is, changed, must change the first step where
    the adjoint step (from lambda = 1) predicts a visible change; one the step hardly touches passes."""
    model, comm, controls = checker.model, checker.comm, checker.controls
    u0, u1 = checker.state(0), checker.state(1)
    reads_next = getattr(model, "adjoint_reads_next", True)
    checked, initial = [], []
    try:
        for name in sorted(controls):
            changed = perturbed(comm, controls[name])
            model.set_controls({**controls, name: changed})
            if problems(comm, None if _same(model.initial_state().getArray(readonly=True), checker.arrays[0])
                        else "initial"):
                initial.append(name)
                continue
            other = model.step(0, u0)
            model.set_controls(controls)
            lam = u1.duplicate()
            lam.set(1.0)
            grad = checker._zero_controls()
            model.adjoint_step(0, u0, u1 if reads_next else None, lam, grad)
            delta = changed.copy()
            delta.axpy(-1.0, controls[name])
            predicted = abs(grad[name].dot(delta))
            if unread(comm, u1, other, predicted):
                return _result("parameters_used", FAILED,
                                      f"control {name!r} changed by {PROBE_CHANGE:g} (relative) leaves step 0 bitwise "
                                      f"the same where the adjoint step predicts a change of {predicted:.2g}: the "
                                      f"step does not read the value set_controls gives it")
            checked.append(name)
    finally:
        model.set_controls(controls)
    parts = []
    if checked:
        parts.append(f"changing {', '.join(checked)} changes the first step (or its adjoint says it hardly can)")
    if initial:
        parts.append(f"{', '.join(initial)} set the initial state")
    return _result("parameters_used", PASSED, "; ".join(parts) or "no controls")
