"""scripts/guard_outputs.py: two runs of one tree compare identical although their measured RSS
baselines differ; a change of plan still shows."""

import copy
import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "guard_outputs.py"


def _guard():
    spec = importlib.util.spec_from_file_location("guard_outputs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: a run under --memory with a compressed RAM level, as guard_outputs records it
RUN = {"J": 0.125, "levels": [{"name": "ram", "slots": 29, "peak_slots": 29}],
       "memory": {"budget": 419430400, "model": 262144, "peak": 419430400, "ram slots": 192610256,
                  "ram_slots_fit": 11465, "snapshot": 16384, "staging": 81920, "total": 193155072},
       "compression": {"ram": {"pool_bytes": 192610256, "slot_bytes": 6641732, "slot_ratio": 0.00247,
                               "largest_bytes": 14522},
                       "disk": {"slot_bytes": 16799, "slot_ratio": 0.975}}}


def _other_baseline(run):
    """The same run measured with another resident set: the fields that follow from it moved."""
    out = copy.deepcopy(run)
    out["memory"].update({"peak": 419430000, "ram slots": 192536528, "ram_slots_fit": 11461, "total": 193081344})
    out["compression"]["ram"].update({"pool_bytes": 192536528, "slot_bytes": 6639190, "slot_ratio": 0.002468})
    return out


def _write(folder: Path, run: dict) -> Path:
    folder.mkdir()
    (folder / "run-x.json").write_text(json.dumps({"rc": 0, "result": run}))
    return folder


def test_two_baselines_compare_identical_and_a_changed_plan_differs(tmp_path):
    guard = _guard()
    a = _write(tmp_path / "a", RUN)
    assert guard.compare(a, _write(tmp_path / "b", _other_baseline(RUN))) == 0
    changed = _other_baseline(RUN)
    changed["levels"][0]["slots"] = 28
    assert guard.compare(a, _write(tmp_path / "c", changed)) == 1
    changed = copy.deepcopy(RUN)
    changed["compression"]["disk"]["slot_bytes"] += 1  # a file level's slots follow no baseline
    assert guard.compare(a, _write(tmp_path / "d", changed)) == 1


def test_without_a_budget_nothing_is_masked():
    guard = _guard()
    run = copy.deepcopy(RUN)
    del run["memory"]["budget"]
    assert guard.masked(run) == run
    assert guard.masked(RUN)["memory"]["ram_slots_fit"] == "<rss>"
    assert guard.masked(RUN)["memory"]["snapshot"] == RUN["memory"]["snapshot"]
