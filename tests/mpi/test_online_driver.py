"""Online plans (one and three levels) run by the driver: gradients bitwise equal to store-all."""

import numpy as np
import pytest

from hpcadj.adjoint import compute_gradient
from hpcadj.checkpoint.manager import CheckpointConfig, build_levels, level_slots, make_plan, profile_for
from hpcadj.checkpoint.schedules import simulate
from hpcadj.checkpoint.schedules.online_binomial import OnlineBinomial
from hpcadj.checkpoint.schedules.online_multilevel import OnlineMultilevel
from hpcadj.checkpoint.schedules.online_plans import OnlinePlan
from hpcadj.cli import Parser
from hpcadj.cli.common import add_model_arguments, build_model

N_STEPS = 11
SMALL = {"heat": ["--grid", "10x9"], "burgers": ["--grid", "12x12"], "wave": ["--grid", "14x12"]}
BUDGETS = [("binomial", {"ram": "3"}), ("binomial", {"pfs": "2"}), ("multilevel", {"ram": "1", "disk": "1"}),
           ("multilevel", {"ram": "1", "disk": "1", "pfs": "2"})]


def small_model(name, comm):
    parser = Parser()
    add_model_arguments(parser)
    return build_model(parser.parse_args(["--model", name, *SMALL[name], "--steps", str(N_STEPS)]), comm)


@pytest.fixture(scope="module", params=sorted(SMALL))
def reference(request, comm):
    model = small_model(request.param, comm)
    controls = model.default_controls()
    result = compute_gradient(model, controls)
    return model, controls, result.J, {k: v.getArray().copy() for k, v in result.gradient.items()}


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
