"""What the A/B scripts share: an older tree's kernel module loaded beside this tree's (ab_wave.py),
and one kernel call's median time (ab_wave.py, ab_model.py)."""

from __future__ import annotations

import time
import types
from pathlib import Path

import numpy as np


def load_kernels(path: Path, name: str) -> types.SimpleNamespace:
    """The kernel module at ``path`` as a namespace, compiled without numba's cache (it cannot reload
    a module run from a path)."""
    ns = {"__name__": name}
    exec(compile(Path(path).read_text().replace("cache=True", "cache=False"), name, "exec"), ns)
    return types.SimpleNamespace(**ns)


def median_ms(fn, reps: int) -> float:
    """Median milliseconds of ``reps`` calls of ``fn`` after one untimed call."""
    fn()
    xs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(xs))
