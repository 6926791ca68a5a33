"""The wave model's tiled advance on 1, 2 and 3 ranks: halos of depth T gathered once per tile, the
overlap computed redundantly, states bitwise the single steps' on uneven partitions with the source
on a rank boundary and at the halo's edge; gradients bitwise the untiled run's under every schedule."""

import os

import numpy as np
import pytest

from hpcadj.adjoint.session import Checkpointing, compute_gradient_checkpointed
from hpcadj.checkpoint.schedules import CostProfile
from hpcadj.models.wave import WaveModel


def _perturbed(model, seed=5):
    controls = model.default_controls()
    rng = np.random.default_rng(seed + model.comm.rank)
    controls["c"].getArray()[...] *= 1.02
    controls["u0"].getArray()[...] = 1e-3 * rng.standard_normal(controls["u0"].getLocalSize())
    return controls


def _agree_equal(comm, a, b) -> bool:
    return comm.allreduce(bool(np.array_equal(a, b)), op=_land())


def _land():
    from hpcadj.imports import mpi

    return mpi().LAND


def _boundary_sources(comm, n_x):
    """source_x fractions putting the source on the first node of each rank after the first along x,
    on the last node before it, and T = 3 nodes inside the neighbour (the halo's edge)."""
    model = WaveModel(comm, (n_x, 9), n_steps=2)
    sizes = np.asarray(model.field.ownership_ranges[0])  # along x (xyz order)
    cuts = np.cumsum(sizes)[:-1]
    assert comm.size == 1 or len(cuts) == comm.size - 1, sizes  # x is the axis split
    out = {0.5}
    for cut in cuts:
        for node in (cut, cut - 1, cut + 3, cut - 4):
            if 0 <= node < n_x:
                out.add((node + 1) / (n_x + 1))
    return sorted(out)


def _assert_tiled_bitwise(comm, model, widths=(None,), check=None):
    """advance(0, u, k) at T = 2, 3, 4, 7 (within the partition's limit), k = 1, T - 1, T, T + 1, 17,
    per slab width: states and J bitwise the single steps' on every rank; ``check(width, depth)``
    after each depth's runs."""
    model.set_controls(_perturbed(model))
    u = model.initial_state()
    states = [u]
    for i in range(17):
        states.append(model.step(i, states[-1]))
    terms = [model.objective(i, states[i]) for i in range(1, 18)]
    limit = model.time_tile_limit()
    for width in widths:
        model.tile_width = width
        for depth in sorted({d for d in (2, 3, 4, 7) if d <= limit}):
            model.set_time_tile(depth)
            for k in (1, depth - 1, depth, depth + 1, 17):
                if k < 1:
                    continue
                got, got_terms = model.advance(0, u, k, objective=True)
                assert _agree_equal(comm, got.getArray(readonly=True), states[k].getArray(readonly=True)), \
                    (width, depth, k)
                assert got_terms == terms[:k], (width, depth, k)
            if check is not None:
                check(width, depth)


@pytest.mark.parametrize("grid", [(29, 11), (23, 8, 9)], ids=["2d", "3d"])
def test_states_bitwise_on_uneven_partitions_with_the_source_on_a_boundary(comm, grid):
    """x (given first) has 29 or 23 points: split over 2 or 3 ranks unevenly; the source put on
    each cut, next to it and at the halo's edge."""
    for source_x in _boundary_sources(comm, grid[0]):
        _assert_tiled_bitwise(comm, WaveModel(comm, grid, n_steps=20, source_x=source_x))


def test_depth_limit_is_the_thinnest_split_block(comm):
    model = WaveModel(comm, (23, 8, 9), n_steps=4)
    limit = model.time_tile_limit()
    if comm.size == 1:
        assert limit == 64
    else:
        assert limit == comm.allreduce(min(model.field.shape[a] for a, s in
                                           enumerate(reversed(model.field.ownership_ranges)) if len(s) > 1),
                                       op=_min())
        with pytest.raises(ValueError, match=f"limit {limit}"):
            model.set_time_tile(limit + 1)


def _min():
    from hpcadj.imports import mpi

    return mpi().MIN


