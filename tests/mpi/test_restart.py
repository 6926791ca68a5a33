"""Restart: kill -9 a rank anywhere in the forward or reverse sweep, --resume, same gradient bitwise.

Fault injection as SCR/VeloC/FTI test it: ``HPCADJ_INJECT_KILL=RANK:K`` makes that rank SIGKILL
itself after action K; mpirun then takes the whole job down, as on a real node failure.
"""

import json
import random
import shutil

import numpy as np
import pytest

from hpcadj.imports import h5py

from ..helpers import (RESTART_BASE, RESTART_LEVELS, assert_bitwise, hpcadj, hpcadj_each, hpcadj_in_process, hpcadj_json,
                      killed_run, restart_args)
from ..helpers import read_gradients as gradients

BASE = list(RESTART_BASE)
LEVELS = RESTART_LEVELS


@pytest.fixture(scope="module", autouse=True)
def cost_profile(restart_costs):
    BASE.extend(restart_costs)
    yield
    del BASE[-2:]


@pytest.fixture(scope="module")
def reference(restart_reference):
    return restart_reference


def crash_then_resume(tmp, k, rank, ref_info, resume_ranks=2, levels=LEVELS):
    args = restart_args(BASE, tmp, levels, tag=str(k))
    killed_run([*args, "--json"], 2, f"{rank}:{k}")
    out = tmp / f"g{k}.h5"
    info = hpcadj_json([*args, "--resume", "--gradient-out", str(out)], resume_ranks, timeout=240)
    assert info["ranks"] == resume_ranks
    return info, gradients(out)


@pytest.mark.slow
def test_kill_anywhere_then_resume_is_bitwise_identical(reference, tmp_path):
    ref_info, ref = reference
    assert all(level["writes"] > 0 for level in ref_info["levels"]), ref_info["levels"]
    rng = random.Random(8)
    # one kill point in each tenth of the plan (both sweeps); the adaptive and compressed resume tests
    # add random points of their own
    bins = np.linspace(1, ref_info["actions"] - 1, 11).astype(int)
    points = [rng.randrange(lo, hi) for lo, hi in zip(bins[:-1], bins[1:])]
    assert len(points) == 10
    resumes = []
    for i, k in enumerate(points):
        args = restart_args(BASE, tmp_path, LEVELS, tag=str(k))
        killed_run([*args, "--json"], 2, f"{i % 2}:{k}")
        resumes.append([*args, "--resume", "--gradient-out", str(tmp_path / f"g{k}.h5"), "--json"])
    # each kill is a job of its own; the resumes need ranks, not a process each: one mpirun runs them all
    for k, proc in zip(points, hpcadj_each(resumes, 2, timeout=600)):
        assert proc.returncode == 0, (k, proc.stderr[-3000:])
        info = json.loads(proc.stdout.strip().splitlines()[-1])
        assert info["resumed"] and info["ranks"] == 2 and info["J"] == ref_info["J"], k
        assert_bitwise(gradients(tmp_path / f"g{k}.h5"), ref, k)


def test_resume_on_another_rank_count_from_the_hdf5_level(reference, tmp_path):
    ref_info, ref = reference
    k = int(ref_info["actions"] * 0.7)  # well into the reverse sweep
    info, grads = crash_then_resume(tmp_path, k, 1, ref_info, resume_ranks=3,
                                    levels=["--ram", "2", "--pfs", "6"])
    assert abs(info["J"] - ref_info["J"]) <= 1e-10 * abs(ref_info["J"])
    for name, field in ref.items():
        assert np.abs(grads[name] - field).max() <= 1e-10 * np.abs(field).max(), name


def test_run_directory_of_another_configuration_is_refused(tmp_path):
    """In this process: the real command's exit status 2 on a refused resume is the next test's."""
    rundir = tmp_path / "rd"
    hpcadj_json([*BASE, "--ram", "3", "--run-dir", str(rundir)], in_process=True)
    proc = hpcadj_in_process([*BASE[:4], "24x16", *BASE[5:], "--ram", "3", "--run-dir", str(rundir), "--resume"])
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "another configuration" in lines[0] and "grid" in lines[0], proc.stderr
    again = hpcadj_in_process([*BASE, "--ram", "3", "--run-dir", str(rundir)])
    assert again.returncode == 2 and "already holds a run" in again.stderr


