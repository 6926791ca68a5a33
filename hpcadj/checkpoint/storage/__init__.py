"""Storage levels: where snapshots live (RAM, node-local files, parallel HDF5). No physics here."""

from .base import Level, LevelError, LevelStats
from .ram import RamLevel

__all__ = ["Level", "LevelError", "LevelStats", "RamLevel"]
