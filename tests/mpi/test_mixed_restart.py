"""Restart of ``--schedule mixed``: a run killed anywhere in either sweep resumes to the uninterrupted
gradient bitwise. Restart states and lambda are what is durable; the data slots live in RAM only and
the resumed plan (a fresh mixed plan for what is left) rebuilds them by recomputation."""

import json

import pytest

from ..helpers import assert_bitwise, hpcadj_each, hpcadj_json, killed_run, read_gradients

#: every test here kills and resumes real runs: 20 s or more each on 2 cores
pytestmark = pytest.mark.slow

#: a budget of 6 restart states (12 fields) for 24 steps: the plan mixes restart states and data
BASE = ["run", "--model", "wave", "--grid", "14x12", "--steps", "24", "--anomaly", "0.15", "--quiet",
        "--schedule", "mixed", "--durable-every", "2", "--durable-interval", "0.05"]
MIXED = [*BASE, "--ram", "6"]
#: actions slowed a little so the interval-driven forward points fall inside the first sweep
SLOW = {"HPCADJ_TEST_STEP_DELAY": "0.02"}


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """MIXED's uninterrupted run on one rank, in this process (no start-up to pay): the one-rank
    reference, and the action count the multi-rank tests choose their kill points from before their
    own reference runs (a plan does not depend on the rank count; each of those checks it is the same)."""
    out = tmp_path_factory.mktemp("one-rank") / "ref.h5"
    info = hpcadj_json([*MIXED, "--gradient-out", str(out)], in_process=True)
    assert info["mixed"]["data_writes"] > 0 and info["mixed"]["restart_writes"] > 0, info["mixed"]
    return info, read_gradients(out)


def _resume_all(resumes, nranks, reference=None):
    """(run --json object, gradients) of each ``(args, gradient file)`` resumed, one after another in
    one mpirun: each kill is a job of its own, a resume needs ranks but not a process of its own. With
    ``reference`` (a gradient file), MIXED's uninterrupted run goes first in the same mpirun, and its
    (object, gradients) lead the list."""
    commands = [[*args, "--resume", "--gradient-out", str(out), "--json"] for args, out in resumes]
    outs = [out for _, out in resumes]
    if reference is not None:
        commands.insert(0, [*MIXED, "--gradient-out", str(reference), "--json"])
        outs.insert(0, reference)
    results = []
    for command, out, proc in zip(commands, outs, hpcadj_each(commands, nranks, timeout=600)):
        assert proc.returncode == 0, (command, proc.stderr[-3000:])
        info = json.loads(proc.stdout.strip().splitlines()[-1])
        assert info["resumed"] == ("--resume" in command), command
        results.append((info, read_gradients(out)))
    if reference is not None:
        mixed = results[0][0]["mixed"]
        assert mixed["data_writes"] > 0 and mixed["restart_writes"] > 0, mixed
    return results


@pytest.mark.timeout(900)
def test_mixed_run_killed_in_either_sweep_resumes_bitwise_on_2_ranks(tmp_path, one_rank):
    actions = one_rank[0]["actions"]
    shares, resumes = (0.2, 0.45, 0.6, 0.85), []
    for share in shares:
        k = int(actions * share)
        args = [*MIXED, "--run-dir", str(tmp_path / f"run{k}")]
        killed_run(args, 2, f"{k % 2}:{k}", env=SLOW, timeout=300)
        resumes.append((args, tmp_path / f"g{k}.h5"))
    (ref_info, ref), *resumed = _resume_all(resumes, 2, reference=tmp_path / "ref2.h5")
    assert ref_info["actions"] == actions  # the plan the kill points were chosen on
    for share, (info, grads) in zip(shares, resumed):
        assert info["J"] == ref_info["J"], share
        assert_bitwise(grads, ref, share)
        if share > 0.5:  # killed in the reverse sweep: resumed from a durable lambda, not from the start
            assert info["adjoint_steps"] < ref_info["adjoint_steps"], (share, info["adjoint_steps"])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("nranks", [1, 3])
