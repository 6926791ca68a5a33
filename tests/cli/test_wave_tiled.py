"""The wave model's time-tiled advance (kernels/wave_tiled.py) on one rank, in process: bitwise k
single steps for every tile depth 1..16 and run length, odd grids, the source anywhere, the sponge,
adaptive steps and the objective sampled inside the tiles; the driver and ``hpcadj check`` refusing
an advance that disagrees; bad depths refused naming the limit."""

import numpy as np
import pytest

from hpcadj.adjoint.contract import FAILED, PASSED, check_advance
from hpcadj.adjoint.advances import AdvanceMismatch
from hpcadj.adjoint.session import Checkpointing, ConfigError, compute_gradient_checkpointed
from hpcadj.imports import mpi
from hpcadj.models.wave import WaveModel


@pytest.fixture(scope="module")
def comm():
    return mpi().COMM_WORLD


def _perturbed(model, seed=3):
    """Controls away from the defaults: c scaled, u0 random (states nonzero from the first step)."""
    controls = model.default_controls()
    rng = np.random.default_rng(seed)
    controls["c"].getArray()[...] *= 1.03
    controls["u0"].getArray()[...] = 1e-3 * rng.standard_normal(controls["u0"].getLocalSize())
    return controls


def _stepped(model, i, u, k):
    states, terms = [u], []
    for j in range(i, i + k):
        states.append(model.step(j, states[-1]))
        terms.append(model.objective(j + 1, states[-1]))
    return states, terms


def _assert_advances(model, start, lengths, depths):
    """advance(start, u, k) for every k and T against the single steps: states and J terms bitwise."""
    model.set_controls(_perturbed(model))
    u = model.initial_state()
    for i in range(start):
        u = model.step(i, u)
    states, terms = _stepped(model, start, u, max(lengths))
    for depth in depths:
        model.set_time_tile(depth)
        for k in lengths:
            got, got_terms = model.advance(start, u, k, objective=True)
            want = states[k].getArray(readonly=True)
            assert np.array_equal(got.getArray(readonly=True), want), (depth, k)
            assert got_terms == terms[:k], (depth, k)
            assert np.array_equal(model.advance(start, u, k).getArray(readonly=True), want), (depth, k)


def _lengths(depth, long):
    return sorted({k for k in (1, depth - 1, depth, depth + 1, long) if k >= 1})


@pytest.mark.parametrize("grid", [(37, 23), (19, 21, 17)], ids=["2d", "3d"])
def test_every_depth_and_run_length_is_bitwise_single_steps(comm, grid):
    long = 41
    model = WaveModel(comm, grid, n_steps=long + 3)
    lengths = sorted({k for d in range(1, 17) for k in _lengths(d, long)})
    _assert_advances(model, 2, lengths, range(1, 17))


@pytest.mark.parametrize("source_x", [0.03, 0.5, 0.97])
def test_source_near_the_faces_and_in_the_sponge(comm, source_x):
    """The source at the first, middle and last nodes along x (inside the sponge at both ends)."""
    model = WaveModel(comm, (15, 13, 11), n_steps=20, source_x=source_x)
    assert model._sponge().max() > 0
    _assert_advances(model, 1, [2, 5, 13], [3, 4])


def test_adaptive_steps_inside_a_tile(comm):
    """Non-uniform dt (the last step shortened to land on t_final): r and dt^2 per step in the tile."""
    model = WaveModel(comm, (17, 15), adaptive=True, t_final=0.31)
    reference = WaveModel(comm, (17, 15), adaptive=True, t_final=0.31)
    for m in (model, reference):
        m.set_controls(_perturbed(m))
    u = reference.initial_state()
    states = [u]
    while not reference.done(len(states) - 1):
        states.append(reference.step(len(states) - 1, states[-1]))
    n = len(states) - 1
    assert reference.steps.dt(n - 1) != reference.steps.dt(n - 2)  # the last step differs
    model.set_time_tile(4)
    got = model.advance(0, model.initial_state(), n)
    assert model.n_steps == n
    assert np.array_equal(got.getArray(readonly=True), states[n].getArray(readonly=True))
    later = model.advance(n - 6, states[n - 6], 6)  # a recomputation over the uneven step
    assert np.array_equal(later.getArray(readonly=True), states[n].getArray(readonly=True))


