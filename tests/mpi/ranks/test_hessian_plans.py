"""H v under checkpointing: every plan and level mix gives H v (and J, dJ/dm) bitwise equal to store-all."""

import numpy as np
import pytest

from hpcadj.adjoint import hessian as H

from hpcadj.adjoint import verify as V
from hpcadj.adjoint import products as P
from hpcadj.checkpoint.manager import CheckpointConfig, build_levels, level_slots, make_plan, profile_for
from hpcadj.adjoint.session import Checkpointing

from test_hessian import build, perturbed_controls

#: (schedule, budgets per level in slots of the pair (u, du))
PLANS = [
    ("revolve", {"ram": "2"}),
    ("multilevel", {"ram": "1", "disk": "2"}),
    ("multilevel", {"ram": "1", "disk": "1", "pfs": "2"}),
]


def owned(vecs):
    return {name: vec.getArray().copy() for name, vec in vecs.items()}


@pytest.fixture(scope="module", params=["heat", "burgers", "wave", "grayscott"])
def reference(request, comm):
    model = build(comm, request.param, steps=8)  # more steps than the plans below have slots
    controls = perturbed_controls(model)
    v = V.scaled_direction(model, controls, 11, scale={k: 0.1 for k in controls})
    ref = H.hessian_action(model, controls, v)
    return model, controls, v, ref


def check_equal(result, ref):
    assert result.J == ref.J
    for part in ("gradient", "hessian"):
        got, want = owned(getattr(result, part)), owned(getattr(ref, part))
        for name in want:
            assert np.array_equal(got[name], want[name]), (part, name)


@pytest.mark.parametrize("schedule,budgets", PLANS, ids=[f"{s}-{'+'.join(b)}" for s, b in PLANS])
def test_plans_bitwise_equal_to_store_all(reference, schedule, budgets, comm, shared_tmp):
    model, controls, v, ref = reference
    stepper = H.SecondOrderStepper(model, v)
    layout = stepper.snapshot_layout()
    config = CheckpointConfig(budgets=budgets, local_dir=shared_tmp, pfs_file=f"{shared_tmp}/hk.h5", async_io=True)
    plans = level_slots(config, layout, comm, model.n_steps)
    plan = make_plan(schedule, model.n_steps, plans, profile_for(plans, None))
    levels = build_levels(plans, layout, comm, config)
    try:
        result = H.hessian_action(model, controls, v, schedule=plan, levels=levels)
    finally:
        for level in levels:
            level.close()
    check_equal(result, ref)
    assert result.result.recomputed_steps > 0
    assert sum(level.stats.writes for level in levels) >= 1


def test_session_with_a_byte_budget(reference, comm, shared_tmp):
    """HessianSession: a RAM budget of one pair snapshot (bytes) and a disk slot, the plan chosen
    by the session; H v bitwise the store-all one, and the plan recomputed."""
    model, controls, v, ref = reference
    pair_bytes = H.SecondOrderStepper(model, v).snapshot_bytes()
    session = H.HessianSession(model, Checkpointing(ram=f"{pair_bytes // comm.size + 64}B",
                                                    disk="1", local_dir=shared_tmp, schedule="multilevel"))
    result = session.hessian_action(controls, v)
    check_equal(result, ref)
    assert result.result.recomputed_steps > 0


def test_many_products_from_one_forward_sweep(reference, comm):
    """HessianProducts: the forward sweep once, then each product bitwise :func:`hessian_action`'s."""
    model, controls, v, ref = reference
    products = P.HessianProducts(model, controls)
    w = V.scaled_direction(model, controls, 13, scale={k: 0.1 for k in controls})
    check_equal(products.hessian_action(v), ref)
    check_equal(products.hessian_action(w), H.hessian_action(model, controls, w))
    check_equal(products.hessian_action(v), ref)
    assert products.counts == {"forward": 8, "tangent": 24, "adjoint": 24, "lambda": 24, "products": 3,
                               "forward_sweeps": 1}


@pytest.mark.parametrize("poll", [4, 12], ids=["forward", "reverse"])
def test_stopped_and_resumed_bitwise(reference, comm, shared_tmp, poll):
    """A HessianSession with a run directory, stopped in the forward or the reverse sweep (the state
    made durable), then resumed from it: H v bitwise the store-all one."""
    import os

    from hpcadj.adjoint.session import Restart

    model, controls, v, ref = reference
    run_dir, local = os.path.join(shared_tmp, f"hrun{poll}"), os.path.join(shared_tmp, f"hlocal{poll}")
    polls = []

    def stop():
        polls.append(1)
        return len(polls) >= poll

    checkpointing = Checkpointing(disk="3", local_dir=local)
    stopped = H.HessianSession(model, checkpointing, restart=Restart(run_dir, durable_every=2), should_stop=stop)
    with pytest.raises(RuntimeError, match="stopped"):
        stopped.hessian_action(controls, v)
    resumed = H.HessianSession(model, checkpointing, restart=Restart(run_dir, resume=True, durable_every=2))
    result = resumed.hessian_action(controls, v)
    check_equal(result, ref)
    assert result.result.forward_steps < 2 * model.n_steps


def test_session_with_lossless_compression(reference, comm):
    """Compressed RAM slots (lossless) under revolve: H v bitwise the store-all one."""
    model, controls, v, ref = reference
    session = H.HessianSession(model, Checkpointing(ram="2", compress="lossless", schedule="revolve"))
    result = session.hessian_action(controls, v)
    check_equal(result, ref)
    assert result.result.recomputed_steps > 0
