"""Hessian-vector products H v of the objective, checkpointed exactly as gradients are.

H v = d/de grad J(m + e v) at e = 0 is computed forward-over-reverse: a tangent-linear sweep carries
du_i (the states' derivative in direction v) beside u_i, and a second-order adjoint sweep carries
dlam_i beside the first-order lam_i. Both sweeps are those of one *composite* stepper,
:class:`SecondOrderStepper`, whose state is the pair (u_i, du_i) and whose adjoint is the pair
(lam_i, dlam_i). The driver, the plans, the storage levels, compression, asynchronous I/O and restart
run it unchanged: a snapshot holds both fields (the model's fields and the same prefixed ``d_``), so a
plan's budget counts the pair as one (twice as large) state, and H v is bitwise the same under every
plan, as gradients are.

The composite's controls are the model's controls m plus the direction v under the names
``d_<control>``; its "gradient" dict holds dJ/dm under the model's names and (H v) under the ``d_``
names. With ``gauss_newton=True`` the second derivatives of the time step are dropped (the
Gauss-Newton product J_m^T (d^2 J/du^2) J_m v of FWI codes): the second-order adjoint is then the
first-order adjoint step applied to dlam, which every model has.

What a model provides (declared in :class:`hpcadj.models.base.SecondOrderSteps`):
``add_objective_hessian(i, u, du, dlam)`` (both products) and ``hessian_adjoint_step(...)`` (the
exact Newton product). All four built-in models do, for fixed steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checkpoint.schedules.storeall import StoreAll, store_all_slots
from ..checkpoint.storage import RamLevel
from ..snapshot import layout_global_bytes
from .driver import Driver, GradientResult
from .verify import evaluate_objective, random_direction

PREFIX = "d_"


class Pair:
    """A composite state (u, du) or adjoint (lam, dlam): two Vecs of the model's state layout."""

    __slots__ = ("u", "d")

    def __init__(self, u, d):
        self.u, self.d = u, d

    def duplicate(self) -> "Pair":
        return Pair(self.u.duplicate(), self.d.duplicate())

    def set(self, value: float) -> None:
        self.u.set(value)
        self.d.set(value)

    def destroy(self) -> None:
        self.u.destroy()
        self.d.destroy()

    def getArray(self, readonly: bool = True):
        """Both Vecs' local values in one new array (what the driver's finiteness and input guards
        read; a copy, never written through)."""
        if not readonly:
            raise ValueError("a Pair's values are read-only through getArray")
        return np.concatenate((self.u.getArray(readonly=True), self.d.getArray(readonly=True)))

    def copy(self, out: "Pair | None" = None) -> "Pair":
        if out is None:
            return Pair(self.u.copy(), self.d.copy())
        self.u.copy(out.u)
        self.d.copy(out.d)
        return out


def _zero_like(vec):
    out = vec.duplicate()
    out.set(0.0)
    return out


def supports_newton(model) -> bool:
    """Whether ``model`` offers the exact (Newton) second-order adjoint step."""
    return callable(getattr(model, "hessian_adjoint_step", None))


def check_model(model, gauss_newton: bool) -> None:
    """ValueError (one line) when ``model`` cannot give the asked product."""
    if model.n_steps is None or getattr(model, "adaptive", False):  # no evaluation's step sequence is kept
        raise ValueError(f"{model.name}: Hessian actions need a fixed step count (adaptive steps are not supported)")
    if not callable(getattr(model, "add_objective_hessian", None)):
        raise ValueError(f"{model.name}: no add_objective_hessian(i, u, du, dlam): the model offers no "
                         f"Hessian actions")
    if not gauss_newton and not supports_newton(model):
        raise ValueError(f"{model.name}: no hessian_adjoint_step: only the Gauss-Newton product is available")


