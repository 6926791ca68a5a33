"""Acoustic wave (leapfrog, sponge, Ricker source, receivers): gradient checks in 2-D and 3-D,
rank-count invariance, observed traces from a file."""

import numpy as np
import pytest

from hpcadj.models.wave import WaveModel

from model_checks import (check_dot_product, check_rank_invariance, check_restart_across_ranks,
                           check_taylor)


def build2(comm):
    return WaveModel(comm, (14, 12), n_steps=24)


def build3(comm):
    return WaveModel(comm, (8, 7, 9), n_steps=14)


@pytest.mark.parametrize("build", [build2, build3], ids=["2d", "3d"])
@pytest.mark.parametrize("control", ["c", "u0"])
def test_taylor(comm, build, control):
    check_taylor(comm, build, control)


@pytest.mark.parametrize("build", [build2, build3], ids=["2d", "3d"])
def test_dot_product(comm, build):
    check_dot_product(comm, build, tol=1e-12)


@pytest.mark.parametrize("build", [build2, build3], ids=["2d", "3d"])
def test_rank_invariance(comm, build):
    check_rank_invariance(comm, build, rtol=1e-13)


def test_restart_across_ranks(comm):
    check_restart_across_ranks(comm, build2, rtol=0.0)


def test_true_model_has_zero_misfit_and_background_does_not(comm):
    model = build2(comm)
    controls = model.default_controls()
    from hpcadj.adjoint.verify import evaluate_objective

    assert evaluate_objective(model, controls) > 0
    true = {"c": model.c_true, "u0": controls["u0"]}
    assert evaluate_objective(model, true) == 0.0


def test_observed_traces_from_file(comm, shared_tmp):
    """Traces written to HDF5 and read back give the same J; a wrong shape is refused."""
    from hpcadj.adjoint.verify import evaluate_objective
    from hpcadj.imports import h5py

    reference = build2(comm)
    path = f"{shared_tmp}/traces.h5"
    if comm.rank == 0:
        with h5py().File(path, "w", driver=None) as f:
            f["traces"] = reference.observed
        with h5py().File(f"{shared_tmp}/short.h5", "w", driver=None) as f:
            f["traces"] = reference.observed[:-1]
    comm.Barrier()
    from_file = WaveModel(comm, (14, 12), n_steps=24, observed=path)
    assert np.array_equal(from_file.observed, reference.observed)
    controls = reference.default_controls()
    assert evaluate_objective(from_file, controls) == evaluate_objective(reference, controls)
    with pytest.raises(ValueError, match="shape"):
        WaveModel(comm, (14, 12), n_steps=24, observed=f"{shared_tmp}/short.h5")


def test_sparse_objective_gradient_adds_what_the_full_vec_adds(comm):
    """add_objective_gradient (receivers only) gives bitwise what lam + objective_gradient gives,
    at a step whose residuals are nonzero somewhere."""
    model = build2(comm)
    controls = model.default_controls()
    model.set_controls(controls)
    u = model.initial_state()
    for i in range(12):
        u = model.step(i, u)
    assert comm.allreduce(sum(abs(r) for _k, _loc, r in model._residuals(12, u))) > 0
    lam = u.copy()
    lam.scale(0.37)
    full = lam.copy()
    full.axpy(1.0, model.objective_gradient(12, u))
    model.add_objective_gradient(12, u, lam)
    assert np.array_equal(lam.getArray(readonly=True), full.getArray(readonly=True))
    assert lam.norm() == full.norm()


def test_split_state_layout_round_trips_through_snapshots_and_controls(comm):
    """The state stores (u^{i-1}, u^i) split; snapshots, the initial state and dJ/du0 keep the
    fields apart and the control u0 interleaved (a swapped or interleaved view would fail here;
    dJ/du0's conversion back is covered by the Taylor and dot-product tests of u0)."""
    from hpcadj.adjoint.verify import random_direction

    model = build3(comm)
    controls = model.default_controls()
    u0 = random_direction(model, controls, seed=5)["u0"]
    controls["u0"] = u0
    model.set_controls(controls)
    state = model.initial_state()
    pair = model.grid.owned_view(u0)
    snap = model.snapshot(state)
    assert np.array_equal(snap["u_prev"], pair[..., 0]) and np.array_equal(snap["u"], pair[..., 1])
    copied = model.restore({k: v.copy() for k, v in snap.items()})
    again = model.snapshot(copied)
    assert all(np.array_equal(again[k], snap[k]) for k in snap)
    assert not np.shares_memory(copied.getArray(readonly=True), state.getArray(readonly=True))
    # views of a pooled state (what a RAM level holds by reference) restore without a copy
    shared = model.restore(snap)
    assert np.shares_memory(shared.getArray(readonly=True), state.getArray(readonly=True))
    swapped = model.restore({"u_prev": snap["u"], "u": snap["u_prev"]})
    assert not np.shares_memory(swapped.getArray(readonly=True), state.getArray(readonly=True))
    assert np.array_equal(model.snapshot(swapped)["u"], snap["u_prev"])


def test_compute_gradient_refuses_an_undecided_step_count(comm):
    from hpcadj.adjoint.verify import compute_gradient

    model = WaveModel(comm, (10, 9), adaptive=True, t_final=0.1)
    with pytest.raises(ValueError, match="adaptive"):
        compute_gradient(model, model.default_controls())
