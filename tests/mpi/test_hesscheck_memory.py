"""A whole-process budget (``memory=``) for H v: the composite's pair (u, du) is two states a slot,
and every rank's peak RSS stays within the budget while H v stays bitwise store-all's (real mpirun)."""

import json
import re

import numpy as np
import pytest

from ..helpers import PYTHON, ROOT, mpirun

JOB = str(ROOT / "tests" / "mpi" / "ranks" / "hessian_job.py")
MiB = 2 ** 20
SIZE = ["--grid", "400x400", "--steps", "100"]


def job(nranks, out, *extra):
    proc = mpirun(nranks, [PYTHON, JOB, str(out), *SIZE, *extra], timeout=180,
                  env={"PYTHONPATH": str(ROOT)})  # this tree's hpcadj, whatever the venv points at
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else proc.stderr


@pytest.mark.timeout(420)
@pytest.mark.parametrize("nranks", [1, 2])
def test_peak_rss_within_the_budget_and_bitwise(tmp_path, nranks):
    rc, refused = job(nranks, tmp_path / "small", "--memory", "150MiB")
    assert rc == 2 and "error" in refused, refused
    least = float(re.search(r"the least budget that would do is ([\d.]+) MiB", refused["error"]).group(1))
    budget = least + 40  # a few pair slots (5 MiB each on one rank) beside the model
    rc, held = job(nranks, tmp_path / "held", "--memory", f"{budget}MiB")
    assert rc == 0, held
    memory = held["memory"]
    assert memory["budget"] == int(budget * MiB) and memory["snapshot"] == 2 * 2 * 400 * 400 * 8 // nranks
    assert 2 <= memory["ram_slots_fit"] and held["forward_steps"] > 100       # recomputes to fit
    assert held["peak_rss_bytes"] <= memory["budget"], (held["peak_rss_bytes"] / MiB, budget)
    rc, store_all = job(nranks, tmp_path / "all")
    assert rc == 0 and store_all["peak_rss_bytes"] > memory["budget"]        # would not have fitted
    assert held["J"] == store_all["J"]
    for rank in range(nranks):
        with np.load(f"{tmp_path}/held.rank{rank}.npz") as got, np.load(f"{tmp_path}/all.rank{rank}.npz") as want:
            assert set(got.files) == set(want.files)
            for name in want.files:
                assert np.array_equal(got[name], want[name]), name