class SecondOrderStepper:
    """The model's forward + tangent step as one stepper; its adjoint is the first- and second-order
    adjoint together. Implements the Stepper seam (:mod:`hpcadj.models.base`), so any plan runs it.

    ``direction`` is v (control name -> Vec); it can also come with the controls as ``d_<name>``.
    """

    def __init__(self, model, direction=None, *, gauss_newton: bool = False):
        check_model(model, gauss_newton)
        self.model = model
        self.comm = model.comm
        self.name = model.name
        self.n_steps = model.n_steps
        self.dt = model.dt
        self.gauss_newton = bool(gauss_newton)
        self.adjoint_reads_next = getattr(model, "adjoint_reads_next", True)
        self.names = sorted(model.control_layout())
        self.direction = None if direction is None else {k: direction[k].copy() for k in self.names}

    # -- controls ---------------------------------------------------------------------------
    def composite_controls(self, controls, direction=None) -> dict:
        """The composite's controls: m under the model's names, v under ``d_<name>``."""
        direction = direction if direction is not None else self.direction
        out = {k: controls[k] for k in self.names}
        out.update({PREFIX + k: direction[k] for k in self.names})
        return out

    def default_controls(self):
        controls = self.model.default_controls()
        if self.direction is None:
            direction = {k: _zero_like(v) for k, v in controls.items()}
        else:
            direction = {k: v.copy() for k, v in self.direction.items()}
        return self.composite_controls(controls, direction)

    def set_controls(self, controls):
        self.model.set_controls({k: controls[k] for k in self.names})
        if PREFIX + self.names[0] in controls:
            self.direction = {k: controls[PREFIX + k].copy() for k in self.names}
        if self.direction is None:
            raise ValueError("no direction v: give it to SecondOrderStepper or as d_<control> controls")

    def initial_state(self):
        return Pair(self.model.initial_state(), self.model.initial_tangent(self.direction))

    # -- forward ----------------------------------------------------------------------------
    def step(self, i, u):
        nxt = self.model.step(i, u.u)
        return Pair(nxt, self.model.tangent_step(i, u.u, nxt, u.d, self.direction))

    def objective(self, i, u):
        return self.model.objective(i, u.u)

    def objective_gradient(self, i, u):
        lam = self.model.objective_gradient(i, u.u)
        if lam is None:
            lam = _zero_like(u.u)
        dlam = _zero_like(u.d)
        self.model.add_objective_hessian(i, u.u, u.d, dlam)
        return Pair(lam, dlam)

    def add_objective_gradient(self, i, u, lam):
        self.model.add_objective_gradient(i, u.u, lam.u)
        self.model.add_objective_hessian(i, u.u, u.d, lam.d)

    # -- adjoint ----------------------------------------------------------------------------
    def _split(self, grad):
        return {k: grad[k] for k in self.names}, {k: grad[PREFIX + k] for k in self.names}

    def adjoint_step(self, i, u, u_next, lam_next, grad):
        g, hg = self._split(grad)
        un, dun = (None, None) if u_next is None else (u_next.u, u_next.d)
        if self.gauss_newton:
            lam = self.model.adjoint_step(i, u.u, un, lam_next.u, g)
            dlam = self.model.adjoint_step(i, u.u, un, lam_next.d, hg)
        else:
            lam, dlam = self.model.hessian_adjoint_step(i, u.u, un, u.d, dun, lam_next.u, lam_next.d,
                                                        self.direction, g, hg)
        return Pair(lam, dlam)

    def initial_adjoint(self, lam0, grad):
        g, hg = self._split(grad)
        self.model.initial_adjoint(lam0.u, g)
        self.model.initial_adjoint(lam0.d, hg)

    # -- tangent of the composite (not needed for H v) ---------------------------------------
    def initial_tangent(self, dcontrols):
        raise NotImplementedError("the composite stepper has no tangent of its own")

    def tangent_step(self, i, u, u_next, du, dcontrols):
        raise NotImplementedError("the composite stepper has no tangent of its own")

    # -- snapshots --------------------------------------------------------------------------
    def snapshot_layout(self):
        layout = self.model.snapshot_layout()
        return {**layout, **{PREFIX + k: v for k, v in layout.items()}}

    def snapshot(self, u):
        snap = self.model.snapshot(u.u)
        snap.update({PREFIX + k: v for k, v in self.model.snapshot(u.d).items()})
        return snap

    def restore(self, snapshot):
        fields = self.model.snapshot_layout()
        return Pair(self.model.restore({k: snapshot[k] for k in fields}),
                    self.model.restore({k: snapshot[PREFIX + k] for k in fields}))

    def control_layout(self):
        layout = self.model.control_layout()
        return {**layout, **{PREFIX + k: v for k, v in layout.items()}}

    def control_arrays(self, controls):
        plain = self.model.control_arrays({k: controls[k] for k in self.names})
        pref = self.model.control_arrays({k: controls[PREFIX + k] for k in self.names})
        return {**plain, **{PREFIX + k: v for k, v in pref.items()}}

    # -- description ------------------------------------------------------------------------
    def time(self, i):
        return self.model.time(i)

    def describe(self):
        return {**self.model.describe(), "hessian": "gauss-newton" if self.gauss_newton else "newton"}

    def working_set_states(self) -> float:
        """In composite states (two model states): the model's own, the direction's copies and the
        tangent/second-order transients (about two model states)."""
        return 0.5 * self.model.working_set_states() + 1.0 + 0.5 * len(self.names)

    def snapshot_bytes(self) -> int:
        return layout_global_bytes(self.snapshot_layout())


@dataclass
class HessianResult:
    """J, dJ/dm and H v (control name -> Vec each) at the controls m, for direction v."""

    J: float
    gradient: dict
    hessian: dict
    result: GradientResult

    @property
    def forward_steps(self) -> int:
        return self.result.forward_steps


