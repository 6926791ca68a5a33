"""Collective agreement: every rank learns every rank's problem and fails, or goes on, alike.

Parallel code that checks something per rank (a file opens, a directory is writable, a block
reads back) must not let one rank raise while the others go on into the next collective call:
they would wait for it forever. These helpers gather each rank's verdict and turn it into the
same outcome on every rank. ``comm`` may be None (one process, no MPI).
"""

from __future__ import annotations


def allgather(comm, value) -> list:
    """Every rank's ``value`` in rank order (``[value]`` without a communicator)."""
    return [value] if comm is None else comm.allgather(value)


def problems(comm, problem: str | None) -> list[tuple[int, str]]:
    """``(rank, problem)`` for every rank whose ``problem`` is not None/empty; the same list everywhere."""
    return [(rank, p) for rank, p in enumerate(allgather(comm, problem)) if p]


def detail(failed: list[tuple[int, str]]) -> str:
    """``"rank 0: why; rank 2: why"``: the failing ranks' problems in one line."""
    return "; ".join(f"rank {rank}: {p}" for rank, p in failed)


def agree_or_raise(comm, problem: str | None, error_type: type[Exception], message: str = "{detail}",
                   *, first: bool = False, cleanup=None, cause: BaseException | None = None) -> None:
    """Raise the same ``error_type`` on every rank if ``problem`` is set on any rank; else return.

    In ``message``, ``{detail}`` becomes each failing rank's problem (``"rank r: ..."`` joined by
    ``"; "``; with ``first``, the first failing rank's problem as it is) and ``{ranks}`` the failing
    ranks, comma-separated (plain replacement, so paths with braces are safe). ``cleanup()`` runs
    on every rank before the raise; ``cause`` becomes the error's ``__cause__``. Collective.
    """
    failed = problems(comm, problem)
    if not failed:
        return
    if cleanup is not None:
        cleanup()
    text = failed[0][1] if first else detail(failed)
    ranks = ", ".join(str(r) for r, _ in failed)
    error = error_type(message.replace("{detail}", text).replace("{ranks}", ranks))
    raise error from cause


def any_rank(comm, flag: bool) -> bool:
    """True on every rank if ``flag`` is true on any rank."""
    if comm is None:
        return bool(flag)
    from .imports import mpi

    return bool(comm.allreduce(bool(flag), op=mpi().LOR))


def common_steps(comm, steps) -> set[int]:
    """The steps in ``steps`` on every rank (their intersection), the same set everywhere."""
    common = set(steps)
    for other in allgather(comm, sorted(common)):
        common &= set(other)
    return common
