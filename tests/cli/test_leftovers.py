"""A finished run leaves nothing it does not report keeping, whatever killed its predecessors: a
calibration killed with its node-local snapshots on disk, a resume without ``--disk`` after a killed
run, a resume after one rank's LAYOUT.json was damaged."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np

from hpcadj.checkpoint.storage.local import SCRATCH_PREFIX
from hpcadj.imports import h5py

from ..helpers import HPCADJ, hpcadj, killed_run, mpi_env

BASE = ["run", "--model", "burgers", "--grid", "96x96", "--steps", "30", "--quiet"]
PROFILE = {"forward_s": 1.0, "adjoint_s": 2.0, "source": "test",
           "levels": [{"name": "ram", "write_s": 0.01, "read_s": 0.01},
                      {"name": "disk", "write_s": 0.05, "read_s": 0.05},
                      {"name": "pfs", "write_s": 0.1, "read_s": 0.1}]}
TIMEOUT = 120


def everything(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def gradients(path):
    with h5py().File(path, "r") as f:
        return {name: f[name][...] for name in f}


def costs(tmp_path) -> str:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(PROFILE))
    return str(path)


def _kill_during_calibration(local: Path) -> bool:
    """Start a run with no cost profile (it calibrates first) and kill it as soon as a calibration
    snapshot file exists; False when the calibration's short-lived files were missed (the run was
    then killed past it, and ``local`` is emptied for another try)."""
    proc = subprocess.Popen([HPCADJ, *BASE, "--ram", "2", "--disk", "4", "--local-dir", str(local)],
                            env=mpi_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not list(local.glob("hpcadj-*/rank0/*.snap")) and proc.poll() is None:
            assert time.monotonic() < deadline, "no snapshot file appeared"
            time.sleep(0.002)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if list(local.glob(f"hpcadj-{SCRATCH_PREFIX}*/rank0/*.snap")):
        return True
    shutil.rmtree(local)
    local.mkdir()
    return False


def test_killed_calibration_is_swept_by_the_next_run(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    assert any(_kill_during_calibration(local) for _ in range(3)), "never killed inside the calibration"
    done = hpcadj([*BASE, "--ram", "2", "--disk", "4", "--local-dir", str(local), "--costs", costs(tmp_path)],
                  timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert everything(local) == []


def killed(tmp_path, levels, local, rundir):
    """A 2-rank run with --run-dir killed part-way through (rank 1, after action 24)."""
    args = [*BASE, *levels, "--local-dir", str(local), "--run-dir", str(rundir), "--costs", costs(tmp_path),
            "--durable-every", "2"]
    killed_run(args, 2, "1:24", timeout=TIMEOUT)
    assert list(local.glob("hpcadj-*/rank1/*.snap")), "the killed run left no node-local snapshot"
    return args


def test_resume_without_disk_removes_the_killed_runs_node_local_files(tmp_path):
    local, rundir = tmp_path / "local", tmp_path / "run"
    local.mkdir()
    args = killed(tmp_path, ["--ram", "2", "--disk", "4"], local, rundir)
    resumed = hpcadj([a for a in args if a not in ("--disk", "4")] + ["--resume"], 2, timeout=TIMEOUT)
    assert resumed.returncode == 0, resumed.stderr
    assert everything(local) == []


def test_resume_after_a_damaged_layout_json_recomputes_bitwise(tmp_path):
    local, rundir = tmp_path / "local", tmp_path / "run"
    local.mkdir()
    ref = tmp_path / "ref.h5"
    proc = hpcadj([*BASE, "--schedule", "store-all", "--gradient-out", str(ref)], 2, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    args = killed(tmp_path, ["--ram", "2", "--disk", "4"], local, rundir)
    (layout,) = local.glob("hpcadj-*/rank1/LAYOUT.json")
    data = bytearray(layout.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit
    layout.write_bytes(bytes(data))
    out = tmp_path / "g.h5"
    resumed = hpcadj([*args, "--resume", "--json", "--gradient-out", str(out)], 2, timeout=TIMEOUT)
    assert resumed.returncode == 0, resumed.stderr
    info = json.loads(resumed.stdout.splitlines()[-1])
    assert any("LAYOUT.json" in fault for fault in info["faults"]), info["faults"]
    want, got = gradients(ref), gradients(out)
    assert sorted(got) == sorted(want)
    for name in want:
        assert np.array_equal(got[name], want[name]), name
    assert everything(local) == []


def test_a_refused_fresh_start_leaves_nothing_that_blocks_the_next(tmp_path):
    """The HDF5 level refuses a file that is not this run's after the node-local level was made
    (kept: a run directory's run): its LAYOUT.json, the --local-dir and the run directory it created
    go again, so the same command with another file simply runs (no --resume asked for)."""
    with h5py().File(tmp_path / "ck.h5", "w") as f:
        f["foreign"] = 1
    local = tmp_path / "local"
    proc = hpcadj(["run", "--model", "heat", "--grid", "8x8", "--steps", "6", "--quiet", "--ram", "1", "--disk", "1",
                   "--pfs", "2", "--pfs-file", str(tmp_path / "ck.h5"), "--local-dir", str(local),
                   "--run-dir", str(tmp_path / "run")], nranks=2, timeout=TIMEOUT)
    assert proc.returncode == 2 and "is not this run's checkpoint file" in proc.stderr, proc.stderr
    assert not local.exists(), everything(local)
    assert not (tmp_path / "run").exists(), everything(tmp_path / "run")
    again = hpcadj(["run", "--model", "heat", "--grid", "8x8", "--steps", "6", "--quiet", "--ram", "1", "--disk", "1",
                    "--pfs", "2", "--pfs-file", str(tmp_path / "mine.h5"), "--local-dir", str(local),
                    "--run-dir", str(tmp_path / "run")], nranks=2, timeout=TIMEOUT)
    assert again.returncode == 0, again.stderr
