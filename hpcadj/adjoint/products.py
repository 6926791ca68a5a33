"""Many Hessian-vector products from one forward sweep, planned as gradients are.

:class:`HessianProducts` keeps u_0 .. u_n of one forward sweep (RAM or node-local files) and runs
each product's tangent and reverse sweeps over them; :func:`plan_products` decides, before any
step, how the products fit a RAM or whole-process budget: each mode's run is declared to
:func:`hpcadj.checkpoint.provision.provision` (its state, working set and n), which sizes the RAM
slots and makes the plan as for a gradient.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from ..checkpoint.memory import MemoryPlan, budget_from_environment, process_rss_bytes
from ..models.base import Stepper
from .data_check import refuse_untrusted_data
from .driver import Driver, GradientResult
from .hessian import (HessianResult, NoTangent, Pair, SecondOrderStepper, _result, _zero_like, check_model,
                      owned_arrays)
from ..buffers import release_idle_buffers
from ..checkpoint.budget import budget_slots
from ..checkpoint.manager import CheckpointConfig, build_levels, snapshot_slot_bytes
from ..checkpoint.options import Checkpointing, ConfigError
from ..checkpoint.provision import Declared, provision
from ..checkpoint.storage import LocalLevel
from ..collective import any_rank
from ..imports import petsc
from ..snapshot import FieldLayout, layout_bytes

#: what a product's reverse sweep holds beyond a gradient driver's states: its adjoint is the pair
#: (lambda, dlambda), two states where the driver's count has one (held and built)
ADJOINT_STATES = 2
#: RAM slots a product's plan needs at least (one du each; a composite plan needs one pair)
MIN_SLOTS = 2
#: node-local kept states a product holds in process memory: the last 3 read and a synchronous
#: level's copy and read (:class:`_StateStore`)
LOCAL_STATES = 3 + 2


@dataclass(frozen=True)
class ProductPlan:
    """How products run: ``mode`` ``store-all`` (no budget: every u_i and du_i kept), ``ram`` (u_0 ..
    u_n kept in RAM, each du chain planned over ``slots`` RAM slots), ``local`` (u kept in node-local
    files, the same plan) or ``recompute`` (each product a composite run over ``slots`` pair slots);
    ``planned`` the :class:`~hpcadj.checkpoint.provision.PlannedRun` of one product's sweep (None
    for store-all); ``memory`` its prediction under a whole-process budget (else None)."""

    mode: str
    slots: int | None = None
    planned: object = None
    memory: MemoryPlan | None = None


def plan_products(model, *, gauss_newton: bool = False, ram=None, memory=None, local_dir=None,
                  schedule: str = "revolve", baseline=None, reserve: int = 0) -> ProductPlan:
    """The :class:`ProductPlan` of products of ``model`` under ``ram`` (slots of one state or bytes
    per rank) and/or ``memory`` (a whole-process budget per rank), before any step (collective).

    Without ``memory``, ``ram`` slots hold the n + 1 kept states and the plan's slots when they can
    (``ram``), else the states go to ``local_dir`` (``local``), else each product recomputes them
    (``recompute``, ``ram // 2`` pair slots). With ``memory``, the first of ``ram``, ``local`` (with
    ``local_dir``) and ``recompute`` whose declared run leaves at least :data:`MIN_SLOTS` slots (one
    pair slot for ``recompute``) wins, counted from ``baseline`` (default :func:`settled_rss` now)
    plus ``reserve`` bytes; ``ram`` caps the slots. ValueError (``ram`` alone) or ConfigError
    (``memory``, naming the least budget that would do) when nothing fits. Without ``memory``,
    ``$HPCADJ_MEMORY`` or SLURM's budget applies, as for a gradient session.
    """
    check_model(model, gauss_newton)
    comm, n = model.comm, model.n_steps
    budgeted = memory is not None or budget_from_environment(os.environ) is not None
    if ram is None and not budgeted:
        return ProductPlan("store-all")
    slots = None
    if ram is not None:
        state_bytes = snapshot_slot_bytes(model.snapshot_layout(), comm)["ram"]
        slots = budget_slots(ram, state_bytes)
        if slots < MIN_SLOTS:
            raise ValueError(f"RAM budget {ram}: a Hessian product needs at least {MIN_SLOTS} slots of one state "
                             f"({state_bytes} bytes per rank)")
    composite = SecondOrderStepper(model, gauss_newton=gauss_newton)
    if not budgeted:
        mode, kept = (("ram", n + 1) if slots >= n + 1 + MIN_SLOTS else ("local", 0) if local_dir is not None
                      else ("recompute", 0))
        plan_slots = slots - kept if mode == "ram" else slots // 2 if mode == "recompute" else slots
        ck = Checkpointing(ram=str(plan_slots), schedule=schedule)
        return ProductPlan(mode, plan_slots, provision(_declared(model, composite, mode, 0), None, ck, config=ck.config()))
    if baseline is None:
        baseline = settled_rss(comm)
    baseline = int(baseline) + int(reserve)
    modes = ["ram"] + (["local"] if local_dir is not None else []) + ["recompute"]
    refusal = None
    for mode in modes:
        cap = None if slots is None else (slots // 2 if mode == "recompute" else slots)
        ck = Checkpointing(ram=None if cap is None else str(cap), memory=memory, schedule=schedule)
        try:
            planned = provision(_declared(model, composite, mode, n), None, ck, config=ck.config(),
                                baseline_bytes=baseline)
        except ConfigError as exc:
            refusal = exc
            continue
        got = sum(p.slots for p in planned.plans if p.kind == "ram")
        if got >= (1 if mode == "recompute" else MIN_SLOTS):
            kept = {"ram": n + 1, "local": LOCAL_STATES}.get(mode, 0)
            memory_plan = replace(planned.memory, detail={**planned.memory.detail, "mode": mode, "kept_states": kept})
            return ProductPlan(mode, got, planned, memory_plan)
    raise ConfigError(str(refusal).replace("cannot hold this gradient", "cannot hold a Hessian product")
                      .replace(" (with one RAM slot; or add --disk/--pfs)", ""))


def _declared(model, composite, mode: str, n: int):
    """One product's sweep as provisioning sees it: in ``ram``/``local`` mode a chain of du (one
    model state a slot) beside the composite's working set, the pair adjoint and the kept states;
    in ``recompute`` mode the composite run (a pair a slot). Six control-sized sets: the composite's
    m and v, dJ/dm and H v, the products' copies of m and of dJ/dm."""
    comm = model.comm
    controls = 3 * layout_bytes(model.control_layout())
    sets = {"controls": FieldLayout((controls * comm.size,), (controls * comm.rank,), (controls,), "uint8")}
    states = 2.0 * composite.working_set_states()  # in model states
    data = composite.adjoint_data_layout()  # the pair's data; a chain of du holds the tangent's half
    if mode == "recompute":
        return Declared(comm, model.n_steps, composite.snapshot_layout(), sets, states / 2.0, data=data)
    kept = {"ram": n + 1, "local": LOCAL_STATES}[mode]
    return Declared(comm, model.n_steps, model.snapshot_layout(), sets, states + ADJOINT_STATES + kept,
                    data=data and model.adjoint_data_layout())


