"""What survived: after a fault, before a durable point, on resume — one survey of the levels.

For each level: flush it (a write failure there is recorded, not raised), list its valid steps,
agree with every rank on which steps are valid everywhere and whether the level failed anywhere,
and discard the rest. Fault re-planning (``Driver._replan``), durable points
(``restart.durability``) and resume (``restart.resume``) all read the levels this way.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...collective import any_rank, common_steps
from .base import LevelError


@dataclass
class Survived:
    """One level's survey: ``steps`` valid on every rank; ``failed`` (agreed): its flush raised on
    some rank, or the caller said so; ``error``: this rank's flush error, if any."""

    steps: set[int]
    failed: bool
    error: LevelError | None = None


def survey(levels, comm, *, flush: bool = True, failed=(), listed=None, keep=None,
           discard: bool = True) -> list[Survived]:
    """Survey ``levels`` in order (collective: every rank calls it with the same levels).

    ``failed``: indices of levels this rank already knows failed a write. ``listed``: per level, the
    only steps that may count (e.g. the ones a manifest names). ``keep(step)``: whether a valid step
    is still wanted. With ``discard``, steps held but not kept (not valid on every rank, not listed,
    not wanted) are discarded from the level.
    """
    out = []
    for index, level in enumerate(levels):
        error = None
        if flush:
            try:
                level.flush()
            except LevelError as exc:
                error = exc
        valid = sorted(level.valid_steps())
        mine = set(valid) if listed is None else set(valid) & set(listed[index])
        down = any_rank(comm, error is not None or index in failed)
        common = common_steps(comm, mine)
        if keep is not None:
            common = {step for step in common if keep(step)}
        if discard:
            for step in valid:
                if step not in common:
                    level.discard(step)
        out.append(Survived(common, down, error))
    return out