def test_check_advance_passes_and_catches_a_wrong_advance(comm):
    model = WaveModel(comm, (13, 11), n_steps=16)
    assert check_advance(model).status == PASSED
    broken = _Broken(comm, (13, 11), n_steps=16)
    result = check_advance(broken)
    assert result.status == FAILED and "differs" in result.reason, result


class _Broken(WaveModel):
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
    model = WaveModel(comm, (13, 11), n_steps=8)
    for bad in (0, -1):
        with pytest.raises(ConfigError, match="whole number >= 1"):
            compute_gradient_checkpointed(model, Checkpointing(time_tile=bad))
    with pytest.raises(ConfigError, match="limit 64"):
        compute_gradient_checkpointed(model, Checkpointing(time_tile=65))


class _Counting(WaveModel):
    """Counts the runs handed to advance, by kind (first sweep: with the objective)."""

    runs = {True: 0, False: 0}

    def advance(self, i, u, k, objective=False):
        self.runs[objective] += 1
        return super().advance(i, u, k, objective)


def test_tiled_first_sweep_and_recomputation_give_the_untiled_gradient(comm):
    model = _Counting(comm, (15, 12, 13), n_steps=37)
    results = []
    for depth in (1, 5):
        controls = _perturbed(model, seed=8)
        r = compute_gradient_checkpointed(model, Checkpointing(ram=3, schedule="revolve", time_tile=depth),
                                          controls=controls)
        results.append((r.J, {n: v.getArray(readonly=True).copy() for n, v in r.gradient.items()},
                        r.forward_steps, r.recomputed_steps))
    (J1, g1, f1, r1), (J5, g5, f5, r5) = results
    assert model.runs[True] > 0 and model.runs[False] > 0, model.runs  # both sweeps handed runs over
    assert J1 == J5 and (f1, r1) == (f5, r5) and r1 > 0
    for name in g1:
        assert np.array_equal(g1[name], g5[name]), name


@pytest.mark.timeout(600)
@pytest.mark.parametrize("at", ["0:frontier=13", "1:12"], ids=["first-sweep", "reverse"])
def test_a_kill_inside_a_tiled_run_resumes_bitwise(tmp_path, at):
    """Rank 0 killed in the middle of the first sweep's advance of steps 0..24 (frontier 13), or
    rank 1 after the 12th action (in the reverse sweep, after recomputation): the resumed gradient
    is bitwise the untiled uninterrupted run's."""
    from ..helpers import assert_bitwise, hpcadj_json, killed_run, read_gradients

    base = ["run", "--model", "wave", "--grid", "17x9x8", "--steps", "40", "--ram", "3", "--schedule", "revolve",
            "--durable-every", "1", "--quiet"]
    ref = hpcadj_json([*base, "--time-tile", "1", "--gradient-out", str(tmp_path / "ref.h5")], 2, timeout=240)
    args = [*base, "--time-tile", "4", "--run-dir", str(tmp_path / "run")]
    killed_run([*args, "--json"], 2, at)
    info = hpcadj_json([*args, "--resume", "--gradient-out", str(tmp_path / "g.h5")], 2, timeout=240)
    assert info["J"] == ref["J"]
    assert_bitwise(read_gradients(tmp_path / "g.h5"), read_gradients(tmp_path / "ref.h5"))


def _width_case(comm, grid, widths, depths, lengths_of, start=2, **kw):
    """Every slab width and depth: advance(start, u, k) bitwise the single steps (states and J)."""
    model = WaveModel(comm, grid, n_steps=60, **kw)
    model.set_controls(_perturbed(model))
    u = model.initial_state()
    for i in range(start):
        u = model.step(i, u)
    long = max(k for d in depths for k in lengths_of(d))
    states, terms = _stepped(model, start, u, long)
    for width in widths:
        model.tile_width = width
        for depth in depths:
            model.set_time_tile(depth)
            for k in lengths_of(depth):
                got, got_terms = model.advance(start, u, k, objective=True)
                assert np.array_equal(got.getArray(readonly=True), states[k].getArray(readonly=True)), \
                    (width, depth, k)
                assert got_terms == terms[:k], (width, depth, k)
            if depth > 1:  # the slabs were used: the tiler keeps edge rows
                assert model._tiler.width == width and model._tiler.edge.shape[0] == depth


