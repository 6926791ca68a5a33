"""TAO's Newton methods (nls, bntr) on Gauss-Newton products through the inversion driver's
HessianShell fit the wave model's traces far better than L-BFGS (lmvm) in the same number of
iterations, under the driver's budgets and bounds."""

import pytest

pytestmark = pytest.mark.timeout(300)
ITERATIONS = 6


@pytest.fixture(scope="module")
def inversions(comm):
    """The inversion driver (hpcadj.inversion) with lmvm, and with nls and bntr on Gauss-Newton
    products through its shell matrix, ``ITERATIONS`` iterations each."""
    from hpcadj.inversion.driver import Inversion
    from hpcadj.models.wave import WaveModel

    out = {}
    # nls's inner CG capped at 10 products a Newton step (65 products in all instead of 474)
    options = {"nls": ["-tao_nls_ksp_max_it", "10"]}
    for kind in ("lmvm", "nls", "bntr"):
        model = WaveModel(comm, (12, 10), n_steps=30)
        out[kind] = Inversion(model, ["c"], tao_type=kind, max_it=ITERATIONS, gatol=0.0, grtol=0.0,
                              tao_options=options.get(kind)).solve()
    return out


@pytest.mark.parametrize("kind", ["nls", "bntr"])
def test_inversion_driver_runs_newton_types_on_hessian_products(inversions, kind):
    lbfgs, newton = inversions["lmvm"], inversions[kind]
    assert newton.iterations == lbfgs.iterations == ITERATIONS
    assert ITERATIONS < newton.counts["hessian_products"] <= 11 * ITERATIONS
    assert newton.counts["hessian_forward_steps"] > 0
    assert "hessian_products" not in lbfgs.counts
    assert newton.misfit < 0.1 * lbfgs.misfit, (newton.misfit, lbfgs.misfit)


def test_a_newton_type_for_a_model_without_products_is_refused(comm):
    from hpcadj.inversion.driver import Inversion, InversionError
    from hpcadj.models.wave import WaveModel

    model = WaveModel(comm, (12, 10), n_steps=4)
    model.add_objective_hessian = None  # as a user's model that offers no Hessian actions
    with pytest.raises(InversionError, match="-tao_type bntr: .*no add_objective_hessian"):
        Inversion(model, ["c"], tao_type="bntr", max_it=1).solve()


def test_bntr_takes_bounds_on_the_velocity(comm):
    """bntr is a bounded method: the driver passes c's bounds to it (the guard against a trial step
    past the leapfrog's CFL limit) and every iterate stays inside them, the upper one active."""
    from hpcadj.inversion.driver import Inversion
    from hpcadj.models.wave import WaveModel

    model = WaveModel(comm, (12, 10), n_steps=30)
    result = Inversion(model, ["c"], tao_type="bntr", bounds={"c": (0.9, 1.3)}, max_it=2, gatol=0.0,
                       grtol=0.0).solve()
    c = result.controls["c"]
    assert result.iterations == 2 and result.counts["hessian_products"] > 0
    assert c.min()[1] >= 0.9 and c.max()[1] == 1.3, (c.min(), c.max())


def test_inversion_products_use_the_ram_budget(comm):
    """The driver hands its checkpointing's RAM budget to the Hessian products: under 4 slots (too
    few for the 11 states) each product is a composite run that recomputes forward steps, and the
    run is bitwise the store-all one. Under a whole-process budget (``memory``) the products go
    through the memory rule (their predicted peak within it), free their states before every
    gradient session and rebuild them for a product that follows one: still bitwise."""
    from hpcadj import Checkpointing
    from hpcadj.inversion.driver import Inversion
    from hpcadj.models.wave import WaveModel

    runs = {}
    steps = 10
    for name, ck in (("store-all", None), ("budget", Checkpointing(ram=4, schedule="revolve")),
                     ("memory", Checkpointing(memory="1GiB"))):
        model = WaveModel(comm, (12, 10), n_steps=steps)
        runs[name] = Inversion(model, ["c"], ck, tao_type="bntr", max_it=2, gatol=0.0, grtol=0.0).solve()
    full, budget, memory = runs["store-all"], runs["budget"], runs["memory"]
    assert 0 < memory.counts["hessian_predicted_peak_bytes"] <= 2 ** 30
    assert memory.counts["hessian_products"] == full.counts["hessian_products"]
    assert memory.counts["hessian_forward_sweeps"] >= full.counts["hessian_forward_sweeps"] >= 2
    assert [h["J"] for h in memory.history] == [h["J"] for h in full.history]
    assert (memory.controls["c"].getArray() == full.controls["c"].getArray()).all()
    assert budget.iterations == full.iterations == 2
    assert budget.counts["hessian_products"] == full.counts["hessian_products"] > 0
    sweeps = full.counts["hessian_forward_steps"]  # one forward sweep per Hessian point
    assert budget.counts["hessian_forward_steps"] > sweeps + steps * budget.counts["hessian_products"], \
        (budget.counts, full.counts)
    assert [h["J"] for h in budget.history] == [h["J"] for h in full.history]
    assert (budget.controls["c"].getArray() == full.controls["c"].getArray()).all()
