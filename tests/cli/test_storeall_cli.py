"""``hpcadj plan`` and ``hpcadj run`` for a model that declares its adjoint data (wave): the same
mixed plan, with its data and restart slots, their bytes and the forward steps saved; what mixed
plans cannot serve yet (a run directory) keeps restart states with one note; heat is unchanged."""

import json

from ..helpers import hpcadj_in_process

WAVE = ["--model", "wave", "--grid", "14x12", "--steps", "24"]
PLAN_FIELDS = ("budget_bytes", "restart_bytes", "data_bytes", "restart_slots", "data_slots", "restart_writes",
               "data_writes", "peak_bytes", "forward_steps", "forward_steps_states_only", "forward_steps_saved")


def _json(args):
    proc = hpcadj_in_process([*args, "--json"])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_plan_and_run_agree_on_the_mixed_plan_s_slots_bytes_and_steps(tmp_path):
    planned = _json(["plan", *WAVE, "--ram", "8", "--schedule", "mixed"])
    ran = _json(["run", *WAVE, "--ram", "8", "--schedule", "mixed", "--quiet", "--local-dir", str(tmp_path)])
    assert planned["schedule"] == ran["schedule"] == "mixed"
    assert planned["forward_steps"] == ran["forward_steps"] == planned["mixed"]["forward_steps"]
    assert {k: planned["mixed"][k] for k in PLAN_FIELDS} == {k: ran["mixed"][k] for k in PLAN_FIELDS}
    facts = planned["mixed"]
    assert facts["restart_slots"] > 0 and facts["data_slots"] > 0 and facts["forward_steps_saved"] > 0
    assert facts["restart_bytes"] == 2 * facts["data_bytes"] == 2 * 14 * 12 * 8
    assert facts["peak_bytes"] <= facts["budget_bytes"] == 8 * facts["restart_bytes"]
    assert planned["levels"][0]["peak"] == ran["levels"][0]["peak_slots"] == facts["restart_slots"]


def test_plan_run_and_the_run_log_show_data_and_restart_slots(tmp_path):
    lines = ("mixed slots per rank: 8 restart of 2688 B, 14 data of 1344 B (writes 8 / 14); peak 21504 B",
             "forward evaluations 33 against 39 with restart states alone in the same bytes: 6 saved")
    planned = hpcadj_in_process(["plan", *WAVE, "--ram", "8", "--schedule", "mixed"])
    assert planned.returncode == 0, planned.stderr
    ran = hpcadj_in_process(["run", *WAVE, "--ram", "8", "--schedule", "mixed", "--local-dir", str(tmp_path),
                             "--log-dir", str(tmp_path / "log")])
    assert ran.returncode == 0, ran.stderr
    for line in lines:
        assert line in planned.stdout and line in ran.stdout, line
    record = json.loads((tmp_path / "log" / "run.json").read_text())["record"]
    assert record["schedule"] == "mixed"
    assert (record["mixed"]["restart_slots"], record["mixed"]["data_slots"], record["mixed"]["forward_steps_saved"]) \
        == (8, 14, 6)


def test_auto_says_which_plan_it_chose_and_why():
    """Priced with wave's own figures (a tiled step 0.5 of a single one, a step from its data 0.2 more):
    with RAM for nearly one field a step the mixed plan; with a third of that, revolve's 39 steps, most
    in the first sweep's advances, beat the mixed plan's 33 with the copies of 14 steps' data."""
    chose = hpcadj_in_process(["plan", *WAVE, "--ram", "12"])
    assert "hpcadj: auto chose a mixed plan: 24 forward steps and 23 reversed from their data" in chose.stdout
    kept = hpcadj_in_process(["plan", *WAVE, "--ram", "8"])
    assert "hpcadj: auto kept restart states: 33 forward steps and 14 reversed from their data" in kept.stdout
    assert "against 39" in kept.stdout


def test_store_all_with_a_run_directory_keeps_restart_states_with_one_note(tmp_path):
    ran = _json(["run", *WAVE, "--quiet", "--run-dir", str(tmp_path / "run"), "--local-dir", str(tmp_path)])
    assert ran["schedule"] == "store-all" and "mixed" not in ran
    notes = [n for n in ran["notes"] if "adjoint data" in n]
    assert len(notes) == 1 and notes[0].startswith("store-all keeps whole restart states: ")
    assert "not with a run directory" in notes[0]


def test_a_model_without_data_plans_as_before():
    planned = _json(["plan", "--model", "heat", "--grid", "14x12", "--steps", "24", "--ram", "8"])
    assert planned["schedule"] == "revolve" and planned["forward_steps"] == 39 and "mixed" not in planned
    assert not any("adjoint data" in n or "mixed" in n for n in planned["notes"])
