"""The driver's check of a model's advance (docs/architecture.md, Seam 1, "Advances").

A model's ``advance(i, u, k)`` must give u_{i+k} bitwise equal to k calls of ``step``; a run compares
the two once, before it uses the first advance, so a model whose advance disagrees is refused with
one line before any gradient is reported (``hpcadj check`` tests it more widely).
"""

from __future__ import annotations

import math
import os
import signal
import time

from ..checkpoint.schedules.actions import MIN_ADVANCE
from ..collective import any_rank
from ..models.base import SolverError, Stepper
from .guards import NonFinite, checksum, finite


class AdvanceMismatch(SolverError):
    """A model's ``advance()`` gave another state than its single steps."""


def verify_advance(stepper, comm, k: int, u, m: int) -> None:
    """``advance(k, u, m)`` against m single steps from u_k, by checksums agreed over the ranks;
    AdvanceMismatch on every rank when they differ. Holds at most the input and two states (the
    intermediate steps' states are destroyed as they go); collective."""
    advanced = stepper.advance(k, u, m)
    want = checksum(stepper, advanced)
    advanced.destroy()
    stepped = u
    for i in range(k, k + m):
        following = stepper.step(i, stepped)
        if stepped is not u:
            stepped.destroy()
        stepped = following
    differs = checksum(stepper, stepped) != want
    stepped.destroy()
    if any_rank(comm, differs):
        raise AdvanceMismatch(f"the model's advance of steps {k}..{k + m - 1} differs from its single steps "
                              f"(advance() must give u_{{i+k}} bitwise equal to k calls of step()); see "
                              f"'hpcadj check'")


class AdvanceRuns:
    """The :class:`~hpcadj.adjoint.driver.Driver`'s hand-over of runs of forward steps to the model's
    own ``advance`` (a mixin: it reads and updates the driver's J, guards and frontier bookkeeping)."""

    #: steps of the check of a model's advance against its single steps, once per run
    ADVANCE_CHECK = 8

    def _start_advances(self) -> None:
        """This run's advance bookkeeping, from zero: whether the model has its own advance, the check
        still to do, and this rank's runs handed to it, their steps and seconds (``run --json``);
        ``advance_counts``: (m, first sweep) -> runs of m steps, as a plan summary counts them."""
        self._advances = type(self.stepper).advance is not Stepper.advance
        self._advance_checked = False
        self.advance_runs, self.advance_steps, self.advance_s = 0, 0, 0.0
        self.advance_counts: dict[tuple[int, bool], int] = {}

    def _advance_run(self, k: int, stop: int, u, first: bool):
        """Steps k..stop-1 through the model's own ``advance`` (the first sweep's only where it sets
        ``advance_objective``, after its input checks), guarded as single steps are; returns (u, the
        step single steps go on from). A kill injected at a frontier in the run lands there."""
        from .driver import _where

        stepper = self.stepper
        if not self._advances or (first and not stepper.advance_objective):
            return u, k
        while first and self._input_checks_left > 0 and k < stop:
            with _where(f"forward step {k}"):
                self._J_before = self.result.J
                u, J_i = self._first_sweep_step(k, u)
            self.result.J += J_i
            self._collect_garbage()
            k += 1
        split = self._split_at if first and self.lam_step is None else None
        while stop - k >= MIN_ADVANCE:
            end = split if split is not None and k < split < stop else stop
            what = f"{'forward' if first else 'recomputed'} steps {k}..{end - 1} (an advance)"
            with _where(what):
                if not self._advance_checked:  # once per run, before the first advance counts
                    self._advance_checked = True
                    verify_advance(stepper, self.comm, k, u, min(end - k, self.ADVANCE_CHECK))
                    self._collect_garbage()
                t0 = time.perf_counter()
                if first:
                    u, terms = stepper.advance(k, u, end - k, objective=True)
                    for J_i in terms:
                        self._J_before = self.result.J
                        self.result.J += J_i
                else:
                    u = stepper.advance(k, u, end - k)
                self.advance_s += time.perf_counter() - t0
                self.advance_runs += 1
                self.advance_steps += end - k
                self.advance_counts[end - k, first] = self.advance_counts.get((end - k, first), 0) + 1
            self._collect_garbage()
            if first and self._agree_flags(0 if math.isfinite(self.result.J) and finite([u]) else 2):
                raise NonFinite(f"forward sweep: a non-finite value (inf or NaN) in u_{end} or the objective"
                                f"{self._since(end, self._finite_state)}; stopped, no gradient")
            self._finite_state = end if first else self._finite_state
            k = end
            if end == split and end == self._kill_at_frontier:
                os.kill(os.getpid(), signal.SIGKILL)
        return u, k
