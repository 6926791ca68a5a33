"""``python tests/slurm_cluster.py --nodes 3`` by hand: every variable a user must set is an
``export`` line of its own (SLURM_TMPDIR too, so evaluating the output does not leave node-local
snapshots on the shared /tmp), and stopping it removes its directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..helpers import ROOT
from ..slurm_cluster import LOOPBACK_MPI, SlurmUnavailable, ensure_installed

pytestmark = [pytest.mark.timeout(240)]


def test_three_node_script_exports_its_variables_and_cleans_up(tmp_path):
    try:
        ensure_installed()
    except SlurmUnavailable as exc:
        pytest.skip(f"SLURM cannot be installed here: {exc}")
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "slurm_cluster.py"), "--nodes", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = []
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
            if line.startswith("# Ctrl-C"):
                break
        assert lines and lines[-1].startswith("# Ctrl-C"), (lines, proc.poll())
        shown = subprocess.run(["bash", "-c", "\n".join(lines) + '\necho "$SLURM_CONF|$SLURM_TMPDIR|$OMPI_MCA_btl"'],
                               capture_output=True, text=True, timeout=10, env={"PATH": os.environ["PATH"]})
        conf, local, btl = shown.stdout.strip().split("|")
        base = Path(conf).parent
        assert Path(conf).is_file() and local == str(base / "local"), lines
        assert btl == LOOPBACK_MPI["OMPI_MCA_btl"], lines
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, proc.stderr.read()
    assert not base.exists(), f"{base} left after the stop"
