"""What is decided about a user's TS before its first step: one line for what cannot work.

- the arguments: the objective's value (a number, alike on every rank) and gradient (a Vec laid
  out as the state), the parameter Vec (laid out as the RHSJacobianP's columns), the Jacobian's
  layout against u0;
- what PETSc itself can do with the TS, asked of PETSc: one step from u0 (``TSStep``: GLLE has no
  step method, it only solves whole), then one adjoint step back (``TSAdjointStep``: only RK and θ
  methods have one in PETSc 3.18); a size PETSc's adjoint finds wrong (the parameter Vec against
  an IJacobianP's columns, which petsc4py cannot read) is named;
- that the parameter reaches the step: the step is taken again with the parameter changed a little;
  bitwise the same state where PETSc's adjoint step predicts a visible change means the callbacks
  never read the value hpcadj sets (the rule of ``hpcadj check``'s parameters_used).

Everything here is collective and decided alike on every rank.
"""

from __future__ import annotations

import contextlib
import numbers

import numpy as np

from ..collective import problems
from ..imports import petsc
from ..models.base import SolverError


def _kind(obj) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ not in ("builtins",) else kind.__name__


def _layout_mismatch(comm, size: int, local: int, want_size: int, want_local: int) -> str | None:
    """None where the sizes agree globally and on every rank; else the counts, alike on every rank."""
    if size != want_size:
        return f"{size} entries where {want_size} are expected"
    rows = comm.allgather((local, want_local))
    for rank, (have, want) in enumerate(rows):
        if have != want:
            return f"{have} entries on rank {rank} where {want} are expected (laid out differently)"
    return None


def _agreed(comm, problem: str | None) -> str | None:
    """The first rank's problem, on every rank (a callback may go wrong on some ranks only)."""
    failed = problems(comm, problem)
    return failed[0][1] if failed else None


def check_value(comm, where: str, value) -> str | None:
    """``value`` must be a real number, the same on every rank."""
    PETSc = petsc()
    local = None
    if isinstance(value, PETSc.Vec):
        local = (f"{where} returned a PETSc Vec, not a number: return the value as a float, the same on every "
                 f"rank (e.g. u.dot(u) / 2)")
    else:
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            local = f"{where} returned a {_kind(value)}, not a number: return a float, the same on every rank"
    problem = _agreed(comm, local)
    if problem:
        return problem
    values = comm.allgather(float(value))
    if len({v for v in values if v == v}) > 1:
        return (f"{where} differs between ranks ({min(values):.6g} .. {max(values):.6g}): reduce it over the "
                f"communicator (Vec.dot, Vec.norm and Vec.sum do)")
    return None


def check_gradient(comm, where: str, grad, u0, allow_none: bool = False) -> str | None:
    """``grad`` must be a PETSc Vec laid out as the state u0."""
    PETSc = petsc()
    local = None
    if not (grad is None and allow_none) and not isinstance(grad, PETSc.Vec):
        local = (f"{where} returned a {_kind(grad)}, not a PETSc Vec: return a Vec laid out as the state "
                 f"(e.g. u.copy() scaled, or u.duplicate() filled)")
    problem = _agreed(comm, local)
    if problem:
        return problem
    absent = [rank for rank, _ in problems(comm, "None" if grad is None else None)]
    if absent:
        return None if len(absent) == comm.size else \
            f"{where} returned None on rank {absent[0]} but a Vec on others: return the same on every rank"
    wrong = _layout_mismatch(comm, grad.getSize(), grad.getLocalSize(), u0.getSize(), u0.getLocalSize())
    if wrong:
        return f"{where} returned a Vec of {wrong} (the state's layout): lay it out as the state (u.duplicate())"
    return None


