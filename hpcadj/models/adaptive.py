"""Adaptive time steps: the step sequence a model decides in an evaluation's first sweep, then replays.

A model with ``--adaptive`` decides dt_i the first time it takes step i, from u_i (a CFL bound, an
error estimate), with collective reductions so every rank decides the same; :class:`StepSequence`
records it. Every later ``step(i, u)`` of the same evaluation (recomputation, a resumed run, the
reverse sweep of a paused one) uses the recorded dt_i, so recomputed states are bitwise the first
ones and ``step`` stays pure in ``(i, u)``. The sequence belongs to the evaluation at one control,
not to the model: a gradient session starts a new one (:meth:`AdaptiveSteps.begin_evaluation`) and
puts its own back whenever it runs (:meth:`AdaptiveSteps.use_steps`), so an answer never depends on
which controls were evaluated before.
The run is over once t_n reaches ``t_final``: the step that would pass it is shortened to land on it,
and the model's ``n_steps`` (None until then) becomes n. The gradient is the discrete scheme's with the
accepted sequence held fixed: how the decisions depend on the controls is not differentiated (as in
PETSc's TSAdjoint). The sequence goes into the run manifest (:meth:`StepSequence.as_dict`) and each
snapshot carries its t_i, so a resumed run replays it exactly.
"""

from __future__ import annotations

import math

#: a step whose end lies within this fraction of t_final of it lands on t_final (no sliver step)
LAND_TOLERANCE = 1e-9


class StepSequence:
    """Accepted steps dt_0, dt_1, ... of one adaptive run, their times, and n once t_final is reached.

    ``proposal`` is the controller's state carried to the next decision (the next trial dt of an
    error-controlled model), recorded so a resumed run decides as the first one would have.
    """

    def __init__(self, t_final: float, max_steps: int = 1_000_000):
        if not (t_final > 0 and math.isfinite(t_final)):
            raise ValueError(f"--t-final must be a positive number, got {t_final}")
        if max_steps < 1:
            raise ValueError(f"max steps must be >= 1, got {max_steps}")
        self.t_final = float(t_final)
        self.max_steps = int(max_steps)
        self.dts: list[float] = []
        self.times: list[float] = [0.0]
        self.n: int | None = None
        self.proposal: float | None = None

    def fresh(self) -> "StepSequence":
        """An empty sequence to the same end time: what a new evaluation decides into."""
        return StepSequence(self.t_final, self.max_steps)

    def known(self, i: int) -> bool:
        """Whether dt_i was decided already (replay it) or is decided now (first sweep, step i)."""
        return i < len(self.dts)

    def dt(self, i: int) -> float:
        return self.dts[i]

    def time(self, i: int) -> float | None:
        """t_i, or None where step i-1 was not taken yet."""
        return self.times[i] if i < len(self.times) else None

    def done(self, i: int) -> bool:
        """True when u_i is the final state (t_i = t_final); the same on every rank."""
        return self.n is not None and i >= self.n

    def clip(self, i: int, dt: float) -> tuple[float, bool]:
        """The step to take from t_i given the controller's ``dt``, and whether it is the last one."""
        if i != len(self.dts) or self.n is not None:
            raise RuntimeError(f"step {i} decided out of order (have {len(self.dts)} steps, n = {self.n})")
        t = self.times[i]
        if not (dt > 0 and math.isfinite(dt)) or dt < 1e-14 * self.t_final:
            raise ValueError(f"adaptive step at t = {t:.6g} collapsed to dt = {dt:g}")
        remaining = self.t_final - t
        if t + dt >= self.t_final - LAND_TOLERANCE * self.t_final:
            return remaining, True
        if i + 1 >= self.max_steps:
            raise ValueError(f"adaptive run needs more than {self.max_steps} steps to reach t = {self.t_final:g} "
                             f"(at t = {t:.6g} with dt = {dt:.3g})")
        return dt, False

    def record(self, i: int, dt: float, last: bool, proposal: float | None = None) -> None:
        """Accept dt_i (``last``: it lands on t_final, so n = i + 1)."""
        self.dts.append(float(dt))
        self.times.append(self.t_final if last else self.times[i] + dt)
        self.proposal = proposal
        if last:
            self.n = i + 1

    def as_dict(self) -> dict:
        """JSON-ready record (floats round-trip exactly through json)."""
        return {"t_final": self.t_final, "dt": list(self.dts), "n": self.n, "proposal": self.proposal}

    def load(self, record: dict) -> None:
        """Replay a recorded sequence (from :meth:`as_dict`); the times follow as when it was taken."""
        if float(record["t_final"]) != self.t_final:
            raise ValueError(f"recorded steps reach t = {record['t_final']}, this run --t-final {self.t_final}")
        dts = [float(x) for x in record["dt"]]
        n = record.get("n")
        self.dts, self.times, self.n = [], [0.0], None
        for i, dt in enumerate(dts):
            self.record(i, dt, n is not None and i + 1 == n)
        self.proposal = record.get("proposal")


class AdaptiveSteps:
    """What a model with adaptive steps shares (mixin): its sequence, clock and completion test.

    The model sets ``self.steps`` to a :class:`StepSequence` (None: fixed steps) and calls
    :meth:`_accepted` after deciding a step; ``n_steps`` is None until the sequence lands on t_final.
    """

    steps: StepSequence | None = None

    @property
    def adaptive(self) -> bool:
        return self.steps is not None

    def done(self, i: int) -> bool:
        """Whether u_i is the final state: ``i >= n_steps`` (fixed), t_i = t_final (adaptive)."""
        if self.steps is None:
            return i >= self.n_steps
        return self.steps.done(i)

    def time(self, i: int) -> float | None:
        if self.steps is None:
            return i * self.dt
        return self.steps.time(i)

    def time_reached(self) -> float:
        """The latest simulated time the first sweep reached (for progress while n is unknown)."""
        return self.steps.times[-1] if self.steps is not None else 0.0

    def step_record(self) -> dict | None:
        """The recorded sequence for a manifest (None with fixed steps)."""
        return None if self.steps is None else self.steps.as_dict()

    def load_step_record(self, record: dict) -> None:
        """Replay a sequence from :meth:`step_record` (a resumed run)."""
        self.steps.load(record)
        self.n_steps = self.steps.n

    def begin_evaluation(self) -> StepSequence | None:
        """Start an evaluation at new controls: an empty sequence, decided afresh by its first sweep
        (n_steps None again); returns it for the evaluation to keep (None with fixed steps)."""
        if self.steps is None:
            return None
        self.use_steps(self.steps.fresh())
        return self.steps

    def use_steps(self, steps: StepSequence) -> None:
        """Make ``steps`` (an evaluation's own sequence) the one the model replays and extends."""
        self.steps = steps
        self.n_steps = steps.n

    def _accepted(self, i: int, dt: float, last: bool, proposal: float | None = None) -> None:
        self.steps.record(i, dt, last, proposal)
        if last:
            self.n_steps = self.steps.n

    def _describe_steps(self, info: dict) -> dict:
        if self.steps is not None:
            info.update(adaptive=True, t_final=self.steps.t_final, steps=self.n_steps)  # None until t_final
            info.pop("dt", None)
        return info

