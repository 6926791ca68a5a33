"""RAPL reader on a fake powercap tree, NVML with a stand-in module, sacct parsing, the energy model."""

import os
import subprocess
import time

import pytest

from hpcadj.telemetry import energy
from hpcadj.telemetry.energy import EnergyMeter, NvmlReader, RaplReader, combine_nodes, rapl_delta_uj, sacct_energy
from hpcadj.telemetry.energy_model import (EnergyModel, EnergyModelError, best_energy, level_kind_map,
                                           load_model, model_run_energy)


def put(path, text):
    """Write a sysfs-like file atomically (a reader thread must never see half a number)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        fh.write(f"{text}\n")
    os.replace(tmp, path)


def zone(root, rel, name, energy_uj=None, max_uj=1_000_000):
    path = os.path.join(root, rel)
    os.makedirs(path, exist_ok=True)
    put(os.path.join(path, "name"), name)
    if energy_uj is not None:
        put(os.path.join(path, "energy_uj"), energy_uj)
        put(os.path.join(path, "max_energy_range_uj"), max_uj)
    return path


@pytest.fixture
def powercap(tmp_path):
    """Two packages (dram only under package 0), a core subzone, an mmio duplicate, sysfs-style links."""
    root = str(tmp_path / "powercap")
    os.makedirs(os.path.join(root, "intel-rapl"))
    put(os.path.join(root, "intel-rapl", "enabled"), 1)
    p0 = zone(root, "intel-rapl:0", "package-0", 999_000)
    zone(root, "intel-rapl:0/intel-rapl:0:0", "core", 5)
    d0 = zone(root, "intel-rapl:0/intel-rapl:0:1", "dram", 50)
    os.symlink(os.path.join(root, "intel-rapl:0/intel-rapl:0:1"), os.path.join(root, "intel-rapl:0:1"))
    p1 = zone(root, "intel-rapl:1", "package-1", 100)
    zone(root, "intel-rapl-mmio:0", "package-0", 7)
    return {"root": root, "package-0": p0, "dram-0": d0, "package-1": p1}


def test_wraparound_delta():
    assert rapl_delta_uj(100, 350, 1000) == 250
    assert rapl_delta_uj(900, 100, 1000) == 200
    assert rapl_delta_uj(5, 5, 1000) == 0


def test_reader_finds_package_and_dram_zones_only(powercap):
    reader = RaplReader(powercap["root"])
    assert sorted(z.label for z in reader.zones) == ["dram-0", "package-0", "package-1"]
    assert reader.read()["package-0"] == (999_000, 1_000_000)
    assert reader.problems == []


def test_meter_wraparound_between_readings_and_missing_dram(powercap):
    meter = EnergyMeter(None, powercap["root"], nvml=False, interval_s=None)
    meter.start()
    put(os.path.join(powercap["package-0"], "energy_uj"), 500)       # wrapped: 1000 + 500 uJ
    put(os.path.join(powercap["package-1"], "energy_uj"), 2_100)     # 2000 uJ
    put(os.path.join(powercap["dram-0"], "energy_uj"), 350)          # 300 uJ
    result = meter.stop()["rapl"]
    assert result["source"] == "rapl"
    assert result["joules"] == pytest.approx(3800e-6)
    assert result["domains"] == {"package": pytest.approx(3500e-6), "dram": pytest.approx(300e-6)}
    assert "dram-1" not in next(iter(result["nodes"].values()))


def test_sampling_catches_two_wraps(powercap):
    """Sampled often enough, a counter that wraps twice between start and stop is still right."""
    meter = EnergyMeter(None, powercap["root"], nvml=False, interval_s=None)
    meter.start()
    p0 = os.path.join(powercap["package-0"], "energy_uj")
    for value in (600_000, 100, 950_000, 50):   # +601_000, +400_100, +949_900, +50_050
        put(p0, value)
        meter._rapl.sample()
    zones = meter.stop()["rapl"]["nodes"]
    assert next(iter(zones.values()))["package-0"] == pytest.approx(2_001_050e-6)


def test_sampling_thread_runs(powercap):
    meter = EnergyMeter(None, powercap["root"], nvml=False, interval_s=0.01)
    meter.start()
    p0 = os.path.join(powercap["package-0"], "energy_uj")
    put(p0, 10)             # wraps: +1010
    time.sleep(0.2)
    put(p0, 999_990)        # +999_980, seen by the thread before ...
    time.sleep(0.2)
    put(p0, 20)             # ... this second wrap (+30)
    zones = meter.stop()["rapl"]["nodes"]
    assert next(iter(zones.values()))["package-0"] == pytest.approx(1_001_020e-6)


def test_unreadable_package_makes_rapl_unavailable_never_zero(powercap, monkeypatch):
    """energy_uj is root-only on most kernels since 2020: reading it raises EACCES."""
    target = os.path.join(powercap["package-1"], "energy_uj")
    real_open = open

    def guarded_open(path, *args, **kwargs):
        if os.fspath(path) == target:
            raise PermissionError(13, "Permission denied", target)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(energy, "open", guarded_open, raising=False)
    meter = EnergyMeter(None, powercap["root"], nvml=False, interval_s=None)
    meter.start()
    result = meter.stop()["rapl"]
    assert result["source"] == "unavailable"
    assert result["joules"] is None
    assert "Permission denied" in result["reason"]


def test_unreadable_dram_is_left_out_and_said(powercap):
    os.unlink(os.path.join(powercap["dram-0"], "energy_uj"))
    meter = EnergyMeter(None, powercap["root"], nvml=False, interval_s=None)
    meter.start()
    put(os.path.join(powercap["package-1"], "energy_uj"), 400)
    result = meter.stop()["rapl"]
    assert result["source"] == "rapl"
    assert result["joules"] == pytest.approx(300e-6)
    assert "dram-0" in result["note"]


def test_no_powercap_directory(tmp_path):
    meter = EnergyMeter(None, str(tmp_path / "absent"), nvml=False, interval_s=None)
    meter.start()
    result = meter.stop()["rapl"]
    assert result == {"source": "unavailable", "joules": None, "counter": "rapl",
                      "reason": result["reason"]}
    assert str(tmp_path / "absent") in result["reason"]


def test_partial_nodes_never_summed():
    nodes = [{"host": "a", "rapl": {"zones": {"package-0": 10.0}, "problems": []}},
             {"host": "b", "rapl": {"zones": {}, "problems": ["no powercap directory /x"]}}]
    result = combine_nodes(nodes)["rapl"]
    assert result["source"] == "unavailable" and result["joules"] is None
    assert "b: no powercap directory /x" in result["reason"]


class FakeNvml:
    """Stand-in for pynvml: GPU energies in millijoules, GPU 1 optionally not supporting the query."""

    def __init__(self, energies, unsupported=()):
        self.energies = energies
        self.unsupported = set(unsupported)

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.energies)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if handle in self.unsupported:
            raise RuntimeError("Not Supported")
        return self.energies[handle]


def test_nvml_energy_per_gpu(tmp_path):
    fake = FakeNvml([1_000, 5_000])
    meter = EnergyMeter(None, str(tmp_path), nvml=NvmlReader(fake), interval_s=None)
    meter.start()
    fake.energies[:] = [4_500, 6_000]
    result = meter.stop()["nvml"]
    assert result["source"] == "nvml"
    assert result["joules"] == pytest.approx(4.5)


def test_nvml_unsupported_is_unavailable(tmp_path):
    meter = EnergyMeter(None, str(tmp_path), nvml=NvmlReader(FakeNvml([1, 2], unsupported=[1])),
                        interval_s=None)
    meter.start()
    result = meter.stop()["nvml"]
    assert result["source"] == "unavailable" and "Not Supported" in result["reason"]


def sacct_runner(stdout, rc=0, stderr=""):
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, rc, stdout, stderr)

    run.calls = calls
    return run


def test_sacct_job_and_step():
    out = "4242|91234\n4242.batch|90000\n4242.extern|91234\n4242.0|85000\n"
    runner = sacct_runner(out)
    assert sacct_energy("4242", runner=runner) == {"source": "slurm", "joules": 91234.0, "job": "4242"}
    assert "--format=JobID,ConsumedEnergyRaw" in runner.calls[0]
    assert sacct_energy("4242", "0", runner=runner)["joules"] == 85000.0


@pytest.mark.parametrize("raw", ["", "0", "18446744073709551614"])
def test_sacct_no_energy_is_unavailable(raw):
    result = sacct_energy("7", runner=sacct_runner(f"7|{raw}\n"))
    assert result["source"] == "unavailable" and result["joules"] is None


def test_sacct_errors():
    assert "exit 1" in sacct_energy("7", runner=sacct_runner("", 1, "sacct: error: no db"))["reason"]
    assert "no record" in sacct_energy("8", runner=sacct_runner("7|100\n"))["reason"]
    assert "not found" in sacct_energy("7", sacct="/nonexistent/sacct")["reason"]


def test_model_formulas():
    model = EnergyModel(watts_per_core=10.0, joules_per_byte_write={"ram": 1e-9, "pfs": 1e-6},
                        joules_per_byte_read={"ram": 2e-9, "pfs": 5e-7})
    assert model.forward_step_joules(0.5, 4) == pytest.approx(20.0)
    assert model.adjoint_step_joules(0.25, 4) == pytest.approx(10.0)
    assert model.write_joules("pfs", 1_000_000, 0.1, 2) == pytest.approx(2.0 + 1.0)
    assert model.read_joules("ram", 1_000_000, 0.1, 2) == pytest.approx(2.0 + 0.002)
    with pytest.raises(KeyError):
        model.write_joules("tape", 1, 0.0, 1)


def test_model_overrides_from_toml(tmp_path, monkeypatch):
    path = tmp_path / "model.toml"
    path.write_text("watts_per_core = 5.5\n[joules_per_byte_write]\npfs = 4e-8\nnvme = 1e-9\n")
    model = load_model(path)
    assert model.watts_per_core == 5.5
    assert model.joules_per_byte_write["pfs"] == 4e-8
    assert model.joules_per_byte_write["nvme"] == 1e-9
    assert model.joules_per_byte_read == load_model(None).joules_per_byte_read
    monkeypatch.setenv("HPCADJ_ENERGY_MODEL", str(path))
    assert load_model().origin == str(path)


@pytest.mark.parametrize("text, message", [("watt_per_core = 1\n", "unknown key"),
                                           ("watts_per_core = -1\n", ">= 0"),
                                           ("watts_per_core = \n", "not valid TOML"),
                                           ("joules_per_byte_read = 3\n", "table")])
def test_model_bad_files(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(EnergyModelError, match=message):
        load_model(path)
    with pytest.raises(EnergyModelError, match="cannot read"):
        load_model(tmp_path / "absent.toml")


def test_run_energy_from_phase_totals():
    model = EnergyModel(watts_per_core=10.0, joules_per_byte_write={"ram": 1e-9},
                        joules_per_byte_read={"ram": 1e-9})
    kinds = level_kind_map([{"name": "fast", "kind": "ram"}, {"name": "odd", "kind": "tape"}])
    phases = [{"phase": "forward", "level": None, "seconds_sum": 3.0, "bytes": 0},
              {"phase": "store", "level": "fast", "seconds_sum": 0.5, "bytes": 2_000_000_000},
              {"phase": "store", "level": "odd", "seconds_sum": 1.0, "bytes": 10}]
    figure = model_run_energy(phases, 0.2, kinds, model)
    assert figure["source"] == "model"
    assert [r["joules"] for r in figure["by_phase"]] == pytest.approx([30.0, 5.0 + 2.0, 10.0, 2.0])
    assert figure["joules"] == pytest.approx(49.0)
    assert "10 bytes of store on level 'odd'" in figure["note"]
    assert best_energy({}, figure) == {"source": "model", "joules": pytest.approx(49.0)}
    rapl = {"rapl": {"source": "rapl", "joules": 40.0},
            "nvml": {"source": "unavailable", "joules": None, "reason": "no GPU query"}}
    assert best_energy(rapl, figure)["source"] == "rapl"
