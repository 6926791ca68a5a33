"""Restart: kill -9 a rank anywhere in the forward or reverse sweep, --resume, same gradient bitwise.

Fault injection as SCR/VeloC/FTI test it: ``HPCADJ_INJECT_KILL=RANK:K`` makes that rank SIGKILL
itself after action K; mpirun then takes the whole job down, as on a real node failure.
"""

import json
import random

import numpy as np
import pytest

from hpcadj.stack import h5py

from .helpers import hpcadj, hpcadj_json

BASE = ["run", "--model", "heat", "--grid", "20x16", "--steps", "30", "--dt", "1e-3", "--durable-every", "2",
        "--quiet"]
LEVELS = ["--ram", "2", "--disk", "3", "--pfs", "4"]
#: I/O cheap against a step, so the multilevel plan uses all three levels (and no run calibrates)
PROFILE = {"forward_s": 1.0, "adjoint_s": 2.0, "source": "test",
           "levels": [{"name": "ram", "write_s": 0.01, "read_s": 0.01},
                      {"name": "disk", "write_s": 0.05, "read_s": 0.05},
                      {"name": "pfs", "write_s": 0.1, "read_s": 0.1}]}


@pytest.fixture(scope="module", autouse=True)
def cost_profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("costs") / "profile.json"
    path.write_text(json.dumps(PROFILE))
    BASE.extend(["--costs", str(path)])
    yield
    del BASE[-2:]


def gradients(path):
    with h5py().File(path, "r") as f:
        return {name: f[name][...] for name in f}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    info = hpcadj_json([*BASE, *LEVELS, "--pfs-file", str(tmp / "ck.h5"), "--local-dir", str(tmp),
                        "--gradient-out", str(tmp / "ref.h5")], 2, timeout=240)
    return info, gradients(tmp / "ref.h5")


def crash_then_resume(tmp, k, rank, ref_info, resume_ranks=2, levels=LEVELS):
    rundir, ck, local = tmp / f"run{k}", tmp / f"ck{k}.h5", tmp / f"local{k}"
    local.mkdir()
    args = [*BASE, *levels, "--pfs-file", str(ck), "--local-dir", str(local), "--run-dir", str(rundir)]
    crashed = hpcadj([*args, "--json"], 2, timeout=240, env={"HPCADJ_INJECT_KILL": f"{rank}:{k}"})
    assert crashed.returncode != 0, f"action {k}: the injected kill did not happen"
    assert crashed.stdout.strip() == "", "a killed run must not print a result"
    out = tmp / f"g{k}.h5"
    info = hpcadj_json([*args, "--resume", "--gradient-out", str(out)], resume_ranks, timeout=240)
    assert info["ranks"] == resume_ranks
    return info, gradients(out)


def test_kill_anywhere_then_resume_is_bitwise_identical(reference, tmp_path):
    ref_info, ref = reference
    assert all(level["writes"] > 0 for level in ref_info["levels"]), ref_info["levels"]
    rng = random.Random(8)
    bins = np.linspace(1, ref_info["actions"] - 1, 21).astype(int)
    points = [rng.randrange(lo, hi) for lo, hi in zip(bins[:-1], bins[1:])]
    assert len(points) == 20
    for i, k in enumerate(points):
        info, grads = crash_then_resume(tmp_path, k, i % 2, ref_info)
        assert info["J"] == ref_info["J"], k
        for name, field in ref.items():
            assert np.array_equal(grads[name], field), (k, name)


def test_resume_on_another_rank_count_from_the_hdf5_level(reference, tmp_path):
    ref_info, ref = reference
    k = int(ref_info["actions"] * 0.7)  # well into the reverse sweep
    info, grads = crash_then_resume(tmp_path, k, 1, ref_info, resume_ranks=3,
                                    levels=["--ram", "2", "--pfs", "6"])
    assert abs(info["J"] - ref_info["J"]) <= 1e-10 * abs(ref_info["J"])
    for name, field in ref.items():
        assert np.abs(grads[name] - field).max() <= 1e-10 * np.abs(field).max(), name


def test_run_directory_of_another_configuration_is_refused(tmp_path):
    rundir = tmp_path / "rd"
    hpcadj_json([*BASE, "--ram", "3", "--run-dir", str(rundir)], 1)
    proc = hpcadj([*BASE[:4], "24x16", *BASE[5:], "--ram", "3", "--run-dir", str(rundir), "--resume"])
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "another configuration" in lines[0] and "grid" in lines[0], proc.stderr
    again = hpcadj([*BASE, "--ram", "3", "--run-dir", str(rundir)])
    assert again.returncode == 2 and "already holds a run" in again.stderr


def test_resume_without_a_run_is_refused(tmp_path):
    proc = hpcadj([*BASE, "--ram", "3", "--run-dir", str(tmp_path / "none"), "--resume"])
    assert proc.returncode == 2 and "nothing to resume" in proc.stderr
    proc = hpcadj([*BASE, "--ram", "3", "--resume"])
    assert proc.returncode == 2 and "--run-dir" in proc.stderr


def test_manifest_records_a_complete_run(tmp_path):
    rundir = tmp_path / "rd"
    hpcadj_json([*BASE, *LEVELS, "--pfs-file", str(tmp_path / "ck.h5"), "--local-dir", str(tmp_path),
                 "--run-dir", str(rundir)], 2, timeout=240)
    manifest = json.loads((rundir / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["ranks"] == 2
    assert manifest["durable"]["phase"] == "reverse" and manifest["durable"]["lam_step"] == 0
    assert not (tmp_path / "ck.h5").exists(), "checkpoint file must be removed when the run completes"


def test_sigusr1_stops_cleanly_with_status_75_then_resumes(reference, tmp_path):
    """SLURM's --signal=B:USR1: the run finishes its step, makes its state durable, exits 75."""
    import os
    import signal
    import subprocess
    import time

    from .helpers import HPCADJ, ROOT, mpi_env

    ref_info, ref = reference
    rundir, local = tmp_path / "run", tmp_path / "local"
    local.mkdir()
    args = [*BASE, *LEVELS, "--pfs-file", str(tmp_path / "ck.h5"), "--local-dir", str(local),
            "--run-dir", str(rundir)]
    slow = {"HPCADJ_TEST_STEP_DELAY": "0.05"}  # make each step slow enough to be caught mid-run
    proc = subprocess.Popen(["mpirun", "--oversubscribe", "-n", "2", HPCADJ, *args], cwd=ROOT,
                            env=mpi_env(slow), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    time.sleep(4.0)
    os.kill(proc.pid, signal.SIGUSR1)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 75, (proc.returncode, out, err)
    assert "continue with --resume" in err and out.strip() == ""
    manifest = json.loads((rundir / "manifest.json").read_text())
    assert manifest["status"] == "stopped"
    info = hpcadj_json([*args, "--resume", "--gradient-out", str(tmp_path / "g.h5")], 2, timeout=240)
    assert info["J"] == ref_info["J"]
    for name, field in ref.items():
        assert np.array_equal(gradients(tmp_path / "g.h5")[name], field), name
