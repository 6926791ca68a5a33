"""J and full gradient fields agree between 1, 2 and 3 ranks (real mpirun, files in natural order)."""

import json

import numpy as np

from ..helpers import hpcadj_each, hpcadj_json, read_gradients

ARGS = ["run", "--model", "heat", "--grid", "18x14", "--steps", "15", "--dt", "1e-3"]
#: 2-D at ARGS's grid, and 3-D
CASES = ([], ["--grid", "7x6x5", "--theta", "1"])


def _command(extra, out):
    return [*ARGS, *extra, "--gradient-out", str(out), "--json"]


def test_rank_invariance_2d_and_3d(tmp_path):
    refs = []
    for i, extra in enumerate(CASES):  # the one-rank references in this process: a process would only add start-up
        info = hpcadj_json(_command(extra, tmp_path / f"grad1-{i}.h5")[:-1], in_process=True)
        grads = read_gradients(tmp_path / f"grad1-{i}.h5")
        assert info["ranks"] == 1 and set(grads) == {"grad_u0", "grad_kappa"}
        refs.append((info, grads))
    for nranks in (2, 3):  # both grids in one mpirun: rank invariance needs ranks, not a process each
        procs = hpcadj_each([_command(extra, tmp_path / f"grad{nranks}-{i}.h5") for i, extra in enumerate(CASES)],
                            nranks, timeout=240)
        for i, ((ref_info, ref), proc) in enumerate(zip(refs, procs)):
            assert proc.returncode == 0, proc.stderr[-3000:]
            info = json.loads(proc.stdout.strip().splitlines()[-1])
            grads = read_gradients(tmp_path / f"grad{nranks}-{i}.h5")
            assert info["ranks"] == nranks
            assert abs(info["J"] - ref_info["J"]) <= 1e-10 * abs(ref_info["J"])
            for name, field in ref.items():
                scale = np.abs(field).max()
                assert np.abs(grads[name] - field).max() <= 1e-10 * scale, (name, nranks, CASES[i])
