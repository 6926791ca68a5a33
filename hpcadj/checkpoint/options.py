"""The checkpointing options a run is given, and the checks that refuse unusable ones before any work.

:class:`Checkpointing` is what ``--ram/--disk/--pfs``, ``--memory``, ``--compress*``, ``--schedule``
and ``--costs`` say, as a library object. Every check here is agreed across ranks: a problem found
on one rank raises the same :class:`ConfigError` on all (:func:`agreed`).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

from ..collective import agree_or_raise
from .budget import parse_budget
from .manager import CheckpointConfig
from .schedules import CostProfile


class ConfigError(ValueError):
    """A configuration no run can use (a budget too small, an unusable file): nothing was done."""


@dataclass(frozen=True)
class Checkpointing:
    """Where snapshots may go and how the plan is chosen.

    Budgets are slots (``8``) or bytes (``"2GiB"``): per rank for ``ram`` and ``disk``, for the
    whole file for ``pfs``. With no budget at all every state is kept in RAM (store-all).
    ``schedule`` None is store-all without budgets, else ``auto`` (the cheapest plan over the
    levels, from ``costs``: a :class:`CostProfile`, a profile file from ``hpcadj calibrate``, or
    None for a brief calibration when the plan needs one).

    ``memory`` is the whole-process budget per rank in bytes (``"3GiB"``; default ``$HPCADJ_MEMORY``,
    else under SLURM the job's memory per task): the model's working set, the driver's states and
    the file levels' staging are predicted (:mod:`hpcadj.checkpoint.memory`) and the rest goes to RAM
    slots, ``ram`` staying an upper bound. ``memory_baseline`` is the process's resident set before
    the model was built (default: measured when the session is created, which counts the model twice
    and so errs on the safe side). Frozen: a caller that needs other options makes a changed copy
    (``dataclasses.replace``).
    """

    ram: object = None
    disk: object = None
    pfs: object = None
    local_dir: str | None = None
    pfs_file: str | None = None
    async_io: bool = True
    keep: bool = False
    schedule: str | None = None
    minimize: str = "time"
    costs: object = None
    memory: object = None
    memory_baseline: int | None = None
    compress: str | None = None       # codec spec for every level: none | lossless[:cname] | lossy:TOL
    compress_ram: str | None = None   # per-level specs override ``compress``
    compress_disk: str | None = None
    compress_pfs: str | None = None
    compress_probe_steps: int | None = None  # the compression probe's last state (default 4)
    time_tile: int | None = None  # advances in time tiles of this depth (1: single steps; None: the model's choice)

    def codecs(self) -> dict:
        """Level name -> codec of the compressed levels (ConfigError on a bad spec)."""
        from .compression import level_codecs

        try:
            return level_codecs(self.compress, {"ram": self.compress_ram, "disk": self.compress_disk,
                                                "pfs": self.compress_pfs})
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def budgets(self) -> dict:
        return {"ram": self.ram, "disk": self.disk, "pfs": self.pfs}

    def check(self, comm) -> None:
        """Refuse contradictions and unusable paths before any work (collective)."""
        if self.pfs_file and self.pfs is None:
            raise ConfigError(f"--pfs-file {self.pfs_file} names the HDF5 level's file, but no --pfs budget "
                              "is given: add --pfs SLOTS|BYTES or drop --pfs-file")
        if self.time_tile is not None and (isinstance(self.time_tile, bool) or not isinstance(self.time_tile, int)
                                           or self.time_tile < 1):
            raise ConfigError(f"--time-tile must be a whole number >= 1 (1: single steps), got {self.time_tile!r}")
        if self.minimize not in ("time", "energy"):
            raise ConfigError(f"minimize must be 'time' or 'energy', got {self.minimize!r}")
        if self.local_dir and self.disk is not None:
            agreed(comm, check_usable_directory, self.local_dir, "--local-dir")
        if self.memory is not None:
            memory_bytes(self.memory, "--memory")
        if self.costs is not None:  # a profile some ranks cannot read
            agreed(comm, load_costs, self.costs)
        self.codecs()

    def config(self) -> CheckpointConfig:
        return CheckpointConfig(budgets=self.budgets, local_dir=self.local_dir, pfs_file=self.pfs_file,
                                async_io=self.async_io, keep=self.keep)


def load_costs(costs) -> CostProfile | None:
    """A cost profile from a :class:`CostProfile`, a path to a profile file, or None."""
    if costs is None or isinstance(costs, CostProfile):
        return costs
    try:
        return CostProfile.load(costs)
    except (ValueError, UnicodeDecodeError) as exc:
        message = str(exc)
        raise ConfigError(message if str(costs) in message else f"{costs}: {message}") from None
    except OSError as exc:
        raise ConfigError(f"{costs}: {exc.strerror or exc}") from None


def memory_bytes(text, flag: str) -> int:
    """A whole-process budget in bytes (``"3GiB"``, or an int of bytes); ConfigError otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise ConfigError(f"{flag} must be a positive number of bytes, got {text}")
        return text
    if str(text).strip().startswith("-"):
        raise ConfigError(f"{flag} {str(text).strip()}: must be positive (bytes per rank, e.g. 3GiB)")
    try:
        budget = parse_budget(text)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None
    if budget.nbytes is None:
        raise ConfigError(f"{flag} {text} is a slot count: give bytes per rank, e.g. 3GiB")
    if budget.nbytes <= 0:
        raise ConfigError(f"{flag} must be a positive number of bytes, got {text}")
    return budget.nbytes


def fmt_bytes(n: int) -> str:
    """Bytes for people: 1.50 GiB, 320.0 MiB."""
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.1f} MiB"


def agreed(comm, check, *args) -> None:
    """Run ``check(*args)`` on every rank; if it raised ConfigError on any, raise the first rank's on
    all (a check that failed on some ranks only would leave the others waiting in a collective)."""
    try:
        check(*args)
        error = None
    except ConfigError as exc:
        error = str(exc)
    agree_or_raise(comm, error, ConfigError, first=True)


def check_writable(path: str) -> None:
    """Raise ValueError unless a file can be created at ``path``."""
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(parent):
        raise ValueError(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write {path}: directory {parent} is not writable")
    if os.path.isdir(path):
        raise ValueError(f"cannot write {path}: it is a directory")


def check_can_create(path: str, flag: str | None = None) -> None:
    """ConfigError unless a file can be created beside ``path`` (tried for real: root passes every
    permission check, yet cannot create files under /proc or on a read-only mount)."""
    try:
        check_writable(path)
        parent = os.path.dirname(os.path.abspath(path)) or "."
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".hpcadj-probe-"):
            pass
    except ValueError as exc:
        raise ConfigError(f"{flag + ' ' if flag else ''}{exc}") from None
    except OSError as exc:
        raise ConfigError(f"{flag + ' ' if flag else ''}cannot write {path}: {exc.strerror or exc}") from None


def check_usable_directory(path: str, flag: str) -> None:
    """ConfigError unless ``path`` is a directory files can be created in, or can be made into one."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        what = "is not a directory" if existing == os.path.abspath(path) else f"lies under the file {existing}"
        raise ConfigError(f"{flag} {path} {what}")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".hpcadj-probe-"):
            pass
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot create files in {existing} ({exc.strerror or exc})") from None


def apply_time_tile(model, depth) -> None:
    """Give ``model`` the time tile depth of its advances (collective; None keeps the model's own
    choice; a model without ``set_time_tile`` has no tiles); ConfigError naming the limit it breaks."""
    setter = getattr(model, "set_time_tile", None)
    if setter is None or depth is None:
        return
    try:
        setter(depth)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