def check_objective(stepper, u0) -> str | None:
    """The objective's terms at u0: values numbers, gradients Vecs laid out as u0."""
    comm = stepper.comm
    if stepper._final is not None:
        value, gradient = stepper._final
        problem = check_value(comm, "final's value(u)", value(u0)) or \
            check_gradient(comm, "final's gradient(u)", gradient(u0), u0)
        if problem:
            return problem
    if stepper._every is not None:
        value, gradient = stepper._every
        t0 = stepper.t0
        problem = check_value(comm, "every_step's value(i, t, u)", value(0, t0, u0)) or \
            check_gradient(comm, "every_step's gradient(i, t, u)", gradient(0, t0, u0), u0, allow_none=True)
        if problem:
            return problem
    return None


def check_layouts(stepper) -> str | None:
    """u0 and the parameter Vec against the TS's Jacobian and RHSJacobianP (where petsc4py reads them)."""
    from . import _capi

    PETSc = petsc()
    ts, comm, u0 = stepper.ts, stepper.comm, stepper._u0
    if not isinstance(u0, PETSc.Vec):
        return f"u0 is a {_kind(u0)}, not a PETSc Vec: give the initial state as a Vec"
    jac = ts.getIJacobian()[0] if ts.getIJacobian()[0] is not None else ts.getRHSJacobian()[0]
    if jac is not None and jac.handle:
        (lrows, rows), _ = jac.getSizes()              # petsc4py: ((local, global), (local, global))
        wrong = _layout_mismatch(comm, u0.getSize(), u0.getLocalSize(), rows, lrows)
        if wrong:
            return (f"u0 has {wrong} (the TS's Jacobian's rows): lay u0 out as the Jacobian's rows (the DM's "
                    f"global Vec)")
    if stepper._pname is None:
        return None
    p, name = stepper._p0, stepper._pname
    if not isinstance(p, PETSc.Vec):
        return (f"parameters[{name!r}] is a {_kind(p)}, not a PETSc Vec: give a Vec laid out as the "
                f"JacobianP's columns")
    handle = _capi.rhs_jacobian_p(ts)
    if handle:
        (cols, lcols) = _capi.mat_columns(handle)
        wrong = _layout_mismatch(comm, p.getSize(), p.getLocalSize(), cols, lcols)
        if wrong:
            return (f"parameters[{name!r}] has {wrong} (the RHSJacobianP's columns): lay the Vec out as the "
                    f"JacobianP's columns")
    elif "__ijacobianp__" not in (ts.getDict() or {}):
        return (f"parameters[{name!r}] is given but the TS has no JacobianP: set ts.setRHSJacobianP or "
                f"ts.setIJacobianP (PETSc's adjoint reads the parameter's derivative there)")
    return None