def test_resume_without_a_run_is_refused(tmp_path):
    proc = hpcadj([*BASE, "--ram", "3", "--run-dir", str(tmp_path / "none"), "--resume"])
    assert proc.returncode == 2 and "nothing to resume" in proc.stderr
    proc = hpcadj_in_process([*BASE, "--ram", "3", "--resume"])
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

    from ..helpers import HPCADJ, ROOT, mpi_env

    ref_info, ref = reference
    args, rundir = restart_args(BASE, tmp_path), tmp_path / "run"
    slow = {"HPCADJ_TEST_STEP_DELAY": "0.05"}  # make each step slow enough to be caught mid-run
    proc = subprocess.Popen(["mpirun", "--oversubscribe", "-n", "2", HPCADJ, *args], cwd=ROOT,
                            env=mpi_env(slow), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 60  # signalled once its first durable point is on disk: mid-run
    while not (rundir / "manifest.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
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
    assert_bitwise(gradients(tmp_path / "g.h5"), ref)


def _flip(path, offset: int, mask: int = 0x40) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))


def _newest_adjoint(rundir):
    files = sorted(rundir.glob("adjoint-*.h5"))
    assert files, "a reverse-sweep durable point must have written an adjoint file"
    return files[0]  # named by step: the lowest step is the newest point of the reverse sweep


def _crash_in_reverse(tmp, ref_info, levels=LEVELS, share=0.8):
    args = restart_args(BASE, tmp, levels)
    killed_run([*args, "--json"], 2, f"1:{int(ref_info['actions'] * share)}")
    return args, tmp / "run"


@pytest.fixture(scope="module")
def crashed_in_reverse(reference, tmp_path_factory):
    """A fresh copy, at the same paths each time, of one run killed at 80 % of its actions (in its
    reverse sweep): each test that damages what the run left gets it as the kill left it, for the
    cost of one killed run."""
    ref_info, _ = reference
    tmp = tmp_path_factory.mktemp("reverse")
    args, rundir = _crash_in_reverse(tmp, ref_info)
    pristine = tmp_path_factory.mktemp("pristine") / "copy"
    shutil.copytree(tmp, pristine, symlinks=True)

    def fresh():
        shutil.rmtree(tmp)
        shutil.copytree(pristine, tmp, symlinks=True)
        return args, rundir

    return fresh


def _resume_bitwise(tmp, args, ref_info, ref, ranks=2):
    info = hpcadj_json([*args, "--resume", "--gradient-out", str(tmp / "g.h5")], ranks, timeout=240)
    assert info["J"] == ref_info["J"]
    assert_bitwise(gradients(tmp / "g.h5"), ref)
    return info


def test_corrupt_adjoint_state_is_detected_and_an_older_point_used(reference, crashed_in_reverse, tmp_path):
    """An exponent byte of lambda flipped in the newest adjoint file gave a gradient off by 6e9."""
    ref_info, ref = reference
    args, rundir = crashed_in_reverse()
    newest = _newest_adjoint(rundir)
    with h5py().File(newest, "r") as f:
        offset = f["lambda/u"].id.get_offset()
        nbytes = f["lambda/u"].id.get_storage_size()
    _flip(newest, offset + nbytes // 2 + 7)  # the sign/exponent byte of a value mid-field
    info = _resume_bitwise(tmp_path, args, ref_info, ref)
    assert any("unusable" in f and "checksum" in f for f in info["faults"]), info["faults"]


def test_every_adjoint_generation_corrupt_still_gives_the_bitwise_gradient(reference, crashed_in_reverse, tmp_path):
    ref_info, ref = reference
    args, rundir = crashed_in_reverse()
    files = sorted(rundir.glob("adjoint-*.h5"))
    for path in files:
        with h5py().File(path, "r") as f:
            offset = f["grad/kappa"].id.get_offset()
        _flip(path, offset + 3, 0x01)  # a mantissa byte: 4e-12 off, caught all the same
    info = _resume_bitwise(tmp_path, args, ref_info, ref)
    assert sum("unusable" in f for f in info["faults"]) == len(files), info["faults"]


def test_corrupt_manifest_falls_back_to_the_previous_generation(reference, crashed_in_reverse, tmp_path):
    """A digit of J changed in manifest.json was taken silently: now its checksum refuses it."""
    ref_info, ref = reference
    args, rundir = crashed_in_reverse()
    manifest = rundir / "manifest.json"
    text = manifest.read_text()
    J = json.loads(text)["durable"]["J"]
    digits = repr(J)
    changed = digits[:4] + ("1" if digits[4] != "1" else "2") + digits[5:]
    assert digits in text
    manifest.write_text(text.replace(digits, changed, 1))
    info = _resume_bitwise(tmp_path, args, ref_info, ref)
    assert any("manifest.json fails its checksum" in f for f in info["faults"]), info["faults"]


def test_both_manifests_corrupt_is_a_clear_error(reference, crashed_in_reverse, tmp_path):
    ref_info, _ = reference
    args, rundir = crashed_in_reverse()
    for name in ("manifest.json", "manifest.prev.json"):
        path = rundir / name
        path.write_text(path.read_text().replace('"ranks": 2', '"ranks": 3'))
    tmp = rundir.parent
    assert (tmp / "ck.h5").exists(), "the kill must have left the HDF5 file"
    proc = hpcadj([*args, "--resume"], 2, timeout=240)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("hpcadj")]
    assert len(lines) == 1 and "checksum" in lines[0] and "remove the directory" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    # what the run owned outside its directory is gone: removing the directory, as told, is enough
    assert not (tmp / "ck.h5").exists() and not any((tmp / "local").rglob("*.snap"))
    shutil.rmtree(rundir)
    info = hpcadj_json(args, 2, timeout=240)
    assert info["J"] == ref_info["J"]