@pytest.mark.parametrize("source_x", [0.03, 0.5, 0.97])
def test_y_slabs_of_every_width_are_bitwise_single_steps(comm, source_x):
    """The y axis (21 points) cut into slabs 1, 2, 3, 5 rows wide, skewed a row per level: every
    depth 1..16 and run length 1, T - 1, T, T + 1, 37; the source (middle y row, so on a slab's edge
    at some level for each width) at the first, middle and last x node, inside the sponge at both."""
    _width_case(comm, (19, 21, 17), (1, 2, 3, 5), range(1, 17), lambda d: _lengths(d, 37), source_x=source_x)


def test_y_slabs_with_adaptive_steps(comm):
    """Non-uniform dt inside a slabbed tile: a made per point there, r and dt^2 per step."""
    reference = WaveModel(comm, (13, 21, 9), adaptive=True, t_final=0.31)
    model = WaveModel(comm, (13, 21, 9), adaptive=True, t_final=0.31)
    for m in (model, reference):
        m.set_controls(_perturbed(m))
    states = [reference.initial_state()]
    while not reference.done(len(states) - 1):
        states.append(reference.step(len(states) - 1, states[-1]))
    n = len(states) - 1
    assert reference.steps.dt(n - 1) != reference.steps.dt(n - 2)
    for width in (2, 5):
        model.tile_width = width
        model.set_time_tile(4)
        got = model.advance(0, model.initial_state(), n)
        assert np.array_equal(got.getArray(readonly=True), states[n].getArray(readonly=True)), width
        later = model.advance(n - 7, states[n - 7], 7)
        assert np.array_equal(later.getArray(readonly=True), states[n].getArray(readonly=True)), width


def _held_bytes(tiler) -> int:
    """Bytes of the arrays a Tiler holds: its own, and the extended c and a it made."""
    arrays = [v for v in vars(tiler).values() if isinstance(v, np.ndarray)]
    arrays += [pair[1] for pair in (tiler._c_of, tiler._a_of) if pair]
    return sum(a.nbytes for a in arrays)


@pytest.mark.parametrize("grid, width", [((96, 96), None), ((24, 20, 18), None), ((24, 20, 18), 4)])
def test_the_working_set_counts_what_the_tiler_holds_and_not_far_more(comm, grid, width):
    """The model's working set (``extra_states``) bounds the tiler's arrays from above, without
    counting the slabs' edge rows where the block is swept whole (a 2-D grid's were 16 states)."""
    from hpcadj.models.kernels import wave_tiled

    model = WaveModel(comm, grid, n_steps=20)
    model.tile_width = width
    model.set_time_tile(8)
    model.set_controls(_perturbed(model))
    model.advance(0, model.initial_state(), 10)
    state = 2 * 8 * int(np.prod(model.field.shape))  # a state: two owned fields
    held = _held_bytes(model._tiler)
    counted = wave_tiled.extra_states(model.field, 8, width) * state
    assert held <= counted <= 1.25 * held, (held / state, counted / state)


@pytest.mark.parametrize("grid, width", [((37, 23), None), ((19, 21, 17), None), ((19, 21, 17), 3)],
                         ids=["2d", "3d", "3d-slabs"])
def test_a_downward_sweep_is_bitwise_single_steps(comm, monkeypatch, grid, width):
    """The sweep run from the block's last plane along z (y in 2-D) to its first, as the last rank of
    a split along that axis takes it: every depth and run length, whole blocks and y slabs."""
    from hpcadj.models.kernels import wave_tiled

    made = []

    def downward(*args, **kwargs):
        made.append(wave_tiled_tiler(*args, **kwargs, down=True))
        return made[-1]

    wave_tiled_tiler = wave_tiled.Tiler
    monkeypatch.setattr(wave_tiled, "Tiler", downward)
    model = WaveModel(comm, grid, n_steps=30)
    model.tile_width = width
    _assert_advances(model, 2, [1, 2, 7, 8, 9, 25], (2, 3, 8, 16))
    assert made and all(t.down for t in made)
