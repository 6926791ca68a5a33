"""Logs written by the real Telemetry + RunLog with a fake clock, for ``hpcadj analyze``'s tests
(tests/unit/test_analyze.py the analysis, tests/cli/test_cli_analyze.py the command), and their
fixtures ``sweep``, ``one_run`` and ``mixed``, imported by both.

The clock makes every phase take the seconds given, so wall times and modeled energies below are
computed by hand. Four runs of n = 20 steps (forward step 0.1 s, adjoint step 0.2 s, 0.5 s set-up),
snapshots of 1 MB, one rank, model: 10 W per core, RAM 1e-9 J/B, PFS 1e-7 J/B:

- ``ram-all``:  21 RAM stores (0.01 s), 20 restores (0.01 s): wall 6.91 s, 69.1 J + 41e6 B x 1e-9 J/B
- ``pfs-all``:  21 PFS stores (0.002 s, async), 20 restores (0.004 s): wall 6.622 s, 66.22 J + 4.1 J
- ``revolve-4``: 4 RAM slots, 30 recomputed steps, 8 stores, 12 restores: wall 9.7 s, 97 J + 0.02 J
- ``revolve-4-slow``: as revolve-4 with 40 recomputed steps: wall 10.7 s — dominated by revolve-4.

So pfs-all is time-optimal, ram-all energy-optimal, and all but revolve-4-slow Pareto-optimal.
"""

import json
import shutil
import time as real_time

import pytest

from hpcadj.telemetry import Telemetry, jsonlog, open_run_log
from hpcadj.telemetry.energy_model import EnergyModel

SNAP = 1_000_000

MODEL = EnergyModel(watts_per_core=10.0, joules_per_byte_write={"ram": 1e-9, "pfs": 1e-7},
                    joules_per_byte_read={"ram": 1e-9, "pfs": 1e-7})

MODEL_TOML = ("watts_per_core = 10.0\n[joules_per_byte_write]\nram = 1e-9\npfs = 1e-7\n"
              "[joules_per_byte_read]\nram = 1e-9\npfs = 1e-7\n")


