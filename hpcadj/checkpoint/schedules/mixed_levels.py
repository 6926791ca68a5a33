"""Mixed plans over several levels: today's multi-level plan with a mixed plan inside every RAM chain.

The multi-level programme (multilevel.py) keeps restart states on the slower levels (node-local files,
the parallel HDF5 file) and reverses the chains between them from RAM. Here every chain whose base is
in RAM — reached when all of RAM is free but that base — is planned by the mixed programme (mixed.py)
in the RAM budget B instead: restart states and steps' adjoint data. The multi-level plan's own RAM
chain is one plan of the mixed vocabulary in those bytes (restart states only, its end state held, its
base left held for the chain to its left), so the mixed chain never takes more forward evaluations,
and the slower levels' writes and reads are the same: never more forward steps than today's plan.
A model whose steps must run again for their data (RK, ``states_suffice=False``) cannot leave its
base held from data, so its plan stays today's multi-level plan.

Capacities: level 0 (RAM) in units of gcd(r, d) bytes, the other levels in slots.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from math import gcd

from .actions import Action, Restore
from .base import Schedule, ScheduleError
from .costs import OpCosts, default_costs
from .mixed import MixedTable, chain_actions
from .multilevel import Multilevel
from .resume import Residual


class MixedLevels(Schedule):
    """Restart states on every level, steps' adjoint data in RAM (level 0); see the module docstring."""

    name = "mixed"
    #: its plans hold and store steps' adjoint data (the driver keeps the last step's data only then)
    stores_data = True
    level = 0

    def __init__(self, n_steps: int, capacities: Sequence[int], state_size: int = 1, data_size: int = 1,
                 costs: OpCosts | None = None, states_suffice: bool = True):
        if len(capacities) < 2:
            raise ScheduleError("MixedLevels plans several levels; one level is Mixed's")
        if state_size < 1 or data_size < 1:
            raise ScheduleError(f"sizes must be positive, got state {state_size}, data {data_size}")
        self.n_steps = int(n_steps)
        self.capacities = tuple(int(c) for c in capacities)
        self.sizes = (int(state_size), int(data_size))
        self.states_suffice = bool(states_suffice)
        self.costs = costs if costs is not None else default_costs(len(self.capacities))
        r, d = self.sizes
        #: today's multi-level plan over the same levels, RAM in whole restart states
        self.today = Multilevel(self.n_steps, self.slots(), self.costs)
        self.table = None
        if self.states_suffice and self.n_steps > 1 and self.capacities[0] >= r:
            unit = gcd(r, d)
            self.table = MixedTable(self.n_steps, self.capacities[0] // unit, r // unit, d // unit, True,
                                    stored_bases=True)
            self._units = min(self.capacities[0] // unit, self.table.M)

    def slots(self) -> list[int]:
        """Capacities in restart states on every level (RAM's whole states of its bytes)."""
        return [self.capacities[0] // self.sizes[0], *self.capacities[1:]]

    def units(self) -> list[int]:
        """Capacities in units on every level (as the simulator checks them with ``sizes``)."""
        return [self.capacities[0], *(c * self.sizes[0] for c in self.capacities[1:])]

    def actions(self) -> Iterator[Action]:
        if self.table is None:
            return self.today.actions()
        return self.today.planner.actions(ram_chain=self._ram_chain)

    def _ram_chain(self, lo: int, hi: int, forward: bool, held: bool) -> Iterator[Action]:
        """The mixed plan of the chain u_lo .. u_hi whose base is stored in RAM: its end state held
        unless ``forward``, its base left held for the chain to its left (none when lo = 0)."""
        if not held:
            yield Restore(lo, 0)
        yield from chain_actions(self.table, 0, lo, hi - lo, self._units, 0 if forward else 1, 1 if lo else 0,
                                 True, forward)

    def resumed(self, capacities, retained, *, lam_step: int | None, costs=None) -> Residual:
        """The plan that finishes a resumed run: segments between the ``retained`` snapshots, each a
        plan of this kind over what the lower ones leave (a restart state takes ``state_size`` units of
        RAM, a slot elsewhere); data slots never survive a run."""
        r, d = self.sizes
        units = [self.capacities[0], *capacities[1:]]
        costs = costs.for_levels(len(units)) if costs is not None else self.costs

        def segment(steps, free):
            return MixedLevels(steps, free, r, d, costs, self.states_suffice)
        return Residual(self.n_steps, units, retained, lam_step=lam_step, costs=costs, segment=segment,
                        slot_units=[r] + [1] * (len(units) - 1), stores_data=True)
