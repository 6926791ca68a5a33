"""``--model path/to/file.py:Name`` and ``--model package.module:Name``: a user's model on the command
line without installing it, for run, gradcheck, calibrate and plan; every way of naming a wrong
object is one line on stderr and exit status 2.

The model file is docs/example.md's (the README's example; public API only), as a user saves it."""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys

import pytest

from ..helpers import ROOT, hpcadj as hpcadj_subprocess, mpirun, HPCADJ

EXTRA = '''

class RateCLI:
    """A ModelCLI with an option of its own."""

    def add_arguments(self, parser):
        parser.add_argument("--rate-steps", type=int, default=None)

    def build(self, comm, args):
        return ReactionDiffusion(comm, grid=(8, 8), n_steps=args.rate_steps or 3)


def make(comm, args):
    """A factory, as a petsc4py-TS adapter's users write them."""
    return ReactionDiffusion(comm, grid=(10, 10), n_steps=args.steps or 3)


def not_a_model(comm, args):
    return 42


class Needy(ReactionDiffusion):
    def __init__(self, comm, viscosity, n_steps=4):
        super().__init__(comm, n_steps=n_steps)


NUMBER = 3
'''


def readme_model() -> str:
    """docs/example.md's model (the README's example), without its ``__main__`` block."""
    text = (ROOT / "docs" / "example.md").read_text()
    example = next(b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S)
                   if "class ReactionDiffusion(Stepper)" in b)
    return example.split('\nif __name__ == "__main__":')[0]


@pytest.fixture
def model_file(tmp_path, monkeypatch):
    """The example's model plus a ModelCLI, factories and wrong objects in ``tmp/models/reaction.py``."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # loading a file puts its folder on sys.path
    folder = tmp_path / "models"
    folder.mkdir()
    path = folder / "reaction.py"
    path.write_text(readme_model() + EXTRA)
    return path


def invoke(argv):
    """(exit status, stdout, stderr) of ``hpcadj argv`` in this process."""
    from hpcadj.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def one_error(argv) -> str:
    rc, out, err = invoke(argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and out == "", (rc, out, err)
    assert lines[0].startswith("hpcadj: error: ") and "Traceback" not in err
    return lines[0]


def test_stepper_class_from_a_file_runs_with_the_shared_options(model_file):
    rc, out, err = invoke(["run", "--model", f"{model_file}:ReactionDiffusion", "--grid", "12x10",
                           "--steps", "5", "--dt", "1e-5", "--ram", "2", "--json", "--quiet"])
    assert rc == 0, err
    info = json.loads(out)
    assert info["model"] == "reaction" and info["adjoint_steps"] == 5 and info["forward_steps"] > 5, info
    assert info["snapshot_bytes"] == 12 * 10 * 8, info


def test_model_cli_with_its_own_option_in_gradcheck(model_file):
    rc, out, err = invoke(["gradcheck", "--model", f"{model_file}:RateCLI", "--rate-steps", "4",
                           "--halvings", "2", "--json"])
    assert rc == 0, err
    info = json.loads(out)
    assert info["passed"] and info["steps"] == 4, info


def test_factory_in_calibrate_and_plan(model_file, tmp_path):
    profile = tmp_path / "costs.json"
    rc, out, err = invoke(["calibrate", "--model", f"{model_file}:make", "--steps", "3", "--repeats", "1",
                           "--out", profile, "--json"])
    assert rc == 0, err
    assert json.loads(profile.read_text())["forward_s"] > 0
    rc, out, err = invoke(["plan", "--model", f"{model_file}:make", "--ram", "2KiB", "--costs", profile,
                           "--json"])
    assert rc == 0, err
    info = json.loads(out)
    # the factory's 10x10 doubles are 800 bytes: 2 KiB hold two slots; n is the model's own 3
    assert info["steps"] == 3 and info["levels"][0]["slots"] == 2, info
    assert info["model"]["snapshot_bytes"] == 800, info


@pytest.mark.parametrize("name,expected", [
    ("Nope", "has no attribute 'Nope'"),
    ("NUMBER", "is an int, not a Stepper class"),
    ("not_a_model", "returned int, not a Stepper"),
    ("Needy", "needs viscosity"),
    ("Grid", "is the class Grid, not a Stepper class"),
])
def test_a_wrong_name_is_one_line(model_file, name, expected):
    line = one_error(["run", "--model", f"{model_file}:{name}", "--steps", "2"])
    assert expected in line and f"{model_file}:{name}" in line, line


def test_missing_file_and_errors_inside_the_users_file(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert "no such file" in one_error(["gradcheck", "--model", f"{tmp_path}/absent.py:M"])
    broken = tmp_path / "broken.py"
    broken.write_text("import math\n\nx = math.sqrt(2)\nraise KeyError('no such field')\n")
    line = one_error(["calibrate", "--model", f"{broken}:M"])
    assert "KeyError: 'no such field'" in line and f"{broken}:4" in line, line
    typo = tmp_path / "typo.py"
    typo.write_text("def f(:\n    pass\n")
    line = one_error(["plan", "--model", f"{typo}:f", "--ram", "2"])
    assert "SyntaxError" in line and f"{typo}:1" in line, line
    missing = tmp_path / "imports.py"
    missing.write_text("\nimport no_such_module_xyz\n")
    line = one_error(["run", "--model", f"{missing}:M"])
    assert "ModuleNotFoundError" in line and f"{missing}:2" in line, line
    assert "no module named 'no_such_pkg_xyz'" in one_error(["run", "--model", "no_such_pkg_xyz.mod:M"])
    assert "unknown model 'reactoin'" in one_error(["run", "--model", "reactoin"])


@pytest.mark.timeout(300)
def test_package_module_spec_on_pythonpath_and_under_mpirun(tmp_path):
    """A package on PYTHONPATH (a real process), and the file spec on two ranks under mpirun."""
    pkg = tmp_path / "site" / "usermodels"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "reaction.py").write_text(readme_model() + EXTRA)
    env = {"PYTHONPATH": str(tmp_path / "site")}
    proc = hpcadj_subprocess(["run", "--model", "usermodels.reaction:make", "--steps", "4", "--json"],
                             env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["adjoint_steps"] == 4
    serial = json.loads(proc.stdout)["J"]
    proc = mpirun(2, [HPCADJ, "run", "--model", f"{pkg / 'reaction.py'}:make", "--steps", "4", "--ram", "2",
                      "--json"], timeout=180)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["ranks"] == 2 and info["adjoint_steps"] == 4 and info["J"] == pytest.approx(serial, rel=1e-12)
    proc = mpirun(2, [HPCADJ, "run", "--model", f"{pkg / 'reaction.py'}:Nope"], timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("hpcadj")]  # not mpirun's notice
    assert proc.returncode == 2 and len(lines) == 1 and "has no attribute 'Nope'" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
