"""The energy model used where no counter can be read, and by the planner to cost operations.

Every figure it produces is labelled ``source: "model"``. The model is deliberately simple and its
constants are stated, so a user can replace them with calibrated ones (a TOML file passed as
``--energy-model FILE`` or named by ``$HPCADJ_ENERGY_MODEL``):

- **compute**: ``watts_per_core`` joules per core-second. Every second a rank spends (computing,
  waiting for I/O or for other ranks) costs one core that long: the cores are reserved for the job
  and a rank waiting in MPI or on a file still draws power.
- **data movement**: ``joules_per_byte_write[kind]`` / ``joules_per_byte_read[kind]`` *on top of* the
  core-seconds the store/restore phases already cost: the extra energy of the memory, the local
  drive or the network and file servers moving the bytes. ``kind`` is a level kind, as in
  ``checkpoint/storage``: ``ram``, ``local`` (node-local disk) or ``pfs`` (parallel HDF5 on a shared
  file system).

Default constants (order-of-magnitude figures, to be calibrated on the machine at hand):

- ``watts_per_core = 12.0``: a 2-socket server node under load (~ 2 x 200 W package + ~ 60 W DRAM)
  shared by ~ 40 cores, rounded.
- ``ram``: 2e-10 J/B either way — DDR4/DDR5 access energy is ~ 15-25 pJ/bit.
- ``local``: 3e-9 J/B written, 2e-9 J/B read — an NVMe drive drawing ~ 8 W at ~ 3 GB/s writes.
- ``pfs``: 2e-8 J/B written, 1.5e-8 J/B read — interconnect plus storage servers, ~ 10-50 nJ/B
  end to end on Lustre/GPFS-class systems.
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field, replace

from ..levelkinds import STORAGE_KINDS as LEVEL_KINDS

#: the phases of the log schema, in report order. The model costs every phase's seconds as compute;
#: ``store`` and ``restore`` also pay per byte on their level.
PHASES = ("plan", "objective", "forward", "recompute", "adjoint", "store", "restore", "move", "io_wait")

#: environment variable naming a TOML file that overrides the default constants.
ENV_VAR = "HPCADJ_ENERGY_MODEL"

DEFAULTS = {
    "watts_per_core": 12.0,
    "joules_per_byte_write": {"ram": 2e-10, "local": 3e-9, "pfs": 2e-8},
    "joules_per_byte_read": {"ram": 2e-10, "local": 2e-9, "pfs": 1.5e-8},
}


class EnergyModelError(ValueError):
    """A constants file that cannot be read or holds an unknown key or a bad value."""


@dataclass(frozen=True)
class EnergyModel:
    """The model's constants and where they came from (``origin``: "defaults" or a file path)."""

    watts_per_core: float = DEFAULTS["watts_per_core"]
    joules_per_byte_write: dict = field(default_factory=lambda: dict(DEFAULTS["joules_per_byte_write"]))
    joules_per_byte_read: dict = field(default_factory=lambda: dict(DEFAULTS["joules_per_byte_read"]))
    origin: str = "defaults"

    def compute_joules(self, seconds: float, cores: int = 1) -> float:
        """Energy of ``cores`` cores busy for ``seconds`` each."""
        return float(seconds) * int(cores) * self.watts_per_core

    def forward_step_joules(self, seconds_per_step: float, cores: int) -> float:
        """Energy of one forward step taking ``seconds_per_step`` on ``cores`` cores (ranks)."""
        return self.compute_joules(seconds_per_step, cores)

    def adjoint_step_joules(self, seconds_per_step: float, cores: int) -> float:
        """Energy of one adjoint step taking ``seconds_per_step`` on ``cores`` cores (ranks)."""
        return self.compute_joules(seconds_per_step, cores)

    def byte_joules(self, kind: str, nbytes: int, direction: str) -> float:
        """Extra energy to move ``nbytes`` to (``direction="write"``) or from (``"read"``) a ``kind`` level."""
        table = self._table(direction)
        if kind not in table:
            raise KeyError(f"energy model has no {direction} cost for level kind {kind!r} "
                           f"(known: {', '.join(sorted(table))})")
        return float(nbytes) * table[kind]

    def write_joules(self, kind: str, nbytes: int, seconds: float, cores: int) -> float:
        """Energy of writing one snapshot: ``cores`` busy ``seconds`` plus the bytes moved to ``kind``."""
        return self.compute_joules(seconds, cores) + self.byte_joules(kind, nbytes, "write")

    def read_joules(self, kind: str, nbytes: int, seconds: float, cores: int) -> float:
        """Energy of reading one snapshot: ``cores`` busy ``seconds`` plus the bytes moved from ``kind``."""
        return self.compute_joules(seconds, cores) + self.byte_joules(kind, nbytes, "read")

    def phase_joules(self, phase: str, core_seconds: float, nbytes: int = 0,
                     kind: str | None = None) -> float:
        """Energy of a phase that kept cores busy ``core_seconds`` in all and moved ``nbytes``.

        ``store`` moves bytes to its level, ``restore`` from it; other phases are compute only.
        Raises KeyError for bytes on a level of unknown kind (the caller reports it; never 0).
        """
        joules = core_seconds * self.watts_per_core
        if nbytes and phase in ("store", "restore"):
            if kind is None:
                raise KeyError(f"{phase} moved {nbytes} bytes on a level of unknown kind")
            joules += self.byte_joules(kind, nbytes, "write" if phase == "store" else "read")
        return joules

    def as_dict(self) -> dict:
        return {"watts_per_core": self.watts_per_core,
                "joules_per_byte_write": dict(self.joules_per_byte_write),
                "joules_per_byte_read": dict(self.joules_per_byte_read), "origin": self.origin}

    def _table(self, direction: str) -> dict:
        if direction == "write":
            return self.joules_per_byte_write
        if direction == "read":
            return self.joules_per_byte_read
        raise ValueError(f"direction must be 'write' or 'read', got {direction!r}")


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise EnergyModelError(f"{where} must be a finite number >= 0, got {value!r}")
    return float(value)