def test_mixed_run_killed_in_the_reverse_sweep_resumes_bitwise(tmp_path, one_rank, nranks):
    k = int(one_rank[0]["actions"] * 0.7)
    args = [*MIXED, "--run-dir", str(tmp_path / "runr")]
    killed_run(args, nranks, f"{nranks - 1}:{k}", env=SLOW, timeout=300)
    out = tmp_path / "gr.h5"
    if nranks == 1:  # the reference and the resume in this process
        (ref_info, ref), resumed = one_rank, hpcadj_json([*args, "--resume", "--gradient-out", str(out)],
                                                         in_process=True)
        assert resumed["resumed"]
        info, grads = resumed, read_gradients(out)
    else:
        (ref_info, ref), (info, grads) = _resume_all([(args, out)], nranks, reference=tmp_path / "ref.h5")
        assert ref_info["actions"] == one_rank[0]["actions"]
    assert info["J"] == ref_info["J"] and info["adjoint_steps"] < ref_info["adjoint_steps"]
    assert_bitwise(grads, ref)


@pytest.mark.timeout(900)
def test_mixed_run_over_ram_disk_and_hdf5_killed_in_either_sweep_resumes_bitwise(tmp_path):
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"forward_s": 1.0, "adjoint_s": 2.0, "source": "test",
                                 "levels": [{"name": n, "write_s": c, "read_s": c}
                                            for n, c in (("ram", 0.01), ("disk", 0.3), ("pfs", 0.6))]}))
    (tmp_path / "local").mkdir()
    # 3.5 restart states of RAM (on 2 ranks a restart pair is 1344 bytes a rank): data fill the odd half
    levels = ["--ram", "4704B", "--disk", "1", "--pfs", "2", "--costs", str(costs),
              "--local-dir", str(tmp_path / "local")]
    out = tmp_path / "ref.h5"
    ref_info = hpcadj_json([*BASE, *levels, "--pfs-file", str(tmp_path / "ref-ck.h5"),
                            "--gradient-out", str(out)], 2, timeout=300)
    ref = read_gradients(out)
    assert ref_info["mixed"]["data_writes"] > 0, ref_info["mixed"]
    assert all(level["writes"] > 0 for level in ref_info["levels"]), ref_info["levels"]
    resumes = []
    for share in (0.3, 0.75):
        k = int(ref_info["actions"] * share)
        args = [*BASE, *levels, "--pfs-file", str(tmp_path / f"ck{k}.h5"),
                "--run-dir", str(tmp_path / f"run{k}")]
        killed_run(args, 2, f"{k % 2}:{k}", env=SLOW, timeout=300)
        resumes.append((args, tmp_path / f"g{k}.h5"))
    for (args, _), (info, grads) in zip(resumes, _resume_all(resumes, 2)):
        assert info["J"] == ref_info["J"], args
        assert_bitwise(grads, ref, args[-1])


@pytest.mark.timeout(600)
def test_adaptive_mixed_run_killed_in_either_sweep_resumes_bitwise(tmp_path):
    """n unknown: killed in the first sweep the run resumes online (its planner's residual), in the
    reverse sweep with the recorded steps replayed; both bitwise."""
    adaptive = [*BASE[:5], "--adaptive", "--t-final", "1.0", *BASE[7:], "--ram", "3"]
    out = tmp_path / "ref.h5"
    ref_info = hpcadj_json([*adaptive, "--gradient-out", str(out)], 2, timeout=300)
    assert ref_info["schedule"] == "online-mixed"
    shares, resumes = (0.25, 0.7), []
    for share in shares:
        k = int(ref_info["actions"] * share)
        args = [*adaptive, "--run-dir", str(tmp_path / f"run{k}")]
        killed_run(args, 2, f"1:{k}", env=SLOW, timeout=300)
        resumes.append((args, tmp_path / f"g{k}.h5"))
    for share, (info, grads) in zip(shares, _resume_all(resumes, 2)):
        assert info["J"] == ref_info["J"], share
        assert_bitwise(grads, read_gradients(out), share)
        if share > 0.5:
            assert info["adjoint_steps"] < ref_info["adjoint_steps"]
