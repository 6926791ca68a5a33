"""The explicit models' compiled kernels: deterministic, inputs untouched, halo faces right."""

import numpy as np
import pytest

from hpcadj.models import kernels
from hpcadj.models.burgers import BurgersModel
from hpcadj.models.dmda import Grid
from hpcadj.models.wave import WaveModel
from hpcadj.stack import mpi


def _models(comm):
    return [WaveModel(comm, (14, 12), n_steps=6), WaveModel(comm, (8, 7, 9), n_steps=6),
            BurgersModel(comm, (12, 9), n_steps=4)]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["wave2d", "wave3d", "burgers"])
def test_recomputed_steps_are_bitwise_equal_and_inputs_unchanged(comm, which):
    model = _models(comm)[which]
    controls = model.default_controls()
    model.set_controls(controls)
    u = model.initial_state().copy()  # u_0 is the model's own: perturb a copy
    rng = np.random.default_rng(7 + comm.rank)
    u.getArray()[...] += 1e-2 * rng.standard_normal(u.getLocalSize())
    before = u.getArray(readonly=True).copy()
    first = model.step(0, u).getArray(readonly=True).copy()
    second = model.step(0, u).getArray(readonly=True).copy()
    assert np.array_equal(first, second)
    assert np.array_equal(u.getArray(readonly=True), before)
    u1 = model.step(0, u)
    lam = u1.copy()
    grads = [{k: v.duplicate() for k, v in controls.items()} for _ in range(2)]
    outs = []
    for grad in grads:
        for v in grad.values():
            v.set(0.0)
        outs.append(model.adjoint_step(0, u, u1, lam, grad).getArray(readonly=True).copy())
    assert np.array_equal(outs[0], outs[1])
    for name in controls:
        assert np.array_equal(grads[0][name].getArray(readonly=True), grads[1][name].getArray(readonly=True))
    assert np.array_equal(lam.getArray(readonly=True), u1.getArray(readonly=True))
    t = [model.tangent_step(0, u, u1, lam, controls).getArray(readonly=True).copy() for _ in range(2)]
    assert np.array_equal(t[0], t[1])


@pytest.mark.parametrize("sizes,periodic", [((9, 7), False), ((6, 5, 7), False), ((9, 7), True)])
def test_halo_faces_match_the_padded_block(comm, sizes, periodic):
    grid = Grid(comm, sizes, periodic=periodic, dof=2)
    vec = grid.create_vec()
    lg = grid.owned_global_indices()
    grid.owned(vec)[...] = lg.astype(float) + 0.5
    padded = grid.padded(vec)
    faces = kernels.Halo(grid).faces(vec)
    inner = [slice(1, -1)] * grid.dim
    k = 0
    for axis in range(grid.dim):
        for end in (0, -1):
            sl = list(inner)
            sl[axis] = end
            assert np.array_equal(faces[k], padded[tuple(sl)]), (axis, end)
            k += 1


def test_new_vec_has_the_grid_layout(comm):
    grid = Grid(comm, (9, 7), dof=2)
    vec = kernels.new_vec(grid)
    ref = grid.create_vec()
    assert vec.getSizes() == ref.getSizes() and vec.getOwnershipRange() == ref.getOwnershipRange()
    assert vec.getBlockSize() == 2


@pytest.mark.parametrize("which", [0, 1, 2], ids=["wave2d", "wave3d", "burgers"])
def test_controls_are_kept_not_referenced(comm, which):
    """set_controls keeps what a step needs of the controls: changing the caller's Vecs afterwards
    changes neither u_0 nor the steps (the models keep no copy of the control Vecs themselves)."""
    model = _models(comm)[which]
    controls = model.default_controls()
    model.set_controls(controls)
    u0 = model.initial_state()
    before = u0.getArray(readonly=True).copy()
    step = model.step(1, model.step(0, u0)).getArray(readonly=True).copy()
    for vec in controls.values():
        vec.scale(1.5)
    again = model.initial_state()
    assert np.array_equal(again.getArray(readonly=True), before)
    assert np.array_equal(model.step(1, model.step(0, again)).getArray(readonly=True), step)
    model.set_controls(controls)  # and the changed controls do change the steps
    changed = model.step(1, model.step(0, model.initial_state())).getArray(readonly=True)
    assert comm.allreduce(not np.array_equal(changed, step), op=mpi().LOR)


@pytest.mark.parametrize("mode", [3, 2])
@pytest.mark.parametrize("alias", ["P", "M"])
def test_burgers_backward_stage_in_place_is_bitwise_the_out_of_place_one(comm, mode, alias):
    """The adjoint step writes a backward stage's vector over the field it reads (P = the stage
    state, or M = the incoming adjoint); every point must still read the old values."""
    from hpcadj.models.kernels import burgers as kern

    model = BurgersModel(comm, (12, 9), n_steps=4)
    model.set_controls(model.default_controls())
    rng = np.random.default_rng(3 + comm.rank)
    u = model.step(0, model.initial_state())
    lam = model.step(1, u).copy()
    lam.getArray()[...] += rng.standard_normal(lam.getLocalSize())
    P, M = model._block(u).copy(), model._block(lam).copy()
    FP, FM = model._faces(u, 0), model._faces(lam, 3)
    args = (model.nu, model.dt, model._ih)
    ref1, ref2, out2 = np.empty_like(P), np.zeros_like(P), np.zeros_like(P)
    g_ref = kern.adjoint_stage(*P, *FP, *M, *FM, mode, *args, *ref1, *ref2)
    target = P if alias == "P" else M
    g = kern.adjoint_stage(*P, *FP, *M, *FM, mode, *args, *target, *out2)
    assert g == g_ref
    assert np.array_equal(target, ref1) and np.array_equal(out2, ref2)
    assert not np.array_equal(ref1, model._block(u if alias == "P" else lam))  # the update did change it
