"""Adaptive steps without MPI: the step sequence's bookkeeping, online residual plans checked by the
simulator, and progress lines while n is unknown."""

import io
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcadj.checkpoint.schedules import ScheduleError, Simulator, default_costs
from hpcadj.checkpoint.schedules.online_binomial import OnlineBinomial
from hpcadj.checkpoint.schedules.online_plans import OnlinePlan, OnlineResidual, make_online_plan
from hpcadj.models.adaptive import StepSequence
from hpcadj.telemetry.progress import SweepProgress, format_line


def test_sequence_lands_on_t_final_and_round_trips():
    seq = StepSequence(1.0)
    i = 0
    while not seq.done(i):
        dt, last = seq.clip(i, 0.3)
        seq.record(i, dt, last, proposal=0.3)
        i += 1
    assert seq.n == 4 and seq.times[-1] == 1.0 and seq.dts[-1] == pytest.approx(0.1)
    again = StepSequence(1.0)
    again.load(seq.as_dict())
    assert again.dts == seq.dts and again.times == seq.times and again.n == 4 and again.proposal == 0.3


def test_sequence_refuses_collapse_runaway_and_out_of_order_steps():
    seq = StepSequence(1.0, max_steps=3)
    with pytest.raises(ValueError, match="collapsed"):
        seq.clip(0, 0.0)
    for i in range(2):
        seq.record(i, *seq.clip(i, 0.1))
    with pytest.raises(ValueError, match="more than 3"):
        seq.clip(2, 0.1)
    with pytest.raises(RuntimeError, match="out of order"):
        seq.clip(5, 0.1)
    with pytest.raises(ValueError, match="t-final"):
        StepSequence(-1.0)
    other = StepSequence(2.0)
    with pytest.raises(ValueError, match="t-final"):
        other.load(seq.as_dict())


def test_a_step_within_the_tolerance_of_t_final_lands_on_it():
    seq = StepSequence(1.0)
    dt, last = seq.clip(0, 1.0 - 1e-12)
    assert last and dt == 1.0


def test_online_plan_needs_n_or_a_done_test():
    with pytest.raises(ScheduleError):
        make_online_plan([3])


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), caps=st.lists(st.integers(0, 4), min_size=1, max_size=3),
       seed=st.integers(0, 10**6))
def test_online_residuals_from_random_first_sweep_states_are_valid(n, caps, seed):
    """A resumed or re-planned first sweep of unknown length: retained snapshots up to the frontier."""
    if sum(caps) < 2:
        caps = [2] + caps[1:]
    rng = random.Random(seed)
    frontier = rng.randint(0, n - 1)
    retained, used = {}, [0] * len(caps)
    for step in sorted(rng.sample(range(frontier + 1), min(frontier + 1, rng.randint(0, 4)))):
        free = [lv for lv, c in enumerate(caps) if used[lv] < c]
        if free:
            level = rng.choice(free)
            retained[step] = level
            used[level] += 1
    if retained and 0 not in retained and sum(used) == sum(caps):
        retained.pop(min(retained))
    costs = default_costs(len(caps))
    one_level = OnlinePlan(OnlineBinomial(caps), done=lambda i: i >= n, factory=OnlineBinomial)
    for plan in (make_online_plan(caps, costs, done=lambda i: i >= n), one_level):
        residual = plan.resumed(caps, retained, costs=costs)
        assert isinstance(residual, OnlineResidual) and residual.n_steps is None
        sim = Simulator.resumed(n, caps, retained, None)
        for action in residual.actions():
            sim.execute(action)
        assert sim.result().adjoint_steps == n


def test_online_plan_streams_once():
    plan = OnlinePlan(make_online_plan([3], n_steps=4).planner, 4)
    list(plan.actions())
    with pytest.raises(ScheduleError):
        list(plan.actions())


def test_progress_line_with_unknown_n_shows_steps_and_simulated_time():
    line = format_line(nsteps=None, forward=7, recomputed=2, adjoint=0, elapsed=1.0, remaining=None,
                       sim_time=0.25, no_remaining="number of steps unknown (adaptive)")
    assert "forward 7 (t = 0.25), recomputed 2, adjoint 0" in line and "/" not in line.split(";")[0]
    stream = io.StringIO()
    progress = SweepProgress(None, stream=stream, interval=1e-9, sim_time=lambda: 0.5)
    progress.forward(3)
    progress.close()
    out = stream.getvalue()
    assert "forward 3 (t = 0.5)" in out and "number of steps unknown" in out and not math.isnan(progress.forwarded)


@pytest.mark.parametrize("n", [1, 2, 7])
def test_online_store_all_evaluates_n_steps_and_refuses_overflow(n):
    from hpcadj.checkpoint.schedules import simulate

    plan = make_online_plan([10], n_steps=n, store_all=True)
    summary = simulate(plan.actions(), n, [10])
    assert summary.forward_steps == n and summary.writes == [max(0, n - 1)]
    small = make_online_plan([2], done=lambda i: False, store_all=True)
    with pytest.raises(ScheduleError, match="does not fit"):
        for _ in zip(range(100), small.actions()):
            pass
