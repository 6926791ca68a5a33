"""Run directories through real ``hpcadj run`` processes under mpirun: a resume with a setting the
model's describe() does not list is refused in one line (exit 2); a run directory in use is refused
while its run goes on, and a killed run's lock is taken over; a heat run is not resumed as burgers.

The model is a user's plug-in (tests/mpi/ranks/rundir_model.py) whose --velocity is not in describe().
"""

import json
import os
import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

from ..helpers import HPCADJ, ROOT, hpcadj, hpcadj_in_process, hpcadj_json, killed_run, mpi_env, read_gradients

MODEL = ["run", "--model", f"{ROOT}/tests/mpi/ranks/rundir_model.py:DriftCLI", "--quiet"]


def one_line(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("hpcadj")]  # not mpirun's banner
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_a_killed_user_run_refuses_another_velocity_and_resumes_on_another_rank_count(tmp_path):
    args = [*MODEL, "--steps", "16", "--disk", "16", "--local-dir", str(tmp_path), "--durable-every", "2"]
    ref = hpcadj_json([*args, "--velocity", "1,0.5", "--gradient-out", str(tmp_path / "ref.h5")], 2)
    run = [*args, "--run-dir", str(tmp_path / "run")]
    killed_run([*run, "--velocity", "1,0.5"], 2, "1:24", timeout=300)
    lock = json.loads((tmp_path / "run" / "lock.json").read_text())  # left by the killed run
    other = one_line(hpcadj([*run, "--velocity=-0.7,1.0", "--resume"], 2))
    assert "another configuration" in other and "first step" in other, other
    assert not (tmp_path / "run" / "lock.json").exists(), "a refused resume must give the directory up"
    killed_run([*run, "--velocity", "1,0.5", "--resume"], 2, "0:6", timeout=300)
    lock = json.loads((tmp_path / "run" / "lock.json").read_text())  # left by the killed resume
    proc = hpcadj([*run, "--velocity", "1,0.5", "--resume", "--json", "--gradient-out", str(tmp_path / "g.h5")], 3)
    assert proc.returncode == 0, proc.stderr
    assert "took over the lock" in proc.stderr and f"pid {lock['pid']}" in proc.stderr, proc.stderr
    info = json.loads(proc.stdout)
    assert info["resumed"] and abs(info["J"] - ref["J"]) <= 1e-12 * abs(ref["J"])
    got, want = read_gradients(tmp_path / "g.h5"), read_gradients(tmp_path / "ref.h5")
    for name, field in want.items():
        assert np.abs(got[name] - field).max() <= 1e-10 * np.abs(field).max(), name
    assert not (tmp_path / "run" / "lock.json").exists()


def test_a_second_run_on_a_directory_in_use_is_refused_in_one_line(tmp_path):
    run = [*MODEL, "--steps", "30", "--disk", "30", "--local-dir", str(tmp_path), "--run-dir", str(tmp_path / "run")]
    lock = tmp_path / "run" / "lock.json"
    first = subprocess.Popen(["mpirun", "--oversubscribe", "-n", "2", HPCADJ, *run], cwd=ROOT,
                             env=mpi_env({"HPCADJ_TEST_STEP_DELAY": "0.1"}), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 60
        while not lock.exists() and time.time() < deadline and first.poll() is None:
            time.sleep(0.1)
        assert lock.exists(), "the first run never locked its run directory"
        holder = json.loads(lock.read_text())
        second = hpcadj([*run, "--resume"], 1)
        assert first.poll() is None, "the first run must still be running for this test to mean anything"
        line = one_line(second)
        assert "in use" in line and f"pid {holder['pid']}" in line, line
        os.kill(first.pid, signal.SIGUSR1)
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.communicate()
    assert first.returncode == 75, (first.returncode, err)
    assert "continue with --resume" in err and "None" not in err, err
    assert not lock.exists(), "a stopped run must give its run directory up"
    info = hpcadj_json([*run, "--resume"], 2)
    assert info["resumed"] and not lock.exists()


def test_a_heat_run_directory_resumed_as_burgers_names_the_model(tmp_path):
    common = ["--grid", "8x8", "--steps", "3", "--quiet", "--run-dir", str(tmp_path / "run")]
    hpcadj_json(["run", "--model", "heat", *common], in_process=True)
    line = one_line(hpcadj(["run", "--model", "burgers", *common, "--resume"]))
    assert "model was 'heat', now 'burgers'" in line, line


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_a_lock_whose_pid_names_another_process_is_taken_over(tmp_path, nranks):
    """A lock naming a live pid is held only while that pid is the process that took it: one with
    another start time (the pid reused by an unrelated process) is taken over; one with the
    process's own start time is refused in one line, exit 2."""
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        with open(f"/proc/{sleeper.pid}/stat") as f:
            start = int(f.read().rsplit(")", 1)[1].split()[19])
        run = tmp_path / "run"
        args = ["run", "--grid", "6x6", "--steps", "2", "--disk", "2", "--local-dir", str(tmp_path),
                "--quiet", "--run-dir", str(run)]

        def plant(started: int) -> None:
            run.mkdir(exist_ok=True)
            (run / "lock.json").write_text(json.dumps({"host": socket.gethostname(), "pid": sleeper.pid,
                                                       "start": started, "since": time.time()}))

        plant(start)
        refused = hpcadj(args, nranks, timeout=240)
        line = one_line(refused)
        assert "in use" in line and f"pid {sleeper.pid}" in line, line
        plant(start - 1)
        proc = hpcadj_in_process(args)
        assert proc.returncode == 0, proc.stderr
        assert "took over the lock" in proc.stderr and "now names another process" in proc.stderr, proc.stderr
        assert not (run / "lock.json").exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_lock_whose_process_exits_within_the_grace_is_taken_over(tmp_path):
    """mpirun may return before a killed job's other ranks have exited: a resume started at once
    found the killed run's rank 0 still alive and was refused. A holder on this host that exits
    within ``RunLock.EXIT_GRACE_S`` no longer keeps the directory."""
    sleeper = subprocess.Popen(["sleep", "1.5"])
    try:
        with open(f"/proc/{sleeper.pid}/stat") as f:
            start = int(f.read().rsplit(")", 1)[1].split()[19])
        run = tmp_path / "run"
        run.mkdir()
        (run / "lock.json").write_text(json.dumps({"host": socket.gethostname(), "pid": sleeper.pid,
                                                   "start": start, "since": time.time()}))
        reaper = threading.Thread(target=sleeper.wait)  # reaped as it exits, as mpirun reaps its ranks
        reaper.start()
        proc = hpcadj_in_process(["run", "--grid", "6x6", "--steps", "2", "--quiet", "--run-dir", str(run)])
        reaper.join()
        assert proc.returncode == 0, proc.stderr
        assert "took over the lock" in proc.stderr and f"pid {sleeper.pid}" in proc.stderr, proc.stderr
    finally:
        sleeper.kill()
        sleeper.wait()
