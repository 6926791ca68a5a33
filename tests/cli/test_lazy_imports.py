"""A TS run loads no numba: it is imported where a built-in model's kernels first run, not at
``import hpcadj.ts``, not at the command line's start-up (whose help texts import every built-in model);
and the start-up reads the installed packages' model entry points once, not once per lookup."""

import json
import subprocess

import pytest

from ..helpers import PYTHON, ROOT, mpi_env

#: run a command through hpcadj.cli.main in a fresh process; report its status and the heavy modules loaded
PROBE = """
import importlib.metadata, json, sys
scans = []
real = importlib.metadata.entry_points
importlib.metadata.entry_points = lambda *a, **k: scans.append(1) or real(*a, **k)
from hpcadj.cli import main
status = main(sys.argv[1:])
print(json.dumps({"status": status, "loaded": [m for m in ("numba", "llvmlite", "scipy") if m in sys.modules],
                  "entry_point_scans": len(scans)}))
"""


def probe(args: list[str]) -> dict:
    proc = subprocess.run([PYTHON, "-c", PROBE, *args, "--quiet"], cwd=ROOT, env=mpi_env(), text=True,
                          capture_output=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(400)
def test_a_ts_run_loads_no_numba_and_a_builtin_model_gets_its_kernels():
    ts = probe(["run", "--model", "hpcadj.ts.examples:grayscott_stepper", "--grid", "16", "--steps", "3"])
    assert ts == {"status": 0, "loaded": [], "entry_point_scans": 1}, ts  # every installed package's metadata
    builtin = probe(["run", "--model", "burgers", "--grid", "8x8", "--steps", "3"])
    assert builtin["status"] == 0 and "numba" in builtin["loaded"], builtin


def test_importing_the_ts_adapter_and_the_models_loads_no_numba():
    code = ("import sys, hpcadj.ts, hpcadj.ts.examples, hpcadj.models.burgers, hpcadj.models.wave, "
            "hpcadj.models.grayscott, hpcadj.models.heat, hpcadj.adjoint.session; "
            "print('numba' in sys.modules)")
    proc = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=mpi_env(), text=True, capture_output=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", (proc.stdout, proc.stderr)
