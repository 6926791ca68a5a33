"""The driver's data actions: a step's adjoint data (what its adjoint step reads) kept and used.

``StoreData(n, level)`` writes the data of step n, captured from the states the last ``Advance`` left
(:meth:`~hpcadj.models.base.Stepper.adjoint_data`); ``AdjointData(n1, n0, level)`` runs adjoint step
n0 from them through the model's stand-in state (:meth:`~hpcadj.models.base.Stepper.adjoint_data_state`),
reading and freeing the slot, or capturing the held data when ``level`` is None. Data slots are RAM
beside the plan level's states; the plan counts their bytes within that level's budget.
"""

from __future__ import annotations

from ..buffers import IDLE_KEPT, release_free_memory, trim_idle_buffers
from ..checkpoint.schedules.actions import PlanError


def _where(text: str):
    from .driver import _where as where

    return where(text)


class DataActions:
    """Mixed into :class:`~hpcadj.adjoint.driver.Driver`: the data slots and the two data actions."""

    def _data_source(self, u, u_next):
        """What the held data of the step just run are made from (its input and output), for a model
        that declares adjoint data and a plan that uses them; captured only if an action asks."""
        return (u, u_next) if self._hold_data else None

    def _data_levels(self) -> list:
        return list(self._data_store.values())

    def data_stats(self) -> dict:
        """Writes and bytes of the data slots (all levels), for run summaries."""
        levels = self._data_levels()
        return {"writes": sum(lv.stats.writes for lv in levels),
                "bytes_written": sum(lv.stats.bytes_written for lv in levels),
                "peak_slots": sum(lv.stats.peak_slots for lv in levels)}

    def _data_level(self, index: int):
        """The data slots beside plan level ``index`` (a RAM level only)."""
        level = self._level(index)
        if self._data_layout is None:
            raise PlanError(f"the model {self.stepper.name!r} declares no adjoint data; the plan stores some")
        if level.kind != "ram":
            raise PlanError(f"adjoint data are kept in RAM only; the plan puts them on {level.name}")
        if index not in self._data_store:
            from ..checkpoint.storage.ram import RamLevel

            self._data_store[index] = RamLevel(self.n, self._data_layout, name=f"{level.name} data")
        return self._data_store[index]

    def _captured(self, n: int):
        u, u_next = self.work.get_data(n)
        with _where(f"capturing the adjoint data of step {n}"):
            return self.stepper.adjoint_data(n, u, u_next)

    SPARE_BUFFERS = IDLE_KEPT
    #: the heap's free pages go back to the system once this many bytes of data slots (this rank's) were
    #: freed: freed data (heap, not mapped, once glibc raised its mmap threshold) stayed resident under
    #: later states. Four wave 128^3 slots on 2 ranks; for small slots a trim (and the page faults of
    #: refilling the pages it returned) after every few costs more than the memory it gives back
    TRIM_BYTES = 32 * 2 ** 20
    _freed_bytes = 0

    def trim_before_state_store(self) -> None:
        """Under a plan holding data, drop the buffers pools keep idle before a restart state is stored:
        the data slots freed since would otherwise stay resident beside the states that replace them."""
        if self._hold_data:
            trim_idle_buffers(self.SPARE_BUFFERS)

    def store_data(self, action) -> None:
        level = self._data_level(action.level)
        # the restart states' buffers a model's pool kept idle would stay resident beside the data
        trim_idle_buffers(self.SPARE_BUFFERS, data=False)
        data = self._captured(action.n)
        with self.telemetry.phase("store_data", step=action.n, nbytes=self._data_nbytes,
                                  level=level.name):
            level.write(action.n, data, time=self.stepper.time(action.n), donate=True)

    def adjoint_from_data(self, action) -> None:
        n0 = action.n0
        if self.lam_step != action.n1:
            raise PlanError(f"adjoint step {n0} needs lambda_{action.n1}, have lambda_{self.lam_step}")
        if action.level is None:
            data = self._captured(n0)
        else:
            level = self._data_level(action.level)
            with self.telemetry.phase("restore_data", step=n0, nbytes=self._data_nbytes,
                                      level=level.name):
                data = level.read(n0)
        self.work.data_adjoint_done(n0)
        self._collect_garbage()
        with self.telemetry.phase("adjoint", step=n0, steps=1):
            with _where(f"adjoint step {n0} (from its data)"):
                u = self.stepper.adjoint_data_state(n0, data)
                if action.level is not None:
                    data = None
                    level.free(n0)
                    self._freed_bytes += self._data_nbytes
                    if self._freed_bytes >= self.TRIM_BYTES:
                        self._freed_bytes = 0
                        release_free_memory()
                lam = self.stepper.adjoint_step(n0, u, None, self.lam, self.grad)
            self.lam, self.lam_step = lam, n0
            self._collect_garbage()
            self.stepper.add_objective_gradient(n0, u, lam)
            u = None
            self._check_lambda(n0, lam, f"adjoint step {n0}")
        self._adjoint_done()
