"""Mixed plans over several levels: today's multi-level plan with a mixed plan inside each RAM chain
never takes more forward steps than today's plan, and every plan passes the simulator in bytes."""

import itertools

import pytest

from hpcadj.checkpoint.schedules import Multilevel, ScheduleError, simulate
from hpcadj.checkpoint.schedules.actions import AdjointData, StoreData
from hpcadj.checkpoint.schedules.costs import OpCosts
from hpcadj.checkpoint.schedules.mixed_levels import MixedLevels

#: RAM cheap, disk dearer, the HDF5 file dearest: the multi-level plan uses every level
COSTS = OpCosts(forward=1.0, adjoint=2.0, write=(0.01, 0.3, 0.6), read=(0.01, 0.3, 0.6))


def _run(plan):
    return simulate(plan.actions(), plan.n_steps, plan.units(), sizes=plan.sizes)


CASES = [(n, ram, disk, pfs, sizes) for n, ram, disk, pfs, sizes in itertools.product(
    (2, 5, 9, 16, 23), (2, 3, 5, 8), (1, 2), (0, 2), ((2, 1), (3, 2), (1, 1)))]


@pytest.mark.parametrize("n, ram, disk, pfs, sizes", CASES)
def test_never_more_forward_steps_than_today_s_multilevel_plan(n, ram, disk, pfs, sizes):
    r, d = sizes
    plan = MixedLevels(n, [ram * r + (r - 1 if n % 2 else 0), disk, pfs][:3 if pfs else 2], r, d, COSTS)
    got = _run(plan)
    today = simulate(Multilevel(n, plan.slots(), COSTS).actions(), n, plan.slots(), COSTS)
    assert got.adjoint_steps == n
    assert got.forward_steps <= today.forward_steps
    assert got.writes[1:] == today.writes[1:] and got.reads[1:] == today.reads[1:]  # the slow levels' I/O
    assert got.peak[0] <= plan.capacities[0]


def test_data_between_disk_states_save_forward_steps():
    """Wave-like sizes (a restart pair of 2 fields, data of 1): RAM for 4 restart states beside disk."""
    plan = MixedLevels(40, [8, 3], 2, 1, COSTS)
    got, today = _run(plan), simulate(plan.today.actions(), 40, plan.slots(), COSTS)
    assert got.forward_steps < today.forward_steps
    actions = list(plan.actions())
    assert any(isinstance(a, StoreData) for a in actions) and any(isinstance(a, AdjointData) for a in actions)


def test_steps_that_must_run_again_for_their_data_keep_today_s_plan():
    plan = MixedLevels(12, [6, 2], 1, 4, COSTS, states_suffice=False)
    assert list(plan.actions()) == list(Multilevel(12, plan.slots(), COSTS).actions())


def test_one_level_is_refused():
    with pytest.raises(ScheduleError, match="one level"):
        MixedLevels(5, [4], 2, 1)


def test_resumed_segments_pass_the_simulator():
    from hpcadj.checkpoint.schedules import Simulator

    plan = MixedLevels(20, [7, 2, 2], 2, 1, COSTS)
    for retained, lam_step in (({}, 13), ({0: 2, 9: 1}, 15), ({11: 2}, None)):
        resumed = plan.resumed([3, 2, 2], retained, lam_step=lam_step)
        units = [resumed.capacities[0], *(c * 2 for c in resumed.capacities[1:])]
        sim = Simulator.resumed(20, units, retained, lam_step, sizes=(2, 1))
        for action in resumed.actions():
            sim.execute(action)
        assert sim.result().adjoint_steps == (lam_step or 20)
