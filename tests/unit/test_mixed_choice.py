"""Store-all and auto for a model that declares its adjoint data: the mixed plan where it is cheaper,
restart states alone where it is not or cannot serve (with a note); models without data unchanged.

Runs are declared by their sizes (no physics): a leapfrog-like run whose restart state is two fields
and whose data one (wave), an RK4-like one whose data are four states and whose adjoint step from a
state re-runs its step."""

import pytest

from hpcadj.checkpoint.options import Checkpointing
from hpcadj.checkpoint.provision import Declared, provision
from hpcadj.checkpoint.schedules import CostProfile, LevelCost
from hpcadj.checkpoint.schedules.costs import AdvanceCost
from hpcadj.imports import mpi
from hpcadj.snapshot import FieldLayout

FIELD = 4096  # bytes of one field on this rank


def _fields(count: int) -> dict:
    nbytes = count * FIELD
    return {"f": FieldLayout((nbytes,), (0,), (nbytes,), "uint8")}


def _run(n: int, state: int = 2, data: int | None = 1, recomputes: bool = False) -> Declared:
    """A run of n steps whose restart state is ``state`` fields and a step's data ``data`` fields."""
    return Declared(mpi().COMM_SELF, n, _fields(state), _fields(1), states=4.0,
                    data=None if data is None else _fields(data), recomputes_in_adjoint=recomputes, name="m")


def _plan(run, **options):
    return provision(run, None, Checkpointing(**options))


def test_wave_store_all_keeps_one_field_a_step_half_the_restart_plan_s_peak():
    n = 40
    planned = _plan(_run(n))
    states = _plan(_run(n, data=None))
    assert states.schedule.name == "store-all" and planned.schedule.name == "mixed"
    assert planned.summary.forward_steps == states.summary.forward_steps == n
    assert planned.summary.data_writes == [n - 1] and planned.summary.writes == [0]
    restart_peak = states.summary.peak[0] * 2 * FIELD
    data_peak = planned.summary.peak[0] * FIELD  # the mixed plan's units: gcd(r, d), one field
    assert data_peak == (n - 1) * FIELD and data_peak * 2 <= restart_peak + 2 * FIELD
    assert any(note.startswith("store-all keeps every step's adjoint data") for note in planned.notes)


