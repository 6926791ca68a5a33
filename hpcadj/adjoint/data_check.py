"""Check a model's declared adjoint data against what its adjoint step reads (``hpcadj check``, runs).

For a few steps i from random states u_i: the data captured from (u_i, u_{i+1}) must match the declared
layout, and after a step from another state (so nothing the model kept of step i is left to read) the
adjoint step and the objective's gradient run from the data's stand-in state must give lambda_i and
dJ/dp bitwise as they do from u_i. A model whose data leave out something its
adjoint step reads fails here, before any gradient is reported. Collective.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np

from ..buffers import release_idle_buffers
from ..checkpoint.options import ConfigError
from ..collective import Agreement, first_of, first_problem
from ..imports import petsc


def _bits(vec) -> np.ndarray:
    return np.ascontiguousarray(vec.getArray(readonly=True)).view(np.uint8).copy()


def _random_like(vec, rng):
    """A Vec shaped as ``vec`` with uniform values; a composite state (``map``) part by part."""
    if hasattr(vec, "map"):
        return vec.map(lambda part: _random_like(part, rng))
    out = vec.duplicate()
    out.getArray()[...] = rng.uniform(-1.0, 1.0, vec.getLocalSize())
    return out


def _layout_problem(data, layout) -> str | None:
    if set(data) != set(layout):
        return f"fields {sorted(data)}, declared {sorted(layout)}"
    for name, field in layout.items():
        if np.shape(data[name]) != tuple(field.shape):
            return f"field {name!r} has this rank's shape {np.shape(data[name])}, declared {tuple(field.shape)}"
    return None


def _drop_garbage(comm) -> None:
    """Destroy the Vecs dropped so far (collective), so the check holds a few states at a time."""
    gc.collect()
    petsc().garbage_cleanup(comm)


def adjoint_data_problem(model, controls, steps: int = 2, seed: int = 41) -> tuple[str | None, str]:
    """(the first problem on any rank or None, what was checked), the same on every rank. A model's
    exception in the check is its problem (``"step i: ValueError: ..."``), agreed like the others;
    where the ranks that did not raise wait in the model's own collective calls instead,
    :class:`~hpcadj.collective.Unreachable` on the raising ranks after the agreement's timeout."""
    layout = model.adjoint_data_layout()
    if layout is None:
        return None, ""
    comm = model.comm
    model.set_controls(controls)
    rng = np.random.default_rng(seed + comm.rank)
    like = model.initial_state()
    n = steps if model.n_steps is None else min(steps, int(model.n_steps))
    with Agreement(comm) as agreement:
        for i in range(n):
            raised = None
            try:
                problem = _step_problem(model, controls, layout, i, like, rng)
            except MemoryError:
                raise
            except Exception as exc:  # noqa: BLE001 - a model's own error is the check's verdict
                lines = str(exc).strip().splitlines()
                problem, raised = None, f"step {i}: {type(exc).__name__}{': ' + lines[0] if lines else ''}"
            problem = first_of(agreement.problems(raised), comm.size) or problem
            if problem:
                return problem, ""
            _drop_garbage(comm)
    return None, f"adjoint steps {0}..{n - 1} from their data bitwise as from the states"


def _step_problem(model, controls, layout, i: int, like, rng) -> str | None:
    """Step i's problem on any rank (its data's layout, or an adjoint step from them that differs),
    or None; the same on every rank. Collective."""
    comm = model.comm
    u = _random_like(like, rng)
    u_next = model.step(i, u)
    lam = _random_like(like, rng)
    data = model.adjoint_data(i, u, u_next)
    wrong = _layout_problem(data, layout)
    problem = first_problem(comm, wrong and f"step {i}'s adjoint data do not match adjoint_data_layout(): {wrong}")
    if problem:
        return problem
    model.step(i, _random_like(like, rng))  # whatever a model keeps of its last step is now another's
    _drop_garbage(comm)
    first, differ = None, []
    for state, following in ((model.adjoint_data_state(i, data), None),
                             (u, u_next if model.adjoint_reads_next else None)):
        grad = {name: vec.duplicate() for name, vec in controls.items()}
        for vec in grad.values():
            vec.set(0.0)
        out = model.adjoint_step(i, state, following, lam, grad)
        model.add_objective_gradient(i, state, out)
        bits = [_bits(out)] + [_bits(grad[name]) for name in sorted(grad)]
        del state, grad, out
        _drop_garbage(comm)
        if first is None:
            first = bits
        else:
            names = ["lambda"] + [f"dJ/d{k}" for k in sorted(controls)]
            differ = [what for what, a, b in zip(names, first, bits) if not np.array_equal(a, b)]
        del bits
    return first_problem(comm, differ and (
        f"adjoint step {i} from its declared data gives another {', '.join(differ)} than "
        f"from u_{i} (the data leave out something the adjoint step reads)"))


def check_adjoint_data(model, controls=None):
    """``adjoint_data`` as a contract property (NOT CHECKED for a model that declares none)."""
    from .contract import FAILED, NOT_CHECKED, PASSED, PropertyResult

    if model.adjoint_data_layout() is None:
        return PropertyResult("adjoint_data", NOT_CHECKED, "the model declares no adjoint data")
    controls = controls if controls is not None else model.default_controls()
    problem, checked = adjoint_data_problem(model, controls)
    if not problem:  # a model with Hessian products: the composite's data too (what its second-order step reads)
        from .hessian import data_composite

        found = data_composite(model, controls)
        if found is not None:
            problem, _ = adjoint_data_problem(*found)
            problem = problem and f"the Hessian composite ({found[0].describe()['hessian']}): {problem}"
            checked += "; the Hessian composite's likewise"
    if problem:
        return PropertyResult("adjoint_data", FAILED, problem)
    return PropertyResult("adjoint_data", PASSED, checked)


class _TrustedModels:
    """The model objects whose declared data passed, by identity, held weakly: nothing is set on the
    user's object, and an object's entry leaves with it, so a new object (even at a reused address) is
    checked. The data are the model's code, not its controls: an inversion's or hesscheck's later
    sessions on the same object do not check again. An object that takes no weak reference is checked
    every time."""

    def __init__(self):
        self._refs: dict[int, weakref.ref] = {}

    def __contains__(self, model) -> bool:
        ref = self._refs.get(id(model))
        return ref is not None and ref() is model

    def add(self, model) -> None:
        key = id(model)

        def forget(ref, key=key):
            if self._refs.get(key) is ref:
                del self._refs[key]

        try:
            self._refs[key] = weakref.ref(model, forget)
        except TypeError:  # __slots__ without __weakref__: not remembered
            pass


TRUSTED = _TrustedModels()


def refuse_untrusted_data(model, controls, plan: str = "--schedule mixed") -> None:
    """ConfigError on every rank, before any gradient, when a model's declared adjoint data disagree
    with what its adjoint step reads (``plan``, a mixed plan, would reverse steps from them); once per
    model object (``TRUSTED``; a model may name what stands for it there: ``data_trust_key``)."""
    key = getattr(model, "data_trust_key", model)
    if key in TRUSTED:
        return
    problem, _ = adjoint_data_problem(model, controls, steps=1)
    # the check's states would stay in the model's pools beside the run's slots, after its baseline
    release_idle_buffers()
    if problem:
        raise ConfigError(f"{plan} cannot trust {model.name!r}'s adjoint data: {problem}; "
                          f"see 'hpcadj check'")
    TRUSTED.add(key)
