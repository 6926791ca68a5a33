"""Run logs from every rank: Telemetry + RunLog under mpirun, one energy reader per node, analyze."""

import os

import pytest

from hpcadj.telemetry import EnergyMeter, Telemetry, open_run_log
from hpcadj.telemetry.analyze import analyse_run, load_run
from hpcadj.telemetry.energy_model import EnergyModel
from hpcadj.telemetry.jsonlog import LogDirError

MODEL = EnergyModel(watts_per_core=10.0, joules_per_byte_write={"ram": 1e-9}, joules_per_byte_read={"ram": 1e-9})


def fake_powercap(comm, root, energy_uj):
    """Rank 0 lays out (or updates) one package zone; every rank waits for it."""
    if comm.rank == 0:
        zone = os.path.join(root, "intel-rapl:0")
        os.makedirs(zone, exist_ok=True)
        for name, value in (("name", "package-0"), ("max_energy_range_uj", 1_000_000),
                            ("energy_uj", energy_uj)):
            with open(os.path.join(zone, name + ".tmp"), "w") as fh:
                fh.write(f"{value}\n")
            os.replace(os.path.join(zone, name + ".tmp"), os.path.join(zone, name))
    comm.Barrier()


def test_every_rank_logs_and_rank0_summarises(comm, shared_tmp):
    root = os.path.join(shared_tmp, "powercap")
    fake_powercap(comm, root, 990_000)
    meter = EnergyMeter(comm, root, nvml=False, interval_s=None)
    hosts = set(comm.allgather(os.uname().nodename))
    assert comm.allreduce(int(meter.is_reader)) == len(hosts)
    log_dir = os.path.join(shared_tmp, "run")
    log = open_run_log(log_dir, comm, {"steps": 6, "schedule": "revolve", "snapshot_bytes": 800},
                       meter=meter, energy_model=MODEL)
    tel = Telemetry(sinks=[log])
    for i in range(6):
        tel.record("forward", t0=0.0, seconds=0.25 * (comm.rank + 1), step=i, steps=1)
    tel.record("recompute", t0=0.0, seconds=0.5, step=0, steps=3)
    tel.record("store", t0=0.0, seconds=0.125, step=0, nbytes=1000 * (comm.rank + 1), level="ram")
    with tel.phase("adjoint", step=5, steps=1):
        pass
    comm.Barrier()
    fake_powercap(comm, root, 4_000)                      # wrapped: 10_000 + 4_000 uJ, counted once
    summary = log.close({"levels": {"ram": {"kind": "ram", "peak_slots": 2}}})
    assert comm.allgather(summary["run_id"]) == [summary["run_id"]] * comm.size
    assert summary["energy"]["total"] == {"source": "rapl", "joules": pytest.approx(0.014)}
    if comm.rank == 0:
        assert set(os.listdir(log_dir)) == {"run.json", "summary.json",
                                            *[f"rank{r:05d}.jsonl" for r in range(comm.size)]}
        run = load_run(log_dir)
        assert run.problems == []
        assert run.ranks == comm.size and sorted(run.events) == list(range(comm.size))
        result = analyse_run(run, MODEL)
        rows = {(p["phase"], p["level"]): p for p in result["phases"]}
        size = comm.size
        assert rows[("forward", None)]["seconds_sum"] == pytest.approx(6 * 0.25 * size * (size + 1) / 2)
        assert rows[("forward", None)]["seconds_max"] == pytest.approx(6 * 0.25 * size)
        assert rows[("store", "ram")]["bytes"] == 1000 * size * (size + 1) // 2
        assert rows[("adjoint", None)]["count"] == size
        assert result["recompute_factor"] == pytest.approx((6 + 3) / 6)
        assert result["energy"]["source"] == "rapl"
        assert {e["host"] for evs in run.events.values() for e in evs} == hosts


def test_unusable_log_dir_fails_on_every_rank(comm, shared_tmp):
    blocker = os.path.join(shared_tmp, "blocker")
    if comm.rank == 0:
        with open(blocker, "w") as fh:
            fh.write("a file, not a directory")
    comm.Barrier()
    with pytest.raises(LogDirError, match="not a directory"):
        open_run_log(blocker, comm, {}, meter=None)
    comm.Barrier()
