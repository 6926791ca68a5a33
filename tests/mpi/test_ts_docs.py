"""docs/ts.md as a user runs it: the example file on 1 and 2 ranks, then every command of the page's
command-line block (a killed run resumed on another rank count; the batch script run locally)."""

import json
import re
import shlex

import pytest

from ..helpers import PYTHON, ROOT, mpi_env, mpirun, run


PAGE = (ROOT / "docs" / "ts.md").read_text()
EXAMPLE = re.findall(r"```python\n(.*?)```", PAGE, flags=re.S)[0]
SHELL = re.findall(r"```sh\n(.*?)```", PAGE, flags=re.S)


@pytest.fixture
def user_dir(tmp_path):
    (tmp_path / "my_ts.py").write_text(EXAMPLE)
    return tmp_path


def _bash(line, cwd, env=None, timeout=240):
    env = mpi_env({"PATH": f"{ROOT / '.venv' / 'bin'}:{mpi_env()['PATH']}", **(env or {})})
    return run(["bash", "-c", line], cwd=cwd, env=env, timeout=timeout)


@pytest.mark.timeout(600)
def test_example_file_runs(user_dir):
    lines = [ln for ln in SHELL[0].splitlines() if ln.strip()]
    assert lines == ["python my_ts.py", "mpirun -n 2 python my_ts.py -ts_type rk -ts_rk_type 4"]
    serial = run([PYTHON, "my_ts.py"], cwd=user_dir, timeout=120)
    assert serial.returncode == 0, serial.stderr
    assert "|gradient - TSAdjointSolve's| = [0.0, 0.0]" in serial.stdout
    parallel = mpirun(2, [PYTHON, "my_ts.py", "-ts_type", "rk", "-ts_rk_type", "4"], cwd=user_dir, timeout=180)
    assert parallel.returncode == 0, parallel.stderr
    assert "|gradient - TSAdjointSolve's| = [0.0, 0.0]" in parallel.stdout


@pytest.mark.timeout(900)
def test_command_lines_run(user_dir):
    lines = [ln.split("#")[0].strip() for ln in SHELL[1].splitlines() if ln.strip()]
    assert len(lines) == 4
    first = _bash(lines[0] + " --json", user_dir)
    assert first.returncode == 0, first.stderr
    info = json.loads(first.stdout.strip().splitlines()[-1])
    assert info["model"] == "my_ts" and info["ts_type"] == "cn" and info["steps"] == 200
    assert info["recomputed_steps"] > 0

    killed = _bash(lines[1], user_dir, {"HPCADJ_INJECT_KILL": "1:300"})
    assert killed.returncode != 0 and "error" not in killed.stderr, killed.stderr
    assert (user_dir / "run1").is_dir()
    resumed = _bash(lines[2] + " --json", user_dir)
    assert resumed.returncode == 0, resumed.stderr
    info = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert info["resumed"] and info["ranks"] == 3 and info["ts_type"] == "rk"

    words = shlex.split(lines[3])
    env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
    assert words[-2:] == ["sbatch", "jobs/gradient.sbatch"]
    env.update(HPCADJ_OUTPUT=str(user_dir / "jobs"), HPCADJ_NTASKS="2", HPCADJ_LAUNCHER="mpirun",
               HPCADJ=str(ROOT / ".venv" / "bin" / "hpcadj"))
    job = _bash(f"bash {ROOT / 'jobs' / 'gradient.sbatch'}", user_dir, env, timeout=400)
    assert job.returncode == 0, job.stdout + job.stderr
    outputs = list((user_dir / "jobs").rglob("*.json"))
    assert outputs, list((user_dir / "jobs").rglob("*"))


@pytest.mark.timeout(600)
def test_adaptive_recipe_and_check_run(user_dir):
    """The page's adaptive-steps block: the TSAdapt's steps to t = 0.5 on 2 ranks, then hpcadj check."""
    lines = [ln for ln in SHELL[2].splitlines() if ln.strip()]
    assert len(lines) == 2 and "-ts_adapt_type basic" in lines[0] and lines[1].startswith("hpcadj check")
    run_ = _bash(lines[0] + " --json", user_dir)
    assert run_.returncode == 0, run_.stderr
    info = json.loads(run_.stdout.strip().splitlines()[-1])
    assert info["adaptive"] and info["t_final"] == 0.5 and info["steps"] == 19 and info["adapt_type"] == "basic"
    check = _bash(lines[1], user_dir)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "adjoint_transpose    NOT CHECKED" in check.stdout and check.stdout.strip().endswith("PASSED")
