"""The suite's tiers and the serial session's collection.

A test's tier is its folder (pyproject.toml lists the markers): ``tests/unit/`` pure Python in this
process, which ``make test-fast`` runs (a unit test that starts a process fails); ``tests/cli/`` the
``hpcadj`` command, in a process or in-process; ``tests/mpi/`` real mpirun: serial tests that launch
ranks, and test_mpi_suites.py, which runs the ``tests/mpi/ranks/`` modules on every rank (collected
only inside mpirun); ``tests/cluster/`` the SLURM job scripts. Each test gets its folder's marker, so
``pytest -m TIER`` selects a tier as well as ``pytest tests/TIER``.
"""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from .helpers import RESTART_BASE, RESTART_LEVELS, RESTART_PROFILE, hpcadj_json, read_gradients

if not os.environ.get("HPCADJ_MPI_WORKER"):
    collect_ignore = ["mpi/ranks"]

TIERS = ("unit", "cli", "mpi", "cluster")
HERE = Path(__file__).resolve().parent


#: tests collected outside every tier folder: each fails, naming the folders (see _in_a_tier_folder)
OUTSIDE: set[str] = set()


def _tier(item) -> str | None:
    """The tier folder a test's file is in (None outside every tier folder)."""
    parts = item.path.resolve().relative_to(HERE).parts
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


#: files whose tests share a session fixture's run (``restart_reference``): one worker runs them all
WORKER_GROUPS = {"test_restart.py": "restart", "test_compression_restart.py": "restart"}
#: files whose tests are independent runs, each worth a worker of its own (one mpirun per test)
SPREAD_FILES = {"test_mpi_suites.py"}
#: but their multi-rank runs go to one worker, one after another: two oversubscribed jobs at once
#: (six ranks on 2 cores) spend their time yielding to each other; beside serial tests they do not
SERIAL_MPI_GROUP = "mpi-suites-multi-rank"
#: the order units are handed to workers: the dearest first, so no long run starts last
_TIER_ORDER = {"mpi": 0, "cluster": 1, "cli": 2, "unit": 3}


def _nranks(item) -> int:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("nranks", 0) if callspec else 0


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Give every test its folder's tier marker, and lay the suite out for
    pytest-xdist (``-n 2 --dist loadgroup``, scripts/run-tests.sh): a file's tests stay on one worker
    (its module fixtures run once), the MPI suites' one-rank runs spread over the workers and their
    multi-rank runs on one worker in turn; dearest first: the multi-rank runs, files with a ``slow``
    test, then by tier and rank count."""
    unit_of, cost = {}, {}
    for item in items:
        folder = _tier(item)
        if folder is None:
            OUTSIDE.add(item.nodeid)
            folder = "unit"
        item.add_marker(getattr(pytest.mark, folder))
        unit = item.nodeid
        if item.path.name in SPREAD_FILES and _nranks(item) > 1:
            unit = SERIAL_MPI_GROUP
            item.add_marker(pytest.mark.xdist_group(unit))
        elif item.path.name not in SPREAD_FILES:
            unit = WORKER_GROUPS.get(item.path.name, item.path.name)
            item.add_marker(pytest.mark.xdist_group(unit))
        unit_of[item] = unit
        slow = 0 if item.get_closest_marker("slow") else 1
        cost[unit] = min(cost.get(unit, (1, 9, 0)), (slow, _TIER_ORDER[folder], -_nranks(item)))
    cost[SERIAL_MPI_GROUP] = (-1, 0, 0)  # the longest unit: handed out first
    first = {}
    for index, item in enumerate(items):
        first.setdefault(unit_of[item], index)
    items.sort(key=lambda item: (cost[unit_of[item]], first[unit_of[item]], -_nranks(item)))


def _collect_and_freeze():
    """Collect, then freeze what is alive (imports, fixtures, earlier tests' survivors): every full
    collection a test's runs make (each session ends with one) then scans only the objects made since,
    not this process's whole heap (30-100 ms a collection, half the CPU time of the second-order and
    inversion modules)."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before a test's fixtures: a module fixture's shared runs (an inversion, a reference) are
    sessions too."""
    _collect_and_freeze()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    """Before a test's body, with what its fixtures made frozen as well."""
    _collect_and_freeze()


#: what a unit-tier test may not launch: MPI jobs, the hpcadj command, Python, shells
_LAUNCHERS = re.compile(r"(mpirun|mpiexec|srun|sbatch|hpcadj|python[\d.]*|bash|sh)")
_Popen = subprocess.Popen


class _NoLaunch(_Popen):
    """Popen that refuses the tier's launchers (a library's own probe, such as ldconfig, still runs)."""

    def __init__(self, args, *rest, **kw):
        argv0 = args if isinstance(args, (str, bytes, os.PathLike)) else args[0]
        if _LAUNCHERS.fullmatch(os.path.basename(os.fsdecode(argv0)).split()[0]):
            raise AssertionError(f"a unit-tier test started {args!r}: mark it cli or mpi")
        super().__init__(args, *rest, **kw)


@pytest.fixture(autouse=True)
def _in_a_tier_folder(request):
    """A test file directly in tests/ has no tier: it fails until moved to its tier's folder."""
    if request.node.nodeid in OUTSIDE:
        pytest.fail(f"{request.node.path.name} is outside tests/{{unit,cli,mpi,cluster}}/: move it to its tier's "
                    "folder (docs/testing.md, Tiers)", pytrace=False)


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(request, monkeypatch):
    """Keep tests/unit honest: the tier that ``make test-fast`` runs starts no process."""
    if request.node.get_closest_marker("unit"):
        monkeypatch.setattr(subprocess, "Popen", _NoLaunch)
    yield


@pytest.fixture(scope="session")
def restart_costs(tmp_path_factory):
    """``["--costs", path]`` of RESTART_PROFILE written once for the session."""
    path = tmp_path_factory.mktemp("costs") / "profile.json"
    path.write_text(json.dumps(RESTART_PROFILE))
    return ["--costs", str(path)]


@pytest.fixture(scope="session")
def restart_reference(tmp_path_factory, restart_costs):
    """(run --json object, gradients) of the uninterrupted, uncompressed restart run on 2 ranks, the
    gradient every killed-and-resumed run of tests/test_restart*.py and test_compression_restart.py
    must reproduce bitwise."""
    tmp = tmp_path_factory.mktemp("ref")
    info = hpcadj_json([*RESTART_BASE, *restart_costs, *RESTART_LEVELS, "--pfs-file", str(tmp / "ck.h5"),
                        "--local-dir", str(tmp), "--gradient-out", str(tmp / "ref.h5")], 2, timeout=240)
    return info, read_gradients(tmp / "ref.h5")
