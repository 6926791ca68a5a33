"""Progress of the forward and reverse sweeps on rank 0: tqdm bars on a terminal, lines otherwise.

:class:`SweepProgress` is fed by the driver (:meth:`SweepProgress.forward`,
:meth:`SweepProgress.adjoint`) or, as a telemetry sink, by ``forward``/``recompute``/``adjoint``
events; use one way or the other. What it shows:

- a serial run whose stderr is a terminal: two tqdm bars (forward, reverse with the recomputed
  steps in its postfix);
- otherwise (stderr a pipe or a file: a batch job's output, ``mpirun``; or more than one rank,
  where mpirun forwards output line by line even with a pty): one short line on stderr every
  ``$HPCADJ_PROGRESS_INTERVAL`` seconds (default 10), see :func:`format_line`: steps done in each
  sweep, elapsed time, the time remaining predicted from the plan's cost model (scaled by the time
  the work done so far took), and the bytes written and read on each level so far;
- nothing on ranks other than 0, or with ``quiet`` (``hpcadj run --quiet`` or ``--json``).

Rank 0 reports its own counts and its own levels' bytes (every rank runs the same plan; the bytes
are rank 0's share), and the line says so: progress makes no MPI call, so it can never hold up
or deadlock the other ranks. Lines are printed from the solver thread when the driver reports a
step, not from a timer thread (a background Python thread could run the cyclic garbage collector
and destroy PETSc objects off the solver thread); a single step longer than the interval delays
the next line until it ends.
"""

from __future__ import annotations

import math
import os
import sys
import time

INTERVAL_ENV = "HPCADJ_PROGRESS_INTERVAL"
DEFAULT_INTERVAL_S = 10.0


def progress_enabled(rank: int = 0, quiet: bool = False, stream=None) -> bool:
    """Whether to draw bars: rank 0, not quiet, and ``stream`` (default stderr) a terminal."""
    stream = sys.stderr if stream is None else stream
    if quiet or rank != 0:
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def progress_mode(rank: int = 0, quiet: bool = False, stream=None, ranks: int = 1) -> str | None:
    """``"bars"`` (one rank, a terminal), ``"lines"`` (rank 0 otherwise) or None (quiet, other ranks)."""
    if quiet or rank != 0:
        return None
    return "bars" if ranks == 1 and progress_enabled(rank, quiet, stream) else "lines"


def progress_interval(environ=None) -> tuple[float, str | None]:
    """Seconds between progress lines from ``$HPCADJ_PROGRESS_INTERVAL`` and a warning if it is bad."""
    text = (os.environ if environ is None else environ).get(INTERVAL_ENV)
    if text is None or not text.strip():
        return DEFAULT_INTERVAL_S, None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        return DEFAULT_INTERVAL_S, (f"{INTERVAL_ENV}={text!r} is not a positive number of seconds; "
                                    f"progress every {DEFAULT_INTERVAL_S:g} s")
    return value, None


def plan_work(actions) -> dict:
    """What a plan's action stream does: forward and adjoint step evaluations, writes and reads per
    level index (a ``Move`` is a read on its source and a write on its destination).

    Reads the schedule action types by name and fields (telemetry imports no schedule code)."""
    work = {"forward": 0, "adjoint": 0, "writes": {}, "reads": {}}
    for action in actions:
        kind = type(action).__name__
        if kind == "Advance":
            work["forward"] += action.n1 - action.n0
        elif kind == "Adjoint":
            work["adjoint"] += action.n1 - action.n0
        elif kind == "Store":
            work["writes"][action.level] = work["writes"].get(action.level, 0) + 1
        elif kind == "Restore":
            work["reads"][action.level] = work["reads"].get(action.level, 0) + 1
        elif kind == "Move":
            work["reads"][action.src] = work["reads"].get(action.src, 0) + 1
            work["writes"][action.dst] = work["writes"].get(action.dst, 0) + 1
    return work


def work_cost(forward: int, adjoint: int, writes: dict, reads: dict, costs) -> float:
    """Cost of some work under an ``OpCosts``-like vector (``forward``, ``adjoint``, ``write``, ``read``)."""
    def level_cost(counts, per):
        return sum(n * (per[k] if 0 <= k < len(per) else 0.0) for k, n in counts.items())

    return (forward * costs.forward + adjoint * costs.adjoint
            + level_cost(writes, costs.write) + level_cost(reads, costs.read))