def _result(stepper, result: GradientResult) -> HessianResult:
    g, hg = stepper._split(result.gradient)
    return HessianResult(J=result.J, gradient=g, hessian=hg, result=result)


def hessian_action(model, controls, direction, *, schedule=None, levels=None, gauss_newton: bool = False,
                   telemetry=None) -> HessianResult:
    """J, dJ/dm and H v at ``controls`` for ``direction`` (control name -> Vec) in one forward +
    reverse sweep of the composite stepper; ``schedule`` and ``levels`` as for a gradient's
    :class:`~.driver.Driver` (their snapshots hold the pair), by default store-all in RAM."""
    stepper = SecondOrderStepper(model, direction, gauss_newton=gauss_newton)
    own_levels = schedule is None
    if own_levels:
        slots = store_all_slots(stepper.n_steps)
        levels = [RamLevel(slots, stepper.snapshot_layout())]
        schedule = StoreAll(stepper.n_steps, [slots])
    try:
        result = Driver(stepper, levels, telemetry).run(schedule, stepper.composite_controls(controls))
    finally:
        if own_levels:
            for level in levels:
                level.close()
    return _result(stepper, result)


class HessianSession:
    """H v under a :class:`~.session.GradientSession`'s checkpointing (budgets, levels, plans,
    compression, restart, logs): each :meth:`hessian_action` is one composite gradient run.

    ``session_options`` go to every GradientSession (``restart``, ``log_dir``, ...);
    ``last_outcome`` is the last run's :class:`~.session.Outcome` (its ``info``: steps, memory, ...).
    """

    def __init__(self, model, checkpointing=None, *, gauss_newton: bool = False, **session_options):
        check_model(model, gauss_newton)
        self.model = model
        self.checkpointing = checkpointing
        self.gauss_newton = gauss_newton
        self.session_options = session_options
        self.last_session = self.last_outcome = None

    def hessian_action(self, controls, v) -> HessianResult:
        """J, dJ/dm and H v at ``controls`` (name -> Vec) for direction ``v`` (name -> Vec)."""
        from .session import GradientSession

        stepper = SecondOrderStepper(self.model, v, gauss_newton=self.gauss_newton)
        session = GradientSession(stepper, self.checkpointing, controls=stepper.composite_controls(controls, v),
                                  **self.session_options)
        self.last_session = session
        outcome = self.last_outcome = session.solve()
        if outcome.status != "complete":
            raise RuntimeError(outcome.message)
        return _result(stepper, outcome.result)


# -- verification ---------------------------------------------------------------------------
def _dot(a: dict, b: dict) -> float:
    return sum(a[k].dot(b[k]) for k in sorted(a))


def _shifted(controls, eps, direction):
    out = {k: v.copy() for k, v in controls.items()}
    for k in direction:
        out[k].axpy(eps, direction[k])
    return out


def scaled_direction(model, controls, seed: int, scale: dict | None = None) -> dict:
    """A random direction over every control, each relative to its control's size (u0-like
    controls, possibly zero, get absolute entries), times ``scale[name]`` if given."""
    direction = random_direction(model, controls, seed, relative=False)
    for name, vec in direction.items():
        size = controls[name].norm() / math.sqrt(max(controls[name].getSize(), 1))
        factor = size if size > 0 else 1.0
        vec.scale(factor * (scale or {}).get(name, 1.0))
    return direction


@dataclass
class SecondOrderTaylor:
    eps: list
    remainders: list
    rates: list

    @property
    def min_rate(self) -> float:
        return min(self.rates)


def second_order_taylor_test(model, controls, direction, *, eps0: float = 1e-2, halvings: int = 4,
                             hess: HessianResult | None = None) -> SecondOrderTaylor:
    """|J(m + e v) - J(m) - e <g, v> - e^2/2 <v, H v>| for e = eps0 / 2^k: rate -> 3 when H v is exact."""
    hess = hess or hessian_action(model, controls, direction)
    gv, vhv = _dot(hess.gradient, direction), _dot(hess.hessian, direction)
    eps_list, rem = [], []
    for k in range(halvings + 1):
        eps = eps0 / 2 ** k
        J = evaluate_objective(model, _shifted(controls, eps, direction))
        eps_list.append(eps)
        rem.append(abs(J - hess.J - eps * gv - 0.5 * eps * eps * vhv))
    model.set_controls(controls)
    rates = [math.log(rem[k] / rem[k + 1], 2) if rem[k + 1] > 0 else math.inf for k in range(halvings)]
    return SecondOrderTaylor(eps_list, rem, rates)


def symmetry_test(model, controls, v, w, *, gauss_newton: bool = False) -> tuple[float, float]:
    """(<H v, w>, <v, H w>): equal for an exact H."""
    hv = hessian_action(model, controls, v, gauss_newton=gauss_newton).hessian
    hw = hessian_action(model, controls, w, gauss_newton=gauss_newton).hessian
    return _dot(hv, w), _dot(v, hw)


