"""The action stream: what a checkpoint plan tells the driver to do, one immutable action at a time.

Steps run u_0 -> u_1 -> ... -> u_n; adjoint step i maps lambda_{i+1} to lambda_i and needs both u_i and
u_{i+1}. Levels are numbered 0 (fastest, RAM) to K-1 (slowest). Every rank executes the identical
stream, so collective I/O stays in step.

Besides its level slots the driver holds at most two *working states*; the rules below (mirrored
exactly by :class:`WorkingStates`, which both the driver and the plan simulator use) say which:

- The forward sweep starts holding u_0.
- ``Advance(n0, n1)`` needs u_{n0} held and computes u_{n0+1} .. u_{n1}. Afterwards the driver holds
  u_{n1} and, if it was holding states beyond n1 (kept for the reverse sweep), the furthest; else the
  last input u_{n1-1} (free: the step just had it), so the first adjoint step after the forward
  sweep needs no recomputation.
- ``Restore(n, level)`` copies u_n from a level into a working state, keeping the held state
  furthest beyond n, if any.
- ``Adjoint(n1, n0)`` (n1 = n0 + 1) runs adjoint step n0 with u_{n0} and u_{n1} held; afterwards
  only u_{n0} is held, kept for the next adjoint step.
- ``Store``/``Move``/``Free`` touch levels only; ``Store(n, level)`` needs u_n held.

A model may also declare *adjoint data*: what its adjoint step reads (RK: the stages; leapfrog: one
field), of a size that may differ from a restart state's. Two more actions and one rule for them:

- After ``Advance(n0, n1)`` the driver also holds the data of step n1-1 (the step just produced them),
  until the next ``Advance``, ``Restore`` or adjoint step; ``StoreData(n, level)`` writes them.
- ``AdjointData(n1, n0, level)`` runs adjoint step n0 from its data alone: read from ``level`` (the
  slot is released: a step's data serve one adjoint step) or, with ``level=None``, the held data.
  No state is read; afterwards the held states beyond n0 are dropped (nothing needs them any more).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar


class Action:
    """Base of every plan action (immutable, hashable, comparable)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Advance(Action):
    """Step the held state u_{n0} forward to u_{n1} (n1 - n0 forward-step evaluations)."""

    n0: int
    n1: int

    def __post_init__(self):
        if not 0 <= self.n0 < self.n1:
            raise ValueError(f"Advance needs 0 <= n0 < n1, got ({self.n0}, {self.n1})")


@dataclass(frozen=True, slots=True)
class _AtLevel(Action):
    """An action on u_n (or on step n's adjoint data) and a slot of ``level``."""

    n: int
    level: int


class Store(_AtLevel):
    """Write the held state u_n to a slot of ``level``."""

    __slots__ = ()


class Restore(_AtLevel):
    """Read u_n from ``level`` into a working state (the slot stays occupied)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Move(Action):
    """Move the snapshot of u_n from level ``src`` to level ``dst`` (the ``src`` slot is freed)."""

    n: int
    src: int
    dst: int


class Free(_AtLevel):
    """Release the slot holding u_n on ``level``."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class _OneStep(Action):
    """An adjoint action: adjoint step n0, lambda_{n1} -> lambda_{n0}, with n1 = n0 + 1."""

    n1: int
    n0: int

    def __post_init__(self):
        if self.n1 != self.n0 + 1 or self.n0 < 0:
            raise ValueError(f"{type(self).__name__} runs one step, n1 = n0 + 1 >= 1; got ({self.n1}, {self.n0})")


class Adjoint(_OneStep):
    """Adjoint step n0: lambda_{n1} -> lambda_{n0}, with n1 = n0 + 1."""

    __slots__ = ()


