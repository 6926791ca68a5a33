"""A run directory knows its run: a resume with a setting the model's describe() does not list (a
velocity), or another dt, is refused in one line; a directory in use is refused; a run stopped or
killed before anything was durable starts afresh; the stop message names what the API user calls.

The model is a user-style Stepper (rundir_model.Drift) whose velocity is not in describe().
"""

import json
import os

import numpy as np
import pytest

from hpcadj.adjoint.session import Checkpointing, ConfigError, GradientSession, Restart

from rundir_model import Drift

pytestmark = pytest.mark.timeout(240)


def controls_for(model):
    """Controls other than the defaults (no earlier evaluation used them)."""
    controls = model.default_controls()
    controls["a"].scale(1.3)
    return controls


@pytest.fixture(scope="module")
def reference(comm):
    model = Drift(comm)
    result = GradientSession(model, controls=controls_for(model)).solve().result
    return result.J, model.control_arrays(result.gradient)


class StopAfter:
    """should_stop: True from the k-th poll on."""

    def __init__(self, k):
        self.k, self.polls = k, 0

    def __call__(self):
        self.polls += 1
        return self.polls >= self.k


def solve(model, run_dir, local, resume=False, stop=None, **checkpointing):
    options = checkpointing or {"disk": 12, "local_dir": local}
    session = GradientSession(model, Checkpointing(**options), controls=controls_for(model),
                              restart=Restart(run_dir, resume=resume, durable_every=2), should_stop=stop)
    return session, session.solve()


def manifest(comm, run_dir):
    text = open(os.path.join(run_dir, "manifest.json")).read() if comm.rank == 0 else None
    return json.loads(comm.bcast(text, root=0))


def assert_same_gradient(model, result, reference):
    J, grads = reference
    assert result.J == J
    got = model.control_arrays(result.gradient)
    for name, field in grads.items():
        assert np.array_equal(got[name], field), name


@pytest.mark.parametrize("poll,phase", [(4, "forward"), (18, "reverse")])
def test_a_resume_with_a_setting_describe_does_not_list_is_refused(comm, shared_tmp, reference, poll, phase):
    run_dir, local = os.path.join(shared_tmp, "run"), os.path.join(shared_tmp, "local")
    _, stopped = solve(Drift(comm), run_dir, local, stop=StopAfter(poll))
    assert stopped.status == "stopped", stopped
    assert manifest(comm, run_dir)["durable"]["phase"] == phase
    # the API user has no --resume flag, and a forward-sweep stop has no adjoint step to name
    assert "resume=True" in stopped.message and "--resume" not in stopped.message, stopped.message
    assert "None" not in stopped.message, stopped.message
    others = [(Drift(comm, velocity=(-0.7, 1.0)), "first step"), (Drift(comm, dt=1.1e-3), "dt was 0.001")]
    for model, what in others:
        with pytest.raises(ConfigError) as caught:
            solve(model, run_dir, local, resume=True)
        message = str(caught.value)
        assert "\n" not in message and "another configuration" in message and what in message, message
    model = Drift(comm)
    session, outcome = solve(model, run_dir, local, resume=True)
    assert outcome.status == "complete" and outcome.info["resumed"]
    assert_same_gradient(model, outcome.result, reference)
    assert manifest(comm, run_dir)["status"] == "complete"


def test_a_run_directory_in_use_is_refused_and_released_on_every_exit(comm, shared_tmp, reference):
    run_dir, local = os.path.join(shared_tmp, "run"), os.path.join(shared_tmp, "local")
    lock = os.path.join(run_dir, "lock.json")
    options = Checkpointing(disk=12, local_dir=local)
    first = GradientSession(Drift(comm), options, controls=controls_for(Drift(comm)), restart=Restart(run_dir))
    first.plan()
    assert comm.bcast(os.path.exists(lock) if comm.rank == 0 else None, root=0)
    second = GradientSession(Drift(comm), Checkpointing(disk=12, local_dir=local),
                             restart=Restart(run_dir, resume=True))
    with pytest.raises(ConfigError) as caught:
        second.plan()
    message = str(caught.value)
    assert "in use" in message and str(os.getpid() if comm.rank == 0 else "") in message, message
    first.close()
    assert not comm.bcast(os.path.exists(lock) if comm.rank == 0 else None, root=0)
    # a refused start (the directory holds a run) leaves no lock behind either
    with pytest.raises(ConfigError, match="already holds a run"):
        solve(Drift(comm), run_dir, local)
    assert not comm.bcast(os.path.exists(lock) if comm.rank == 0 else None, root=0)
    model = Drift(comm)
    _, outcome = solve(model, run_dir, local, resume=True)
    assert outcome.status == "complete"
    assert_same_gradient(model, outcome.result, reference)
    assert not comm.bcast(os.path.exists(lock) if comm.rank == 0 else None, root=0)


