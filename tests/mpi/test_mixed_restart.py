"""Restart of ``--schedule mixed``: a run killed anywhere in either sweep resumes to the uninterrupted
gradient bitwise. Restart states and lambda are what is durable; the data slots live in RAM only and
the resumed plan (a fresh mixed plan for what is left) rebuilds them by recomputation."""

import pytest

from ..helpers import assert_bitwise, hpcadj_json, killed_run, read_gradients

#: a budget of 6 restart states (12 fields) for 24 steps: the plan mixes restart states and data
MIXED = ["run", "--model", "wave", "--grid", "14x12", "--steps", "24", "--anomaly", "0.15", "--quiet",
         "--schedule", "mixed", "--ram", "6", "--durable-every", "2", "--durable-interval", "0.05"]
#: actions slowed a little so the interval-driven forward points fall inside the first sweep
SLOW = {"HPCADJ_TEST_STEP_DELAY": "0.02"}


def _reference(tmp_path, nranks):
    out = tmp_path / f"ref{nranks}.h5"
    info = hpcadj_json([*MIXED, "--gradient-out", str(out)], nranks, timeout=300)
    assert info["mixed"]["data_writes"] > 0 and info["mixed"]["restart_writes"] > 0, info["mixed"]
    return info, read_gradients(out)


def _crash_then_resume(tmp_path, nranks, at, tag):
    args = [*MIXED, "--run-dir", str(tmp_path / f"run{tag}")]
    killed_run(args, nranks, at, env=SLOW, timeout=300)
    out = tmp_path / f"g{tag}.h5"
    info = hpcadj_json([*args, "--resume", "--gradient-out", str(out)], nranks, timeout=300)
    return info, read_gradients(out)


@pytest.mark.timeout(900)
def test_mixed_run_killed_in_either_sweep_resumes_bitwise_on_2_ranks(tmp_path):
    ref_info, ref = _reference(tmp_path, 2)
    actions = ref_info["actions"]
    for share in (0.2, 0.45, 0.6, 0.85):
        k = int(actions * share)
        info, grads = _crash_then_resume(tmp_path, 2, f"{k % 2}:{k}", str(k))
        assert info["resumed"] and info["J"] == ref_info["J"], k
        assert_bitwise(grads, ref, k)
        if share > 0.5:  # killed in the reverse sweep: resumed from a durable lambda, not from the start
            assert info["adjoint_steps"] < ref_info["adjoint_steps"], (k, info["adjoint_steps"])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("nranks", [1, 3])
def test_mixed_run_killed_in_the_reverse_sweep_resumes_bitwise(tmp_path, nranks):
    ref_info, ref = _reference(tmp_path, nranks)
    k = int(ref_info["actions"] * 0.7)
    info, grads = _crash_then_resume(tmp_path, nranks, f"{nranks - 1}:{k}", "r")
    assert info["J"] == ref_info["J"] and info["adjoint_steps"] < ref_info["adjoint_steps"]
    assert_bitwise(grads, ref)
