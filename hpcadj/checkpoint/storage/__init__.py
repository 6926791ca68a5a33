"""Storage levels: where snapshots live (RAM, node-local files, parallel HDF5). No physics here."""

from .base import CorruptSnapshot, Level, LevelError, LevelStats, agree_run_id
from .factory import KINDS, make_level
from .local import LocalLevel, resolve_local_dir
from .pfs import PfsLevel
from .pfs_async import AsyncPfsLevel
from .ram import RamLevel

__all__ = ["AsyncPfsLevel", "CorruptSnapshot", "KINDS", "Level", "LevelError", "LevelStats", "LocalLevel",
           "PfsLevel", "RamLevel", "agree_run_id", "make_level", "resolve_local_dir"]