def test_resume_on_fewer_ranks_leaves_no_node_local_files(reference, tmp_path):
    ref_info, ref = reference
    args, rundir = _crash_in_reverse(tmp_path, ref_info, share=0.45)
    local = tmp_path / "local"
    assert any(local.rglob("*.snap")), "the crashed run must have left node-local snapshots"
    info = hpcadj_json([*args, "--resume", "--gradient-out", str(tmp_path / "g.h5")], in_process=True)
    assert abs(info["J"] - ref_info["J"]) <= 1e-10 * abs(ref_info["J"])
    assert any("removed" in f and "node-local" in f for f in info["faults"]), info["faults"]
    assert list(local.rglob("*")) == [], list(local.rglob("*"))


@pytest.mark.parametrize("kind", ["text", "gradient"])
def test_an_existing_file_is_never_taken_as_the_checkpoint_file(reference, tmp_path, kind):
    """--pfs-file naming a user's file truncated it and deleted it at the end (exit 0)."""
    victim = tmp_path / "precious.h5"
    if kind == "text":
        victim.write_text("my data\n")
    else:
        hpcadj_json([*BASE, "--ram", "3", "--gradient-out", str(victim)], in_process=True)
    before = victim.read_bytes()
    proc = hpcadj([*BASE, "--ram", "2", "--pfs", "4", "--pfs-file", str(victim), "--json"], 2, timeout=240)
    assert proc.returncode == 2 and proc.stdout.strip() == "", (proc.returncode, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("hpcadj")]
    assert len(lines) == 1 and "already exists" in lines[0], proc.stderr
    assert victim.read_bytes() == before


def test_forward_progress_is_durable_at_the_interval(reference, tmp_path):
    """A plan whose stores near the frontier go to RAM left a kill late in the forward sweep to
    redo it from an early durable point; with --durable-interval the frontier state itself is
    written, so the resume starts near where the kill struck, and the gradient is bitwise."""
    ref_info, ref = reference
    rundir, local = tmp_path / "run", tmp_path / "local"
    local.mkdir()
    args = [*BASE, "--ram", "4", "--disk", "2", "--local-dir", str(local), "--run-dir", str(rundir),
            "--durable-interval", "0.2"]
    slow = {"HPCADJ_TEST_STEP_DELAY": "0.03"}
    first = next(i for i, a in enumerate(BASE) if a == "--steps")
    n = int(BASE[first + 1])
    killed_run([*args, "--json"], 2, f"0:frontier={n - 3}", env=slow)
    manifest = json.loads((rundir / "manifest.json").read_text())
    assert manifest["durable"]["phase"] == "forward" and "forward" in manifest["durable"], manifest["durable"]
    frontier = manifest["durable"]["frontier"]
    assert frontier >= n // 3, frontier
    info = _resume_bitwise(tmp_path, args, ref_info, ref)
    assert info["forward_steps"] - info["recomputed_steps"] <= n - frontier, info
    assert info["durable"]["points"] >= 1 and info["durable"]["seconds"] > 0
    assert info["predicted_durable_s"] > 0  # counted in the predicted makespan