def test_a_compressed_run_gone_before_any_durable_point_resumes_as_a_fresh_start(comm, shared_tmp, reference):
    """Killed during start-up (calibration), before the manifest named its levels' codecs: every
    --resume was refused for 'other compression than the run recorded'."""
    run_dir, local = os.path.join(shared_tmp, "run"), os.path.join(shared_tmp, "local")
    options = {"disk": 12, "local_dir": local, "compress": "lossless"}
    started = GradientSession(Drift(comm), Checkpointing(**options), controls=controls_for(Drift(comm)),
                              restart=Restart(run_dir))
    started.plan()  # the manifest exists, nothing durable yet: as a run killed in calibration leaves it
    started.close()
    assert manifest(comm, run_dir)["durable"] is None
    model = Drift(comm)
    session, outcome = solve(model, run_dir, local, resume=True, **options)
    assert outcome.status == "complete", outcome.message
    assert_same_gradient(model, outcome.result, reference)
    assert any("nothing durable" in note for note in session.notes), session.notes
    assert manifest(comm, run_dir)["setup"]["compression"]["disk"]["codec"].startswith("lossless")


def test_a_manifest_of_an_older_format_is_refused_in_one_line(comm, shared_tmp):
    run_dir, local = os.path.join(shared_tmp, "run"), os.path.join(shared_tmp, "local")
    solve(Drift(comm), run_dir, local, stop=StopAfter(3))
    if comm.rank == 0:
        import zlib

        for name in ("manifest.json", "manifest.prev.json"):
            path = os.path.join(run_dir, name)
            body = {k: v for k, v in json.load(open(path)).items() if k != "crc32"}
            body["format"] = 2
            body["crc32"] = zlib.crc32(json.dumps(body, sort_keys=True).encode())
            json.dump(body, open(path, "w"))
    comm.Barrier()
    with pytest.raises(ConfigError) as caught:
        solve(Drift(comm), run_dir, local, resume=True)
    message = str(caught.value)
    assert "\n" not in message and "format 2" in message and "older" in message, message


def test_a_lock_from_another_host_is_taken_over_only_once_its_slurm_job_is_gone(comm, shared_tmp, monkeypatch):
    """squeue is a two-line script here (its state from $HPCADJ_TEST_SQUEUE_STATE): what a cluster's
    squeue prints for a job id, RUNNING, or nothing once the job is gone."""
    import time

    bin_dir = os.path.join(shared_tmp, "bin")
    if comm.rank == 0:
        os.makedirs(bin_dir)
        with open(os.path.join(bin_dir, "squeue"), "w") as f:
            f.write('#!/bin/sh\n[ -n "$HPCADJ_TEST_SQUEUE_STATE" ] && echo "$HPCADJ_TEST_SQUEUE_STATE"\n')
        os.chmod(os.path.join(bin_dir, "squeue"), 0o755)
    comm.Barrier()
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("SLURM_JOB_ID", "88")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")

    def plant(run_dir, job, restart):
        if comm.rank == 0:
            os.makedirs(run_dir)
            with open(os.path.join(run_dir, "lock.json"), "w") as f:
                json.dump({"host": "node-elsewhere", "pid": 4242, "job": job, "restart": restart,
                           "since": time.time()}, f)
        comm.Barrier()

    local = os.path.join(shared_tmp, "local")
    monkeypatch.setenv("HPCADJ_TEST_SQUEUE_STATE", "RUNNING")
    plant(os.path.join(shared_tmp, "a"), "77", None)
    with pytest.raises(ConfigError) as caught:
        solve(Drift(comm), os.path.join(shared_tmp, "a"), local)
    message = str(caught.value)
    assert "in use" in message and "node-elsewhere" in message and "SLURM job 77" in message, message
    monkeypatch.setenv("HPCADJ_TEST_SQUEUE_STATE", "")  # squeue no longer lists job 77
    session, outcome = solve(Drift(comm), os.path.join(shared_tmp, "a"), local)
    assert outcome.status == "complete"
    assert any(kind == "fault" and "took over" in text and "squeue no longer lists" in text for kind, text in session.messages)
    # this very job before SLURM requeued it (restart count 0, now 1): taken over though squeue lists it
    monkeypatch.setenv("HPCADJ_TEST_SQUEUE_STATE", "RUNNING")
    plant(os.path.join(shared_tmp, "b"), "88", "0")
    session, outcome = solve(Drift(comm), os.path.join(shared_tmp, "b"), local)
    assert outcome.status == "complete"
    assert any("requeued" in text for kind, text in session.messages), session.messages
