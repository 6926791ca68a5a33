"""What a script sees when it signals a bare ``mpirun ... hpcadj run`` (docs/restart.md, "Stopping a
run under mpirun"): SIGUSR1 is forwarded to the ranks and mpirun exits 75. SIGTERM makes OpenMPI's
mpirun terminate the job itself: SIGTERM to the ranks, SIGKILL to those still running
``odls_base_sigkill_timeout`` seconds later, and its own exit status 1 whatever the ranks return; with
time enough the ranks stop durably (manifest ``stopped``). The documented trap turns SIGTERM into
SIGUSR1, and so 75. Real mpirun, two ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ..helpers import HPCADJ, ROOT, mpi_env

pytestmark = [pytest.mark.timeout(400)]

#: 30 s unstopped (HPCADJ_TEST_STEP_DELAY), in actions of a few steps: a stop takes a fraction of a second
RUN = ["run", "--model", "heat", "--grid", "16x16", "--steps", "3000", "--ram", "600", "--quiet"]
SLOW = {"HPCADJ_TEST_STEP_DELAY": "0.01"}

#: docs/restart.md's wrapper: SIGTERM to the script becomes SIGUSR1 to mpirun
WRAPPER = r'''
stopping=0
trap 'stopping=1; kill -USR1 "$pid"' TERM
mpirun "$@" & pid=$!
wait "$pid"; rc=$?
if ((stopping && rc > 128)); then wait "$pid"; rc=$?; fi
exit "$rc"
'''


def test_the_documented_wrapper_is_the_tested_one():
    assert WRAPPER.strip() in (ROOT / "docs" / "restart.md").read_text()


def _stop(launcher: list[str], run_dir: Path, sig: int) -> tuple[int, str]:
    """Start the run, signal the launcher once the run directory exists, return (status, stderr)."""
    argv = [*launcher, "-n", "2", "--oversubscribe", HPCADJ, *RUN, "--run-dir", str(run_dir)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=mpi_env(SLOW), start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "manifest.json").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # into the time loop
        assert proc.poll() is None, "the run ended before the signal"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        return proc.returncode, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _status(run_dir: Path) -> str:
    return json.loads((run_dir / "manifest.json").read_text())["status"]


def test_what_a_script_sees_for_each_signal(tmp_path):
    """SIGUSR1's 75 under mpirun is test_restart's test_sigusr1_stops_cleanly_with_status_75_then_resumes."""
    rc, err = _stop(["mpirun", "--mca", "odls_base_sigkill_timeout", "4"], tmp_path / "term", signal.SIGTERM)
    assert rc == 1, err  # mpirun's own status when it terminates a job, whatever the ranks return
    assert _status(tmp_path / "term") == "stopped" and "continue with --resume" in err, err

    script = tmp_path / "wrap.sh"
    script.write_text(WRAPPER)
    rc, err = _stop(["bash", str(script)], tmp_path / "wrapped", signal.SIGTERM)
    assert rc == 75, err
    assert _status(tmp_path / "wrapped") == "stopped"
