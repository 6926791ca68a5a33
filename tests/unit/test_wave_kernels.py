"""The wave model's forward kernels on hand-made blocks (no PETSc): the single step bitwise a numpy
transcription of the leapfrog with sponge and source, sigma's zero runs, and how the tiled advance
picks its slab width and depth from the cache sizes."""

from types import SimpleNamespace

import numpy as np
import pytest

from hpcadj.models.kernels import wave, wave_tiled


def _reference_step(P, C, faces, sigma, hdt, c, ih2, has_z, dt2, r, src, fval):
    """u^{i+1} in numpy, term for term in the kernel's order (the Laplacian summed from 0.0 over z, y, x)."""
    zlo, zhi, ylo, yhi, xlo, xhi = faces
    ihz2, ihy2, ihx2 = ih2
    lap = np.zeros_like(C)
    if has_z:
        lap += (np.concatenate([zlo[None], C[:-1]]) - C) * ihz2
        lap += (np.concatenate([C[1:], zhi[None]]) - C) * ihz2
    lap += (np.concatenate([ylo[:, None, :], C[:, :-1]], axis=1) - C) * ihy2
    lap += (np.concatenate([C[:, 1:], yhi[:, None, :]], axis=1) - C) * ihy2
    lap += (np.concatenate([xlo[:, :, None], C[:, :, :-1]], axis=2) - C) * ihx2
    lap += (np.concatenate([C[:, :, 1:], xhi[:, :, None]], axis=2) - C) * ihx2
    s = hdt * sigma
    a, b = 1.0 / (1.0 + s), r - s
    force = (c * c) * lap
    out = a * (((1.0 + r) * C - b * P) + dt2 * force)
    out[src] = a[src] * (((1.0 + r) * C[src] - b[src] * P[src]) + dt2 * (force[src] + fval))
    return out


def _sponge(shape, width):
    """sigma: 0 inside, growing towards every face over ``width`` points (one zero run per inner row)."""
    d = [np.minimum(np.arange(n), np.arange(n)[::-1]) for n in shape]
    depth = [np.clip((width - x) / width, 0.0, None) ** 2 if n > 1 else np.zeros(1) for x, n in zip(d, shape)]
    return 40.0 * (depth[0][:, None, None] + depth[1][None, :, None] + depth[2][None, None, :])


@pytest.mark.parametrize("shape, has_z, src", [((7, 9, 13), True, (3, 4, 6)), ((7, 9, 13), True, (0, 1, 1)),
                                               ((1, 11, 17), False, (0, 5, 8)), ((1, 11, 17), False, (0, 0, 16))])
def test_the_step_is_bitwise_the_numpy_leapfrog(shape, has_z, src):
    """Random fields and halo faces, the sponge, the source inside and in the sponge, uneven r."""
    rng = np.random.default_rng(7)
    mz, my, mx = shape
    P, C = rng.standard_normal(shape), rng.standard_normal(shape)
    c = 1.0 + 0.1 * rng.standard_normal(shape)
    sigma = _sponge(shape, 3)
    if has_z:
        faces = [rng.standard_normal(s) for s in ((my, mx), (my, mx), (mz, mx), (mz, mx), (mz, my), (mz, my))]
    else:
        faces = [np.zeros((1, 1))] * 2 + [rng.standard_normal(s) for s in ((mz, mx), (mz, mx), (mz, my), (mz, my))]
    ih2 = (0.0 if not has_z else 2.7, 3.1, 1.9)
    hdt, dt2, r, fval = 0.013, 0.00031, 1.0 + 2.0 ** -7, 0.37
    runs = wave.zero_runs(sigma)
    assert (runs[:, :, 1] > runs[:, :, 0]).any()  # the shorter formula is taken somewhere
    out_p, out_c = np.empty(shape), np.empty(shape)
    wave.step(P, C, tuple(faces), sigma, hdt, c, ih2, has_z, dt2, r, np.array(src), fval, runs, out_p, out_c)
    want = _reference_step(P, C, faces, sigma, hdt, c, ih2, has_z, dt2, r, src, fval)
    assert np.array_equal(out_p, C)
    assert np.array_equal(out_c.view(np.int64), want.view(np.int64))


def test_zero_runs_mark_one_run_per_row_or_none():
    sigma = np.ones((1, 4, 6))
    sigma[0, 0, 2:5] = 0.0      # one run
    sigma[0, 1, [1, 4]] = 0.0   # two runs: none taken
    sigma[0, 2, :] = -0.0       # the whole row (-0.0 is 0)
    runs = wave.zero_runs(sigma)
    assert runs[0].tolist() == [[2, 5], [0, 0], [0, 6], [0, 0]]


def test_the_slab_width_comes_from_the_cache_sizes(monkeypatch):
    """The whole block where its working set fits a core's last-level cache share; else the widest
    slab (a multiple of 4 rows) whose rows fit half the L2; the default depth 16 unsplit, 8 split."""
    field = SimpleNamespace(dim=3, shape=(128, 128, 128), ownership_ranges=((128,), (128,), (128,)))
    sizes = {2: 2 * 2 ** 20, 3: 150 * 2 ** 20}
    monkeypatch.setattr(wave_tiled, "_cache_bytes", lambda level, default: sizes[level])
    assert wave_tiled.auto_width(field, 8) == 128
    sizes[3] = 0
    width = wave_tiled.auto_width(field, 8)
    assert 4 <= width < 128 and width % 4 == 0
    assert wave_tiled.slab_bytes(field, 8, width) <= 2 ** 20 < wave_tiled.slab_bytes(field, 8, width + 4)
    assert wave_tiled.auto_depth(field) == 16
    split = SimpleNamespace(dim=3, shape=(128, 128, 64), ownership_ranges=((128,), (128,), (64, 64)))
    assert wave_tiled.auto_depth(split) == 8
