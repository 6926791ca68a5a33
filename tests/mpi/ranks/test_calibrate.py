"""Calibration on every rank count: what it measures, and that a run's prediction uses all of it."""

import math

import pytest

from hpcadj.checkpoint.calibrate import calibrate
from hpcadj.checkpoint.manager import CheckpointConfig, LevelPlan
from hpcadj.adjoint.session import Checkpointing, GradientSession
from hpcadj.checkpoint.schedules import CostProfile, LevelCost
from hpcadj.cli import Parser
from hpcadj.cli.common import add_model_arguments, build_model


def wave(comm, steps=12):
    parser = Parser()
    add_model_arguments(parser)
    return build_model(parser.parse_args(["--model", "wave", "--grid", "24x24x16", "--steps", str(steps)]), comm)


def test_profile_times_steps_and_the_first_touch_of_ram_slots_only(comm, shared_tmp):
    model = wave(comm)
    plans = [LevelPlan("ram", "ram", 2), LevelPlan("disk", "local", 2)]
    config = CheckpointConfig(local_dir=shared_tmp)
    profile = calibrate(model, model.default_controls(), comm, plans, config, repeats=2)
    ram, disk = profile.levels
    assert profile.forward_s > 0 and profile.adjoint_s > 0
    assert ram.fill_s > 0 and disk.fill_s == 0
    assert profile.data_s > 0  # wave declares u^i: a step from its data copies it out and in
    assert ram.write_s >= 0 and disk.write_s > 0 and disk.read_s > 0
    # every rank holds the same profile: the slowest rank's timings, agreed
    gathered = comm.allgather((profile.forward_s, profile.adjoint_s, ram.fill_s, disk.write_s))
    assert all(g == gathered[0] for g in gathered)


def test_predicted_makespan_adds_each_filled_ram_slot(comm, shared_tmp):
    model = wave(comm)
    profile = CostProfile(forward_s=1.0, adjoint_s=2.0, levels=[LevelCost("ram", 0.01, 0.01, fill_s=0.5)])
    session = GradientSession(model, Checkpointing(ram="4", schedule="revolve", costs=profile))
    planned = session.plan()
    summary = planned.summary
    priced = summary.forward_steps * 1.0 + summary.adjoint_steps * 2.0 + 0.01 * (summary.writes[0] + summary.reads[0])
    assert summary.peak[0] == 4
    assert math.isclose(planned.predicted_s, priced + 0.5 * 4, rel_tol=1e-12)