def test_wave_ram_for_one_field_a_step_auto_takes_every_step_once_not_revolve_s_449():
    n = 300
    planned = _plan(_run(n), ram=str(n // 2))           # 150 restart states = 300 fields
    today = _plan(_run(n, data=None), ram=str(n // 2))
    assert today.schedule.name == "revolve" and today.summary.forward_steps == 449
    assert planned.schedule.name == "mixed" and planned.summary.forward_steps == n
    assert "auto chose a mixed plan: 300 forward steps" in planned.notes[-1]
    assert "against 449" in planned.notes[-1]


def test_auto_mixes_restart_states_and_data_where_neither_alone_fits():
    planned = _plan(_run(24), ram="8")
    assert planned.schedule.name == "mixed"
    assert planned.summary.forward_steps == 33 < _plan(_run(24, data=None), ram="8").summary.forward_steps == 39
    assert planned.summary.writes[0] > 0 and planned.summary.data_writes[0] > 0


def test_auto_keeps_restart_states_where_they_already_take_every_step_once():
    planned = _plan(_run(24), ram="30")
    assert planned.schedule.name == "revolve" and planned.summary.forward_steps == 24


def test_data_no_smaller_than_a_state_change_nothing():
    for options in ({}, {"ram": "6"}):
        planned, today = _plan(_run(24, data=2), **options), _plan(_run(24, data=None), **options)
        assert planned.schedule.name == today.schedule.name != "mixed"
        assert list(planned.schedule.actions()) == list(today.schedule.actions())
        assert planned.notes == today.notes


def test_rk_store_all_keeps_the_stages_when_they_fit_else_restart_states():
    n = 30
    stages = _plan(_run(n, state=1, data=4, recomputes=True))
    assert stages.schedule.name == "mixed" and stages.summary.forward_steps == n
    assert "stages" in stages.notes[-1] and f"against {2 * n}" in stages.notes[-1]
    tight = _plan(_run(n, state=1, data=4, recomputes=True), ram=f"{2 * (n - 1) * FIELD}B", schedule="store-all")
    assert tight.schedule.name == "store-all"
    assert tight.notes[-1].startswith("store-all keeps restart states: the adjoint data of every step")


@pytest.mark.parametrize("options, words", [
    ({"ram": "4", "disk": "8"}, "not with several levels"),
    ({"ram": "8", "compress": "lossless"}, "not with compression"),
])
def test_what_mixed_plans_cannot_serve_keeps_restart_states_with_one_note(options, words):
    run = Declared(mpi().COMM_SELF, 24, _fields(2), _fields(1), states=4.0, data=_fields(1), name="m",
                   compressed_bytes=FIELD)
    planned = _plan(run, **options)
    plain = _plan(Declared(mpi().COMM_SELF, 24, _fields(2), _fields(1), states=4.0, compressed_bytes=FIELD), **options)
    assert planned.schedule.name == plain.schedule.name != "mixed"
    assert list(planned.schedule.actions()) == list(plain.schedule.actions())
    extra = [note for note in planned.notes if note not in plain.notes]
    assert len(extra) == 1 and extra[0].startswith("auto keeps whole restart states") and words in extra[0]


def test_a_run_directory_keeps_restart_states_with_one_note():
    def durability(schedule, plans, profile, makespan_s):
        return 0.0

    planned = provision(_run(24), None, Checkpointing(), durability=durability)
    assert planned.schedule.name == "store-all"
    assert planned.notes[-1] == ("store-all keeps whole restart states: it weighs steps' adjoint data on one "
                                 "uncompressed RAM level without a run directory only, not with a run directory "
                                 "(--schedule mixed asks for them, but for compressed RAM)")


def test_auto_does_not_wait_for_a_huge_mixed_table():
    planned = _plan(_run(3000), ram="1000")
    assert planned.schedule.name == "revolve"
    assert planned.notes[-1].startswith("auto keeps restart states: a mixed plan of 3000 steps")


def _profile(advance_step: float | None, data_s: float | None) -> CostProfile:
    """Costs in forward steps: the model's own advance at ``advance_step`` a step (None: none), a step
    reversed from its data at ``data_s`` beyond its adjoint step (None: not measured)."""
    advance = None if advance_step is None else AdvanceCost(fixed_s=0.0, step_s=advance_step, first=True)
    return CostProfile(forward_s=1.0, adjoint_s=2.0, levels=[LevelCost("ram", 0.01, 0.01)], advance=advance,
                       data_s=data_s, source="calibrated")


def _wave_like(n: int, advance_step: float | None = None, data_step: float = 0.0) -> Declared:
    """A wave-like run (restart pair, u^i as data) whose advance and data the model itself prices."""
    return Declared(mpi().COMM_SELF, n, _fields(2), _fields(1), states=4.0, data=_fields(1), name="m",
                    relative_advance_step=advance_step, relative_data_step=data_step, advance_objective=True)


def test_cheap_advances_and_priced_copies_keep_revolve_although_mixed_takes_fewer_steps():
    # 32 restart states (the FWI case's --ram 512MiB): mixed 543 forward steps, revolve 567, but 267
    # of revolve's run in the first sweep's long advances and mixed copies the data of 235 steps (with
    # advances this cheap the multi-level DP's plan of restart states is cheaper still)
    planned = _plan(_run(300), ram="32", costs=_profile(0.3, 0.1))
    assert planned.schedule.name != "mixed" and planned.summary.forward_steps > 543
    assert planned.notes[-1].startswith("auto kept restart states: 543 forward steps and 235 reversed")


def test_expensive_advances_and_free_copies_take_the_mixed_plan():
    planned = _plan(_run(300), ram="32", costs=_profile(1.0, 0.0))
    assert planned.schedule.name == "mixed" and planned.summary.forward_steps == 543
    assert planned.notes[-1].startswith("auto chose a mixed plan: 543 forward steps")


def test_default_profile_prices_the_model_s_own_advance_and_data_copies():
    keeps = _plan(_wave_like(300, advance_step=0.5, data_step=0.1), ram="32")
    assert keeps.schedule.name == "revolve" and "auto kept restart states" in keeps.notes[-1]
    assert keeps.profile.advance.step_s == 0.5 and keeps.profile.data_s == 0.1
    assert keeps.predicted_s == pytest.approx(keeps.summary.cost(keeps.profile.vector()))
    # one field a step: every step once from its data, against revolve's 449
    mixes = _plan(_wave_like(300, advance_step=0.5, data_step=0.1), ram="150")
    assert mixes.schedule.name == "mixed" and mixes.summary.forward_steps == 300
    # the same run without the model's figures prices single steps and free copies: mixed
    assert _plan(_wave_like(300), ram="32").schedule.name == "mixed"


def test_a_measured_profile_prices_over_the_model_s_figures():
    planned = _plan(_wave_like(300, advance_step=0.3, data_step=0.3), ram="32", costs=_profile(1.0, 0.0))
    assert planned.schedule.name == "mixed"
    planned = _plan(_wave_like(300, advance_step=1.0, data_step=0.0), ram="32", costs=_profile(0.3, 0.1))
    assert planned.schedule.name != "mixed"


def test_a_profile_without_data_figures_takes_the_model_s():
    # a calibrated profile of before data were measured: the model's own figure prices the copies
    planned = _plan(_wave_like(300, data_step=0.1), ram="32", costs=_profile(0.3, None))
    assert planned.schedule.name != "mixed" and planned.profile.data_s == 0.1


def test_the_node_check_counts_store_all_s_data_not_restart_states(monkeypatch):
    # without a budget the ranks claim the predicted peak: the slack, the model's 4 and the driver's 4
    # restart states of 2 fields, 2 control fields, then the RAM: 39 fields of data (mixed store-all)
    # or 39 restart states (78 fields); the node holds 70 fields beside the fixed part
    from hpcadj.checkpoint import memory_fit
    from hpcadj.checkpoint.options import ConfigError

    fixed = memory_fit.ALLOCATOR_SLACK_BYTES + 18 * FIELD
    monkeypatch.setattr(memory_fit, "node_memory_bytes", lambda: (fixed + 70 * FIELD, "a test node"))
    planned = _plan(_run(40))
    assert planned.schedule.name == "mixed" and planned.summary.peak[0] * FIELD == 39 * FIELD
    with pytest.raises(ConfigError, match="more than a test node holds"):
        _plan(_run(40, data=None))
    with pytest.raises(ConfigError, match="more than a test node holds"):  # a run directory keeps states
        provision(_run(40), None, Checkpointing(), durability=lambda *args: 0.0)
