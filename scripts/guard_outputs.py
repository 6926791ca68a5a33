"""Record what a fixed set of plans and runs print, to show a change of structure changed no result.

``python scripts/guard_outputs.py record DIR`` runs every configuration below (``hpcadj plan
--actions --json`` and ``mpirun -n 2 hpcadj run --json``) and writes one file per configuration
into DIR, with the fields that measure time, memory or host left out; ``python
scripts/guard_outputs.py compare A B`` prints every configuration whose output differs and exits 1
if any does. Plans are given a fixed cost profile, so they do not depend on this machine's speed.

Run it with the tree before a refactoring (``PYTHONPATH=<old tree>``) and after; the two must agree.

Under a memory budget (``--memory``: the output's ``memory`` has a ``budget``) the baseline is the
process's measured resident set, which differs between two runs of one tree by some KiB to a few MiB,
and so do the fields that follow from it: ``memory``'s ``peak``, ``ram_slots_fit``, ``ram slots`` and
``total`` (a compressed RAM level's pool is sized from what the budget leaves), and a RAM pool's
``pool_bytes``, ``slot_bytes`` and ``slot_ratio`` under ``compression``. ``compare`` reads them as
``"<rss>"`` (:func:`masked`); the files keep them. The slots each level holds and uses, the actions, J
and the gradient are still compared, so a change of plan still shows.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILE = str(ROOT / "experiments" / "levels" / "profile.json")
VOLATILE = re.compile(r"(wall|seconds|_s$|_s_|time|rss|host|date|path|dir|file|job|pid|bytes_per_s"
                      r"|bandwidth|energy|joule|_j$|baseline|created|measured|calibrat)", re.I)

PLANS = {
    "revolve-1000x20": ["--steps", "1000", "--ram", "20"],
    "storeall-50": ["--steps", "50", "--ram", "60", "--schedule", "store-all"],
    "periodic-200": ["--steps", "200", "--ram", "12", "--schedule", "periodic"],
    "multilevel-500": ["--steps", "500", "--ram", "4", "--disk", "12", "--pfs", "40"],
    "online-300": ["--steps", "300", "--ram", "6", "--disk", "10", "--schedule", "online"],
    "bytes-2lvl": ["--steps", "400", "--ram", "64MiB", "--disk", "256MiB", "--snapshot-bytes", "4MiB"],
    "memory-1GiB": ["--steps", "400", "--memory", "1GiB", "--snapshot-bytes", "8MiB", "--model-states", "12"],
    "compressed": ["--steps", "400", "--ram", "64MiB", "--snapshot-bytes", "8MiB", "--compress", "lossless",
                   "--compressed-bytes", "2MiB"],
}

RUNS = {
    "heat-storeall": ["--model", "heat", "--grid", "24x20", "--steps", "12"],
    "heat-revolve": ["--model", "heat", "--grid", "24x20", "--steps", "30", "--ram", "4"],
    "heat-be-bytes": ["--model", "heat", "--grid", "24x20", "--steps", "30", "--theta", "1", "--ram", "20KiB"],
    "burgers-3lvl": ["--model", "burgers", "--grid", "32x24", "--steps", "24", "--ram", "2", "--disk", "3",
                     "--pfs", "4", "--no-async"],
    "burgers-3lvl-async": ["--model", "burgers", "--grid", "32x24", "--steps", "24", "--ram", "2", "--disk", "3",
                           "--pfs", "4"],
    "wave-periodic": ["--model", "wave", "--grid", "12x10x14", "--steps", "20", "--ram", "5",
                      "--schedule", "periodic"],
    "grayscott-multilevel": ["--model", "grayscott", "--grid", "24x24", "--steps", "16", "--ram", "2",
                             "--disk", "4"],
    "wave-compressed": ["--model", "wave", "--grid", "12x10x14", "--steps", "20", "--ram", "4",
                        "--compress", "lossless"],
    "heat-memory": ["--model", "heat", "--grid", "64x64", "--steps", "30", "--memory", "400MiB"],
    "wave-ram-pool": ["--model", "wave", "--grid", "12x10x14", "--steps", "30", "--ram", "40KiB",
                      "--compress", "lossless"],
    "heat-memory-compressed": ["--model", "heat", "--grid", "64x64", "--steps", "30", "--memory", "400MiB",
                               "--compress", "lossless", "--disk", "4"],
    "heat-online-adaptive": ["--model", "heat", "--grid", "24x20", "--adaptive", "--t-final", "0.002",
                             "--schedule", "online", "--ram", "4"],
}


def stable(value):
    """``value`` with every field that measures time, memory, place or energy left out."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in sorted(value.items()) if not VOLATILE.search(k)}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