def load_model(path: str | os.PathLike | None = None) -> EnergyModel:
    """The default model, with overrides from the TOML file ``path`` (else ``$HPCADJ_ENERGY_MODEL``).

    The file holds any of the keys of :data:`DEFAULTS`; per-kind tables may add new level kinds.
    """
    path = path if path is not None else os.environ.get(ENV_VAR) or None
    if path is None:
        return EnergyModel()
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise EnergyModelError(f"cannot read energy model {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise EnergyModelError(f"energy model {path} is not valid TOML: {exc}") from None
    unknown = set(data) - set(DEFAULTS)
    if unknown:
        raise EnergyModelError(f"energy model {path}: unknown key(s) {', '.join(sorted(unknown))} "
                               f"(known: {', '.join(DEFAULTS)})")
    model = EnergyModel(origin=str(path))
    changes = {}
    if "watts_per_core" in data:
        changes["watts_per_core"] = _number(data["watts_per_core"], f"{path}: watts_per_core")
    for key in ("joules_per_byte_write", "joules_per_byte_read"):
        if key in data:
            if not isinstance(data[key], dict):
                raise EnergyModelError(f"{path}: {key} must be a table of level kind = J/B")
            table = dict(getattr(model, key))
            for kind, value in data[key].items():
                table[kind] = _number(value, f"{path}: {key}.{kind}")
            changes[key] = table
    return replace(model, **changes)


def level_kind_map(levels) -> dict:
    """``{level name or index: kind}`` from a run record's ``levels`` list (``[{"name", "kind"}, ...]``)
    or a summary's ``{name: {"kind": ...}}`` mapping; a level named after a kind is that kind."""
    kinds: dict = {kind: kind for kind in LEVEL_KINDS}
    if isinstance(levels, dict):
        levels = [dict(v, name=k) for k, v in levels.items() if isinstance(v, dict)]
    for index, level in enumerate(levels or []):
        if isinstance(level, dict) and level.get("kind"):
            kinds[index] = level["kind"]
            kinds[str(index)] = level["kind"]
            if level.get("name") is not None:
                kinds[level["name"]] = level["kind"]
    return kinds


def model_run_energy(phases, other_core_seconds: float, kinds: dict, model: EnergyModel) -> dict:
    """Modeled energy of a run from its phase totals (summed over ranks: one rank = one core).

    ``phases`` is a list of ``{"phase", "level", "seconds_sum", "bytes"}``; ``other_core_seconds`` is
    the ranks' time outside every phase (set-up, output), costed as compute. Returns a figure with
    ``source: "model"``, ``joules`` and ``by_phase`` rows; bytes on a level of unknown kind are
    left out of the total and named in ``note``.
    """
    rows = []
    uncosted = []
    for row in phases:
        kind = kinds.get(row.get("level"))
        try:
            joules = model.phase_joules(row["phase"], row["seconds_sum"], row.get("bytes", 0), kind)
        except KeyError:
            joules = model.phase_joules(row["phase"], row["seconds_sum"])
            uncosted.append(f"{row.get('bytes', 0)} bytes of {row['phase']} on level {row.get('level')!r}")
        rows.append({"phase": row["phase"], "level": row.get("level"), "joules": joules})
    other = model.compute_joules(max(other_core_seconds, 0.0))
    rows.append({"phase": "other", "level": None, "joules": other})
    figure = {"source": "model", "joules": sum(r["joules"] for r in rows), "by_phase": rows,
              "constants": model.as_dict()}
    if uncosted:
        figure["note"] = "level kind unknown, bytes not costed: " + "; ".join(uncosted)
    return figure


def best_energy(measured: dict | None, model_figure: dict) -> dict:
    """The run's energy figure to report: measured RAPL (+ NVML) when readable, else the model.

    Measured figures never mix with modeled ones: a node without a readable counter makes the
    measurement unavailable and the model is reported, labelled as such.
    """
    measured = measured or {}
    rapl = measured.get("rapl")
    if rapl and rapl.get("source") == "rapl":
        nvml = measured.get("nvml")
        if nvml and nvml.get("source") == "nvml":
            return {"source": "rapl+nvml", "joules": rapl["joules"] + nvml["joules"]}
        figure = {"source": "rapl", "joules": rapl["joules"]}
        if nvml:
            figure["note"] = "GPU energy unavailable: " + nvml.get("reason", "")
        return figure
    return {"source": "model", "joules": model_figure["joules"]}
