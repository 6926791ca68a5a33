"""The collective-agreement helpers, on every rank under mpirun (1, 2 and 3 ranks).

One rank with a problem must make every rank raise the same error (and run the clean-up), none
must let every rank go on; the step survey must agree on the steps valid everywhere.
"""

import pytest
from mpi4py import MPI

from hpcadj.collective import agree_or_raise, any_rank, common_steps, one_line, problems


class Boom(RuntimeError):
    pass


def test_no_problem_returns_on_every_rank(comm):
    assert agree_or_raise(comm, None, Boom, "never {detail}") is None
    assert problems(comm, None) == []


@pytest.mark.parametrize("culprit", [0, -1])
def test_one_rank_failing_raises_the_same_error_everywhere(comm, culprit):
    culprit %= comm.size
    cleaned = []
    problem = f"disk full on {comm.rank}" if comm.rank == culprit else None
    with pytest.raises(Boom) as info:
        agree_or_raise(comm, problem, Boom, "level {path}: cannot open ({detail}) on {ranks}",
                       cleanup=lambda: cleaned.append(True))
    message = str(info.value)
    assert message == f"level {{path}}: cannot open (rank {culprit}: disk full on {culprit}) on {culprit}"
    assert cleaned == [True]
    assert comm.allgather(message) == [message] * comm.size


def test_every_rank_failing_lists_every_rank_and_first_keeps_only_one(comm):
    with pytest.raises(Boom) as info:
        agree_or_raise(comm, f"bad {comm.rank}", Boom)
    assert str(info.value) == "; ".join(f"rank {r}: bad {r}" for r in range(comm.size))
    with pytest.raises(Boom) as info:
        agree_or_raise(comm, f"bad {comm.rank}", Boom, first=True)
    assert str(info.value) == "bad 0"


def test_first_names_the_rank_of_a_problem_some_ranks_only_have(comm):
    last = comm.size - 1
    with pytest.raises(Boom) as info:
        agree_or_raise(comm, "no such file" if comm.rank == last else None, Boom, first=True)
    assert str(info.value) == ("no such file" if comm.size == 1 else f"rank {last}: no such file")


def test_one_line_groups_ranks_and_drops_them_when_all_failed_alike():
    assert one_line([(0, "x"), (1, "x")], 2) == "x"
    assert one_line([(1, "x")], 2) == "rank 1: x"
    assert one_line([(0, "a"), (1, "b"), (2, "b")], 4) == "rank 0: a; ranks 1, 2: b"


def test_cause_is_chained(comm):
    cause = ValueError("root cause")
    with pytest.raises(Boom) as info:
        agree_or_raise(comm, "x" if comm.rank == 0 else None, Boom, cause=cause)
    assert info.value.__cause__ is cause


def test_any_rank_and_common_steps(comm):
    last = comm.size - 1
    assert any_rank(comm, comm.rank == last) is True
    assert any_rank(comm, False) is False
    steps = {0, 5, 9, 100 + comm.rank}
    if comm.rank == last:
        steps.discard(5)
    expect = {0, 9} | ({100} if comm.size == 1 else set())
    assert common_steps(comm, steps) == expect
    assert common_steps(None, {3}) == {3} and any_rank(None, True) is True
    assert MPI.Is_initialized()
