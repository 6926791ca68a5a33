"""``hpcadj run`` and ``gradcheck``: the summary, the JSON keys, and bad input (one line, exit 2).

The real command runs under mpirun, for gradcheck's exit status and for one bad input; the rest calls
``hpcadj.cli.main`` in this process (a process would cost a second of start-up each)."""

import pytest

from ..helpers import hpcadj, hpcadj_in_process, hpcadj_json

KEYS = {"model", "grid", "steps", "ranks", "J", "grad_norm", "grad_kappa_norm", "forward_steps",
        "adjoint_steps", "wall_s", "snapshot_bytes"}


def test_json_has_the_documented_keys():
    info = hpcadj_json(["run", "--grid", "16x12", "--steps", "6"], in_process=True)
    assert KEYS <= set(info)
    assert info["model"] == "heat" and info["grid"] == "16x12" and info["steps"] == 6
    assert info["forward_steps"] == 6 and info["adjoint_steps"] == 6
    assert info["snapshot_bytes"] == 16 * 12 * 8
    assert info["J"] > 0 and info["grad_norm"] > 0 and info["grad_kappa_norm"] > 0


def test_human_summary_on_two_ranks():
    proc = hpcadj(["run", "--grid", "16x12", "--steps", "4"], nranks=2, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("hpcadj run: heat 16x12, 4 steps, 2 rank(s)") == 1
    assert "|dJ/du0|" in proc.stdout


def test_gradcheck_passes():
    proc = hpcadj(["gradcheck", "--grid", "12x10", "--steps", "5", "--dt", "1e-3"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASSED" in proc.stdout


@pytest.mark.parametrize("args", [
    ["--grid", "0x16"], ["--grid", "16"], ["--grid", "axb"], ["--steps", "0"], ["--dt", "-1"],
    ["--dt", "0"], ["--theta", "0.4"], ["--theta", "1.5"], ["--model", "nosuch"], ["--bogus"],
    ["--gradient-out", "/nonexistent-dir/g.h5"], ["--observations", "/nonexistent.h5"],
])
def test_bad_input_is_one_line_and_exit_2(args):
    argv = ["run", "--steps", "2", "--grid", "8x8", *args] if "--grid" not in args and "--steps" not in args \
        else ["run", *args]
    proc = hpcadj(argv) if args == ["--grid", "0x16"] else hpcadj_in_process(argv)  # one real command
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hpcadj: error:"), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_too_many_ranks_for_the_grid():
    proc = hpcadj(["run", "--grid", "2x2", "--steps", "1"], nranks=3, timeout=120)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hpcadj: error:")]
    assert len(errors) == 1 and "cannot split" in errors[0]
    assert "Traceback" not in proc.stderr


def test_unwritable_gradient_path_leaves_no_file(tmp_path):
    target = tmp_path / "ro"
    target.mkdir()
    target.chmod(0o500)
    proc = hpcadj_in_process(["run", "--grid", "8x8", "--steps", "2", "--gradient-out", str(target / "g.h5")])
    target.chmod(0o700)
    import os

    if os.geteuid() == 0:
        # root may write anywhere: the run must then succeed and leave exactly the result file
        assert proc.returncode == 0 and sorted(os.listdir(target)) == ["g.h5"]
    else:
        assert proc.returncode == 2 and os.listdir(target) == []