def _petsc_reason(exc) -> str:
    """The last line of a PETSc error: what went wrong, without the trace."""
    lines = [line.split("] ", 1)[-1].strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _alternatives(current: str) -> str:
    kinds = ["rk", "cn", "beuler", "theta"] + (["arkimex"] if _has_arkimex_adjoint() else [])
    return ", ".join(f"-ts_type {k}" for k in kinds if k != current)


def _has_arkimex_adjoint() -> bool:
    return tuple(petsc().Sys.getVersion())[:2] >= (3, 19)


def dry_run(stepper) -> str | None:
    """One step from u0, one adjoint step back and the parameter probe; the first problem, or None.

    A step that does not converge at the TS's first dt decides nothing here (the run reports it)."""
    PETSc = petsc()
    u0 = stepper._u0
    version = ".".join(str(v) for v in tuple(PETSc.Sys.getVersion())[:3])
    dt = stepper._dt0 if stepper.dt is None else stepper.dt
    saved_last = stepper._last_taken
    try:
        try:
            base = stepper._probe_step(u0, dt)
        except PETSc.Error as exc:
            if "No method step" in str(exc):
                return (f"PETSc {version}'s TS type {stepper.ts_type} cannot take one step at a time (TSStep: "
                        f"{_petsc_reason(exc)}; it only solves whole): choose {_alternatives(stepper.ts_type)}")
            return f"the TS's first step from u0 fails in PETSc: {_petsc_reason(exc)}"
        except SolverError:
            return None
        lam = u0.duplicate()
        lam.set(1.0)
        mu = None
        if stepper._pname is not None:
            mu = stepper._p0.duplicate()
            mu.set(0.0)
        found = []
        try:
            with _ijacobian_p_checked(stepper, found):
                stepper._adjoint(0, stepper.t0, stepper.t0 + dt, dt, u0, base, lam, mu)
        except SolverError:
            return None
        except Exception as exc:                   # a mismatch found comes back as the callback's error
            if found:
                return found[0]
            if not isinstance(exc, PETSc.Error):
                raise
            if "No method adjointstep" in str(exc):
                return (f"PETSc {version} has no adjoint step for TS type {stepper.ts_type} (TSAdjointStep: "
                        f"{_petsc_reason(exc)}): choose {_alternatives(stepper.ts_type)}")
            if mu is not None and "size" in str(exc).lower():
                return (f"parameters[{stepper._pname!r}] ({stepper._p0.getSize()} entries) does not fit the "
                        f"TS's JacobianP in PETSc's adjoint step ({_petsc_reason(exc)}): lay the Vec out as "
                        f"the JacobianP's columns")
            return f"PETSc's adjoint step of this TS fails before the first step: {_petsc_reason(exc)}"
        if mu is None:
            return None
        return _parameter_probe(stepper, u0, dt, base, mu)
    finally:
        stepper._last_taken = saved_last


@contextlib.contextmanager
def _ijacobian_p_checked(stepper, found: list):
    """The user's IJacobianP callback wrapped, while in the context, to compare the matrix PETSc hands
    it (petsc4py 3.18 reads it nowhere else) with the parameter Vec, on every rank at once: a
    mismatch on some ranks only would otherwise take those into an error and the rest into the
    product's communication. A mismatch goes into ``found`` and fails the adjoint step on every rank."""
    entries = stepper.ts.getDict()
    original = entries.get("__ijacobianp__")
    if original is None or stepper._pname is None:
        yield
        return
    function, args, kwargs = original
    p, name, comm = stepper._p0, stepper._pname, stepper.comm

    def checked(ts, t, u, udot, shift, C, *more, **kw):
        lcols, cols = C.getSizes()[1]                  # ((local, global) rows, (local, global) columns)
        wrong = _layout_mismatch(comm, p.getSize(), p.getLocalSize(), cols, lcols)
        if wrong:
            found.append(f"parameters[{name!r}] has {wrong} (the IJacobianP's columns): lay the Vec out as "
                         f"the JacobianP's columns")
            raise ValueError(found[-1])
        return function(ts, t, u, udot, shift, C, *more, **kw)

    entries["__ijacobianp__"] = (checked, args, kwargs)
    try:
        yield
    finally:
        entries["__ijacobianp__"] = original


def _parameter_probe(stepper, u0, dt, base, mu) -> str | None:
    """The step again with the parameter changed by δp: it must change where PETSc's adjoint step
    predicts a visible change <1, Δu> = <μ, δp> (the rule of ``hpcadj check``'s parameters_used)."""
    from ..adjoint.probes import PROBE_CHANGE, perturbed, unread

    comm, name = stepper.comm, stepper._pname
    p = stepper._p_initial
    changed = perturbed(comm, p)
    delta = changed.copy()
    delta.axpy(-1.0, p)
    predicted = abs(mu.dot(delta))
    try:
        stepper._apply_parameter(changed)
        try:
            other = stepper._probe_step(u0, dt)
        except SolverError:
            return None
    finally:
        stepper._apply_parameter(p)
    if not unread(comm, base, other, predicted):
        return None
    route = ("apply_parameters(vec) does not pass the value on to them" if stepper._apply is not None else
             f"hpcadj writes each new value into the Vec given as parameters={{{name!r}: vec}}: read it from "
             f"there, or pass apply_parameters=")
    return (f"parameter {name!r} does not reach the TS: changing it by {PROBE_CHANGE:g} (relative) leaves the "
            f"step bitwise the same where PETSc's adjoint step (the JacobianP) predicts a change of "
            f"{predicted:.2g}, so the gradient would be for the old value; the callbacks must use the current "
            f"value: {route}")
