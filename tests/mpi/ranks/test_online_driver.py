"""Online plans (one and three levels) run by the driver: gradients bitwise equal to store-all."""

import numpy as np
import pytest
from model_checks import small_model, store_all_reference

from hpcadj.adjoint import compute_gradient
from hpcadj.checkpoint.manager import CheckpointConfig, build_levels, level_slots, make_plan, profile_for
from hpcadj.checkpoint.schedules import simulate
from hpcadj.checkpoint.schedules.online_binomial import OnlineBinomial
from hpcadj.checkpoint.schedules.online_multilevel import OnlineMultilevel
from hpcadj.checkpoint.schedules.online_plans import OnlinePlan

N_STEPS = 11
MODELS = ("heat", "burgers", "wave")
BUDGETS = [("binomial", {"ram": "3"}), ("binomial", {"pfs": "2"}), ("multilevel", {"ram": "1", "disk": "1"}),
           ("multilevel", {"ram": "1", "disk": "1", "pfs": "2"})]


@pytest.fixture(scope="module", params=sorted(MODELS))
def reference(request, comm):
    return store_all_reference(small_model(request.param, comm, N_STEPS))


@pytest.mark.parametrize("kind,budgets", BUDGETS, ids=[f"{k}-{'+'.join(b)}" for k, b in BUDGETS])
def test_online_plan_gradient_bitwise_equal_to_store_all(reference, kind, budgets, comm, shared_tmp):
    model, controls, J_ref, grad_ref = reference
    config = CheckpointConfig(budgets=budgets, local_dir=shared_tmp, pfs_file=f"{shared_tmp}/on.h5")
    plans = level_slots(config, model.snapshot_layout(), comm, model.n_steps)
    base = make_plan("auto", model.n_steps, plans, profile_for(plans, None))
    caps = list(base.capacities)

    def planner():
        return OnlineBinomial(caps) if kind == "binomial" else OnlineMultilevel(caps, getattr(base, "costs", None))

    expected = simulate(OnlinePlan(planner(), model.n_steps).actions(), model.n_steps, caps)
    levels = build_levels(plans, model.snapshot_layout(), comm, config)
    result = compute_gradient(model, controls, OnlinePlan(planner(), model.n_steps), levels)  # closes them
    assert result.J == J_ref
    for name, ref in grad_ref.items():
        assert np.array_equal(result.gradient[name].getArray(), ref), name
    assert result.forward_steps == expected.forward_steps
    assert [level.stats.writes for level in levels] == expected.writes