def test_fill_probe_holds_its_slots_and_prices_the_rest_at_its_tail(comm, monkeypatch):
    """A RAM slot's first touch is measured over blocks held at once, as a run holds its slots (a
    block freed and allocated again reuses warm pages), at most FILL_PROBE_BYTES a rank; slots past
    the probe cost the mean of its last quarter (a VM's cold pages come last)."""
    import types

    from hpcadj.checkpoint import calibrate as cal

    live, peak, clock = [0], [0], [0.0]
    costs = [1.0] * 6 + [5.0] * 2  # the probe's 8 blocks: the last quarter comes cold

    class Block:
        def __init__(self):
            live[0] += 1
            peak[0] = max(peak[0], live[0])

        def fill(self, value):
            clock[0] += costs.pop(0)

        def __del__(self):
            live[0] -= 1

    monkeypatch.setattr(cal, "mapped_empty", lambda shape, dtype: Block())
    monkeypatch.setattr(cal, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(cal, "FILL_PROBE_BYTES", 8 * 1024)
    fill = cal._fill_seconds(comm, 1024, slots=20, repeats=2)
    assert peak[0] == 8 and live[0] == 0
    assert fill == pytest.approx((6 * 1.0 + 2 * 5.0 + 12 * 5.0) / 20)
    costs[:] = [2.0, 4.0, 6.0]  # fewer slots than the floor of 3 blocks: their plain mean
    assert cal._fill_seconds(comm, 1024, slots=2, repeats=2) == pytest.approx(4.0)
    monkeypatch.setattr(cal, "FILL_PROBE_BYTES", 2 ** 40)  # tiny states, many slots: the block cap
    costs[:] = [1.0] * cal.FILL_PROBE_SLOTS
    peak[0] = 0
    assert cal._fill_seconds(comm, 8, slots=10 ** 6, repeats=2) == pytest.approx(1.0)
    assert peak[0] == cal.FILL_PROBE_SLOTS


def test_profile_prices_the_models_own_advance_only(comm, shared_tmp):
    """Wave's tiled advance is timed over run lengths around its tile depth and a line fitted; heat,
    whose advance is the default loop over steps, gets none (its plans price m single steps)."""
    from hpcadj.checkpoint.calibrate import advance_cost

    model = wave(comm, steps=40)
    model.set_time_tile(4)
    model.set_controls(model.default_controls())
    found = advance_cost(model, comm, repeats=1)
    assert [m for m, _ in found.runs] == [2, 4, 8, 16]
    assert all(t > 0 for _, t in found.runs)
    assert found.depth == 4 and found.first
    assert found.fixed_s >= 0 and found.step_s > 0
    gathered = comm.allgather((found.fixed_s, found.step_s))
    assert all(g == gathered[0] for g in gathered)
    parser = Parser()
    add_model_arguments(parser)
    heat = build_model(parser.parse_args(["--model", "heat", "--grid", "16x16", "--steps", "10"]), comm)
    assert advance_cost(heat, comm, repeats=1) is None


def test_a_model_without_adjoint_data_has_no_data_cost(comm):
    from hpcadj.checkpoint.calibrate import data_cost

    parser = Parser()
    add_model_arguments(parser)
    heat = build_model(parser.parse_args(["--model", "heat", "--grid", "16x16", "--steps", "10"]), comm)
    assert data_cost(heat, comm, 0, None, None) is None
    model = wave(comm)
    model.set_controls(model.default_controls())
    u0 = model.initial_state()
    u1 = model.step(0, u0)
    found = data_cost(model, comm, 0, u0, u1, repeats=1)
    assert found > 0 and comm.allgather(found) == [found] * comm.size


def test_run_reports_predicted_and_measured_advances(comm):
    """A plan priced with an advance model: the session reports the runs it predicted and those the
    driver measured (the same runs; the first sweep's input checks take a step or two singly)."""
    from hpcadj.checkpoint.schedules.costs import AdvanceCost

    model = wave(comm, steps=30)
    advance = AdvanceCost(fixed_s=0.2, step_s=0.3, first=True, depth=4)
    profile = CostProfile(forward_s=1.0, adjoint_s=2.0, levels=[LevelCost("ram", 0.01, 0.01)], advance=advance)
    with GradientSession(model, Checkpointing(ram="5", costs=profile)) as session:
        outcome = session.solve()
    got = outcome.info["advance_s"]
    assert got["runs"] == got["measured_runs"] > 0
    assert got["steps"] - 3 <= got["measured_steps"] <= got["steps"]
    assert got["predicted"] == pytest.approx(got["runs"] * 0.2 + got["steps"] * 0.3)
    assert got["measured"] > 0


def test_first_touch_priced_leaves_ram_slots_unfilled(comm):
    """RAM slots whose first touch costs more than the recomputation they save are not planned; a
    profile without a first-touch cost keeps every slot given."""
    model = wave(comm, steps=60)
    levels = [LevelCost("ram", 0.0, 0.0, fill_s=0.0)]
    free = GradientSession(model, Checkpointing(ram="20", schedule="revolve", costs=CostProfile(
        forward_s=1.0, adjoint_s=2.0, levels=levels))).plan()
    assert free.plans[0].slots == 20
    dear = GradientSession(model, Checkpointing(ram="20", schedule="revolve", costs=CostProfile(
        forward_s=1.0, adjoint_s=2.0, levels=[LevelCost("ram", 0.0, 0.0, fill_s=3.0)]))).plan()
    slots = dear.plans[0].slots
    assert 2 <= slots < 20
    assert any("first touch" in note for note in dear.notes)
    # the slots chosen cost least, first touch included, of every count from 2 to 20
    from hpcadj.checkpoint.schedules import Revolve, simulate

    def cost(s):
        summary = simulate(Revolve(60, [s]).actions(), 60, [s])
        return summary.forward_steps * 1.0 + 3.0 * summary.peak[0]

    assert cost(slots) == min(cost(s) for s in range(2, 21))


def test_online_run_prices_the_advances_it_made(comm):
    """An online plan's n is unknown when planned: its report prices the runs the driver advanced."""
    from hpcadj.checkpoint.schedules.costs import AdvanceCost

    parser = Parser()
    add_model_arguments(parser)
    model = build_model(parser.parse_args(["--model", "wave", "--grid", "24x24x16", "--adaptive",
                                           "--t-final", "0.25"]), comm)
    advance = AdvanceCost(fixed_s=0.2, step_s=0.3, first=True, depth=4)
    profile = CostProfile(forward_s=1.0, adjoint_s=2.0, levels=[LevelCost("ram", 0.0, 0.0)], advance=advance)
    with GradientSession(model, Checkpointing(ram="3", schedule="online", costs=profile)) as session:
        outcome = session.solve()
    got = outcome.info["advance_s"]
    assert got["runs"] == got["measured_runs"] > 0 and got["steps"] == got["measured_steps"]
    single = outcome.info["forward_steps"] - got["steps"]
    expected = single * 1.0 + got["runs"] * 0.2 + got["steps"] * 0.3 + outcome.info["adjoint_steps"] * 2.0
    assert outcome.info["predicted_s"] == pytest.approx(expected)
