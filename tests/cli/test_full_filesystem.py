"""A full file system never hangs a run nor leaves a file looking like a result (issue 27, item 8).

A real tmpfs of a few MiB is mounted (root, as on CI) and filled: the parallel-HDF5 level
overflowing it mid-run takes no more writes and the run re-plans to the store-all gradient
bitwise; a run directory or a ``--gradient-out`` file on it ends the run with one line and exit
status 2 and no ``.partial`` file left; on 2 and 3 ranks, each under a timeout (a hang fails).
The node-local level re-plans too, and calibrating on a full file system is one line and exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

from hpcadj.imports import h5py

from ..helpers import hpcadj

#: 128x128 burgers: 256 KiB a snapshot; 30 steps; I/O cheap, so the planner fills the pfs level
BASE = ["run", "--model", "burgers", "--grid", "128x128", "--steps", "30", "--quiet", "--json"]
PROFILE = {"forward_s": 1.0, "adjoint_s": 2.0, "source": "test",
           "levels": [{"name": "ram", "write_s": 0.01, "read_s": 0.01},
                      {"name": "disk", "write_s": 0.05, "read_s": 0.05},
                      {"name": "pfs", "write_s": 0.1, "read_s": 0.1}]}
TIMEOUT = 90
TMPFS_MIB = 2


@pytest.fixture(scope="module")
def tmpfs(tmp_path_factory):
    """A TMPFS_MIB MiB tmpfs, unmounted at the end whatever happened."""
    where = tmp_path_factory.mktemp("tmpfs")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MIB}m", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def full(tmpfs):
    """The tmpfs, emptied before and after the test; ``fill(free)`` leaves ``free`` bytes."""
    def empty():
        for entry in os.listdir(tmpfs):
            path = tmpfs / entry
            if path.is_dir():
                subprocess.run(["rm", "-rf", str(path)], check=True)
            else:
                path.unlink()

    def fill(free: int) -> None:
        st = os.statvfs(tmpfs)
        size = st.f_bavail * st.f_frsize - free
        with open(tmpfs / "filler", "wb") as f:
            os.posix_fallocate(f.fileno(), 0, size)

    empty()
    try:
        yield tmpfs, fill
    finally:
        empty()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fullfs")
    (tmp / "costs.json").write_text(json.dumps(PROFILE))
    return tmp


def gradients(path):
    with h5py().File(path, "r") as f:
        return {name: f[name][...] for name in f}


@pytest.fixture(scope="module")
def reference(workdir):
    """The store-all gradient on 2 and 3 ranks (J and every dataset of --gradient-out)."""
    out = {}
    for ranks in (2, 3):
        path = workdir / f"ref{ranks}.h5"
        proc = hpcadj([*BASE, "--schedule", "store-all", "--gradient-out", str(path)], ranks, timeout=TIMEOUT)
        assert proc.returncode == 0, proc.stderr
        out[ranks] = (json.loads(proc.stdout.splitlines()[-1])["J"], gradients(path))
    return out


def error_lines(stderr: str) -> list[str]:
    """What the ranks printed on stderr, without mpirun's own report of a non-zero exit status."""
    text = stderr.split("-" * 74)[0]
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("async_io", ["--async", "--no-async"])
def test_pfs_level_on_a_full_file_system_replans_bitwise(full, workdir, reference, ranks, async_io):
    tmpfs, _fill = full
    pfs = tmpfs / "ck.h5"
    out = workdir / f"g{ranks}{async_io}.h5"
    proc = hpcadj([*BASE, "--ram", "2", "--pfs", "16", "--pfs-file", str(pfs), async_io,
                   "--costs", str(workdir / "costs.json"), "--gradient-out", str(out)], ranks, timeout=TIMEOUT)
    assert proc.returncode != 124, f"hung on a full file system:\n{proc.stderr}"
    assert proc.returncode == 0, proc.stderr
    assert error_lines(proc.stderr) == [], proc.stderr
    info = json.loads(proc.stdout.splitlines()[-1])
    assert any("pfs" in fault for fault in info["faults"]), info["faults"]
    J, grads = reference[ranks]
    assert info["J"] == J
    got = gradients(out)
    assert sorted(got) == sorted(grads)
    for name in grads:
        assert np.array_equal(got[name], grads[name]), name
    assert sorted(os.listdir(tmpfs)) == [], "the checkpoint file was left on the full file system"


@pytest.mark.parametrize("ranks", [2, 3])
def test_node_local_level_on_a_full_file_system_replans_bitwise(full, workdir, reference, ranks):
    tmpfs, _fill = full
    proc = hpcadj([*BASE, "--ram", "2", "--disk", "16", "--local-dir", str(tmpfs),
                   "--costs", str(workdir / "costs.json")], ranks, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout.splitlines()[-1])
    assert any("disk" in fault and "No space left" in fault for fault in info["faults"]), info["faults"]
    assert info["J"] == reference[ranks][0]
    assert sorted(os.listdir(tmpfs)) == []


@pytest.mark.parametrize("ranks", [2, 3])
def test_calibration_on_a_full_file_system_exits_2(full, ranks):
    tmpfs, fill = full
    fill(400 * 1024)  # calibration's HDF5 file (a few 256 KiB snapshots) does not fit
    proc = hpcadj([*BASE, "--ram", "2", "--pfs", "16", "--pfs-file", str(tmpfs / "ck.h5")], ranks, timeout=TIMEOUT)
    assert proc.returncode != 124, f"hung on a full file system:\n{proc.stderr}"
    assert proc.returncode == 2, proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and "No space left" in lines[0], proc.stderr
    assert sorted(os.listdir(tmpfs)) == ["filler"]


@pytest.mark.parametrize("ranks", [2, 3])
def test_run_dir_on_a_full_file_system_exits_2(full, workdir, ranks):
    tmpfs, fill = full
    rundir = tmpfs / "run"
    fill(192 * 1024)  # the manifest fits; a durable adjoint or forward file (>= 512 KiB) does not
    proc = hpcadj([*BASE, "--ram", "4", "--run-dir", str(rundir), "--durable-every", "2",
                   "--costs", str(workdir / "costs.json")], ranks, timeout=TIMEOUT)
    assert proc.returncode != 124, f"hung on a full file system:\n{proc.stderr}"
    assert proc.returncode == 2, proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("hpcadj: ") and "No space left" in lines[0], proc.stderr
    assert proc.stdout.strip() == ""
    left = sorted(os.listdir(rundir))
    assert not [name for name in left if name.endswith(".partial") or name.endswith(".tmp")], left


@pytest.mark.parametrize("ranks", [2, 3])
def test_gradient_out_on_a_full_file_system_exits_2(full, workdir, ranks):
    tmpfs, fill = full
    fill(64 * 1024)
    out = tmpfs / "grad.h5"
    proc = hpcadj([*BASE, "--gradient-out", str(out)], ranks, timeout=TIMEOUT)
    assert proc.returncode != 124, f"hung on a full file system:\n{proc.stderr}"
    assert proc.returncode == 2, proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("hpcadj: ") and "No space left" in lines[0], proc.stderr
    assert proc.stdout.strip() == ""
    assert sorted(os.listdir(tmpfs)) == ["filler"], "a partial gradient file was left"
