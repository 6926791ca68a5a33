"""``hpcadj run --schedule mixed``: the wave gradient from steps' data and restart states in one RAM
budget, bitwise the store-all run's, with fewer forward steps than revolve in the same bytes; the
refusals of what it cannot plan."""

import json

import pytest

from hpcadj.checkpoint.budget import parse_budget

from ..helpers import assert_bitwise, hpcadj, hpcadj_in_process, read_gradients

WAVE = ["run", "--model", "wave", "--grid", "14x12", "--steps", "24", "--anomaly", "0.15", "--json"]


def _run(args, tmp_path, tag, nranks=2):
    out = tmp_path / f"{tag}.h5"
    proc = hpcadj([*WAVE, *args, "--gradient-out", str(out)], nranks, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), read_gradients(out)


@pytest.mark.timeout(600)
def test_mixed_run_is_bitwise_store_all_with_fewer_forward_steps(tmp_path):
    info, want = _run(["--schedule", "store-all"], tmp_path, "all")
    mixed, got = _run(["--schedule", "mixed", "--ram", "6"], tmp_path, "mixed")
    revolve, _ = _run(["--schedule", "revolve", "--ram", "6"], tmp_path, "revolve")
    assert_bitwise(got, want)
    assert mixed["J"] == info["J"]
    facts = mixed["mixed"]
    assert mixed["forward_steps"] < revolve["forward_steps"] == facts["forward_steps_states_only"]
    assert facts["forward_steps_saved"] == revolve["forward_steps"] - mixed["forward_steps"]
    assert facts["data_writes"] > 0 and facts["restart_bytes"] == 2 * facts["data_bytes"]
    assert facts["peak_bytes"] <= facts["budget_bytes"] == 6 * facts["restart_bytes"]


def _costs(tmp_path) -> list[str]:
    """``--costs`` of a profile where node-local disk is dear but used (no calibration: plans fixed)."""
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"forward_s": 1.0, "adjoint_s": 2.0, "source": "test",
                                 "levels": [{"name": "ram", "write_s": 0.01, "read_s": 0.01},
                                            {"name": "disk", "write_s": 0.3, "read_s": 0.3}]}))
    return ["--costs", str(costs)]


@pytest.mark.timeout(600)
def test_mixed_over_ram_and_disk_beats_today_s_multilevel_plan_bitwise(tmp_path):
    levels = ["--ram", "8", "--disk", "2", "--local-dir", str(tmp_path), *_costs(tmp_path)]
    info, want = _run(["--schedule", "store-all"], tmp_path, "all")
    mixed, got = _run(["--schedule", "mixed", *levels], tmp_path, "mixed")
    today, _ = _run(["--schedule", "multilevel", *levels], tmp_path, "multilevel")
    assert_bitwise(got, want)
    assert mixed["forward_steps"] < today["forward_steps"] == mixed["mixed"]["forward_steps_states_only"]
    assert mixed["mixed"]["data_writes"] > 0 and mixed["levels"][1]["writes"] > 0


@pytest.mark.timeout(600)
def test_mixed_with_a_compressed_disk_level_is_bitwise_store_all(tmp_path):
    info, want = _run(["--schedule", "store-all"], tmp_path, "all")
    mixed, got = _run(["--schedule", "mixed", "--ram", "4704B", "--disk", "16KiB", "--local-dir", str(tmp_path),
                       "--compress-disk", "lossless:zlib", *_costs(tmp_path)], tmp_path, "mixed")
    assert_bitwise(got, want)
    assert mixed["compression"]["disk"]["codec"] == "lossless:zlib" and mixed["levels"][1]["writes"] > 0
    assert mixed["mixed"]["data_writes"] > 0


