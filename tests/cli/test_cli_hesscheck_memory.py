"""``hpcadj hesscheck --memory`` goes through the Hessian products' budget rule (the rule itself, on
the process's peak resident set: tests/unit/test_hessian_memory.py)."""

import contextlib
import io
import json

import pytest

pytestmark = pytest.mark.timeout(120)


def test_hesscheck_memory_goes_through_the_same_rule():
    """``hpcadj hesscheck --memory``: PASSED, the products under the budget, and a budget too small
    is one line and exit 2."""
    from hpcadj.cli import main

    def invoke(*argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["hesscheck", "--model", "wave", "--grid", "12x10", "--steps", "20", "--json", *argv])
        return rc, out.getvalue(), err.getvalue()

    rc, out, err = invoke("--memory", "2GiB")
    info = json.loads(out)
    assert rc == 0 and info["passed"], (out, err)
    assert info["memory"]["budget"] == 2 * 2 ** 30 and info["memory"]["mode"] == "ram"
    assert info["memory"]["peak_rss_bytes"] <= info["memory"]["budget"]
    rc, out, err = invoke("--memory", "1MiB")
    assert rc == 2 and out == "" and "cannot hold" in err and len(err.strip().splitlines()) == 1, err


def test_hesscheck_schedule_mixed_plans_the_products_with_steps_data():
    """``--schedule mixed``: wave's products planned with steps' adjoint data under the budget, PASSED
    with the revolve run's J and no more tangent steps; a model whose products declare no data is one
    line and exit 2."""
    from hpcadj.cli import main

    def invoke(model, *argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["hesscheck", "--model", model, "--steps", "12", "--json", "--gauss-newton", *argv])
        return rc, out.getvalue(), err.getvalue()

    runs = {}
    for schedule in ("revolve", "mixed"):
        rc, out, err = invoke("wave", "--grid", "12x10", "--memory", "2GiB", "--schedule", schedule)
        assert rc == 0, (out, err)
        runs[schedule] = json.loads(out)
    mixed, revolve = runs["mixed"], runs["revolve"]
    assert mixed["passed"] and mixed["memory"]["schedule"] == "mixed" and revolve["memory"]["schedule"] == "revolve"
    assert mixed["J"] == revolve["J"] and mixed["symmetry"] == revolve["symmetry"]
    assert mixed["memory"]["tangent_steps"] <= revolve["memory"]["tangent_steps"]
    rc, out, err = invoke("heat", "--grid", "7x6", "--schedule", "mixed")
    assert rc == 2 and out == "" and "declares none" in err and len(err.strip().splitlines()) == 1, err
