"""Progress bars for the forward and reverse sweeps: tqdm on rank 0, fed by telemetry events.

:class:`SweepProgress` is a telemetry sink: ``forward`` events advance the forward bar by their
``steps``, ``adjoint`` events advance the reverse bar, ``recompute`` steps are counted in the reverse
bar's postfix. Bars show only on rank 0, only when the stream is a terminal, and not with ``quiet``;
otherwise the sink does nothing (and tqdm is never imported). The same object also serves as the
driver's ``progress`` argument (:meth:`forward`, :meth:`adjoint`); use one way or the other.
"""

from __future__ import annotations

import sys


def progress_enabled(rank: int = 0, quiet: bool = False, stream=None) -> bool:
    """Whether to draw bars: rank 0, not quiet, and ``stream`` (default stderr) a terminal."""
    stream = sys.stderr if stream is None else stream
    if quiet or rank != 0:
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class SweepProgress:
    """Forward and reverse bars over ``nsteps`` time steps (a sink for :class:`Telemetry`)."""

    def __init__(self, nsteps: int, *, rank: int = 0, quiet: bool = False, stream=None):
        self.nsteps = int(nsteps)
        self.stream = sys.stderr if stream is None else stream
        self.enabled = progress_enabled(rank, quiet, self.stream)
        self._forward = None
        self._reverse = None
        self.recomputed = 0

    def _bar(self, desc: str):
        from tqdm import tqdm

        return tqdm(total=self.nsteps, desc=desc, unit="step", file=self.stream, leave=True,
                    dynamic_ncols=True)

    def __call__(self, event: dict) -> None:
        """Sink: advance the bars from a telemetry event."""
        phase = event.get("phase")
        if phase in ("forward", "recompute"):
            self.forward(event.get("steps") or 0, recompute=phase == "recompute")
        elif phase == "adjoint":
            self.adjoint(event.get("steps") or 1)

    def forward(self, steps: int, recompute: bool = False) -> None:
        """``steps`` forward steps done: first-sweep steps advance the forward bar, others are counted."""
        if not self.enabled:
            return
        if recompute:
            self.recomputed += steps
            if self._reverse is not None:
                self._reverse.set_postfix(recomputed=self.recomputed, refresh=False)
            return
        if self._forward is None:
            self._forward = self._bar("forward")
        self._forward.update(steps)

    def adjoint(self, steps: int = 1) -> None:
        """``steps`` adjoint steps done: advance the reverse bar (opened on the first one)."""
        if not self.enabled:
            return
        if self._reverse is None:
            if self._forward is not None:
                self._forward.close()
            self._reverse = self._bar("reverse")
            self._reverse.set_postfix(recomputed=self.recomputed, refresh=False)
        self._reverse.update(steps)

    def close(self) -> None:
        """Close the bars (safe to call when disabled or twice)."""
        for bar in (self._forward, self._reverse):
            if bar is not None:
                bar.close()
        self._forward = self._reverse = None
