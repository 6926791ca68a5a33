"""Energy counters: Linux powercap RAPL, NVIDIA NVML (optional), SLURM accounting (``sacct``).

Every figure is a dict with ``source`` (``rapl``, ``nvml``, ``slurm``) and ``joules``; a counter that
cannot be read gives ``{"source": "unavailable", "joules": None, "counter": ..., "reason": ...}`` —
never 0 joules. RAPL and NVML count the whole node (other processes included), so one rank per node
reads them (:class:`EnergyMeter` elects it with ``Split_type(COMM_TYPE_SHARED)``).

RAPL layout (Documentation/ABI/testing/sysfs-class-powercap): zones ``<root>/intel-rapl:P`` (name
``package-P``) with subzones ``intel-rapl:P:S`` (names ``core``, ``uncore``, ``dram``); each has
``energy_uj`` (a counter in microjoules that wraps back to 0 after ``max_energy_range_uj``). We read
``package-*`` and ``dram`` zones only: ``core``/``uncore`` are parts of the package, ``psys`` overlaps
it, and ``intel-rapl-mmio`` zones duplicate the MSR package counters.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass
from ..imports import mpi

DEFAULT_POWERCAP_ROOT = "/sys/class/powercap"
#: how often the node's reader samples RAPL so that a counter cannot wrap twice between samples
#: (a 32-bit package counter at 61 uJ/unit spans ~262 kJ: ~11 min at 400 W).
DEFAULT_INTERVAL_S = 30.0
#: sacct prints values at or above this for "no value" (Slurm's NO_VAL64 and friends).
_SLURM_NO_VAL = 2 ** 63


def unavailable(counter: str, reason: str) -> dict:
    """The figure for a counter that could not be read: no joules, and why."""
    return {"source": "unavailable", "joules": None, "counter": counter, "reason": reason}


def rapl_delta_uj(before: int, after: int, max_range_uj: int) -> int:
    """Microjoules counted from ``before`` to ``after``, the counter wrapping once at ``max_range_uj``."""
    if after >= before:
        return after - before
    return after + max_range_uj - before


@dataclass(frozen=True)
class RaplZone:
    """A package or dram zone: ``label`` (``package-0``, ``dram-0``), ``kind`` and its sysfs dir."""

    label: str
    kind: str
    path: str


def _read_text(path: str) -> str:
    with open(path) as fh:
        return fh.read().strip()


def _read_int(path: str) -> int:
    return int(_read_text(path))


class RaplReader:
    """Reads the package and dram RAPL zones under a powercap root (a parameter, for tests)."""

    _ZONE = re.compile(r"^[a-z-]*rapl:(\d+)(?::(\d+))?$")

    def __init__(self, root: str = DEFAULT_POWERCAP_ROOT):
        self.root = str(root)
        self.zones, self.problems = self._discover()

    def _discover(self) -> tuple[list[RaplZone], list[str]]:
        zones: list[RaplZone] = []
        problems: list[str] = []
        seen: set[str] = set()
        if not os.path.isdir(self.root):
            return zones, [f"no powercap directory {self.root}"]
        stack = [self.root]
        while stack:
            parent = stack.pop()
            try:
                entries = sorted(os.listdir(parent))
            except OSError as exc:
                problems.append(f"cannot list {parent}: {exc.strerror}")
                continue
            for entry in entries:
                match = self._ZONE.match(entry)
                path = os.path.join(parent, entry)
                if match is None or "mmio" in entry or not os.path.isdir(path):
                    continue
                real = os.path.realpath(path)
                if real in seen:
                    continue
                seen.add(real)
                stack.append(path)
                try:
                    name = _read_text(os.path.join(path, "name"))
                except OSError as exc:
                    problems.append(f"{entry}/name: {exc.strerror}")
                    continue
                if name.startswith("package"):
                    zones.append(RaplZone(name, "package", path))
                elif name == "dram":
                    zones.append(RaplZone(f"dram-{match.group(1)}", "dram", path))
        zones.sort(key=lambda z: (z.kind != "package", z.label))
        if not any(z.kind == "package" for z in zones):
            problems.append(f"no RAPL package zone under {self.root}")
        return zones, problems

    def read(self) -> dict[str, tuple[int, int] | str]:
        """``{label: (energy_uj, max_energy_range_uj)}``, or ``{label: reason}`` for an unreadable zone."""
        out: dict[str, tuple[int, int] | str] = {}
        for zone in self.zones:
            try:
                out[zone.label] = (_read_int(os.path.join(zone.path, "energy_uj")),
                                   _read_int(os.path.join(zone.path, "max_energy_range_uj")))
            except OSError as exc:
                out[zone.label] = f"{zone.label}: {exc.strerror or exc}"
            except ValueError:
                out[zone.label] = f"{zone.label}: energy_uj or max_energy_range_uj is not an integer"
        return out


class RaplAccumulator:
    """Sums each zone's counter increments between successive samples (wraparound handled)."""

    def __init__(self, reader: RaplReader):
        self.reader = reader
        self._last: dict[str, tuple[int, int]] = {}
        self.total_uj: dict[str, int] = {}
        self.failed: dict[str, str] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            self._last.clear()
            self.total_uj.clear()
            self.failed.clear()
            for label, value in self.reader.read().items():
                if isinstance(value, str):
                    self.failed[label] = value
                else:
                    self._last[label] = value
                    self.total_uj[label] = 0

    def sample(self) -> None:
        with self._lock:
            now = self.reader.read()
            for label, last in list(self._last.items()):
                value = now.get(label, f"{label}: zone disappeared")
                if isinstance(value, str):
                    self.failed[label] = value
                    del self._last[label]
                    del self.total_uj[label]
                    continue
                self.total_uj[label] += rapl_delta_uj(last[0], value[0], value[1])
                self._last[label] = value

    def result(self) -> dict:
        """This node's figure: ``{label: joules}`` for readable zones, ``{label: reason}`` for the rest."""
        zones: dict[str, float | str] = {label: uj / 1e6 for label, uj in self.total_uj.items()}
        zones.update(self.failed)
        return {"zones": zones, "problems": list(self.reader.problems)}


