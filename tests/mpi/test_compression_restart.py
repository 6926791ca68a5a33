"""--compress with --run-dir: the manifest records each level's codec and slot bytes, a killed
compressed run resumes from the compressed node-local and HDF5 blocks it left, with the gradient
bitwise equal to an uncompressed one; a resume with other compression, or a compressed HDF5 level
on another rank count, is refused in one line."""

import json

import numpy as np
import pytest

from ..helpers import RESTART_BASE, RESTART_LEVELS, assert_bitwise, hpcadj, hpcadj_json, killed_run, restart_args
from ..helpers import read_gradients as gradients


@pytest.fixture(scope="module")
def costs(restart_costs):
    return restart_costs


def args_for(tmp, costs, compress, levels=RESTART_LEVELS):
    return restart_args([*RESTART_BASE, *costs], tmp, levels, extra=compress)


@pytest.fixture(scope="module")
def reference(restart_reference):
    """The uncompressed gradient of the same plan (no run directory)."""
    return restart_reference


@pytest.mark.parametrize("fraction,rank", [(0.3, 0), (0.75, 1)])  # forward sweep, reverse sweep
def test_killed_compressed_run_resumes_from_its_compressed_blocks_bitwise(reference, costs, tmp_path,
                                                                           fraction, rank):
    ref_info, ref = reference
    args = args_for(tmp_path, costs, ["--compress", "lossless", "--compress-disk", "lossless:zstd"])
    k = int(ref_info["actions"] * fraction)
    killed_run([*args, "--json"], 2, f"{rank}:{k}")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    recorded = manifest["setup"]["compression"]
    assert recorded["disk"]["codec"] == "lossless:zstd" and recorded["pfs"]["codec"] == "lossless"
    assert all(v["slot_bytes"] > 0 for v in recorded.values())
    durable = sum(len(steps) for steps in manifest["snapshots"].values())
    info = hpcadj_json([*args, "--resume", "--gradient-out", str(tmp_path / "g.h5")], 2, timeout=240)
    assert info["resumed"] and info["faults"] == [] and info["J"] == ref_info["J"]
    assert not info["lossy"] and info["compression"]["pfs"]["codec"] == "lossless"
    if durable:  # the resume started from the compressed blocks, not from scratch
        assert info["forward_steps"] < ref_info["forward_steps"], (k, info["forward_steps"])
    assert_bitwise(gradients(tmp_path / "g.h5"), ref, k)


def test_resume_with_other_compression_or_a_compressed_hdf5_level_on_other_ranks_is_refused(
        reference, costs, tmp_path):
    ref_info, _ = reference
    args = args_for(tmp_path, costs, ["--compress", "lossless"])
    killed_run([*args, "--json"], 2, f"1:{int(ref_info['actions'] * 0.6)}")
    for extra, ranks, message in ((["--compress", "lossy:1e-6"], 2, "other compression than the run recorded"),
                                  ([], 3, "resume on 2 rank(s)")):
        argv = [a for a in args if a not in ("--compress", "lossless")] + (extra or ["--compress", "lossless"])
        p = hpcadj([*argv, "--resume"], ranks, timeout=120)
        errors = [ln for ln in p.stderr.splitlines() if ln.startswith("hpcadj: error:")]
        assert p.returncode == 2 and len(errors) == 1 and message in errors[0], p.stderr[-2000:]
        assert "Traceback" not in p.stderr


def test_compressed_ram_with_uncompressed_hdf5_resumes_on_another_rank_count(reference, costs, tmp_path):
    ref_info, ref = reference
    levels = ["--ram", "2", "--pfs", "6"]
    args = args_for(tmp_path, costs, ["--compress-ram", "lossy:1e-9"], levels=levels)
    killed_run([*args, "--json"], 2, f"0:{int(ref_info['actions'] * 0.7)}")
    info = hpcadj_json([*args, "--resume", "--gradient-out", str(tmp_path / "g.h5")], 3, timeout=240)
    assert info["ranks"] == 3 and info["lossy"] and info["compression"]["ram"]["max_error"] <= 1e-9
    grads = gradients(tmp_path / "g.h5")
    for name, field in ref.items():
        assert np.abs(grads[name] - field).max() <= 1e-6 * np.abs(field).max(), name
