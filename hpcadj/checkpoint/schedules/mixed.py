"""Mixed checkpointing on one level: store restart states (size r) or steps' adjoint data (size d).

A step's *adjoint data* are what its adjoint step reads (actions.py): reversing a step from them needs
no state and no recomputation. This plan chooses, for every step, between keeping restart states and
keeping data, in a byte budget B, so as to minimise forward evaluations and then writes — a dynamic
programme in the spirit of CAMS (Zhang & Constantinescu, arXiv 2106.13879) and Maddison's mixed
schedule (arXiv 2305.09568), over bytes rather than slot counts.

Two kinds of model (``states_suffice``):

- True (leapfrog wave, theta-method, models without data): the adjoint step also runs from the two
  working states u_i, u_{i+1} at no cost, and after it u_i stays held (actions.py).
- False (RK: the stages exist only while the step runs): a step is reversed only from its data; from a
  state that means evaluating the step again. This is checkpoint_schedules' mixed model; with d = r
  the counts equal its ``MixedCheckpointSchedule``'s (tests/unit/test_schedules_mixed.py).

The programme. ``T(L, m, e, f)`` is the least cost to reverse a chain of L steps whose first state
u_a is held and not stored, with m free units, where ``e`` says u_{a+L} is held (so step a+L-1 may
be reversed from states without advancing) and ``f`` demands that step a itself be reversed from
states (so u_a stays held for the chain to its left). Cost = evaluations * W + writes. Options:

- A, L = 1: reverse step a: from states with e (free), else after one advance;
- B, data: advance one step, store its data, reverse the rest ``T(L-1, m-d, e, .)``, then step a from
  its data: ``W + 1 + T(L-1, m-d, e, 0)`` (not with f);
- C, restart: store u_a, advance i steps (1 <= i < L), reverse the right part ``T(L-i, m-r, e, f')``,
  restore u_a and reverse the left part with the whole budget ``T(i, m, f', f)``, where f' says the
  right part's first step ran from states (then u_{a+i} is still held).

A chain whose base is already stored (the left part of C) saves C's write. Complexity O(n^2 M) in
units of gcd(r, d). Where storing every step fits (the data of steps 0..n-2, or their states when
they suffice and are smaller) that is the plan, without the table: n evaluations and n-1 writes, the
least of both.
"""

from __future__ import annotations

from collections.abc import Iterator
from math import gcd

import numpy as np

from .actions import Action, Adjoint, AdjointData, Advance, EndForward, EndReverse, Free, Restore, Store, StoreData
from .base import Schedule, ScheduleError
from .resume import Residual
from .storeall import StoreAll

_INF = 1 << 62
#: the table's infinity: two of them still add up inside an int64
_TABLE_INF = 1 << 60


def least_budget(n_steps: int, state_size: int, data_size: int) -> int:
    """The least budget with which a mixed plan reverses ``n_steps``: one restart state (a chain
    from it), or the data of every step but the last (whose data the forward sweep still holds)."""
    return 0 if n_steps <= 1 else min(state_size, (n_steps - 1) * data_size)