class NvmlReader:
    """Total GPU energy (``nvmlDeviceGetTotalEnergyConsumption``, millijoules) of this node's GPUs.

    ``nvml`` is the ``pynvml`` module (optional dependency ``nvidia-ml-py``) or a stand-in for tests.
    """

    def __init__(self, nvml=None):
        if nvml is None:
            import pynvml as nvml  # an optional dependency
        self.nvml = nvml
        nvml.nvmlInit()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    def read(self) -> dict[str, int | str]:
        out: dict[str, int | str] = {}
        for i, handle in enumerate(self.handles):
            try:
                out[f"gpu-{i}"] = int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
            except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported and friends
                out[f"gpu-{i}"] = f"gpu-{i}: {exc}"
        return out


def _try_nvml():
    try:
        reader = NvmlReader()
    except Exception:  # noqa: BLE001 - no pynvml, no driver, no GPU: no NVML figure at all
        return None
    return reader if reader.handles else None


class EnergyMeter:
    """Measures the job's energy from RAPL (and NVML) between :meth:`start` and :meth:`stop`.

    Collective over ``comm`` (an mpi4py communicator, or None for one process): one rank per node
    (rank 0 of ``comm.Split_type(COMM_TYPE_SHARED)``) reads that node's counters and samples them
    every ``interval_s`` on a thread (None: only at start and stop); :meth:`stop` combines the
    nodes and returns the same dict on every rank: ``{"rapl": figure, "nvml": figure}`` (``nvml``
    only where a node has GPUs).
    """

    def __init__(self, comm=None, powercap_root: str = DEFAULT_POWERCAP_ROOT, *, nvml=True,
                 interval_s: float | None = DEFAULT_INTERVAL_S):
        self.comm = comm
        if comm is not None:
            self.node_comm = comm.Split_type(mpi().COMM_TYPE_SHARED, key=comm.rank)
            self.is_reader = self.node_comm.rank == 0
        else:
            self.node_comm = None
            self.is_reader = True
        self.host = socket.gethostname()
        self.interval_s = interval_s
        self._rapl = RaplAccumulator(RaplReader(powercap_root)) if self.is_reader else None
        if self.is_reader and nvml:
            self._nvml = nvml if isinstance(nvml, NvmlReader) else _try_nvml()
        else:
            self._nvml = None
        self._nvml_start: dict[str, int | str] = {}
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Take the first reading (node readers only; no communication)."""
        if not self.is_reader:
            return
        self._rapl.start()
        if self._nvml is not None:
            self._nvml_start = self._nvml.read()
        if self.interval_s and self._rapl.total_uj:
            self._stop_event.clear()
            self._thread = threading.Thread(target=self._sample_loop, name="hpcadj-rapl", daemon=True)
            self._thread.start()

    def _sample_loop(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self._rapl.sample()

    def _node_result(self) -> dict:
        if self._thread is not None:
            self._stop_event.set()
            self._thread.join()
            self._thread = None
        self._rapl.sample()
        result = {"host": self.host, "rapl": self._rapl.result()}
        if self._nvml is not None:
            now = self._nvml.read()
            gpus: dict[str, float | str] = {}
            for gpu, before in self._nvml_start.items():
                after = now.get(gpu, f"{gpu}: disappeared")
                if isinstance(before, str):
                    gpus[gpu] = before
                elif isinstance(after, str):
                    gpus[gpu] = after
                else:
                    gpus[gpu] = (after - before) / 1e3
            result["nvml"] = gpus
        return result

    def stop(self) -> dict:
        """Final reading; collective: every rank gets the combined figures of all nodes."""
        mine = self._node_result() if self.is_reader else None
        nodes = [mine] if self.comm is None else self.comm.allgather(mine)
        return combine_nodes([n for n in nodes if n is not None])


def combine_nodes(nodes: list[dict]) -> dict:
    """Sum per-node readings into one figure per counter; any node unreadable makes it unavailable.

    A partial sum would understate the job's energy, so it is never given as the total; the
    per-node detail stays in ``nodes``.
    """
    out: dict[str, dict] = {}
    rapl_nodes = {n["host"]: n["rapl"] for n in nodes}
    problems = [f"{host}: {p}" for host, r in rapl_nodes.items() for p in r["problems"]]
    bad = [f"{host}: {v}" for host, r in rapl_nodes.items() for v in r["zones"].values()
           if isinstance(v, str)]
    no_package = [host for host, r in rapl_nodes.items()
                  if not any(k.startswith("package") and not isinstance(v, str) for k, v in r["zones"].items())]
    bad_package = [f"{host}: {v}" for host, r in rapl_nodes.items() for k, v in r["zones"].items()
                   if k.startswith("package") and isinstance(v, str)]
    if no_package or bad_package:
        out["rapl"] = unavailable("rapl", "; ".join(bad_package + problems) or
                                  f"no readable package zone on {', '.join(no_package)}")
    else:
        domains: dict[str, float] = {}
        for r in rapl_nodes.values():
            for label, value in r["zones"].items():
                if not isinstance(value, str):
                    kind = label.split("-")[0]
                    domains[kind] = domains.get(kind, 0.0) + value
        figure = {"source": "rapl", "joules": sum(domains.values()), "domains": domains,
                  "nodes": {h: r["zones"] for h, r in rapl_nodes.items()}}
        notes = []
        if bad:
            notes.append("unreadable zones left out of the total: " + "; ".join(bad))
        elif "dram" not in domains:
            notes.append("no dram zone: the total is package energy only")
        if notes:
            figure["note"] = "; ".join(notes)
        out["rapl"] = figure
    gpu_nodes = {n["host"]: n["nvml"] for n in nodes if "nvml" in n}
    if gpu_nodes:
        bad = [f"{host}: {v}" for host, g in gpu_nodes.items() for v in g.values() if isinstance(v, str)]
        if bad:
            out["nvml"] = unavailable("nvml", "; ".join(bad))
        else:
            out["nvml"] = {"source": "nvml", "joules": sum(v for g in gpu_nodes.values() for v in g.values()),
                           "nodes": gpu_nodes}
    return out


def sacct_energy(job_id: str, step: str | None = None, *, sacct: str = "sacct", runner=subprocess.run,
                 timeout: float = 30.0) -> dict:
    """The job's (or job step's) ``ConsumedEnergyRaw`` from SLURM accounting, in joules.

    Energy accounting must be enabled (``AcctGatherEnergyType``); it is only the job's own energy
    when the nodes were allocated exclusively. Empty, 0 or "no value" readings are ``unavailable``.
    """
    counter = "slurm"
    if runner is subprocess.run and shutil.which(sacct) is None:
        return unavailable(counter, f"{sacct} not found")
    cmd = [sacct, "-j", str(job_id), "--format=JobID,ConsumedEnergyRaw", "--noheader", "--parsable2"]
    try:
        proc = runner(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return unavailable(counter, f"{' '.join(cmd)}: {exc}")
    if proc.returncode != 0:
        first = (proc.stderr or "").strip().splitlines()
        return unavailable(counter, f"sacct exit {proc.returncode}: {first[0] if first else ''}".strip())
    want = f"{job_id}.{step}" if step not in (None, "") else str(job_id)
    for line in proc.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) >= 2 and fields[0] == want:
            raw = fields[1].strip()
            try:
                joules = float(raw)
            except ValueError:
                return unavailable(counter, f"job {want}: ConsumedEnergyRaw is {raw!r} "
                                            "(energy accounting off or job still running)")
            if joules <= 0 or joules >= _SLURM_NO_VAL:
                return unavailable(counter, f"job {want}: ConsumedEnergyRaw is {raw} "
                                            "(energy accounting off or no value)")
            return {"source": "slurm", "joules": joules, "job": want}
    return unavailable(counter, f"sacct has no record of job {want}")