class StoreData(_AtLevel):
    """Write the held adjoint data of step n (what adjoint step n reads) to a slot of ``level``."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class AdjointData(_OneStep):
    """Adjoint step n0 from its adjoint data (from ``level``, freeing the slot; None: the held data)."""

    level: int | None = None


@dataclass(frozen=True, slots=True)
class EndForward(Action):
    """The forward sweep has reached u_n (held): evaluate the final objective, seed lambda_n."""


@dataclass(frozen=True, slots=True)
class EndReverse(Action):
    """lambda_0 is known: the gradient is complete; no level may still hold a snapshot."""


T = TypeVar("T")

#: the fewest consecutive steps the driver hands to a model's ``advance`` at once
MIN_ADVANCE = 2


def advance_runs(n0: int, n1: int, frontier: int, keeps_beyond: bool) -> list[tuple[int, bool]]:
    """The runs of ``Advance(n0, n1)`` a driver hands to a model's ``advance``, as (steps, first
    sweep): the range is split at the first sweep's ``frontier`` (steps from it on are first-sweep),
    and the last step stays a single step when u_{n1-1} is kept (``keeps_beyond`` False: no state
    is held beyond n1); runs shorter than :data:`MIN_ADVANCE` are single steps. The first sweep's
    input checks and the model's ``advance_objective`` are the driver's to apply."""
    runs = []
    k = n0
    while k < n1:
        first = k >= frontier
        end = n1 if first else min(n1, frontier)
        stop = end - 1 if end == n1 and not keeps_beyond else end
        if stop - k >= MIN_ADVANCE:
            runs.append((stop - k, first))
        k = end
    return runs


class PlanError(RuntimeError):
    """An action that cannot run in the current state: the plan is wrong."""


class WorkingStates(Generic[T]):
    """The at most two working states a driver holds, keyed by step; see the module docstring."""

    def __init__(self, n0: int = 0, u0: T | None = None):
        self._held: dict[int, T] = {n0: u0}
        self._data: tuple[int, object] | None = None

    def __contains__(self, n: int) -> bool:
        return n in self._held

    def __len__(self) -> int:
        return len(self._held)

    def steps(self) -> list[int]:
        return sorted(self._held)

    def get(self, n: int) -> T:
        try:
            return self._held[n]
        except KeyError:
            raise PlanError(f"u_{n} is not held (held: {self.steps()})") from None

    def _kept_beyond(self, n: int) -> dict[int, T]:
        """The held state furthest beyond step n (the one the reverse sweep keeps), if any."""
        beyond = [k for k in self._held if k > n]
        return {max(beyond): self._held[max(beyond)]} if beyond else {}

    def advanced(self, n0: int, n1: int, last_input: T, result: T, data: object = None) -> None:
        """Record the outcome of ``Advance(n0, n1)``: ``last_input`` is u_{n1-1}, ``result`` u_{n1},
        ``data`` the adjoint data of step n1-1 (None if the model declares none)."""
        kept = self._kept_beyond(n1)
        if not kept:
            kept = {n1 - 1: last_input}
        self._held = {**kept, n1: result}
        self._data = (n1 - 1, data)

    def restored(self, n: int, u: T) -> None:
        """Record ``Restore(n, level)``: u_n is held, with any state kept beyond n."""
        self._held = {**self._kept_beyond(n), n: u}
        self._data = None

    def adjoint_done(self, n0: int) -> None:
        """After adjoint step n0 only u_{n0} stays held."""
        self._held = {n0: self._held[n0]}
        self._data = None

    def data_step(self) -> int | None:
        """The step whose adjoint data are held, if any."""
        return None if self._data is None else self._data[0]

    def get_data(self, n: int) -> object:
        """The held adjoint data of step n (PlanError if other or none are held)."""
        if self.data_step() != n:
            raise PlanError(f"the data of step {n} are not held (held: {self.data_step()})")
        return self._data[1]

    def data_adjoint_done(self, n0: int) -> None:
        """After adjoint step n0 ran from its data: the states beyond n0 and the held data are dropped."""
        self._held = {k: u for k, u in self._held.items() if k <= n0}
        self._data = None
