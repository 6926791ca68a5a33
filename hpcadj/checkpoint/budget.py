"""Storage budgets per level, given as slots (``8``) or bytes (``2GiB``, ``512MB``, ``1.5e9B``).

Bytes become slots through the snapshot size (bytes of one snapshot *on this level*: the per-rank
block for node-local levels, the global size for a shared file), rounding down. The conversion is
pure integer arithmetic on the same inputs, so every rank derives the same plan.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


@dataclass(frozen=True)
class Budget:
    """A budget as the user gave it: ``slots`` or ``nbytes``, exactly one set."""

    slots: int | None = None
    nbytes: int | None = None

    def to_slots(self, snapshot_bytes: int | None) -> int:
        """Slots this budget holds for snapshots of ``snapshot_bytes`` bytes."""
        if self.slots is not None:
            return self.slots
        if snapshot_bytes is None:
            raise ValueError("a budget in bytes needs the snapshot size to become slots")
        if snapshot_bytes <= 0:
            raise ValueError(f"snapshot size must be positive, got {snapshot_bytes}")
        return self.nbytes // snapshot_bytes


def parse_budget(text: str | int) -> Budget:
    """Parse ``8`` (slots), ``2GiB``, ``512MB``, ``1.5e9B``, ``64k`` (bytes) into a :class:`Budget`.

    A bare integer is a slot count; any unit makes it bytes (k/M/G/T alone are binary, KB/MB/GB are
    decimal, KiB/MiB/GiB binary). Raises ValueError with the reason otherwise.
    """
    if isinstance(text, bool):
        raise ValueError(f"budget must be slots or bytes, got {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"{text} is negative: a budget must be positive (slots such as 8, "
                             "bytes such as 2GiB), or 0 for no such level")
        return Budget(slots=text)
    match = _PATTERN.match(str(text))
    negative = _PATTERN.match(str(text).strip()[1:]) if str(text).strip().startswith("-") else None
    if negative and negative.group(1).strip("0.") and negative.group(2).lower() in {"", *_UNITS}:
        raise ValueError(f"{str(text).strip()} is negative: a budget must be positive (slots such as 8, "
                         "bytes such as 2GiB), or 0 for no such level")
    if not match:
        raise ValueError(f"{text!r} is not slots (a whole number such as 8) nor bytes "
                         "(a number with a unit such as 2GiB, 512MB or 1.5e9B)")
    number, unit = match.groups()
    if not unit:
        if not re.fullmatch(r"[0-9]+", number):
            raise ValueError(f"{text} is not slots (a whole number such as 8) nor bytes "
                             "(a number with a unit such as 2GiB, 512MB or 1.5e9B)")
        return Budget(slots=int(number))
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(f"{text}: unknown unit {unit!r} (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    value = float(number) * factor
    if not math.isfinite(value):
        raise ValueError(f"{text} is more bytes than any machine holds")
    return Budget(nbytes=int(value))


def budget_slots(text: str | int, snapshot_bytes: int | None = None) -> int:
    """Slots in the budget ``text`` for snapshots of ``snapshot_bytes`` bytes."""
    return parse_budget(text).to_slots(snapshot_bytes)
