"""A user's TS on the command line: ``--model module:factory`` with PETSc options passed through, a
three-level compressed run killed (SIGKILL on one rank) and resumed on the same and on another rank count.
"""

import json

import numpy as np
import pytest

from ..helpers import hpcadj, hpcadj_json, kill_env
from ..helpers import read_gradients as gradients


MODEL = ["--model", "hpcadj.ts.examples:grayscott_stepper", "--grid", "12", "--steps", "12"]
#: RAM and node-local compressed; the HDF5 level uncompressed, so another rank count can resume from it
LEVELS = ["--ram", "2", "--disk", "2", "--pfs", "3", "--compress", "lossless", "--compress-pfs", "none",
          "--durable-every", "1"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, restart_costs):
    """The uninterrupted store-all gradient of the RK4 run on 2 ranks."""
    tmp = tmp_path_factory.mktemp("tsref")
    info = hpcadj_json(["run", *MODEL, "--gradient-out", str(tmp / "ref.h5"), "-ts_type", "rk"], 2, timeout=240)
    return info, gradients(tmp / "ref.h5")


def test_petsc_options_reach_the_users_ts(reference):
    info, grads = reference
    assert info["ts_type"] == "rk" and info["rk_type"] == "4" and info["adjoint_stages"] == "recomputed"
    assert sorted(grads) == ["grad_gamma", "grad_u0"]
    cn = hpcadj_json(["run", *MODEL, "-ts_type", "cn", "-ts_dt", "0.25"], 1, timeout=120)
    assert cn["ts_type"] == "cn" and cn["adjoint_stages"] == "filled" and cn["dt"] == 0.25


def test_mixed_keeps_the_rk_stages(reference, tmp_path):
    """--schedule mixed without a budget: every step's stages kept, n forward steps, the same gradient."""
    info = hpcadj_json(["run", *MODEL, "--schedule", "mixed", "--gradient-out", str(tmp_path / "g.h5"),
                        "-ts_type", "rk"], 2, timeout=240)
    assert info["forward_steps"] == 12 and info["mixed"]["data_writes"] == 11, info["mixed"]
    assert info["mixed"]["data_bytes"] == 4 * info["mixed"]["restart_bytes"]
    grads = gradients(tmp_path / "g.h5")
    for name, field in reference[1].items():
        assert np.array_equal(grads[name], field), name


@pytest.mark.parametrize("resume_ranks", [2, 3])
def test_killed_then_resumed(reference, tmp_path, restart_costs, resume_ranks):
    ref_info, ref = reference
    args = ["run", *MODEL, *LEVELS, *restart_costs, "--pfs-file", str(tmp_path / "ck.h5"),
            "--local-dir", str(tmp_path), "--run-dir", str(tmp_path / "run"), "-ts_type", "rk"]
    crashed = hpcadj([*args, "--json"], 2, timeout=240, env=kill_env("1:40"))
    assert crashed.returncode != 0 and crashed.stdout.strip() == ""
    info = hpcadj_json([*args, "--resume", "--gradient-out", str(tmp_path / "g.h5")], resume_ranks, timeout=240)
    assert info["resumed"] and info["ranks"] == resume_ranks and info["recomputed_steps"] >= 0
    assert all(level["writes"] > 0 for level in info["levels"]) or info["adjoint_steps"] < 12
    grads = gradients(tmp_path / "g.h5")
    for name, field in ref.items():
        if resume_ranks == 2:
            assert np.array_equal(grads[name], field), name
        else:  # another decomposition: the same arithmetic up to the order of the sums over ranks
            assert np.abs(grads[name] - field).max() <= 1e-12 * np.abs(field).max(), name


def test_gradcheck_runs_taylor_only(tmp_path):
    info = hpcadj_json(["gradcheck", "--model", "hpcadj.ts.examples:grayscott_stepper", "--grid", "16", "--steps", "5",
                        "-ts_type", "rk", "-ts_rk_type", "4"], 1, timeout=120)
    assert info["passed"] and info["dot_product"] is None
    assert sorted(info["taylor"]) == ["gamma", "u0"]
    assert all(t["min_rate"] >= 1.95 for t in info["taylor"].values())


def test_calibrate_prices_the_recomputing_adjoint(tmp_path):
    """RK's adjoint step re-runs the forward step: the measured adjoint cost includes it."""
    out = tmp_path / "costs.json"
    proc = hpcadj(["calibrate", "--model", "hpcadj.ts.examples:grayscott_stepper", "--grid", "24", "--steps", "6",
                   "--out", str(out), "-ts_type", "rk", "-ts_rk_type", "4"], 1, timeout=120)
    assert proc.returncode == 0, proc.stderr
    profile = json.loads(out.read_text())
    assert profile["adjoint_s"] > 1.5 * profile["forward_s"]
