"""A resume whose trajectory fingerprint differs says what differs, by how much, and what to do: on
another rank count a small difference is a loose solver tolerance (resume on the run's rank count, or
start afresh with tight tolerances), not "another configuration"; bitwise resume stays the contract."""

import copy

from hpcadj.restart.identity import trajectory_refusal



def fingerprint(u1=(10.0, 1.0, 2.0)) -> dict:
    field = {"crc32": 7, "sums": list(u1)}
    return {"u1": {"u": field}, "lambda0": {"u": {"crc32": 8, "sums": [3.0, 0.5, 0.25]}},
            "grad": {"k": {"crc32": 9, "sums": [1.0, 1.0, 1.0]}}, "objective": [0.5, 0.25, 0.25]}


def test_a_loose_tolerance_across_rank_counts_is_named_with_the_difference_and_the_remedy():
    saved, now = fingerprint(), fingerprint((10.0, 1.0 + 1e-5, 2.0))
    now["u1"]["u"]["crc32"] = 70
    line = trajectory_refusal("run1", saved, now, 1, 2)
    assert "\n" not in line and "another configuration" not in line, line
    assert "first step u_1" in line and "in u by 1.0e-06 relative" in line, line
    assert "run on 1 rank and cannot resume on 2" in line and "resume on 1 rank," in line, line
    assert "-ksp_rtol 1e-12" in line and "start afresh" in line, line
    assert trajectory_refusal("run1", saved, copy.deepcopy(saved), 1, 2) is None
    rounding = fingerprint((10.0, 1.0 + 1e-8, 2.0))           # 1e-9 of sum |u|: rounding, resumes
    assert trajectory_refusal("run1", saved, rounding, 2, 3) is None


def test_a_large_or_same_rank_difference_is_another_configuration_with_its_size():
    saved, other = fingerprint(), fingerprint((10.0, 4.0, 2.0))
    line = trajectory_refusal("run1", saved, other, 1, 2)
    assert "belongs to another configuration" in line and "in u by 3.0e-01 relative" in line, line
    same = fingerprint()
    same["grad"]["k"] = {"crc32": 90, "sums": [1.0, 1.0, 1.0 + 2e-16]}
    line = trajectory_refusal("run1", saved, same, 2, 2)
    assert "another configuration" in line and "parameter gradient" in line and "in k by 2.2e-16" in line, line