def _schedules(tmp):
    local = os.path.join(tmp, "local")
    os.makedirs(local, exist_ok=True)
    return {
        "store-all": {},
        "revolve": {"ram": 3, "schedule": "revolve"},
        "multilevel-async-hdf5": {"ram": 1, "disk": 2, "pfs": 3, "local_dir": local, "schedule": "multilevel",
                                  "costs": CostProfile.default(3)},
        "online": {"ram": 3, "schedule": "online", "costs": CostProfile.default(1)},
        "compressed": {"ram": 3, "compress": "lossless", "schedule": "revolve"},
        "memory": {"memory": "2GiB", "ram": 4, "costs": CostProfile.default(1)},
    }


def test_gradients_bitwise_the_untiled_runs_under_every_schedule(comm, shared_tmp):
    model = WaveModel(comm, (17, 8, 9), n_steps=29)
    limit = model.time_tile_limit()
    depth = min(4, limit)
    for name, options in _schedules(shared_tmp).items():
        got = []
        for tile in (1, depth):
            extra = ({"pfs_file": os.path.join(shared_tmp, f"{name}-{tile}.h5")} if "pfs" in options else {})
            r = compute_gradient_checkpointed(model, Checkpointing(**options, **extra, time_tile=tile),
                                              controls=_perturbed(model, seed=11))
            got.append((r.J, {n: v.getArray(readonly=True).copy() for n, v in r.gradient.items()},
                        r.forward_steps, r.recomputed_steps))
        (J1, g1, f1, r1), (J2, g2, f2, r2) = got
        assert J1 == J2 and (f1, r1) == (f2, r2), name
        for field in g1:
            assert _agree_equal(comm, g1[field], g2[field]), (name, field)


@pytest.mark.parametrize("grid", [(23, 8, 9), (9, 23, 8)], ids=["x-split", "y-split"])
def test_y_slabs_bitwise_on_uneven_partitions(comm, grid):
    """Slabs 1 and 3 rows wide along y on blocks extended by a depth-T halo (split along x, or along
    y where the slabs then cross the halo): states and J bitwise the single steps' on 1, 2 and 3
    ranks, the source on a cut along x."""
    sources = _boundary_sources(comm, grid[0]) if grid[0] > grid[1] else [0.5]
    for source_x in sources:
        model = WaveModel(comm, grid, n_steps=20, source_x=source_x)

        def width_used(width, _depth):
            assert model._tiler.width == width

        _assert_tiled_bitwise(comm, model, (1, 3), width_used)


def _cut_depths(comm, grid):
    """source_depth fractions putting the source and the receivers' line on the first node of each
    rank after the first along the sweep axis (z, or y in 2-D), the last node before it, and T = 3
    nodes inside the neighbour (the halo's edge)."""
    n_a = grid[-1]
    sizes = np.asarray(WaveModel(comm, grid, n_steps=2).field.ownership_ranges[-1])
    cuts = np.cumsum(sizes)[:-1]
    assert comm.size == 1 or len(cuts) == comm.size - 1, sizes  # the sweep axis is the one split
    out = {0.2}
    for cut in cuts:
        for node in (cut, cut - 1, cut + 3, cut - 4):
            if 0 <= node < n_a:
                out.add((node + 1) / (n_a + 1))
    return sorted(out)


@pytest.mark.parametrize("grid, widths", [((9, 29), (None,)), ((8, 9, 23), (None, 2))], ids=["2d", "3d"])
def test_a_split_along_the_sweep_overlaps_the_halo_and_stays_bitwise(comm, grid, widths):
    """Split along the sweep axis (y in 2-D, z in 3-D): the first rank sweeps up, the last down (away
    from their halo) and take their owned planes' iterations before waiting for it; a middle rank
    waits first. States and J bitwise the single steps' with the source and the receivers on each
    cut, beside it and at the halo's edge, whole blocks and y slabs 2 rows wide."""
    first, last = comm.rank == 0, comm.rank == comm.size - 1
    for frac in _cut_depths(comm, grid):
        model = type("Shot", (WaveModel,), {"source_depth": frac})(comm, grid, n_steps=20)

        def sweeps_as_said(_width, depth):
            assert model._tiler.down == (last and not first), frac
            assert model._tiler.sweep(depth)[1] == (model.field.shape[0] if first or last else 0), frac

        _assert_tiled_bitwise(comm, model, widths, sweeps_as_said)
