"""The explicit models' compiled kernels: deterministic, inputs untouched, halo faces right."""

import numpy as np
import pytest

from hpcadj.models import kernels
from hpcadj.models.burgers import BurgersModel
from hpcadj.models.dmda import Grid
from hpcadj.models.wave import WaveModel
from hpcadj.imports import mpi


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


@pytest.mark.parametrize("sizes,depth,periodic", [((9, 7), 3, True), ((5, 4), 3, True), ((12, 9), 5, True),
                                                  ((3, 3), 5, True), ((9, 7), 3, False)])
def test_deep_halo_strips_hold_the_neighbours_points(comm, sizes, depth, periodic):
    """DeepHalo's four strips hold the points around the owned block, corners included, wrapped
    periodically (0 outside a non-periodic domain), also where they reach past the next rank
    (3 ranks split 3 or 4 points per axis, depth 3 or 5), for each field of a split state."""
    field = kernels.LeanGrid(comm, sizes, periodic=periodic)
    pair = kernels.PairLayout(field)
    split = kernels.SplitPair(field, pair)
    halos = [split.deep_halo(c, depth) for c in (0, 1)]
    field.release()
    ny, nx = field.global_shape
    (my, mx), (ys, xs) = field.shape, field.start
    vec = split.pool.new_vec()
    fields = split.fields(vec, readonly=False)
    gy, gx = np.meshgrid(np.arange(ys, ys + my), np.arange(xs, xs + mx), indexing="ij")
    fields[0] = 1.0 + gy * 1000 + gx
    fields[1] = -fields[0]

    def expected(rows, cols, sign):
        r, c = np.meshgrid(rows, cols, indexing="ij")
        inside = (r >= 0) & (r < ny) & (c >= 0) & (c < nx)
        value = sign * (1.0 + (r % ny) * 1000 + (c % nx))
        return np.where(inside | periodic, value, 0.0)

    cols = np.arange(xs - depth, xs + mx + depth)
    for component, sign in ((0, 1.0), (1, -1.0)):
        ylo, yhi, xlo, xhi = halos[component].strips(vec)
        assert np.array_equal(ylo, expected(np.arange(ys - depth, ys), cols, sign))
        assert np.array_equal(yhi, expected(np.arange(ys + my, ys + my + depth), cols, sign))
        assert np.array_equal(xlo, expected(np.arange(ys, ys + my), np.arange(xs - depth, xs), sign))
        assert np.array_equal(xhi, expected(np.arange(ys, ys + my), np.arange(xs + mx, xs + mx + depth), sign))


def test_fma_rounds_once_in_vector_and_scalar_code(comm):
    """kernels.fma.fma is a fused multiply-add in a vectorised loop and in its scalar remainder alike:
    (1 + 2^-30)(1 - 2^-30) - 1 = -2^-60 exactly, which a separate multiply and add round to 0."""
    from numba import njit

    from hpcadj.models.kernels.fma import fma

    @njit
    def apply(a, b, c, out):
        for i in range(a.shape[0]):
            out[i] = fma(a[i], b[i], c[i])

    n = 37  # a vectorised body and a scalar remainder
    a, b, c = np.full(n, 1.0 + 2.0 ** -30), np.full(n, 1.0 - 2.0 ** -30), np.full(n, -1.0)
    out = np.empty(n)
    apply(a, b, c, out)
    assert np.all(out == -(2.0 ** -60))
    assert float(a[0] * b[0] + c[0]) == 0.0


def _burgers_stage_reference(w, nu, dt, h, beta):
    """beta (w + dt N(w)) on the whole periodic grid, numpy, w of shape (2, ny, nx)."""
    hy, hx = h
    u, v = w

    def sh(f, dy, dx):  # f at (j + dy, i + dx)
        return np.roll(f, (-dy, -dx), axis=(0, 1))

    def adv(c):  # 1/2 [w . grad c + div(w c)], central
        dcx = (sh(c, 0, 1) - sh(c, 0, -1)) / (2 * hx)
        dcy = (sh(c, 1, 0) - sh(c, -1, 0)) / (2 * hy)
        fx = (sh(u * c, 0, 1) - sh(u * c, 0, -1)) / (2 * hx)
        fy = (sh(v * c, 1, 0) - sh(v * c, -1, 0)) / (2 * hy)
        return 0.5 * (u * dcx + v * dcy + fx + fy)

    def lap(c):
        return ((sh(c, 0, 1) - 2 * c + sh(c, 0, -1)) / hx ** 2 + (sh(c, 1, 0) - 2 * c + sh(c, -1, 0)) / hy ** 2)

    return np.stack([beta * (c + dt * (-adv(c) + nu * lap(c))) for c in (u, v)])


