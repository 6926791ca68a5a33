"""What the A/B scripts share: an older tree's kernel module loaded beside this tree's (ab_wave.py),
an older tree's model imported beside this tree's (ab_model.py, grayscott.py), and one kernel
call's median time (ab_wave.py, ab_model.py)."""

from __future__ import annotations

import importlib
import shutil
import sys
import tempfile
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


def import_old(root: Path, model: str):
    """The model module of the package under ``root``/hpcadj, imported as ``hpcadj_old`` (the
    package's own imports are relative)."""
    where = Path(tempfile.mkdtemp(prefix="ab_model_"))
    shutil.copytree(root / "hpcadj", where / "hpcadj_old")
    sys.path.insert(0, str(where))
    return importlib.import_module(f"hpcadj_old.models.{model}"), where


def median_ms(fn, reps: int) -> float:
    """Median milliseconds of ``reps`` calls of ``fn`` after one untimed call."""
    fn()
    xs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(xs))
