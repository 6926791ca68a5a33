"""``hpcadj hesscheck``: PASSED for every built-in model, FAILED (exit 1) for a wrong product, bad input exit 2."""

import contextlib
import io
import json

import pytest

SMALL = {"heat": ["--grid", "8x7", "--steps", "4"], "burgers": ["--grid", "10x10", "--steps", "4"],
         "wave": ["--grid", "12x10", "--steps", "20"], "grayscott": ["--grid", "8x8", "--steps", "3"]}


def invoke(argv):
    """(exit status, stdout, stderr) of ``hpcadj argv`` in this process."""
    from hpcadj.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("model", sorted(SMALL))
def test_every_builtin_model_passes(model):
    rc, out, err = invoke(["hesscheck", "--model", model, *SMALL[model], "--json"])
    info = json.loads(out)
    assert rc == 0 and info["passed"], (out, err)
    assert info["taylor"]["min_rate"] >= 2.9 and info["symmetry"]["relative"] <= 1e-10
    assert info["product"] == "newton"


def test_gauss_newton_checks_symmetry_only():
    rc, out, err = invoke(["hesscheck", "--model", "burgers", *SMALL["burgers"], "--gauss-newton"])
    assert rc == 0 and "PASSED" in out and "Taylor" not in out, (out, err)


BROKEN = '''
from hpcadj.models.heat import HeatModel


class BrokenHeat(HeatModel):
    """Heat whose Newton product forgets the kappa second-order terms (the Gauss-Newton one)."""

    def hessian_adjoint_step(self, i, u, u_next, du, du_next, lam_next, dlam_next, dcontrols, grad, hgrad):
        lam = self.adjoint_step(i, u, u_next, lam_next, grad)
        return lam, self.adjoint_step(i, u, u_next, dlam_next, hgrad)
'''


def test_a_wrong_product_fails_with_exit_1(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text(BROKEN)
    rc, out, err = invoke(["hesscheck", "--model", f"{path}:BrokenHeat", *SMALL["heat"], "--json"])
    info = json.loads(out)
    assert rc == 1 and not info["passed"], (out, err)
    assert info["taylor"]["min_rate"] < 2.5


def test_a_model_without_fixed_steps_is_one_line_exit_2():
    rc, out, err = invoke(["hesscheck", "--model", "heat", "--grid", "8x8", "--adaptive", "--t-final", "1e-3"])
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and out == "" and len(lines) == 1 and "fixed step count" in lines[0], (rc, out, err)


#: heat at ordinary sizes, where the gradient differences at the default step sit in the solver's
#: noise (the check must choose larger steps, or say that the tolerance limits it)
ORDINARY = [["--grid", "48x48", "--steps", "10"], ["--grid", "32x32", "--steps", "20"],
            ["--grid", "32x32", "--steps", "10", "--theta", "1"]]


@pytest.mark.parametrize("size", ORDINARY, ids=["48x48x10", "32x32x20", "theta1"])
def test_heat_passes_at_ordinary_sizes(size):
    rc, out, err = invoke(["hesscheck", "--model", "heat", *size, "--json"])
    info = json.loads(out)
    assert rc == 0 and info["passed"], (out, err)
    assert info["taylor"]["rate"] >= 2.9 and info["symmetry"]["relative"] <= 1e-10


@pytest.mark.parametrize("nranks", [2, 3])
def test_every_model_passes_at_its_defaults_on_several_ranks(nranks):
    """hesscheck's own steps and tolerances (no --eps, --fd-eps) on 2 and 3 ranks; heat at 48x48 x 10.
    The four models' commands share one mpirun."""
    from ..helpers import hpcadj_each

    models = sorted(SMALL)
    commands = [["hesscheck", "--model", model, *(ORDINARY[0] if model == "heat" else SMALL[model]), "--json"]
                for model in models]
    for model, proc in zip(models, hpcadj_each(commands, nranks, timeout=600)):
        assert proc.returncode == 0, (model, proc.stdout, proc.stderr[-2000:])
        info = json.loads(proc.stdout)
        assert info["passed"] and info["ranks"] == nranks, (model, info)
