"""Progress bars for the forward and reverse sweeps: tqdm on rank 0, fed by telemetry events.

:class:`SweepProgress` is a telemetry sink: ``forward`` events advance the forward bar by their
``steps``, ``adjoint`` events advance the reverse bar, ``recompute`` steps are counted in the reverse
bar's postfix. Bars show only on rank 0, only when the stream is a terminal, and not with ``quiet``;
otherwise the sink does nothing (and tqdm is never imported).
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
        if not self.enabled:
            return
        phase = event.get("phase")
        if phase == "forward":
            if self._forward is None:
                self._forward = self._bar("forward")
            self._forward.update(event.get("steps") or 0)
        elif phase == "recompute":
            self.recomputed += event.get("steps") or 0
            if self._reverse is not None:
                self._reverse.set_postfix(recomputed=self.recomputed, refresh=False)
        elif phase == "adjoint":
            if self._reverse is None:
                if self._forward is not None:
                    self._forward.close()
                self._reverse = self._bar("reverse")
                self._reverse.set_postfix(recomputed=self.recomputed, refresh=False)
            self._reverse.update(event.get("steps") or 1)

    def close(self) -> None:
        """Close the bars (safe to call when disabled or twice)."""
        for bar in (self._forward, self._reverse):
            if bar is not None:
                bar.close()
        self._forward = self._reverse = None
