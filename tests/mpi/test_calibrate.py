"""Calibration on every rank count: what it measures, and that a run's prediction uses all of it."""

import math

from hpcadj.adjoint.calibrate import calibrate
from hpcadj.adjoint.manager import CheckpointConfig, LevelPlan
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
