"""J and full gradient fields agree between 1, 2 and 3 ranks (real mpirun, files in natural order)."""

import numpy as np

from hpcadj.imports import h5py

from ..helpers import hpcadj_json

ARGS = ["run", "--model", "heat", "--grid", "18x14", "--steps", "15", "--dt", "1e-3"]


def _run(nranks, tmp_path, extra=()):
    out = tmp_path / f"grad{nranks}.h5"
    if nranks == 1:  # the one-rank reference in this process: a process would only add start-up
        info = hpcadj_json([*ARGS, *extra, "--gradient-out", str(out)], in_process=True)
    else:
        info = hpcadj_json([*ARGS, *extra, "--gradient-out", str(out)], nranks, timeout=240)
    with h5py().File(out, "r") as f:
        grads = {name: f[name][...] for name in f}
    return info, grads


def test_rank_invariance_2d_and_3d(tmp_path):
    for extra in ([], ["--grid", "7x6x5", "--theta", "1"]):
        ref_info, ref = _run(1, tmp_path, extra)
        assert ref_info["ranks"] == 1 and set(ref) == {"grad_u0", "grad_kappa"}
        for nranks in (2, 3):
            info, grads = _run(nranks, tmp_path, extra)
            assert info["ranks"] == nranks
            assert abs(info["J"] - ref_info["J"]) <= 1e-10 * abs(ref_info["J"])
            for name, field in ref.items():
                scale = np.abs(field).max()
                assert np.abs(grads[name] - field).max() <= 1e-10 * scale, (name, nranks)