@pytest.mark.timeout(600)
def test_mixed_with_adaptive_steps_is_online_plan_bitwise_with_no_more_forward_steps(tmp_path):
    adaptive = ["run", "--model", "wave", "--grid", "14x12", "--adaptive", "--t-final", "1.0", "--anomaly", "0.15",
                "--json", "--ram", "3"]
    runs = {}
    for schedule in ("online", "mixed"):
        out = tmp_path / f"{schedule}.h5"
        proc = hpcadj([*adaptive, "--schedule", schedule, "--gradient-out", str(out), "--log-dir",
                       str(tmp_path / schedule)], 2, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[schedule] = json.loads(proc.stdout.strip().splitlines()[-1]), read_gradients(out)
    (online, want), (mixed, got) = runs["online"], runs["mixed"]
    assert_bitwise(got, want)
    assert mixed["schedule"] == "online-mixed" and mixed["steps"] == online["steps"] > 40
    assert mixed["forward_steps"] < online["forward_steps"]
    # the mixed object, as a run with fixed steps has it: the plan as streamed and the run agree
    facts = mixed["mixed"]
    assert "mixed" not in online and facts["reverse_sweep"] == "mixed"
    assert facts["forward_steps"] == mixed["forward_steps"]
    assert facts["forward_steps_states_only"] == online["forward_steps"]
    assert facts["forward_steps_saved"] == online["forward_steps"] - mixed["forward_steps"]
    assert facts["data_writes"] > 0 and facts["data_slots"] > 0 and facts["restart_bytes"] == 2 * facts["data_bytes"]
    assert facts["peak_bytes"] <= facts["budget_bytes"] == 3 * facts["restart_bytes"]
    assert json.loads((tmp_path / "mixed" / "summary.json").read_text())["result"]["mixed"] == facts


@pytest.mark.timeout(300)
def test_a_mixed_run_stays_near_its_budget_in_resident_memory(tmp_path):
    """Freed data slots and idle state buffers go back to the system, so restart states stored after
    a phase of data do not come on top of them: peak RSS within a quarter of the budget of revolve's
    in the same bytes (it was one budget more: 457 against 355 MiB)."""
    run = ["run", "--model", "wave", "--grid", "64x64x64", "--steps", "150", "--json", "--quiet", "--ram", "30"]
    peaks = {}
    for schedule in ("revolve", "mixed"):
        proc = hpcadj([*run, "--schedule", schedule], 1, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        info = json.loads(proc.stdout.strip().splitlines()[-1])
        peaks[schedule], budget = info["peak_rss_bytes"], 30 * info["snapshot_bytes"]
    assert peaks["mixed"] <= peaks["revolve"] + budget // 4, (peaks, budget)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("memory", ["300MiB", "330MiB"])
def test_a_mixed_run_under_memory_stays_within_it(memory):
    """--memory is the whole process's: a mixed plan's run, the data check before it included, peaks
    within it (it peaked one data check and two states above: the check's states were kept by the
    pools, freed data buffers stayed beside the restart states that replaced them)."""
    run = ["run", "--model", "wave", "--grid", "64x64x64", "--steps", "150", "--json", "--quiet",
           "--memory", memory, "--schedule", "mixed"]
    proc = hpcadj(run, 1, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["mixed"]["data_writes"] > 0 and info["mixed"]["restart_writes"] > 0, info["mixed"]
    assert info["peak_rss_bytes"] <= parse_budget(memory).nbytes, (info["peak_rss_bytes"], info["memory"])


@pytest.mark.timeout(300)
def test_mixed_without_a_budget_stores_every_step_s_data_once(tmp_path):
    info, _ = _run(["--schedule", "mixed"], tmp_path, "all", nranks=1)
    assert info["forward_steps"] == 24 and info["recomputed_steps"] == 0
    assert info["mixed"]["data_writes"] == 23 and info["mixed"]["restart_writes"] == 0


@pytest.mark.parametrize("args, words", [
    (["--model", "heat", "--steps", "6"], "declares no"),
    (["--model", "wave", "--grid", "14x12", "--steps", "6", "--disk", "4"], "keeps steps' data in RAM"),
    (["--model", "wave", "--grid", "14x12", "--steps", "6", "--ram", "4", "--compress", "lossless:zlib"],
     "does not compress its RAM slots"),
    (["--model", "wave", "--grid", "14x12", "--steps", "6", "--ram", "100B"], "one snapshot is"),
])
def test_what_mixed_cannot_plan_is_one_line_and_exit_2(args, words, tmp_path):
    proc = hpcadj_in_process(["run", *args, "--schedule", "mixed", "--local-dir", str(tmp_path)])
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcadj: error:") and words in lines[0], proc.stderr
