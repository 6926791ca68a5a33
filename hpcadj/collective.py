"""Collective agreement: every rank learns every rank's problem and fails, or goes on, alike.

Parallel code that checks something per rank (a file opens, a directory is writable, a block
reads back) must not let one rank raise while the others go on into the next collective call:
they would wait for it forever. These helpers gather each rank's verdict and turn it into the
same outcome on every rank. ``comm`` may be None (one process, no MPI).

A rank that failed where the others may already be inside another collective call (a model's
constructor creating its DMDA) cannot wait for them unboundedly: :class:`Agreement` agrees on a
communicator of its own, and a rank with a problem waits for the others only so long.
"""

from __future__ import annotations

import os
import time

from .imports import mpi

#: seconds a rank that failed waits for the others to agree before it ends the job
#: ($HPCADJ_AGREE_TIMEOUT overrides it)
AGREE_TIMEOUT_S = 10.0


def agree_timeout() -> float:
    """Seconds a failing rank waits for the others (:data:`AGREE_TIMEOUT_S` or $HPCADJ_AGREE_TIMEOUT)."""
    try:
        timeout = float(os.environ.get("HPCADJ_AGREE_TIMEOUT", AGREE_TIMEOUT_S))
    except ValueError:
        return AGREE_TIMEOUT_S
    return timeout if timeout > 0 else AGREE_TIMEOUT_S


def allgather(comm, value) -> list:
    """Every rank's ``value`` in rank order (``[value]`` without a communicator)."""
    return [value] if comm is None else comm.allgather(value)


def problems(comm, problem: str | None) -> list[tuple[int, str]]:
    """``(rank, problem)`` for every rank whose ``problem`` is not None/empty; the same list everywhere."""
    return [(rank, p) for rank, p in enumerate(allgather(comm, problem)) if p]


def first_problem(comm, problem: str | None) -> str | None:
    """The first failing rank's problem (prefixed with its rank on several ranks), alike everywhere."""
    return first_of(problems(comm, problem), 1 if comm is None else comm.size)


def first_of(failed: list[tuple[int, str]], size: int) -> str | None:
    """The first of ``failed``'s problems (prefixed with its rank on several ranks), or None."""
    if not failed:
        return None
    rank, text = failed[0]
    return text if size == 1 else f"rank {rank}: {text}"


def detail(failed: list[tuple[int, str]]) -> str:
    """``"rank 0: why; rank 2: why"``: the failing ranks' problems in one line."""
    return "; ".join(f"rank {rank}: {p}" for rank, p in failed)


def agree_or_raise(comm, problem: str | None, error_type: type[Exception], message: str = "{detail}",
                   *, first: bool = False, cleanup=None, cause: BaseException | None = None) -> None:
    """Raise the same ``error_type`` on every rank if ``problem`` is set on any rank; else return.

    In ``message``, ``{detail}`` becomes each failing rank's problem (``"rank r: ..."`` joined by
    ``"; "``; with ``first``, the first failing rank's problem, as it is when every rank failed, else
    as ``"rank r: ..."``: a problem of some ranks only names them) and ``{ranks}`` the failing
    ranks, comma-separated (plain replacement, so paths with braces are safe). ``cleanup()`` runs
    on every rank before the raise; ``cause`` becomes the error's ``__cause__``. Collective.
    """
    failed = problems(comm, problem)
    if not failed:
        return
    if cleanup is not None:
        cleanup()
    if first:
        text = failed[0][1] if len(failed) == (1 if comm is None else comm.size) else detail(failed[:1])
    else:
        text = detail(failed)
    ranks = ", ".join(str(r) for r, _ in failed)
    error = error_type(message.replace("{detail}", text).replace("{ranks}", ranks))
    raise error from cause


def any_rank(comm, flag: bool) -> bool:
    """True on every rank if ``flag`` is true on any rank."""
    if comm is None:
        return bool(flag)

    return bool(comm.allreduce(bool(flag), op=mpi().LOR))


def common_steps(comm, steps) -> set[int]:
    """The steps in ``steps`` on every rank (their intersection), the same set everywhere."""
    common = set(steps)
    for other in allgather(comm, sorted(common)):
        common &= set(other)
    return common


def one_line(failed: list[tuple[int, str]], size: int) -> str:
    """The failing ranks' problems in one line: the problem alone when every rank had the same one,
    else ``"rank 1: why"``, ranks with the same problem together (``"ranks 1, 2: why"``)."""
    texts = list(dict.fromkeys(p for _, p in failed))
    if len(failed) == size and len(texts) == 1:
        return texts[0]
    parts = []
    for text in texts:
        ranks = [r for r, p in failed if p == text]
        parts.append(f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {text}")
    return "; ".join(parts)


class Unreachable(Exception):
    """This rank has a problem and the other ranks did not come to agree on it in time: they are
    elsewhere (in a collective call this rank will never join), so only ending the job is left."""


class Agreement:
    """Agreement on problems over a duplicate of ``comm`` kept for it alone, bounded in time.

    :meth:`problems` is :func:`problems` where a rank *with* a problem waits at most ``timeout``
    seconds for every rank to arrive (then raises :class:`Unreachable`); a rank without one waits
    as long as it takes. Any two calls match each other, so a rank that failed at one point and
    ranks that arrive at another (the end of the command, say) still learn each other's problems.
    The duplicate keeps these calls from being matched with any other collective. Creating one is
    collective over ``comm``; ``timeout`` defaults to :func:`agree_timeout`. As a context manager it
    frees the duplicate at the end.
    """

    #: the longest pause between two polls of the barrier (seconds)
    POLL_S = 0.05

    def __init__(self, comm, timeout: float | None = None):
        self.comm = comm.Dup()
        self.size = comm.size
        self.timeout = agree_timeout() if timeout is None else timeout

    def __enter__(self) -> Agreement:
        return self

    def __exit__(self, exc_type, *_exc) -> None:
        """Free the duplicate when every rank is leaving together (after an error some rank may
        be elsewhere, and the job is ending anyway)."""
        if exc_type is None:
            self.free()

    def free(self) -> None:
        """Free the duplicate communicator (collective over every rank that made it)."""
        self.comm.Free()

    def problems(self, problem: str | None) -> list[tuple[int, str]]:
        """``(rank, problem)`` of every rank with one, the same list everywhere (see the class)."""
        request = self.comm.Ibarrier()
        deadline = time.monotonic() + self.timeout if problem else None
        pause = 0.001
        while not request.Test():  # polled, not Wait(): a waiting rank leaves the cores to the others
            if deadline is not None and time.monotonic() > deadline:
                raise Unreachable(problem)
            time.sleep(pause)
            pause = min(2 * pause, self.POLL_S)
        return problems(self.comm, problem)