def _burgers_tangent_reference(w, d, nu, dnu, dt, h):
    """u_{i+1} and its tangent in direction (d, dnu), numpy: every stage map S is quadratic in w
    and bilinear in (w, nu), so (S(w + d; nu + dnu) - S(w - d; nu - dnu)) / 2 is its exact tangent
    (to round-off), and a whole step's tangent follows stage by stage."""
    def S(x, n, beta):
        return _burgers_stage_reference(x, n, dt, h, beta)

    def T(x, dx, beta):
        return 0.5 * (S(x + dx, nu + dnu, beta) - S(x - dx, nu - dnu, beta))

    w1, d1 = S(w, nu, 1.0), T(w, d, 1.0)
    w2, d2 = 0.75 * w + S(w1, nu, 0.25), 0.75 * d + T(w1, d1, 0.25)
    return w / 3 + S(w2, nu, 2.0 / 3.0), d / 3 + T(w2, d2, 2.0 / 3.0)


@pytest.mark.parametrize("sizes", [(29, 37), (7, 5)], ids=["29x37", "7x5"])
def test_burgers_one_pass_tangent_and_adjoint_steps_agree_with_numpy_stages(comm, sizes):
    """The one-pass tangent step (three stages through rings, a depth-3 halo) equals a numpy RK3
    tangent made stage by stage on the gathered grid, and the one-pass adjoint step (depth 5 and 3)
    is its transpose: <lambda_{i+1}, T (d, dnu)> = <lambda_i, d> + dJ/dnu's increment dnu. On 3
    ranks 7x5 puts blocks of 2-3 points under halos of 3 and 5."""
    from hpcadj.models.burgers import scalar_value

    model = BurgersModel(comm, sizes, n_steps=2)
    controls = model.default_controls()
    model.set_controls(controls)
    rng = np.random.default_rng(11)
    global_shape = (2,) + model.field.global_shape
    d_full, lam_full = rng.standard_normal(global_shape), rng.standard_normal(global_shape)
    (ys, xs), (my, mx) = model.field.start, model.field.shape
    block = (slice(None), slice(ys, ys + my), slice(xs, xs + mx))

    def state(full):
        vec = model._pool.new_vec()
        model._block(vec, readonly=False)[...] = full[block]
        return vec

    def gathered(vec):
        full = np.zeros(global_shape)
        full[block] = model._block(vec)
        return comm.allreduce(full)

    u = model.step(0, model.initial_state())
    w_full = gathered(u)
    dnu = 0.3 * model.nu
    dcontrols = {"u0": controls["u0"], "nu": controls["nu"].copy()}
    dcontrols["nu"].set(dnu)
    assert scalar_value(comm, dcontrols["nu"]) == dnu
    tangent = gathered(model.tangent_step(1, u, None, state(d_full), dcontrols))
    dt = model._step_dt(1, u)
    _, ref = _burgers_tangent_reference(w_full, d_full, model.nu, dnu, dt, model.h)
    assert np.max(np.abs(tangent - ref)) <= 1e-12 * np.max(np.abs(ref))

    grad = {name: vec.duplicate() for name, vec in controls.items()}
    for vec in grad.values():
        vec.set(0.0)
    lam_i = gathered(model.adjoint_step(1, u, None, state(lam_full), grad))
    dj_dnu = scalar_value(comm, grad["nu"])
    lhs = float(np.vdot(lam_full, tangent))
    rhs = float(np.vdot(lam_i, d_full)) + dj_dnu * dnu
    assert abs(lhs - rhs) <= 1e-12 * (abs(lhs) + abs(rhs)), (lhs, rhs)