def gradient_difference(model, controls, direction, eps: float, checkpointing=None) -> dict:
    """(g(m + e v) - g(m - e v)) / 2e, control name -> Vec: H v to O(e^2). The two gradients are
    store-all, or checkpointed sessions under ``checkpointing`` (a memory budget, say)."""
    from .session import compute_gradient_checkpointed
    from .verify import compute_gradient

    def gradient(at):
        if checkpointing is None:
            return compute_gradient(model, at).gradient
        return compute_gradient_checkpointed(model, checkpointing, controls=at).gradient

    plus = gradient(_shifted(controls, eps, direction))
    minus = gradient(_shifted(controls, -eps, direction))
    out = {}
    for k in plus:
        out[k] = plus[k].copy()
        out[k].axpy(-1.0, minus[k])
        out[k].scale(1.0 / (2.0 * eps))
    model.set_controls(controls)
    return out


def relative_difference(a: dict, b: dict) -> float:
    """||a - b|| / ||b|| over all controls together."""
    num = den = 0.0
    for k in a:
        d = a[k].copy()
        d.axpy(-1.0, b[k])
        num += d.norm() ** 2
        den += b[k].norm() ** 2
    return math.sqrt(num) / max(math.sqrt(den), 1e-300)


def owned_arrays(model, vecs: dict) -> dict:
    """This rank's owned blocks of control-shaped Vecs (for bitwise comparisons)."""
    return {k: np.array(v) for k, v in model.control_arrays(vecs).items()}


class _StateStore:
    """u_0 .. u_n of one forward sweep, kept for every product at the same controls: the Vecs
    themselves in RAM, or the model's snapshots on a node-local level (one file per rank and step,
    read back by step; a read restores u_i bitwise). The last few states read are cached."""

    CACHE = 3

    def __init__(self, model, *, local_dir=None):
        self.model = model
        self.vecs, self.level, self.cache = [], None, {}
        if local_dir is not None:
            from ..checkpoint.storage import LocalLevel

            self.level = LocalLevel(model.n_steps + 1, model.snapshot_layout(), model.comm,
                                    local_dir=local_dir, async_io=False, name="hessian-states")

    @property
    def where(self) -> str:
        return "ram" if self.level is None else "local"

    def put(self, i: int, u) -> None:
        if self.level is None:
            self.vecs.append(u)
        else:
            self.level.write(i, self.model.snapshot(u), self.model.time(i))

    def get(self, i: int):
        if self.level is None:
            return self.vecs[i]
        u = self.cache.get(i)
        if u is None:
            u = self.model.restore(self.level.read(i))
            if len(self.cache) >= self.CACHE:
                self.cache.pop(next(iter(self.cache)))
            self.cache[i] = u
        return u

    def close(self) -> None:
        self.vecs, self.cache = [], {}
        if self.level is not None:
            for step in sorted(self.level.valid_steps()):
                self.level.free(step)
            self.level.close()
            self.level = None


