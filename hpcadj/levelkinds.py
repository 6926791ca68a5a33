"""The level kinds, their command-line names and what each promises: the one table.

Levels are named after their budgets and always ordered fastest first: ``ram`` (process memory),
``disk`` (node-local files) and ``pfs`` (one parallel HDF5 file). A ``ram`` or ``disk`` budget is
per rank; a ``pfs`` budget is for the whole file. Node-local and HDF5 snapshots outlive the process
(a resumed run reopens them); RAM snapshots do not.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LevelKind:
    """One kind of level: its name (the budget's flag), its storage kind, and its promises."""

    name: str
    kind: str
    durable: bool
    per_rank_budget: bool


#: every level, fastest first
LEVEL_KINDS = (LevelKind("ram", "ram", durable=False, per_rank_budget=True),
               LevelKind("disk", "local", durable=True, per_rank_budget=True),
               LevelKind("pfs", "pfs", durable=True, per_rank_budget=False))
#: level names (budget flags), fastest first
LEVEL_NAMES = tuple(k.name for k in LEVEL_KINDS)
#: storage kinds, fastest first
STORAGE_KINDS = tuple(k.kind for k in LEVEL_KINDS)
#: storage kinds whose snapshots outlive the process
DURABLE_KINDS = tuple(k.kind for k in LEVEL_KINDS if k.durable)