class FakeTime:
    """Stands in for the ``time`` module inside jsonlog: a clock the simulation advances."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        return self.now

    def time(self):
        return 1.7e9 + self.now

    strftime = staticmethod(real_time.strftime)


def simulate(path, clock, label, *, level, store_s, restore_s, slots, recompute, stores, restores):
    """One run: set-up, forward sweep storing ``stores`` snapshots, reverse sweep with recomputation."""
    record = {"label": label, "model": "heat", "grid": "64x64", "steps": 20, "schedule": label,
              "levels": [{"name": level, "kind": level, "capacity": slots}], "snapshot_bytes": SNAP}
    log = open_run_log(path, None, record, meter=None, energy_model=MODEL)
    tel = Telemetry(sinks=[log], petsc_events=False)

    def phase(name, seconds, **kw):
        tel.record(name, t0=clock.time(), seconds=seconds, **kw)
        clock.now += seconds

    clock.now += 0.5
    for i in range(20):
        phase("forward", 0.1, step=i, steps=1)
    for i in range(stores):
        phase("store", store_s, step=i, nbytes=SNAP, level=level)
    for i in range(recompute):
        phase("recompute", 0.1, step=i, steps=1)
    for i in range(restores):
        phase("restore", restore_s, step=i, nbytes=SNAP, level=level)
    for i in reversed(range(20)):
        phase("adjoint", 0.2, step=i, steps=1)
    log.close({"levels": {level: {"kind": level, "peak_slots": slots}}})


RUNS = {
    "ram-all": dict(level="ram", store_s=0.01, restore_s=0.01, slots=21, recompute=0, stores=21, restores=20),
    "pfs-all": dict(level="pfs", store_s=0.002, restore_s=0.004, slots=21, recompute=0, stores=21, restores=20),
    "revolve-4": dict(level="ram", store_s=0.01, restore_s=0.01, slots=4, recompute=30, stores=8, restores=12),
    "revolve-4-slow": dict(level="ram", store_s=0.01, restore_s=0.01, slots=4, recompute=40, stores=8,
                           restores=12),
}


def by_label(results):
    return {r["label"]: r for r in results}


def partial_run(path, clock, label, *, forward=20, recompute=0, adjoint=20, end="close", resumed=False,
                overwrite=False, levels=True):
    """A RAM run cheaper than every complete one in the sweep (0.5 s set-up, few steps)."""
    record = {"label": label, "model": "heat", "grid": "64x64", "steps": 20, "schedule": "revolve",
              "levels": [{"name": "ram", "kind": "ram", "capacity": 4}], "snapshot_bytes": SNAP,
              "resumed": resumed}
    log = open_run_log(path, None, record, meter=None, energy_model=MODEL, overwrite=overwrite)
    tel = Telemetry(sinks=[log], petsc_events=False)
    clock.now += 0.5
    for kind, count, seconds in (("forward", forward, 0.01), ("recompute", recompute, 0.01),
                                 ("adjoint", adjoint, 0.02)):
        for i in range(count):
            tel.record(kind, t0=clock.time(), seconds=seconds, step=i, steps=1)
            clock.now += seconds
    result = {"levels": {"ram": {"kind": "ram", "peak_slots": 1}}} if levels else {}
    if end == "close":
        log.close(result)
    elif end in ("stopped", "failed"):
        log.close({"status": end})
    elif end == "abort":
        log.abort("LevelError: ram: all 4 slots are full")
    return log


def write_sweep(root):
    """The four complete runs of the module docstring, one directory each under ``root``."""
    clock = FakeTime()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jsonlog, "time", clock)
        for label, kw in RUNS.items():
            clock.now = 0.0
            simulate(root / label, clock, label, **kw)
    return root


@pytest.fixture(scope="module", name="sweep")
def sweep_fixture(tmp_path_factory):
    """The four runs of the module docstring, written once for a test module."""
    return write_sweep(tmp_path_factory.mktemp("sweep"))


@pytest.fixture(name="one_run")
def one_run_fixture(sweep, tmp_path):
    """A copy of ``ram-all`` a test may damage."""
    target = tmp_path / "ram-all"
    shutil.copytree(sweep / "ram-all", target)
    return target


def write_mixed(sweep, root):
    """The complete sweep plus a resumed fragment (over the stopped part before it), a run missing a
    rank's log, a failed (aborted) run, a stopped run and a killed one (no end record)."""
    for label in RUNS:
        shutil.copytree(sweep / label, root / label)
    clock = FakeTime()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jsonlog, "time", clock)
        first = partial_run(root / "fragment", clock, "fragment", adjoint=12, end="stopped")
        clock.now = 0.0
        partial_run(root / "fragment", clock, "fragment", forward=0, recompute=3, adjoint=8,
                    resumed=True, overwrite=True)
        clock.now = 0.0
        partial_run(root / "half-ranks", clock, "half-ranks")
        clock.now = 0.0
        partial_run(root / "failed", clock, "failed", adjoint=5, end="abort")
        clock.now = 0.0
        partial_run(root / "stopped", clock, "stopped", adjoint=5, end="stopped")
        clock.now = 0.0
        partial_run(root / "killed", clock, "killed")
    # half-ranks: a 2-rank run whose rank 1 log was lost (its totals hold half the phases)
    for name in ("run.json", "summary.json"):
        data = json.loads((root / "half-ranks" / name).read_text())
        data["ranks"] = 2
        (root / "half-ranks" / name).write_text(json.dumps(data))
    # killed: the end record and the summary never written
    rank0 = root / "killed" / "rank00000.jsonl"
    rank0.write_text("".join(rank0.read_text().splitlines(keepends=True)[:-1]))
    (root / "killed" / "summary.json").unlink()
    return root, first.run_id


@pytest.fixture(scope="module", name="mixed")
def mixed_fixture(sweep, tmp_path_factory):
    """The complete sweep plus a resumed fragment, a run missing a rank's log, a failed, a stopped and a
    killed run (:func:`write_mixed`)."""
    return write_mixed(sweep, tmp_path_factory.mktemp("mixed"))
