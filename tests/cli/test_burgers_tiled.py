"""The burgers model's time-tiled advance (kernels/burgers_tiled.py) on one rank, in process: bitwise
k single steps for every tile depth 1..8 and run length, odd and tiny grids (the depth-3T halo
wrapping the periodic domain several times), J at the last step, adaptive steps; ``hpcadj check``
and the session refusing an advance that disagrees; bad depths refused naming the limit; the
gradient bitwise the untiled one's under revolve."""

import numpy as np
import pytest

from hpcadj.adjoint.advances import AdvanceMismatch
from hpcadj.adjoint.contract import FAILED, PASSED, check_advance
from hpcadj.adjoint.session import Checkpointing, ConfigError, compute_gradient_checkpointed
from hpcadj.imports import mpi
from hpcadj.models.burgers import BurgersModel


@pytest.fixture(scope="module")
def comm():
    return mpi().COMM_WORLD


def _perturbed(model, seed=3):
    """Controls away from the defaults: u0 with random noise, nu scaled."""
    controls = model.default_controls()
    rng = np.random.default_rng(seed)
    controls["u0"].getArray()[...] += 0.05 * rng.standard_normal(controls["u0"].getLocalSize())
    controls["nu"].getArray()[...] *= 1.3
    return controls


def _stepped(model, i, u, k):
    states, terms = [u], []
    for j in range(i, i + k):
        states.append(model.step(j, states[-1]))
        terms.append(model.objective(j + 1, states[-1]))
    return states, terms


def _lengths(depth, long):
    return sorted({k for k in (1, depth - 1, depth, depth + 1, long) if k >= 1})


def _assert_advances(model, start, depths, long):
    """advance(start, u, k) for every T and k against the single steps: states and J terms bitwise."""
    model.set_controls(_perturbed(model))
    u = model.initial_state()
    for i in range(start):
        u = model.step(i, u)
    states, terms = _stepped(model, start, u, long)
    for depth in depths:
        model.set_time_tile(depth)
        for k in _lengths(depth, long):
            got, got_terms = model.advance(start, u, k, objective=True)
            want = states[k].getArray(readonly=True)
            assert np.array_equal(got.getArray(readonly=True), want), (depth, k)
            assert got_terms == terms[:k], (depth, k)
            assert np.array_equal(model.advance(start, u, k).getArray(readonly=True), want), (depth, k)


@pytest.mark.parametrize("grid", [(37, 23), (7, 5)], ids=["odd", "tiny"])
def test_every_depth_and_run_length_is_bitwise_single_steps(comm, grid):
    """T = 1..8, k = 1, T - 1, T, T + 1, 29; the run ends at the last step (J's) at k = 29."""
    model = BurgersModel(comm, grid, n_steps=31)
    _assert_advances(model, 2, range(1, 9), 29)


def test_adaptive_steps_inside_a_tile(comm):
    """Recorded non-uniform dt (the last step shortened to land on t_final) inside the tiles; in the
    first sweep a step whose dt is not decided yet is a single step."""
    model = BurgersModel(comm, (17, 15), adaptive=True, t_final=0.4)
    reference = BurgersModel(comm, (17, 15), adaptive=True, t_final=0.4)
    for m in (model, reference):
        m.set_controls(_perturbed(m))
    states = [reference.initial_state()]
    while not reference.done(len(states) - 1):
        states.append(reference.step(len(states) - 1, states[-1]))
    n = len(states) - 1
    dts = [reference.steps.dt(i) for i in range(n)]
    assert n > 8 and len(set(dts)) > 2, dts  # the dt changes from step to step
    model.set_time_tile(4)
    got = model.advance(0, model.initial_state(), n)
    assert model.n_steps == n
    assert np.array_equal(got.getArray(readonly=True), states[n].getArray(readonly=True))
    later = model.advance(n - 7, states[n - 7], 7)  # a recomputation over decided steps, in tiles
    assert np.array_equal(later.getArray(readonly=True), states[n].getArray(readonly=True))


def test_check_advance_passes_and_catches_a_wrong_advance(comm):
    model = BurgersModel(comm, (13, 11), n_steps=16)
    assert check_advance(model).status == PASSED
    result = check_advance(_Broken(comm, (13, 11), n_steps=16))
    assert result.status == FAILED and "differs" in result.reason, result


class _Broken(BurgersModel):
    """An advance one ulp off at one point."""

    def advance(self, i, u, k, objective=False):
        got = super().advance(i, u, k, objective)
        out = got[0] if objective else got
        out.getArray()[0] = np.nextafter(out.getArray()[0], 1.0)
        return got


def test_the_session_refuses_a_wrong_advance_before_any_gradient(comm):
    model = _Broken(comm, (13, 11), n_steps=24)
    with pytest.raises(AdvanceMismatch, match="differs from its single steps"):
        compute_gradient_checkpointed(model, Checkpointing(ram=3, schedule="revolve"))


def test_bad_depths_are_refused_naming_the_limit(comm):
    model = BurgersModel(comm, (13, 11), n_steps=8)
    for bad in (0, -1):
        with pytest.raises(ConfigError, match="whole number >= 1"):
            compute_gradient_checkpointed(model, Checkpointing(time_tile=bad))
    with pytest.raises(ConfigError, match="limit 64"):
        compute_gradient_checkpointed(model, Checkpointing(time_tile=65))


class _Counting(BurgersModel):
    """Counts the runs handed to advance, by kind (first sweep: with the objective)."""

    runs = {True: 0, False: 0}

    def advance(self, i, u, k, objective=False):
        self.runs[objective] += 1
        return super().advance(i, u, k, objective)


def test_tiled_first_sweep_and_recomputation_give_the_untiled_gradient(comm):
    model = _Counting(comm, (15, 12), n_steps=37)
    results = []
    for depth in (1, 5):
        r = compute_gradient_checkpointed(model, Checkpointing(ram=3, schedule="revolve", time_tile=depth),
                                          controls=_perturbed(model, seed=8))
        results.append((r.J, {n: v.getArray(readonly=True).copy() for n, v in r.gradient.items()},
                        r.forward_steps, r.recomputed_steps))
    (J1, g1, f1, r1), (J5, g5, f5, r5) = results
    assert model.runs[True] > 0 and model.runs[False] > 0, model.runs  # both sweeps handed runs over
    assert J1 == J5 and (f1, r1) == (f5, r5) and r1 > 0
    for name in g1:
        assert np.array_equal(g1[name], g5[name]), name
