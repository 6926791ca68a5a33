"""The driver's destruction of dropped PETSc objects and Python's cycles, at plan-determined points."""

from __future__ import annotations

import gc

from ..imports import petsc


class GarbageCleanups:
    """A :class:`~hpcadj.adjoint.driver.Driver` mixin: collective garbage cleanups, batched for small
    states, and the cyclic collector run on the solver thread."""

    GC_EVERY = 64
    #: global bytes of states (one per call, at most) that dropped Vecs may hold between two collective
    #: garbage cleanups: one cleanup a call for states this large or larger, every few steps for small ones
    GARBAGE_BYTES = 2 * 2 ** 20

    def _start_garbage(self, state_bytes: int) -> None:
        """Count calls from zero; clean up every call, or per ``GARBAGE_BYTES`` of ``state_bytes``."""
        self._gc_calls, self._parked = 0, 0
        self._garbage_every = max(1, self.GARBAGE_BYTES // max(state_bytes, 1))

    def _collect_garbage(self, force: bool = False) -> None:
        """Destroy the PETSc objects whose Python references were dropped (old states, adjoints).

        petsc4py (>= 3.18) does not destroy a parallel object when its last Python reference
        goes: it parks it on the communicator's garbage list until the collective
        ``PETSc.garbage_cleanup(comm)``. Without cleanups every Vec a step or an adjoint step
        created stayed allocated until the end of the run, so peak memory grew with the number of
        step evaluations and recomputation cost memory instead of saving it. Every rank executes
        the same plan, so the calls are collective in the same order.

        A cleanup is two allreduces, and a call comes after each step, a few per adjoint step: for
        small states those synchronisations cost more than the Vecs they free (a 128^2 RK TS on 2
        ranks: 8 a step beside the 20 of PETSc's own TSSolve + TSAdjointSolve). So a cleanup runs
        every ``GARBAGE_BYTES / (a state's global bytes)`` calls (every call for states of that size
        or more), counted alike on every rank, and always with ``force`` (a run's end, a pause).

        Python's cyclic collector is off during a run: left on, it ran on whichever thread
        allocated, an I/O thread included, and destroyed PETSc objects held in reference cycles
        there, on some ranks and not others. Here it runs on the solver thread every
        ``GC_EVERY`` calls, at the same points of the plan on every rank.
        """
        self._gc_calls += 1
        if self._gc_calls % self.GC_EVERY == 0:
            gc.collect(2 if self._gc_calls % (64 * self.GC_EVERY) == 0 else 1)
        self._parked += 1
        if force or self._parked >= self._garbage_every:
            self._parked = 0
            petsc().garbage_cleanup(self.comm)
