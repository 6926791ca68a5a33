"""The burgers model's tiled advance on 1, 2 and 3 ranks: a halo of depth 3T gathered once per tile
(reaching past the next rank where T is deep), the overlap computed redundantly, states and J
bitwise the single steps' on uneven partitions cut along x or y; gradients bitwise the untiled
run's under every schedule."""

import os

import numpy as np
import pytest

from hpcadj.adjoint.session import Checkpointing, compute_gradient_checkpointed
from hpcadj.models.burgers import BurgersModel

from test_wave_tiled import _schedules  # the same six schedules as the wave's tiles


def _perturbed(model, seed=5):
    controls = model.default_controls()
    rng = np.random.default_rng(seed + model.comm.rank)
    controls["u0"].getArray()[...] += 0.05 * rng.standard_normal(controls["u0"].getLocalSize())
    controls["nu"].getArray()[...] *= 1.2
    return controls


def _agree_equal(comm, a, b) -> bool:
    from hpcadj.imports import mpi

    return comm.allreduce(bool(np.array_equal(a, b)), op=mpi().LAND)


@pytest.mark.parametrize("grid", [(29, 11), (11, 29)], ids=["x-split", "y-split"])
def test_states_bitwise_on_uneven_partitions(comm, grid):
    """29 points along the split axis: blocks of 15/14 or 10/10/9 points, so a depth-7 tile's halo
    (21 points) reaches past the next rank; T = 1, 2, 3, 4, 7 and runs of 1, T - 1, T, T + 1 and 17
    steps ending at the last step (J's)."""
    model = BurgersModel(comm, grid, n_steps=17)
    sizes = [len(r) for r in model.field.ownership_ranges]  # ranks along x, y
    assert comm.size == 1 or sizes[0 if grid[0] > grid[1] else 1] == comm.size, sizes
    model.set_controls(_perturbed(model))
    u = model.initial_state()
    states = [u]
    for i in range(17):
        states.append(model.step(i, states[-1]))
    terms = [model.objective(i, states[i]) for i in range(1, 18)]
    for depth in (1, 2, 3, 4, 7):
        model.set_time_tile(depth)
        for k in sorted({k for k in (1, depth - 1, depth, depth + 1, 17) if k >= 1}):
            got, got_terms = model.advance(17 - k, states[17 - k], k, objective=True)
            assert _agree_equal(comm, got.getArray(readonly=True), states[17].getArray(readonly=True)), (depth, k)
            assert got_terms == terms[17 - k:], (depth, k)
            got = model.advance(0, u, k)
            assert _agree_equal(comm, got.getArray(readonly=True), states[k].getArray(readonly=True)), (depth, k)


def test_gradients_bitwise_the_untiled_runs_under_every_schedule(comm, shared_tmp):
    model = BurgersModel(comm, (17, 13), n_steps=29)
    for name, options in _schedules(shared_tmp).items():
        got = []
        for tile in (1, 4):
            extra = ({"pfs_file": os.path.join(shared_tmp, f"burgers-{name}-{tile}.h5")} if "pfs" in options else {})
            r = compute_gradient_checkpointed(model, Checkpointing(**options, **extra, time_tile=tile),
                                              controls=_perturbed(model, seed=11))
            got.append((r.J, {n: v.getArray(readonly=True).copy() for n, v in r.gradient.items()},
                        r.forward_steps, r.recomputed_steps))
        (J1, g1, f1, r1), (J2, g2, f2, r2) = got
        assert J1 == J2 and (f1, r1) == (f2, r2), name
        for field in g1:
            assert _agree_equal(comm, g1[field], g2[field]), (name, field)