#: fields that follow from the measured baseline under a budget: memory's, and a compressed RAM pool's
RSS_MEMORY = ("peak", "ram_slots_fit", "ram slots", "total")
RSS_POOL = ("pool_bytes", "slot_bytes", "slot_ratio")


def masked(doc):
    """``doc`` (a plan summary or a run's result) with the RSS-derived fields read as ``"<rss>"``
    where a memory budget made the measured baseline count."""
    memory = doc.get("memory") if isinstance(doc, dict) else None
    if not isinstance(memory, dict) or "budget" not in memory:
        return doc
    out = dict(doc, memory={k: "<rss>" if k in RSS_MEMORY else v for k, v in memory.items()})
    if isinstance(doc.get("compression"), dict):
        out["compression"] = {level: {k: "<rss>" if k in RSS_POOL and "pool_bytes" in info else v
                                      for k, v in info.items()} if isinstance(info, dict) else info
                              for level, info in doc["compression"].items()}
    return out


def _comparable(path: Path):
    """A recorded file as ``compare`` reads it: the RSS-derived fields masked."""
    record = json.loads(path.read_text())
    for key in ("summary", "result"):
        if key in record:
            record[key] = masked(record[key])
    return record


def hpcadj(args: list[str], nranks: int, cwd: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1")
    cmd = [sys.executable, "-m", "hpcadj", *args]
    if nranks > 1:
        cmd = ["mpirun", "--oversubscribe", "-n", str(nranks), "-x", "PYTHONPATH", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


def record(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        for name, args in PLANS.items():
            proc = hpcadj(["plan", *args, "--costs", PROFILE, "--actions", "--json"], 1, work)
            lines = proc.stdout.splitlines()
            summary = stable(json.loads(lines[-1])) if proc.returncode == 0 and lines else None
            (out / f"plan-{name}.json").write_text(json.dumps(
                {"rc": proc.returncode, "actions": lines[:-1], "summary": summary}, indent=1))
            print(f"plan {name}: rc {proc.returncode}")
        for name, args in RUNS.items():
            local = os.path.join(work, name)
            os.makedirs(local)
            extra = ["--local-dir", local] + (["--pfs-file", os.path.join(local, "c.h5")] if "--pfs" in args else [])
            proc = hpcadj(["run", *args, *extra, "--costs", PROFILE, "--quiet", "--json"], 2, work)
            result = stable(json.loads(proc.stdout)) if proc.returncode == 0 else proc.stderr[-2000:]
            (out / f"run-{name}.json").write_text(json.dumps({"rc": proc.returncode, "result": result}, indent=1))
            print(f"run {name}: rc {proc.returncode}")


def compare(a: Path, b: Path) -> int:
    names = sorted({p.name for p in a.glob("*.json")} | {p.name for p in b.glob("*.json")})
    differ = [n for n in names if not (a / n).exists() or not (b / n).exists()
              or _comparable(a / n) != _comparable(b / n)]
    for name in differ:
        print(f"differs: {name}")
    print(f"{len(names) - len(differ)} of {len(names)} configurations identical")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("record").add_argument("out", type=Path)
    cmp = sub.add_parser("compare")
    cmp.add_argument("a", type=Path)
    cmp.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.command == "record":
        record(args.out)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
