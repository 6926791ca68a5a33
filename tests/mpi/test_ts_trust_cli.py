"""A user's TS on the command line refused in one line, exit 2, before the first step (no traceback,
no MPI_ABORT, on one and two ranks); a resume with a changed TSAdapt setting refused, naming it.

The model is docs/ts.md's own ``my_ts.py``; PETSc options make each a command of its own.
"""

import json
import re

import pytest

from ..helpers import ROOT, hpcadj, hpcadj_in_process, killed_run


PAGE = (ROOT / "docs" / "ts.md").read_text()
EXAMPLE = re.findall(r"```python\n(.*?)```", PAGE, flags=re.S)[0]
ADAPTIVE = ["-ts_type", "rk", "-ts_rk_type", "2a", "-ts_adapt_type", "basic", "-ts_max_time", "0.3",
            "-ts_max_steps", "1000"]


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    (tmp_path / "my_ts.py").write_text(EXAMPLE)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _refused(proc, *fragments):
    """Exit 2, nothing on stdout, one error line holding every fragment, no traceback, no MPI_ABORT
    (mpirun's own note that a rank exited with 2 aside)."""
    ours = [line for line in proc.stderr.splitlines() if line.startswith("hpcadj:")]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout.strip() == "" and len(ours) == 1 and ours[0].startswith("hpcadj: error: "), proc.stderr
    assert "Traceback" not in proc.stderr and "MPI_ABORT" not in proc.stderr, proc.stderr
    lines = ours
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.mark.timeout(600)
def test_refused_before_the_first_step(user_dir):
    run = ["run", "--model", "my_ts.py:build", "--steps", "10"]
    _refused(hpcadj([*run, "-ts_type", "euler"], cwd=user_dir, timeout=120),
             "no adjoint step for TS type euler", "choose -ts_type rk")
    _refused(hpcadj([*run, "-ts_type", "glle"], cwd=user_dir, timeout=120),
             "TS type glle cannot take one step at a time")
    _refused(hpcadj([*run, "-ts_type", "rk", "-ts_rk_type", "2a", "-ts_adapt_type", "basic"], cwd=user_dir,
                    timeout=120), "needs an end time: give -ts_max_time T")
    _refused(hpcadj([*run, *ADAPTIVE, "-ts_adapt_dt_max", "0.001", "-ts_max_steps", "100"], cwd=user_dir,
                    timeout=120), "cannot reach t = 0.3 in 100 steps of at most 0.001", "-ts_max_steps N with N >= 300")


@pytest.mark.timeout(600)
def test_refused_alike_on_two_ranks(user_dir):
    """An up-front refusal and one that can only come mid-run (the TSAdapt's steps outnumber the max
    steps): one line either way, every rank agreeing, no MPI_ABORT."""
    run = ["run", "--model", "my_ts.py:build", "--steps", "10"]
    _refused(hpcadj([*run, "-ts_type", "ssp"], 2, cwd=user_dir, timeout=120), "no adjoint step for TS type ssp")
    line = _refused(hpcadj([*run, *ADAPTIVE, "-ts_max_steps", "4"], 2, cwd=user_dir, timeout=120),
                    "needs more than its 4 max steps to reach t = 0.3", "give a larger -ts_max_steps")
    assert "forward step" in line


def test_bad_objective_gradient_in_the_users_file(user_dir):
    """The gradient as a numpy array: refused in one line when the model is built, not a PETSc traceback
    at the first adjoint step after the forward sweep."""
    text = EXAMPLE.replace("lambda u: u * (1.0 / n)", "lambda u: u.getArray() / n")
    assert text != EXAMPLE
    (user_dir / "bad_ts.py").write_text(text)
    proc = hpcadj_in_process(["run", "--model", "bad_ts.py:build", "--steps", "10"])
    _refused(proc, "final's gradient(u) returned a numpy.ndarray, not a PETSc Vec")


@pytest.mark.timeout(600)
def test_resume_with_a_changed_adapt_setting_is_refused(user_dir):
    """Killed in its first sweep, resumed with -ts_adapt_dt_max changed: refused, naming the setting."""
    args = ["run", "--model", f"{user_dir / 'my_ts.py'}:build", "--ram", "3", "--run-dir", str(user_dir / "run"),
            "--durable-every", "1", "--pfs", "4", "--pfs-file", str(user_dir / "ck.h5"), *ADAPTIVE]
    killed_run([*args, "-ts_adapt_dt_max", "0.02"], 1, "0:frontier=10")   # of 16 steps
    _refused(hpcadj([*args, "--resume", "-ts_adapt_dt_max", "0.03"], cwd=user_dir, timeout=120),
             "adapt_dt_max was 0.02, now 0.03")


def test_check_passes_the_docs_example(user_dir):
    """hpcadj check on docs/ts.md's my_ts.py: the tangent step NOT CHECKED, the adjoint checked against
    central differences, the parameter seen to reach the step; exit 0."""
    proc = hpcadj_in_process(["check", "--model", "my_ts.py:build", "--check-steps", "2", "--json"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads(proc.stdout)
    status = {name: p["status"] for name, p in info["properties"].items()}
    assert status["adjoint_transpose"] == "NOT CHECKED"
    assert all(status[name] == "PASSED" for name in ("step_pure", "inputs_untouched", "snapshot_round_trip",
                                                     "adjoint_difference", "parameters_used")), status