def format_duration(seconds: float | None) -> str:
    """``12.3 s``, ``4 min 05 s``, ``2 h 03 min``; ``n/a`` for None."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    seconds = max(float(seconds), 0.0)
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        m, s = divmod(int(round(seconds)), 60)
        return f"{m} min {s:02d} s"
    h, m = divmod(int(round(seconds / 60)), 60)
    return f"{h} h {m:02d} min"


def format_bytes(n: int) -> str:
    """Bytes as ``512 B``, ``12.0 KiB``, ``3.4 MiB``, ``1.2 GiB``, ``5.0 TiB``."""
    value = float(n)
    if abs(value) < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def format_line(*, nsteps: int | None, forward: int, recomputed: int, adjoint: int, elapsed: float,
                remaining: float | None, levels: list[tuple[str, int, int]] | None = None,
                rank: int = 0, no_remaining: str = "no plan cost model", sim_time: float | None = None) -> str:
    """One progress line (no newline): steps done in each sweep, elapsed, predicted remaining, bytes
    written/read per level, all as counted on ``rank``. ``remaining`` None: no prediction, for the
    reason ``no_remaining``. ``nsteps`` None (adaptive steps, n not known yet): the steps so far and
    the simulated time ``sim_time`` reached."""
    if nsteps is None:
        clock = "" if sim_time is None else f" (t = {sim_time:.6g})"
        head = f"forward {forward}{clock}, recomputed {recomputed}, adjoint {adjoint}"
    else:
        head = f"forward {forward}/{nsteps}, recomputed {recomputed}, adjoint {adjoint}/{nsteps}"
    parts = [f"hpcadj: progress (rank {rank}): {head}",
             f"elapsed {format_duration(elapsed)}",
             (f"remaining n/a ({no_remaining})" if remaining is None
              else f"remaining ~{format_duration(remaining)} (plan cost model)")]
    if levels:
        parts.append(f"written/read on rank {rank}'s levels: "
                     + ", ".join(f"{name} {format_bytes(w)}/{format_bytes(r)}" for name, w, r in levels))
    return "; ".join(parts)


class SweepProgress:
    """Progress over ``nsteps`` time steps, shown on rank 0 (a sink for :class:`Telemetry` too).

    Parameters
    ----------
    nsteps : int
        n, the steps of each sweep.
    rank, ranks : int
        This process's rank and the communicator size; only rank 0 shows anything, and more than
        one rank always means lines (mpirun forwards output line by line).
    quiet : bool
        Show nothing.
    stream : file, optional
        Where to write (default stderr).
    levels : sequence, optional
        The storage levels (objects with ``name`` and ``stats.bytes_written``/``bytes_read``/
        ``writes``/``reads``); read, never called, for the bytes per level.
    plan : schedule, optional
        The plan being executed (an object with ``actions()``); with ``costs`` it gives the
        predicted remaining time.
    costs : OpCosts, optional
        Per-operation costs the plan's work is weighed with (their unit does not matter: the
        remaining time is the elapsed time scaled by the share of the predicted work still to do).
    interval : float, optional
        Seconds between lines (default ``$HPCADJ_PROGRESS_INTERVAL``, else 10).
    clock : callable, optional
        Monotonic seconds (tests).
    """

    def __init__(self, nsteps: int | None, *, rank: int = 0, quiet: bool = False, stream=None, ranks: int = 1,
                 levels=None, plan=None, costs=None, interval: float | None = None, clock=None, sim_time=None):
        self.nsteps = None if nsteps is None else int(nsteps)
        self.sim_time = sim_time  # adaptive steps: sim_time() is the simulated time reached, shown while n is unknown
        self.rank = int(rank)
        self.stream = sys.stderr if stream is None else stream
        self.mode = progress_mode(rank, quiet, self.stream, ranks)
        self.enabled = self.mode is not None
        self.levels = list(levels) if levels is not None else []
        self._clock = clock or time.monotonic
        self._t0 = self._clock()
        self._forward = None
        self._reverse = None
        self.forwarded = 0
        self.recomputed = 0
        self.adjoints = 0
        self.lines = 0
        self._closed = False
        self.interval = DEFAULT_INTERVAL_S
        self._total = None
        self._costs = costs
        if self.mode == "lines":
            warning = None
            if interval is None:
                self.interval, warning = progress_interval()
            else:
                self.interval = float(interval)
            if warning:
                self._print(f"hpcadj: warning: {warning}")
            if plan is not None and costs is not None:
                try:
                    work = plan_work(plan.actions())
                    self._total = work_cost(work["forward"], work["adjoint"], work["writes"], work["reads"],
                                            costs)
                except Exception:  # noqa: BLE001 - no prediction rather than a failed run
                    self._total = None
        self._last = self._t0

    # -- what the driver calls ------------------------------------------------------------------
    def __call__(self, event: dict) -> None:
        """Sink: count a telemetry event."""
        phase = event.get("phase")
        if phase in ("forward", "recompute"):
            self.forward(event.get("steps") or 0, recompute=phase == "recompute")
        elif phase == "adjoint":
            self.adjoint(event.get("steps") or 1)

    def forward(self, steps: int, recompute: bool = False) -> None:
        """``steps`` forward steps done: first-sweep steps, or recomputed ones with ``recompute``."""
        if not self.enabled:
            return
        if recompute:
            self.recomputed += steps
        else:
            self.forwarded += steps
        if self.mode == "lines":
            self._tick()
            return
        if recompute:
            if self._reverse is not None:
                self._reverse.set_postfix(recomputed=self.recomputed, refresh=False)
            return
        if self._forward is None:
            self._forward = self._bar("forward")
        self._forward.update(steps)
        if self.nsteps is None and self.sim_time is not None:
            self._forward.set_postfix(t=f"{self.sim_time():.6g}", refresh=False)

    def adjoint(self, steps: int = 1) -> None:
        """``steps`` adjoint steps done."""
        if not self.enabled:
            return
        self.adjoints += steps
        if self.mode == "lines":
            self._tick()
            return
        if self._reverse is None:
            if self._forward is not None:
                self._forward.close()
            self._reverse = self._bar("reverse")
            self._reverse.set_postfix(recomputed=self.recomputed, refresh=False)
        self._reverse.update(steps)

    def close(self) -> None:
        """Close the bars; in line mode print a last line if any was printed (safe to call twice)."""
        if self.mode == "lines" and self.enabled and self.lines and not self._closed:
            self._emit()
        self._closed = True
        for bar in (self._forward, self._reverse):
            if bar is not None:
                bar.close()
        self._forward = self._reverse = None

    # -- lines ------------------------------------------------------------------------------------
    def _bar(self, desc: str):
        from tqdm import tqdm

        total = self.nsteps if self.nsteps is not None else (self.forwarded if desc == "reverse" else None)
        return tqdm(total=total, desc=desc, unit="step", file=self.stream, leave=True,
                    dynamic_ncols=True)

    def _tick(self) -> None:
        now = self._clock()
        if now - self._last >= self.interval:
            self._emit(now)

    def level_bytes(self) -> list[tuple[str, int, int]]:
        """(name, bytes written, bytes read) of each level so far, on this rank."""
        out = []
        for level in self.levels:
            stats = getattr(level, "stats", None)
            out.append((str(getattr(level, "name", "?")), int(getattr(stats, "bytes_written", 0) or 0),
                        int(getattr(stats, "bytes_read", 0) or 0)))
        return out

    def remaining(self, elapsed: float) -> float | None:
        """Seconds left: ``elapsed`` x (predicted work left / work done), weighed with the plan's costs
        (None without a plan and costs, or before any work is done)."""
        if self._total is None or self._costs is None:
            return None
        writes = {k: int(getattr(lv.stats, "writes", 0) or 0) for k, lv in enumerate(self.levels)}
        reads = {k: int(getattr(lv.stats, "reads", 0) or 0) for k, lv in enumerate(self.levels)}
        done = work_cost(self.forwarded + self.recomputed, self.adjoints, writes, reads, self._costs)
        if done <= 0:
            return None
        return elapsed * max(self._total - done, 0.0) / done

    def line(self, now: float | None = None) -> str:
        """The progress line for the counts so far."""
        elapsed = (self._clock() if now is None else now) - self._t0
        t = self.sim_time() if self.nsteps is None and self.sim_time is not None else None
        return format_line(nsteps=self.nsteps, forward=self.forwarded, recomputed=self.recomputed,
                           adjoint=self.adjoints, elapsed=elapsed, remaining=self.remaining(elapsed),
                           levels=self.level_bytes(), rank=self.rank, sim_time=t,
                           no_remaining=("no plan cost model" if self._total is None else "no step done yet")
                           if self.nsteps is not None else "number of steps unknown (adaptive)")

    def _emit(self, now: float | None = None) -> None:
        now = self._clock() if now is None else now
        self._print(self.line(now))
        self.lines += 1
        self._last = now

    def _print(self, text: str) -> None:
        try:
            print(text, file=self.stream, flush=True)
        except (OSError, ValueError):  # stderr closed or a broken pipe: progress is not worth a failure
            self.enabled = False
