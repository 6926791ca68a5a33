"""plan_memory: the per-rank breakdown {model, working states, staging, ram slots} and the slots a budget fits."""

import pytest

from hpcadj.checkpoint.memory import (DEFAULT_MODEL_STATES, DRIVER_STATES, LevelSpec, budget_from_environment,
                                   least_budget, model_states, plan_memory, process_rss_bytes,
                                   staging_snapshots)
from hpcadj.snapshot import FieldLayout

MiB = 2**20


class FakeStepper:
    """Only what plan_memory reads: layouts and (optionally) a declared working set."""

    def __init__(self, snapshot_mib=1, control_mib=2, states=None):
        self._snap = {"u": FieldLayout((snapshot_mib * MiB // 8,), (0,), (snapshot_mib * MiB // 8,))}
        self._ctrl = {"c": FieldLayout((control_mib * MiB // 8,), (0,), (control_mib * MiB // 8,))}
        if states is not None:
            self.working_set_states = lambda: states

    def snapshot_layout(self):
        return self._snap

    def control_layout(self):
        return self._ctrl


class LevelPlanLike:  # duck type of manager.LevelPlan: no queue depths
    def __init__(self, name, kind, slots):
        self.name, self.kind, self.slots = name, kind, slots


def test_breakdown_adds_up():
    plan = plan_memory(FakeStepper(states=10), [LevelSpec("ram", "ram", 4)])
    assert plan.breakdown() == {"model": 10 * MiB, "working states": DRIVER_STATES * MiB + 2 * 2 * MiB,
                                "staging": 0, "ram slots": 4 * MiB}
    assert plan.total_bytes == sum(plan.breakdown().values())
    assert plan.peak_bytes == plan.total_bytes and plan.budget_bytes is None and plan.ram_slots_fit is None


def test_default_working_set_for_a_model_that_declares_none():
    assert model_states(FakeStepper()) == DEFAULT_MODEL_STATES
    plan = plan_memory(FakeStepper(), [])
    assert plan.model_bytes == DEFAULT_MODEL_STATES * MiB


def test_stepper_base_class_default_is_the_documented_one():
    from hpcadj.models.base import Stepper

    assert Stepper.working_set_states(None) == DEFAULT_MODEL_STATES


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_declared_working_set_is_refused(bad):
    with pytest.raises(ValueError, match="working_set_states"):
        plan_memory(FakeStepper(states=bad))


def test_staging_of_file_levels():
    assert staging_snapshots(LevelSpec("ram", "ram", 9)) == 0
    assert staging_snapshots(LevelSpec("disk", "local", 9)) == 2 * 2 + 1
    assert staging_snapshots(LevelSpec("pfs", "pfs", 9, queue_depth=3, prefetch_depth=2)) == 8
    assert staging_snapshots(LevelSpec("pfs", "pfs", 9, queue_depth=1, prefetch_depth=0)) == 3
    assert staging_snapshots(LevelSpec("disk", "local", 9, async_io=False)) == 2
    assert staging_snapshots(LevelPlanLike("disk", "local", 9)) == 5  # make_level's defaults
    plan = plan_memory(FakeStepper(states=0), [LevelSpec("ram", "ram", 2), LevelPlanLike("disk", "local", 50),
                                               LevelSpec("pfs", "pfs", 100, queue_depth=1)])
    assert plan.staging_bytes == (5 + 3) * MiB and plan.ram_slot_bytes == 2 * MiB
    assert plan.detail["staging_snapshots"] == {"disk": 5, "pfs": 3}


def test_slots_that_fit_a_budget():
    stepper = FakeStepper(states=10)
    fixed = 10 * MiB + DRIVER_STATES * MiB + 4 * MiB
    baseline = 100 * MiB
    plan = plan_memory(stepper, [LevelSpec("disk", "local", 8)], budget_bytes=baseline + fixed + 5 * MiB + 5 * MiB + 123,
                       baseline_bytes=baseline)
    # 5 MiB of staging for the disk level, then 5 slots and 123 bytes spare
    assert plan.fixed_bytes == baseline + fixed + 5 * MiB
    assert plan.ram_slots_fit == 5
    assert least_budget(plan, plan.ram_slots_fit) <= plan.budget_bytes < least_budget(plan, plan.ram_slots_fit + 1)
    assert plan.fits  # no RAM slots planned: the rest fits
    too_small = plan_memory(stepper, [LevelSpec("ram", "ram", 3)], budget_bytes=baseline + fixed - 1,
                            baseline_bytes=baseline)
    assert too_small.ram_slots_fit == 0 and too_small.fits is False
    assert least_budget(too_small) == baseline + fixed


def test_overrides_and_bad_input():
    plan = plan_memory(FakeStepper(states=1), [LevelSpec("ram", "ram", 1)], snapshot_bytes=1000, control_bytes=10)
    assert plan.breakdown() == {"model": 1000, "working states": DRIVER_STATES * 1000 + 20, "staging": 0,
                                "ram slots": 1000}
    with pytest.raises(ValueError):
        plan_memory(FakeStepper(), budget_bytes=-1)
    with pytest.raises(ValueError):
        plan_memory(FakeStepper(), [LevelSpec("ram", "ram", -1)])
    assert set(plan.as_dict()) >= {"model", "working states", "staging", "ram slots", "total", "peak"}


def test_process_rss_is_measured_here():
    rss = process_rss_bytes()
    assert rss is None or rss > 1 * MiB


def test_real_models_declare_their_working_sets():
    """The built-in models declare counts below the default (no MPI run: class attributes only)."""
    from hpcadj.models.grayscott import GrayScottModel
    from hpcadj.models.heat import HeatModel

    from hpcadj.models.base import Stepper

    for cls in (HeatModel, GrayScottModel):
        assert cls.working_set_states is not Stepper.working_set_states


def test_budget_from_environment():
    assert budget_from_environment({}) is None
    assert budget_from_environment({"HPCADJ_MEMORY": "3GiB", "SLURM_MEM_PER_CPU": "10"}) == (
        "3GiB", "$HPCADJ_MEMORY", False)
    assert budget_from_environment({"SLURM_MEM_PER_CPU": "1000", "SLURM_CPUS_PER_TASK": "4"}) == (
        "4000MiB", "SLURM_MEM_PER_CPU", False)
    assert budget_from_environment({"SLURM_MEM_PER_NODE": "64000"}) == ("64000MiB", "SLURM_MEM_PER_NODE", True)
    assert budget_from_environment({"SLURM_MEM_PER_NODE": "0"}) is None