def product_options(checkpointing) -> dict:
    """:class:`HessianProducts` options under an inversion's ``checkpointing``: its whole-process
    budget (``memory``), its RAM budget (an upper bound under ``memory``), its node-local directory
    and one-level schedule."""
    if checkpointing is None:
        return {}
    out = {"local_dir": checkpointing.local_dir, "memory": checkpointing.memory, "ram": checkpointing.ram}
    if checkpointing.schedule not in (None, "auto", "store-all", "multilevel"):
        out["schedule"] = checkpointing.schedule
    return out


def settled_rss(comm) -> int:
    """This rank's resident set once what is already dropped is freed: collected garbage, parallel
    Vecs awaiting ``garbage_cleanup``, the models' idle pooled buffers and the heap's free pages
    (the baseline a budget's slots are counted from). Collective."""
    import gc


    gc.collect()
    petsc().garbage_cleanup(comm)
    release_idle_buffers()
    return process_rss_bytes() or 0


def _same_controls(model, a: dict, b: dict) -> bool:
    """Whether the controls ``a`` and ``b`` hold the same bytes on every rank (collective)."""
    mine = owned_arrays(model, a), owned_arrays(model, b)
    differ = set(mine[0]) != set(mine[1]) or any(
        mine[0][k].tobytes() != mine[1][k].tobytes() for k in mine[0])
    return not any_rank(model.comm, differ)


