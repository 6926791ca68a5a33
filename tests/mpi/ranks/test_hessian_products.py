"""Many H v from one forward sweep under a RAM budget (HessianProducts): products at the same controls
reuse the kept states (and, Gauss-Newton, lambda) and are bitwise fresh runs'; a product at other
controls runs a new forward sweep and is bitwise a fresh session's at those controls."""

import numpy as np
import pytest

from hpcadj.adjoint import hessian as H

from hpcadj.adjoint import verify as V
from hpcadj.adjoint import products as P

from test_hessian import build, perturbed_controls

pytestmark = pytest.mark.timeout(300)
STEPS = 8
#: (mode HessianProducts should pick, its options; ``local`` gets a node-local directory)
MODES = [("ram", {"ram": "12"}), ("local", {"ram": "3"}), ("recompute", {"ram": "4"})]


def check_equal(result, ref, parts=("gradient", "hessian")):
    assert result.J == ref.J
    for part in parts:
        got, want = getattr(result, part), getattr(ref, part)
        for name in want:
            assert np.array_equal(got[name].getArray(), want[name].getArray()), (part, name)


MODELS = ["heat", "burgers", "wave", "grayscott"]
#: every model in every mode, each model and each mode with both products (Newton, Gauss-Newton)
CASES = [(name, mode, options, (i + j) % 2 == 1)
         for i, name in enumerate(MODELS) for j, (mode, options) in enumerate(MODES)]


@pytest.fixture(scope="module", params=MODELS)
def problem(request, comm):
    model = build(comm, request.param, steps=STEPS)
    controls = perturbed_controls(model)
    dirs = [V.scaled_direction(model, controls, seed, scale={k: 0.1 for k in controls}) for seed in (11, 13)]
    return model, controls, dirs


@pytest.mark.parametrize("problem,mode,options,gauss_newton", CASES, indirect=["problem"],
                         ids=[f"{n}-{m}-{'gauss-newton' if g else 'newton'}" for n, m, _, g in CASES])
def test_products_reuse_the_forward_sweep(problem, comm, shared_tmp, mode, options, gauss_newton):
    model, controls, (v, w) = problem
    if mode == "local":
        options = {**options, "local_dir": shared_tmp}
    refs = [H.hessian_action(model, controls, d, gauss_newton=gauss_newton) for d in (v, w)]
    products = P.HessianProducts(model, controls, gauss_newton=gauss_newton, **options)
    try:
        assert products.mode == mode
        for d, ref in ((v, refs[0]), (w, refs[1]), (v, refs[0])):
            check_equal(products.hessian_action(d), ref)
        counts = dict(products.counts)
    finally:
        products.close()
    assert counts["forward_sweeps"] == 1 and counts["products"] == 3
    if mode == "recompute":  # states not kept: every product recomputes them
        assert counts["forward"] > 3 * STEPS
    else:  # one forward sweep for all three; the plan recomputes tangent steps only
        assert counts["forward"] == STEPS
        assert counts["tangent"] > 3 * STEPS
    # lambda does not depend on v: Gauss-Newton computes it in the first product only
    assert counts["lambda"] == (STEPS if gauss_newton and mode != "store-all" else 3 * STEPS)
    assert counts["adjoint"] == 3 * STEPS


@pytest.mark.parametrize("mode,options", [(None, {}), MODES[1]], ids=["store-all", "local"])
def test_a_product_at_other_controls_is_not_reused(problem, comm, shared_tmp, mode, options):
    """After products at m, one at m2 (and m2 differing from m in one entry on one rank only):
    a new forward sweep each, bitwise a fresh HessianSession's at m2; back at m, bitwise m's again."""
    model, controls, (v, w) = problem
    if mode == "local":
        options = {**options, "local_dir": shared_tmp}
    other = perturbed_controls(model)
    for k in other:
        other[k].axpy(0.5, w[k])
    nudged = {k: vec.copy() for k, vec in controls.items()}
    name = max(sorted(nudged), key=lambda k: nudged[k].getSize())  # a field: every rank owns some
    owners = [r for r, size in enumerate(comm.allgather(nudged[name].getLocalSize())) if size]
    if comm.rank == owners[-1]:
        with nudged[name] as arr:
            arr[-1] = np.nextafter(arr[-1], np.inf)
    products = P.HessianProducts(model, controls, **options)
    try:
        here = products.hessian_action(v)
        there = products.hessian_action(v, controls=other)
        assert products.counts["forward_sweeps"] == 2
        check_equal(there, H.HessianSession(model).hessian_action(other, v))
        products.hessian_action(w, controls=other)
        assert products.counts["forward_sweeps"] == 2  # the same bytes: reused
        nudge = products.hessian_action(v, controls=nudged)
        assert products.counts["forward_sweeps"] == 3
        check_equal(nudge, H.hessian_action(model, nudged, v))
        back = products.hessian_action(v, controls=controls)
        assert products.counts["forward_sweeps"] == 4
    finally:
        products.close()
    check_equal(back, here)
    assert back.J != there.J


def test_node_local_states_are_removed(problem, comm, shared_tmp):
    """close() removes the kept states' node-local files."""
    import os

    model, controls, (v, _) = problem
    local = os.path.join(shared_tmp, "states")
    products = P.HessianProducts(model, controls, ram="3", local_dir=local)
    products.hessian_action(v)
    files_before = sum(len(f) for _, _, f in os.walk(local)) if comm.rank == 0 else 1
    products.close()
    comm.Barrier()  # rank 0 counts every rank's files: each rank must have closed first
    files_after = sum(len(f) for _, _, f in os.walk(local)) if comm.rank == 0 else 0
    assert files_before > 0 and files_after == 0


def test_too_small_a_budget_is_refused(problem):
    model, controls, _ = problem
    with pytest.raises(ValueError, match="at least 2 slots"):
        P.HessianProducts(model, controls, ram="1")
