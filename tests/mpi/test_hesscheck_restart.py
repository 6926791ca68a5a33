"""A Hessian-vector product killed (SIGKILL on one rank) in its reverse sweep and resumed from its run
directory is bitwise the uninterrupted product, at 1, 2 and 3 ranks under real mpirun."""

import json

import numpy as np
import pytest

from ..helpers import PYTHON, ROOT, kill_env, mpirun

JOB = str(ROOT / "tests" / "mpi" / "ranks" / "hessian_job.py")
STEPS, SLOTS = 24, 3


def job(nranks, out, *extra, env=None):
    return mpirun(nranks, [PYTHON, JOB, str(out), "--steps", str(STEPS), "--disk", str(SLOTS), *extra],
                  timeout=120, env={"PYTHONPATH": str(ROOT), **(env or {})})  # this tree's hpcadj


def result(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def arrays(out, nranks):
    loaded = []
    for rank in range(nranks):
        with np.load(f"{out}.rank{rank}.npz") as data:
            loaded.append({k: data[k].copy() for k in data.files})
    return loaded


def reverse_sweep_action():
    """An action index halfway through the revolve plan's reverse sweep (the plan the job runs)."""
    from hpcadj.checkpoint.schedules import make_schedule
    from hpcadj.checkpoint.schedules.actions import EndForward

    actions = list(make_schedule("revolve", STEPS, [SLOTS]).actions())
    end_forward = next(i for i, a in enumerate(actions) if isinstance(a, EndForward)) + 1
    return end_forward, (end_forward + len(actions)) // 2


@pytest.mark.timeout(420)
@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_killed_in_the_reverse_sweep_and_resumed_is_bitwise(tmp_path, nranks):
    local = tmp_path / "local"
    local.mkdir()
    ref = result(job(nranks, tmp_path / "ref", "--local-dir", str(local)))
    end_forward, kill_at = reverse_sweep_action()
    assert end_forward < kill_at < ref["actions"]
    run = ["--local-dir", str(local), "--run-dir", str(tmp_path / "run")]
    killed = job(nranks, tmp_path / "killed", *run, env=kill_env(f"{nranks - 1}:{kill_at}"))
    assert killed.returncode not in (0, 124), killed.stderr[-3000:]
    assert not list(tmp_path.glob("killed.rank*.npz"))
    resumed = result(job(nranks, tmp_path / "resumed", *run, "--resume"))
    assert resumed["J"] == ref["J"]
    assert resumed["forward_steps"] < ref["forward_steps"]  # resumed inside the reverse sweep
    for got, want in zip(arrays(tmp_path / "resumed", nranks), arrays(tmp_path / "ref", nranks)):
        assert set(got) == set(want) and any(k.startswith("h_") for k in want)
        for name in want:
            assert np.array_equal(got[name], want[name]), name