class TangentChain:
    """The chain du_0 -> du_1 -> ... of one direction v over kept forward states, as a Stepper: its
    state is du_i alone (one model state: a plan's slot holds one du), its step the model's tangent
    step reading u_i and u_{i+1} from a :class:`_StateStore`, its adjoint the composite's (first-
    and second-order adjoint together). The driver and every plan run it, so the reverse sweep of
    each product is checkpointed under a budget while the forward states are never recomputed.

    ``first_order=False`` (Gauss-Newton only, where dlambda does not read lambda) skips lambda and
    dJ/dm: the products after the first reuse the gradient instead of recomputing it.
    """

    def __init__(self, model, states: _StateStore, direction, *, gauss_newton: bool = False,
                 first_order: bool = True):
        self.pair = SecondOrderStepper(model, direction, gauss_newton=gauss_newton)
        if not first_order and not gauss_newton:
            raise ValueError("the exact second-order adjoint step reads lambda: first_order=False needs "
                             "gauss_newton=True")
        self.model, self.states, self.first_order = model, states, first_order
        self.comm, self.name = model.comm, model.name
        self.n_steps, self.dt = model.n_steps, model.dt
        self.adjoint_reads_next = self.pair.adjoint_reads_next

    def _pair(self, i, du):
        return None if du is None else Pair(self.states.get(i), du)

    def set_controls(self, controls):
        self.pair.set_controls(controls)

    def initial_state(self):
        return self.model.initial_tangent(self.pair.direction)

    def step(self, i, du):
        return self.model.tangent_step(i, self.states.get(i), self.states.get(i + 1), du, self.pair.direction)

    def objective(self, i, du):
        """Zero: J was summed once, in the forward sweep of the kept states."""
        return 0.0

    def objective_gradient(self, i, du):
        if self.first_order:
            return self.pair.objective_gradient(i, self._pair(i, du))
        dlam = _zero_like(du)
        self.model.add_objective_hessian(i, self.states.get(i), du, dlam)
        return Pair(_zero_like(du), dlam)

    def add_objective_gradient(self, i, du, lam):
        if self.first_order:
            self.pair.add_objective_gradient(i, self._pair(i, du), lam)
        else:
            self.model.add_objective_hessian(i, self.states.get(i), du, lam.d)

    def adjoint_step(self, i, du, du_next, lam_next, grad):
        u_next = self.states.get(i + 1) if self.adjoint_reads_next else None
        if self.first_order:
            nxt = None if du_next is None else Pair(u_next, du_next)
            return self.pair.adjoint_step(i, self._pair(i, du), nxt, lam_next, grad)
        _, hg = self.pair._split(grad)
        dlam = self.model.adjoint_step(i, self.states.get(i), u_next, lam_next.d, hg)
        return Pair(lam_next.u, dlam)

    def initial_adjoint(self, lam0, grad):
        g, hg = self.pair._split(grad)
        if self.first_order:
            self.model.initial_adjoint(lam0.u, g)
        self.model.initial_adjoint(lam0.d, hg)

    def initial_tangent(self, dcontrols):
        raise NotImplementedError("the tangent chain has no tangent of its own")

    def tangent_step(self, i, u, u_next, du, dcontrols):
        raise NotImplementedError("the tangent chain has no tangent of its own")

    def snapshot_layout(self):
        return self.model.snapshot_layout()

    def snapshot(self, du):
        return self.model.snapshot(du)

    def restore(self, snapshot):
        return self.model.restore(snapshot)

    def control_layout(self):
        return self.pair.control_layout()

    def control_arrays(self, controls):
        return self.pair.control_arrays(controls)

    def time(self, i):
        return self.model.time(i)

    def describe(self):
        return {**self.pair.describe(), "states": self.states.where}

    def working_set_states(self) -> float:
        return self.pair.working_set_states() * 2.0


def _same_controls(model, a: dict, b: dict) -> bool:
    """Whether the controls ``a`` and ``b`` hold the same bytes on every rank (collective)."""
    from ..collective import any_rank

    mine = owned_arrays(model, a), owned_arrays(model, b)
    differ = set(mine[0]) != set(mine[1]) or any(
        mine[0][k].tobytes() != mine[1][k].tobytes() for k in mine[0])
    return not any_rank(model.comm, differ)


def settled_rss(comm) -> int:
    """This rank's resident set once what is already dropped is freed: collected garbage, parallel
    Vecs awaiting ``garbage_cleanup``, the models' idle pooled buffers and the heap's free pages
    (the baseline a budget's slots are counted from). Collective."""
    import gc

    from ..checkpoint.memory import process_rss_bytes
    from ..imports import petsc
    from ..buffers import release_idle_buffers

    gc.collect()
    petsc().garbage_cleanup(comm)
    release_idle_buffers()
    return process_rss_bytes() or 0


def product_memory(model, memory, *, gauss_newton: bool = False, local_dir=None, baseline=None, reserve: int = 0):
    """How Hessian products of ``model`` fit the whole-process budget ``memory`` per rank (bytes, or
    text such as ``"3GiB"``): the one rule ``hpcadj invert``'s Newton types and ``hpcadj hesscheck``
    share (:func:`hpcadj.checkpoint.memory.plan_products` over the composite's working set, one
    state's and the controls' bytes, the largest rank's each, and the settled resident set plus the
    planner's allocator slack). ``baseline``: the resident set to count from (default
    :func:`settled_rss` now); ``reserve`` bytes per rank kept for what the caller allocates while
    the products live (an optimiser's Krylov and quasi-Newton vectors). Returns the ProductMemory;
    ConfigError (one line, naming the least budget that would do) when no mode fits. Collective."""
    from ..checkpoint.memory import plan_products
    from ..checkpoint.options import ConfigError, fmt_bytes, memory_bytes
    from ..checkpoint.provision import ALLOCATOR_SLACK_BYTES
    from ..imports import mpi
    from ..snapshot import layout_bytes

    budget = memory_bytes(memory, "--memory")
    comm, MAX = model.comm, mpi().MAX
    if baseline is None:
        baseline = settled_rss(comm)
    baseline = comm.allreduce(int(baseline) + int(reserve), op=MAX) + ALLOCATOR_SLACK_BYTES
    state = comm.allreduce(layout_bytes(model.snapshot_layout()), op=MAX)
    controls = comm.allreduce(layout_bytes(model.control_layout()), op=MAX)
    composite = 2.0 * SecondOrderStepper(model, gauss_newton=gauss_newton).working_set_states()
    fit = plan_products(composite, model.n_steps, budget_bytes=budget, baseline_bytes=baseline,
                        snapshot_bytes=state, control_bytes=controls, local=local_dir is not None)
    if fit.mode is None:
        raise ConfigError(f"--memory {fmt_bytes(budget)} per rank cannot hold a Hessian product: the process "
                          f"holds {fmt_bytes(baseline)} (with the planner's slack) before the product's "
                          f"working set of {composite:.1f} states of {fmt_bytes(state)}, its driver's states "
                          f"and slots; the least budget that would do is {fmt_bytes(fit.least)}")
    fit.memory.detail["source"] = "--memory"
    return fit


