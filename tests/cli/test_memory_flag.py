"""--memory: a whole-process budget per rank that sizes the RAM slots, refused up front when the
model alone (or the node) cannot hold it, and held by a real run."""

import re

import pytest

from ..helpers import hpcadj, hpcadj_in_process, hpcadj_json

MiB = 2 ** 20
#: 8.4 MiB a state per rank on 2 ranks: store-all's 16 states need twice the margin given below; a
#: short step (dt h^-2 = 0.16) keeps CG to a few iterations a solve, the same states stored
STEPS = 16
HEAT = ["run", "--model", "heat", "--grid", "128x128x128", "--steps", str(STEPS), "--dt", "1e-5"]


def least_budget(proc) -> float:
    """The least budget the one error line names, in MiB."""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hpcadj: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return float(re.search(r"the least budget that would do is ([\d.]+) MiB", errors[0]).group(1))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_peak_rss_of_every_rank_stays_within_a_budget_of_a_few_slots():
    least = least_budget(hpcadj([*HEAT, "--memory", "200MiB"], 2, timeout=120))
    budget = least + 60  # room for a few 8.4 MiB slots beside the model
    info = hpcadj_json([*HEAT, "--memory", f"{budget}MiB"], 2, timeout=240)
    memory = info["memory"]
    slots = info["levels"][0]["slots"]
    assert memory["budget"] == int(budget * MiB) and 2 <= slots <= 10, memory
    assert info["forward_steps"] > STEPS and info["schedule"] != "store-all"   # recomputes to fit
    assert info["peak_rss_bytes"] <= memory["budget"], (info["peak_rss_bytes"] / MiB, budget)
    assert memory["peak"] <= memory["budget"]
    # the same run with every state in RAM would not have fitted
    store_all = hpcadj_json(HEAT, 2, timeout=240)
    assert store_all["peak_rss_bytes"] > memory["budget"], store_all["peak_rss_bytes"] / MiB


@pytest.mark.timeout(120)
def test_a_budget_the_model_alone_exceeds_is_refused_before_any_work(tmp_path):
    proc = hpcadj([*HEAT, "--memory", "100MiB", "--log-dir", str(tmp_path / "logs")], 2, timeout=60)
    assert least_budget(proc) > 100
    assert not (tmp_path / "logs").exists()   # nothing started


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args,message", [
    (["--memory", "8"], "is a slot count"),
    (["--memory", "nonsense"], "--memory"),
    (["--memory", "900GiB"], "more than the node's memory"),
    (["--ram", "900GiB", "--steps", "60000", "--grid", "128x128x128"], "more than the node's memory"),
])
def test_budgets_the_node_cannot_hold_are_one_line(args, message):
    """Refused before any work, so in this process but for one real command."""
    argv = ["run", "--model", "heat", "--grid", "32x32", *args]
    proc = hpcadj(argv, 1, timeout=60) if args == ["--memory", "8"] else hpcadj_in_process(argv)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hpcadj: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and message in errors[0], proc.stderr


@pytest.mark.timeout(120)
def test_the_environment_sets_the_budget():
    proc = hpcadj([*HEAT, "--steps", "3"], 1, timeout=60, env={"HPCADJ_MEMORY": "100MiB"})
    assert "$HPCADJ_MEMORY 100.0 MiB per rank cannot hold" in proc.stderr and proc.returncode == 2
    info = hpcadj_json(["run", "--model", "heat", "--grid", "32x32", "--steps", "20"], 1, timeout=60,
                       env={"SLURM_MEM_PER_CPU": "2048"})
    assert info["memory"]["budget"] == 2048 * MiB and info["memory"]["source"] == "SLURM_MEM_PER_CPU"


def test_plan_shows_the_breakdown():
    info = hpcadj_json(["plan", "--steps", "300", "--memory", "1GiB", "--snapshot-bytes", str(16 * MiB),
                        "--disk", "20"])
    m = info["memory"]
    assert m["model"] == 32 * 16 * MiB and m["peak"] <= m["budget"]
    assert info["levels"][0]["name"] == "ram" and info["levels"][0]["slots"] == m["ram_slots_fit"]
    proc = hpcadj(["plan", "--steps", "300", "--memory", "100MiB", "--snapshot-bytes", str(16 * MiB)])
    assert proc.returncode == 2 and "least budget" in proc.stderr


def test_a_bad_pfs_file_is_refused_before_the_warm_up_gradient(tmp_path, monkeypatch):
    """--memory measures its baseline after a warm-up gradient: a path no run can use is refused first."""
    import hpcadj.cli.run as run

    warmed = []
    monkeypatch.setattr(run, "memory_baseline", lambda args, comm: warmed.append(args.grid) or 0)
    bad = tmp_path / "no-such-dir" / "c.h5"
    proc = hpcadj_in_process(["run", "--model", "heat", "--grid", "32x32", "--steps", "4", "--memory", "400MiB",
                              "--pfs", "4", "--pfs-file", str(bad)])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hpcadj: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "--pfs-file" in errors[0], proc.stderr
    assert warmed == [], "the warm-up gradient ran before the configuration was checked"
