"""Phase timing: a context manager per phase that feeds PETSc.Log events, totals and sinks."""

from __future__ import annotations

import time
from dataclasses import dataclass
from ..imports import petsc


@dataclass
class PhaseTotal:
    """Accumulated cost of one phase (per level for store/restore phases)."""

    seconds: float = 0.0
    count: int = 0
    nbytes: int = 0
    steps: int = 0


class Telemetry:
    """Times phases; each finished phase goes to the totals and to every sink.

    A sink is any callable taking one event dict (``phase``, ``t0``, ``seconds``, ``step``,
    ``steps``, ``bytes``, ``level``). With ``petsc_events`` each phase is also a PETSc.Log event
    named ``hpcadj:<phase>``, so ``-log_view`` shows hpcadj's phases.
    """

    def __init__(self, sinks=(), petsc_events: bool = True):
        self.sinks = list(sinks)
        self.totals: dict[tuple[str, str | None], PhaseTotal] = {}
        self._petsc_events = petsc_events
        self._events: dict[str, object] = {}

    def _petsc_event(self, phase: str):
        event = self._events.get(phase)
        if event is None:
            event = petsc().Log.Event(f"hpcadj:{phase}")
            self._events[phase] = event
        return event

    def phase(self, phase: str, *, step: int | None = None, steps: int = 0, nbytes: int = 0,
              level: str | None = None) -> "_Phase":
        """Time the enclosed block as ``phase`` (``steps`` time steps, ``nbytes`` moved on ``level``)."""
        return _Phase(self, phase, step, steps, nbytes, level)

    def record(self, phase: str, *, t0: float, seconds: float, step=None, steps: int = 0,
               nbytes: int = 0, level: str | None = None, detail: str | None = None) -> None:
        """Account a finished phase (also for phases timed elsewhere, e.g. on an I/O thread);
        ``detail`` says what happened (a fault's reason) in the logged event."""
        total = self.totals.setdefault((phase, level), PhaseTotal())
        total.seconds += seconds
        total.count += 1
        total.nbytes += nbytes
        total.steps += steps
        if self.sinks:
            event = {"phase": phase, "t0": t0, "seconds": seconds, "step": step, "steps": steps,
                     "bytes": nbytes, "level": level}
            if detail is not None:
                event["detail"] = detail
            for sink in self.sinks:
                sink(event)

    def phase_seconds(self) -> dict[str, float]:
        """Seconds per phase, summed over levels."""
        out: dict[str, float] = {}
        for (phase, _level), total in self.totals.items():
            out[phase] = out.get(phase, 0.0) + total.seconds
        return out


class _Phase:
    """The context manager of :meth:`Telemetry.phase` (a plain class: it runs around every step)."""

    __slots__ = ("telemetry", "phase", "step", "steps", "nbytes", "level", "event", "t0", "start")

    def __init__(self, telemetry: Telemetry, phase, step, steps, nbytes, level):
        self.telemetry, self.phase, self.step = telemetry, phase, step
        self.steps, self.nbytes, self.level = steps, nbytes, level

    def __enter__(self):
        telemetry = self.telemetry
        self.event = telemetry._petsc_event(self.phase) if telemetry._petsc_events else None
        if self.event is not None:
            self.event.begin()
        self.t0 = time.time()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> bool:
        seconds = time.perf_counter() - self.start
        if self.event is not None:
            self.event.end()
        self.telemetry.record(self.phase, t0=self.t0, seconds=seconds, step=self.step, steps=self.steps,
                              nbytes=self.nbytes, level=self.level)
        return False