class HessianProducts:
    """Several H v at the same controls from one forward sweep: u_0 .. u_n are computed once and
    kept (in RAM, or with ``local_dir`` on node-local disk), and each product runs only the tangent
    and reverse sweeps over them. Each product is bitwise the one :func:`hessian_action` gives.

    ``ram`` (slots of one model state, or bytes per rank; None: no budget) bounds what a product
    holds in RAM: without it every du_i is kept too (store-all); with it the chain du_0 .. du_n of
    each product is reversed by ``schedule`` (revolve by default) over ``ram`` slots of one du each
    (:class:`TangentChain` under the ordinary driver), recomputing tangent steps only, never forward
    steps. The states go to RAM when they fit in ``ram`` beside the plan's slots, else to
    ``local_dir``; with neither, each product is a composite run under the budget (pairs (u, du) in
    ``ram // 2`` slots) and only J and dJ/dm are reused.

    lambda does not depend on v: with ``gauss_newton`` the second-order adjoint does not read it, so
    only the first product computes lambda and dJ/dm and the others reuse them. The exact product's
    second-order step reads lambda_{i+1} and returns lambda_i from the same solves, so there lambda is
    recomputed with dlambda.

    ``memory`` (a whole-process budget per rank, bytes or text such as ``"2GiB"``) chooses the mode
    and the slots instead, by :func:`product_memory` counted from ``baseline`` (default: the settled
    resident set now) plus ``reserve`` bytes; ``ram`` then caps the slots. ConfigError when no mode
    fits.

    :meth:`hessian_action` with other ``controls`` runs a new forward sweep (nothing is reused).
    ``counts`` tallies the model's forward and tangent steps, the second-order adjoint steps
    (``adjoint``), those that computed lambda too (``lambda``), the products and forward sweeps.
    Call :meth:`close` when done (it removes node-local files).
    """

    MIN_SLOTS = 2

    def __init__(self, model, controls, *, gauss_newton: bool = False, ram=None, local_dir=None,
                 schedule: str = "revolve", memory=None, baseline=None, reserve: int = 0):
        check_model(model, gauss_newton)
        self.model, self.gauss_newton = model, gauss_newton
        self.local_dir, self.schedule_name = local_dir, schedule
        n = model.n_steps
        self.slots = self.memory = None
        if ram is not None:
            from ..checkpoint.manager import snapshot_slot_bytes
            from ..checkpoint.budget import budget_slots

            state_bytes = snapshot_slot_bytes(model.snapshot_layout(), model.comm)["ram"]
            self.slots = budget_slots(ram, state_bytes)
            if self.slots < self.MIN_SLOTS:
                raise ValueError(f"ram={ram}: a product needs at least {self.MIN_SLOTS} slots of one state "
                                 f"({state_bytes} bytes per rank)")
        if memory is not None:
            fit = product_memory(model, memory, gauss_newton=gauss_newton, local_dir=local_dir, baseline=baseline,
                                 reserve=reserve)
            self.memory = fit.memory
            cap = None if self.slots is None else (self.slots // 2 if fit.mode == "recompute" else self.slots)
            self.mode, self.plan_slots = fit.mode, fit.slots if cap is None else max(1, min(fit.slots, cap))
        elif self.slots is None:
            self.mode, self.plan_slots = "store-all", None
        elif self.slots >= n + 1 + self.MIN_SLOTS:
            self.mode, self.plan_slots = "ram", self.slots - (n + 1)
        elif local_dir is not None:
            self.mode, self.plan_slots = "local", self.slots
        else:
            self.mode, self.plan_slots = "recompute", self.slots // 2
        self.states = None
        self.gradient = None
        self.counts = {"forward": 0, "tangent": 0, "adjoint": 0, "lambda": 0, "products": 0,
                       "forward_sweeps": 0}
        self._forward(controls)

    def _forward(self, controls) -> None:
        """The forward sweep at ``controls``: J, and the states kept (not in ``recompute`` mode)."""
        from ..imports import petsc

        self.close()
        model = self.model
        self.controls = {k: v.copy() for k, v in controls.items()}
        self.gradient = None
        model.set_controls(self.controls)
        keep = self.mode != "recompute"
        if keep:
            self.states = _StateStore(model, local_dir=self.local_dir if self.mode == "local" else None)
        u = model.initial_state()
        if keep:
            self.states.put(0, u)
        self.J = model.objective(0, u)
        for i in range(model.n_steps):
            u = model.step(i, u)
            if keep:
                self.states.put(i + 1, u)
            self.J += model.objective(i + 1, u)
            petsc().garbage_cleanup(model.comm)  # a parallel Vec dropped is freed only here
        self.counts["forward"] += model.n_steps
        self.counts["forward_sweeps"] += 1

    def close(self) -> None:
        """Free the kept states (and remove their node-local files)."""
        from ..imports import petsc

        if self.states is not None:
            self.states.close()
            self.states = None
            petsc().garbage_cleanup(self.model.comm)

    def hessian_action(self, v, controls=None) -> HessianResult:
        """J, dJ/dm and H v for direction ``v``; at ``controls`` if given (a new forward sweep when
        they differ from the kept ones in any byte), else at the kept controls."""
        if controls is not None and not _same_controls(self.model, controls, self.controls):
            self._forward(controls)
        if self.memory is not None:  # the last product's levels, pooled, are no part of this one's room
            settled_rss(self.model.comm)
        if self.mode == "store-all":
            out = self._store_all(v)
        else:
            out = self._planned(v)
        self.counts["products"] += 1
        return out

    def _levels_and_plan(self, stepper, slots):
        from ..checkpoint.manager import CheckpointConfig, build_levels, level_slots, make_plan, profile_for

        layout = stepper.snapshot_layout()
        config = CheckpointConfig(budgets={"ram": str(slots)})
        plans = level_slots(config, layout, self.model.comm, self.model.n_steps)
        plan = make_plan(self.schedule_name, self.model.n_steps, plans, profile_for(plans, None))
        return build_levels(plans, layout, self.model.comm, config), plan

    def _planned(self, v) -> HessianResult:
        model = self.model
        model.set_controls(self.controls)
        reuse = self.gauss_newton and self.gradient is not None
        if self.mode == "recompute":
            stepper = SecondOrderStepper(model, v, gauss_newton=self.gauss_newton)
        else:
            stepper = TangentChain(model, self.states, v, gauss_newton=self.gauss_newton, first_order=not reuse)
        pair = stepper if self.mode == "recompute" else stepper.pair
        levels, plan = self._levels_and_plan(stepper, self.plan_slots)
        try:
            result = Driver(stepper, levels).run(plan, pair.composite_controls(self.controls))
        finally:
            for level in levels:
                level.close()
        if self.mode == "recompute":
            self.counts["forward"] += result.forward_steps
        self.counts["tangent"] += result.forward_steps
        self.counts["adjoint"] += result.adjoint_steps
        self.counts["lambda"] += 0 if reuse else result.adjoint_steps
        result.J = self.J
        out = _result(pair, result)
        if reuse:
            out.gradient = {k: g.copy() for k, g in self.gradient.items()}
        elif self.gradient is None:
            self.gradient = {k: g.copy() for k, g in out.gradient.items()}
        return out

    def _store_all(self, v) -> HessianResult:
        from ..imports import petsc

        model, n = self.model, self.model.n_steps
        states = self.states.vecs
        stepper = SecondOrderStepper(model, v, gauss_newton=self.gauss_newton)
        model.set_controls(self.controls)
        du = model.initial_tangent(stepper.direction)
        dus = [du]
        for i in range(n):
            du = model.tangent_step(i, states[i], states[i + 1], du, stepper.direction)
            dus.append(du)
        grad = {}
        for name, vec in stepper.composite_controls(self.controls).items():
            grad[name] = vec.duplicate()
            grad[name].set(0.0)
        lam = stepper.objective_gradient(n, Pair(states[n], dus[n]))
        for i in reversed(range(n)):
            nxt = Pair(states[i + 1], dus[i + 1]) if stepper.adjoint_reads_next else None
            here = Pair(states[i], dus[i])
            lam = stepper.adjoint_step(i, here, nxt, lam, grad)
            dus[i + 1] = nxt = None
            stepper.add_objective_gradient(i, here, lam)
            petsc().garbage_cleanup(model.comm)
        stepper.initial_adjoint(lam, grad)
        self.counts["tangent"] += n
        self.counts["adjoint"] += n
        self.counts["lambda"] += n
        result = GradientResult(J=self.J, gradient=grad, forward_steps=0, adjoint_steps=n)
        return _result(stepper, result)


def budget_options(checkpointing, comm=None) -> dict:
    """:class:`HessianProducts` options under an inversion's ``checkpointing``: its whole-process
    budget (``memory``: ``--memory``, else ``$HPCADJ_MEMORY`` or SLURM's, as a gradient session
    takes it; a node's budget shared among the ranks of ``comm`` on that node), its RAM budget
    (``ram``, slots of one state or bytes per rank, an upper bound under ``memory``), its node-local
    directory and one-level schedule; none (store-all) without a budget. Collective over ``comm``
    (default: the world)."""
    if checkpointing is None:
        return {}
    from ..checkpoint.provision import _memory_budget
    from ..imports import mpi

    MPI = mpi()
    node = (comm or MPI.COMM_WORLD).Split_type(MPI.COMM_TYPE_SHARED)
    try:
        memory, _source = _memory_budget(checkpointing, node.size)
    finally:
        node.Free()
    if memory is None and checkpointing.ram is None:
        return {}
    out = {"local_dir": checkpointing.local_dir}
    if checkpointing.ram is not None:
        out["ram"] = checkpointing.ram
    if memory is not None:
        out["memory"] = memory
    if checkpointing.schedule not in (None, "auto", "store-all", "multilevel"):
        out["schedule"] = checkpointing.schedule
    return out


class HessianShell:
    """y = (H + w I) x over packed controls, as the context of a petsc4py shell Mat, for TAO's
    Newton methods (nls, bntr).

    ``space`` packs the inverted controls into one Vec (:class:`hpcadj.inversion.space.ControlSpace`:
    ``pack``, ``unpack``, ``names``, ``vec``); ``w`` is a zeroth-order Tikhonov weight. TAO's Hessian
    callback (:meth:`point`) fixes m and runs one forward sweep (:class:`HessianProducts`, which
    ``products_options`` such as ``ram``, ``memory`` and ``local_dir`` configure); every product after
    it (:meth:`mult`, one per Krylov iteration) runs only the tangent and reverse sweeps.
    :meth:`release` frees the kept states between Krylov solves (a product after it runs the
    forward sweep at the same m again); ``prepare`` is called before each forward sweep (the
    inversion frees its own kept levels there, so that a budget holds one of the two at a time).
    """

    def __init__(self, model, space, *, gauss_newton: bool = False, regularization: float = 0.0,
                 prepare=None, **products_options):
        self.model, self.space = model, space
        self.gauss_newton, self.weight = gauss_newton, float(regularization)
        self.products_options = products_options
        self.prepare = prepare
        self.products = self.mat = self.x = None
        self.count = 0
        self.sweeps = 0
        self.steps = {"forward": 0, "tangent": 0, "adjoint": 0}
        self.peak_predicted = None

    def matrix(self):
        """The shell Mat (collective); :meth:`close` destroys it."""
        from ..imports import petsc

        vec = self.space.vec
        sizes = (vec.getLocalSize(), vec.getSize())
        self.mat = petsc().Mat().createPython((sizes, sizes), context=self, comm=vec.getComm())
        self.mat.setUp()
        return self.mat

    def point(self, tao, x, H, P) -> None:
        """TAO's Hessian callback: the products that follow are at the controls packed in ``x``."""
        self.release()
        if self.x is not None:
            self.x.destroy()
        self.x = x.copy()
        self._products()

    def _products(self) -> "HessianProducts":
        if self.products is None:
            if self.prepare is not None:
                self.prepare()
            controls = self.space.unpack(self.x)
            self.products = HessianProducts(self.model, controls, gauss_newton=self.gauss_newton,
                                            **self.products_options)
            for vec in controls.values():
                vec.destroy()
            self.sweeps += 1
            if self.products.memory is not None:
                peak = self.products.memory.peak_bytes
                self.peak_predicted = max(self.peak_predicted or 0, peak)
        return self.products

    def mult(self, mat, x, y) -> None:
        v = self.space.unpack(x)
        for name, vec in v.items():
            if name not in self.space.names:
                vec.set(0.0)
        self.space.pack(self._products().hessian_action(v).hessian, y)
        if self.weight:
            y.axpy(self.weight, x)
        self.count += 1

    def counts(self) -> dict:
        """Products so far, the forward sweeps they ran and the model steps they took."""
        steps = dict(self.steps)
        if self.products is not None:
            for key in steps:
                steps[key] += self.products.counts[key]
        out = {"hessian_products": self.count, "hessian_forward_sweeps": self.sweeps,
               **{f"hessian_{k}_steps": v for k, v in steps.items()}}
        if self.peak_predicted is not None:
            out["hessian_predicted_peak_bytes"] = self.peak_predicted
        return out

    def release(self) -> None:
        """Free the kept states (and their node-local files); the point stays."""
        if self.products is not None:
            for key in self.steps:
                self.steps[key] += self.products.counts[key]
            self.products.close()
            self.products = None

    def close(self) -> None:
        """Release the kept forward states (and their node-local files) and the shell Mat."""
        self.release()
        if self.x is not None:
            self.x.destroy()
            self.x = None
        if self.mat is not None:
            self.mat.destroy()
            self.mat = None