class _StateStore:
    """u_0 .. u_n of one forward sweep, kept for every product at the same controls: the Vecs
    themselves in RAM, or the model's snapshots on a node-local level (one file per rank and step,
    read back by step; a read restores u_i bitwise). The last few states read are cached."""

    CACHE = 3

    def __init__(self, model, *, local_dir=None, run_id=None):
        self.model = model
        self.vecs, self.level, self.cache = [], None, {}
        if local_dir is not None:
            self.level = LocalLevel(model.n_steps + 1, model.snapshot_layout(), model.comm,
                                    local_dir=local_dir, run_id=run_id, async_io=False, name="hessian-states")

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


class TangentChain(NoTangent, Stepper):
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

    def default_controls(self):
        return self.pair.default_controls()

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

    # adjoint data: the tangent's half of the composite's (u_i comes from the kept states)
    recomputes_in_adjoint = False

    def adjoint_data_layout(self):
        return None if self.pair.adjoint_data_layout() is None else self.model.adjoint_data_layout()

    def adjoint_data(self, i, du, du_next):
        return self.model.adjoint_data(i, du, du_next)

    def adjoint_data_state(self, i, data):
        return self.model.adjoint_data_state(i, data)


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
    and the slots instead (:func:`plan_products`), counted from ``baseline`` (default: the settled
    resident set now) plus ``reserve`` bytes; ``ram`` then caps the slots. ConfigError when no mode
    fits. ``plan``: a :class:`ProductPlan` decided before (the options are then not read).

    :meth:`hessian_action` with other ``controls`` runs a new forward sweep (nothing is reused).
    ``counts`` tallies the model's forward and tangent steps, the second-order adjoint steps
    (``adjoint``), those that computed lambda too (``lambda``), the products and forward sweeps.
    Call :meth:`close` when done (it removes node-local files).
    """

    def __init__(self, model, controls, *, gauss_newton: bool = False, ram=None, local_dir=None,
                 schedule: str = "revolve", memory=None, baseline=None, reserve: int = 0, plan=None,
                 run_id=None):
        check_model(model, gauss_newton)
        self.model, self.gauss_newton = model, gauss_newton
        self.local_dir, self.run_id = local_dir, run_id
        if plan is None:
            plan = plan_products(model, gauss_newton=gauss_newton, ram=ram, memory=memory, local_dir=local_dir,
                                 schedule=schedule, baseline=baseline, reserve=reserve)
        self.plan = plan
        self.mode, self.plan_slots, self.memory = plan.mode, plan.slots, plan.memory
        self.states = None
        self.gradient = None
        self.counts = {"forward": 0, "tangent": 0, "adjoint": 0, "lambda": 0, "products": 0,
                       "forward_sweeps": 0}
        self._forward(controls)

    def _forward(self, controls) -> None:
        """The forward sweep at ``controls``: J, and the states kept (not in ``recompute`` mode)."""
        self.close()
        model = self.model
        self.controls = {k: v.copy() for k, v in controls.items()}
        self.gradient = None
        model.set_controls(self.controls)
        keep = self.mode != "recompute"
        if keep:
            self.states = _StateStore(model, local_dir=self.local_dir if self.mode == "local" else None,
                                      run_id=self.run_id)
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

    def _planned(self, v) -> HessianResult:
        model = self.model
        model.set_controls(self.controls)
        reuse = self.gauss_newton and self.gradient is not None
        if self.mode == "recompute":
            stepper = SecondOrderStepper(model, v, gauss_newton=self.gauss_newton)
        else:
            stepper = TangentChain(model, self.states, v, gauss_newton=self.gauss_newton, first_order=not reuse)
        pair = stepper if self.mode == "recompute" else stepper.pair
        if getattr(self.plan.planned.schedule, "stores_data", False):  # a chain's data are the pair's half
            refuse_untrusted_data(pair, pair.composite_controls(self.controls), "a Hessian product's mixed plan")
        levels = build_levels(list(self.plan.planned.plans), stepper.snapshot_layout(), model.comm,
                              CheckpointConfig())
        try:
            result = Driver(stepper, levels).run(self.plan.planned.schedule, pair.composite_controls(self.controls))
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