class MixedTable:
    """The programme's tables for chains up to ``n_steps`` long and budgets up to ``units``: one numpy
    row per budget, a chain length's column filled for every budget at once."""

    def __init__(self, n_steps: int, units: int, r: int, d: int, states_suffice: bool, stored_bases: bool = False):
        self.n, self.r, self.d, self.states = n_steps, r, d, states_suffice
        # beyond what storing every step needs (data, or states where they suffice) nothing helps; a
        # chain whose base is stored and must stay held (``stored_bases``) may use every state's bytes
        useful = n_steps * r if stored_bases else (n_steps - 1) * (min(r, d) if states_suffice else d)
        self.M = min(units, useful)
        self.W = n_steps * (n_steps + 1) // 2 + 2
        flags = ((0, 0), (0, 1), (1, 0), (1, 1)) if states_suffice else ((0, 0),)
        self.flags = flags
        # U[e, f][m, L]: base not stored; S: base stored (C saves its write); SPI = L * W + S: the left
        # part of C plus the advance to its split
        shape = (self.M + 1, n_steps + 1)
        self.U = {ef: np.full(shape, _TABLE_INF, dtype=np.int64) for ef in flags}
        self.S = {ef: np.full(shape, _TABLE_INF, dtype=np.int64) for ef in flags}
        self.SPI = {ef: np.full(shape, _TABLE_INF, dtype=np.int64) for ef in flags}
        for length in range(1, n_steps + 1):
            self._fill(length)

    def _key(self, e: int, f: int) -> tuple[int, int]:
        return (e, f) if self.states else (0, 0)

    def _u(self, e: int, f: int, m: int):
        return self.U[self._key(e, f)][m]

    def _a(self, e: int, f: int) -> int:
        """Option A's cost for a single step."""
        if not self.states:
            return _INF if f else self.W
        return 0 if e else self.W

    def _b(self, length: int, m: int, e: int, f: int) -> int:
        if f or m < self.d:
            return _INF
        return self.W + 1 + int(self._u(e, 0, m - self.d)[length - 1])

    def _c_split(self, length: int, m: int, e: int, f: int, fp: int) -> list[int]:
        """C's cost (write of u_a excluded) for every split i = 1 .. length-1, with right part flag fp."""
        if (fp or f) and not self.states:
            return []
        right = self._u(e, fp, m - self.r)
        left = self.SPI[(fp, f)][m]
        return (left[1:length] + right[length - 1:0:-1]).tolist()

    def _fill(self, length: int) -> None:
        """Tabulate chains of ``length`` for every budget and flag combination; C's splits summed as
        a (budget x split) array, B from the column one shorter."""
        rows, n_budgets = self.M + 1, self.M + 1 - self.r
        fps = (0, 1) if self.states else (0,)
        for ef in self.flags:
            if length == 1:
                a = min(self._a(*ef), _TABLE_INF)
                self.U[ef][:, 1] = self.S[ef][:, 1] = a
                self.SPI[ef][:, 1] = min(self.W + a, _TABLE_INF)
                continue
            e, f = ef
            c = np.full(rows, _TABLE_INF, dtype=np.int64)
            if n_budgets > 0:
                right = [self.U[self._key(e, fp)][:n_budgets, length - 1:0:-1] for fp in fps]
                left = [self.SPI[(fp, f)][self.r:, 1:length] for fp in fps]
                c[self.r:] = np.minimum.reduce([(lt + rt).min(axis=1) for lt, rt in zip(left, right)])
            b = np.full(rows, _TABLE_INF, dtype=np.int64)
            if not f and rows > self.d:
                b[self.d:] = self.W + 1 + self.U[self._key(e, 0)][:rows - self.d, length - 1]
            np.minimum(b, _TABLE_INF, out=b)
            np.minimum(c, _TABLE_INF, out=c)
            s = np.minimum(b, c)
            self.U[ef][:, length] = np.minimum(np.minimum(b, c + 1), _TABLE_INF)
            self.S[ef][:, length] = s
            self.SPI[ef][:, length] = np.minimum(length * self.W + s, _TABLE_INF)

    def cost(self, length: int, m: int, e: int, f: int, stored: bool) -> int:
        table = self.S if stored else self.U
        value = int(table[self._key(e, f)][min(m, self.M), length])
        return _INF if value >= _TABLE_INF else value

    def choice(self, length: int, m: int, e: int, f: int, stored: bool) -> tuple:
        """The option reaching ``cost(...)``: ('A',), ('B',) or ('C', i, f')."""
        m = min(m, self.M)
        best = self.cost(length, m, e, f, stored)
        if length == 1:
            return ("A",)
        if self._b(length, m, e, f) == best:
            return ("B",)
        write = 0 if stored else 1
        for fp in (1, 0) if self.states else (0,):
            if m < self.r:
                break
            splits = self._c_split(length, m, e, f, fp)
            for i, c in enumerate(splits, start=1):
                if c + write == best:
                    return ("C", i, fp)
        raise AssertionError("no option reaches the tabulated cost")


class Mixed(Schedule):
    """The optimal single-level mixed plan: restart states of ``state_size`` and step data of
    ``data_size`` units in ``capacities[level]`` units (bytes, say); see the module docstring."""

    name = "mixed"
    #: its plans hold and store steps' adjoint data (the driver keeps the last step's data only then)
    stores_data = True

    def __init__(self, n_steps: int, capacities, state_size: int = 1, data_size: int = 1,
                 states_suffice: bool = True, level: int = 0):
        if n_steps < 1:
            raise ScheduleError(f"steps must be >= 1, got {n_steps}")
        if not 0 <= level < len(capacities):
            raise ScheduleError(f"level {level} does not exist ({len(capacities)} levels)")
        if state_size < 1 or data_size < 1:
            raise ScheduleError(f"sizes must be positive, got state {state_size}, data {data_size}")
        self.n_steps = int(n_steps)
        self.capacities = tuple(int(c) for c in capacities)
        self.level = level
        self.sizes = (int(state_size), int(data_size))
        self.states_suffice = bool(states_suffice)
        budget = self.capacities[level]
        least = least_budget(self.n_steps, *self.sizes)
        if budget < least:
            raise ScheduleError(f"a budget of {budget} cannot reverse {self.n_steps} steps with restart states "
                                f"of {state_size} and step data of {data_size}: the least that would do is {least}")
        #: storing every step fits: "data" or "states" (the smaller, when states suffice), else None
        self.store_all = self._store_all(budget)
        self.table = None
        if self.store_all is None:
            unit = gcd(*self.sizes)
            self.table = MixedTable(self.n_steps, budget // unit, state_size // unit, data_size // unit,
                                    self.states_suffice)
            self._units = min(budget // unit, self.table.M)

    def _store_all(self, budget: int) -> str | None:
        r, d = self.sizes
        steps = self.n_steps - 1
        if self.states_suffice and r < d and steps > 0:
            return "states" if budget >= steps * r else None
        return "data" if budget >= steps * d else None

    def resumed(self, capacities, retained, *, lam_step: int | None, costs=None) -> Residual:
        """The plan that finishes a resumed run: the rest cut into segments between the ``retained``
        snapshots (step -> level), each a fresh mixed plan in the units of this plan's level that the
        lower retained snapshots leave (a restart state takes ``state_size`` there, a slot elsewhere).
        Data slots never survive a run: they are rebuilt by recomputation from the segment's base."""
        r, d = self.sizes
        units, sizes = list(capacities), [1] * len(capacities)
        units[self.level], sizes[self.level] = self.capacities[self.level], r

        def segment(steps, free):
            return Mixed(steps, free, r, d, self.states_suffice, level=self.level)
        return Residual(self.n_steps, units, retained, lam_step=lam_step, costs=costs, segment=segment,
                        slot_units=sizes, stores_data=True)

    def forward_steps(self) -> int:
        """Forward evaluations of this plan (the programme's optimum)."""
        if self.table is None:
            return self.n_steps
        return self.table.cost(self.n_steps, self._units, 0, 0, False) // self.table.W

    def writes(self) -> int:
        """Restart and data writes of this plan (the second objective)."""
        if self.table is None:
            return self.n_steps - 1
        return self.table.cost(self.n_steps, self._units, 0, 0, False) % self.table.W

    def _store_all_actions(self) -> Iterator[Action]:
        n, lv = self.n_steps, self.level
        if self.store_all == "states":
            yield from StoreAll(n, self.capacities, level=lv).actions()
            return
        for i in range(n - 1):
            yield Advance(i, i + 1)
            yield StoreData(i, lv)
        yield Advance(n - 1, n)
        yield EndForward()
        yield Adjoint(n, n - 1) if self.states_suffice else AdjointData(n, n - 1)
        for i in reversed(range(n - 1)):
            yield AdjointData(i + 1, i, lv)
        yield EndReverse()

    def actions(self) -> Iterator[Action]:
        if self.table is None:
            yield from self._store_all_actions()
            return
        yield from chain_actions(self.table, self.level, 0, self.n_steps, self._units, 0, 0, False, True)
        yield EndReverse()


def chain_actions(t: MixedTable, lv: int, a: int, length: int, m: int, e: int, f: int, stored: bool,
                  fwd: bool) -> Iterator[Action]:
    """The table's plan for the chain u_a .. u_{a+length} on level ``lv`` with ``m`` units (the base's
    included when ``stored``), ``e``/``f`` as in the module docstring; ``fwd`` when the chain's last step
    is still ahead of the first sweep (its advance ends with EndForward). u_a is held at the start."""
    states = t.states
    # pending tasks, last first: ("chain", a, L, m, e, f, stored, fwd) | ("restore", a) | ("data", a)
    stack: list[tuple] = [("chain", a, length, min(m, t.M), e, f, stored, fwd)]
    while stack:
        task = stack.pop()
        if task[0] == "restore":
            yield Restore(task[1], lv)
            continue
        if task[0] == "data":
            yield AdjointData(task[1] + 1, task[1], lv)
            continue
        _, a, length, m, e, f, stored, fwd = task
        option = t.choice(length, m, e, f, stored)
        if stored and option[0] != "C":
            yield Free(a, lv)
        if option[0] == "A":
            if not e:
                yield Advance(a, a + 1)
                if fwd:
                    yield EndForward()
            yield Adjoint(a + 1, a) if states else AdjointData(a + 1, a)
        elif option[0] == "B":
            yield Advance(a, a + 1)
            yield StoreData(a, lv)
            stack.append(("data", a))
            stack.append(("chain", a + 1, length - 1, m - t.d, e, 0, False, fwd))
        else:
            _, i, fp = option
            if not stored:
                yield Store(a, lv)
            yield Advance(a, a + i)
            stack.append(("chain", a, i, m, fp, f, True, False))
            stack.append(("restore", a))
            stack.append(("chain", a + i, length - i, m - t.r, e, fp, False, fwd))
