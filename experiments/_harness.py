"""Shared plumbing for the studies in experiments/: launching ``hpcadj run`` under mpirun, the
machine description, medians, CSV output. Each study's ``run.py`` imports this file by path.

Nothing here is part of the library; it only calls the public CLI and API.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = ROOT / ".venv" / "bin" / "python"
HPCADJ = ROOT / ".venv" / "bin" / "hpcadj"


#: variables an MPI singleton (a Python process that initialised MPI without mpirun) puts in its
#: environment; a child mpirun that inherits them exits 1 without a word
_SINGLETON = ("PMIX_", "ORTE_", "OMPI_MCA_ess", "OMPI_MCA_orte_", "OMPI_MCA_pmix", "OMPI_APP_CTX_")


def mpi_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SINGLETON)}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", HDF5_USE_FILE_LOCKING="FALSE",
               PYTHONUNBUFFERED="1")
    return env


def mpirun(ranks: int, argv: list[str], timeout: float = 900, env: dict | None = None) -> str:
    """Run ``argv`` under ``mpirun --oversubscribe -n ranks``; return stdout (raise with stderr on failure)."""
    cmd = ["mpirun", "--oversubscribe", "-n", str(ranks), *map(str, argv)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or mpi_env(),
                          cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def hpcadj_run(ranks: int, args: list[str], timeout: float = 900, env: dict | None = None) -> dict:
    """``mpirun -n ranks hpcadj run ARGS --json --quiet`` -> its JSON object."""
    out = mpirun(ranks, [HPCADJ, "run", *map(str, args), "--json", "--quiet"], timeout, env)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"no JSON from hpcadj run {' '.join(map(str, args))}:\n{out[-2000:]}")
    return json.loads(lines[-1])


def hpcadj_cmd(ranks: int, sub: str, args: list[str], timeout: float = 900) -> str:
    return mpirun(ranks, [HPCADJ, sub, *map(str, args)], timeout)


def machine() -> dict:
    """nproc, CPU model, load average at the time of the call."""
    model = "unknown"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": model, "loadavg_1m": round(os.getloadavg()[0], 2),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M")}


def warm_memory(gib: float) -> float:
    """Touch ``gib`` GiB once (mapped, populated, unmapped) and return the seconds per GiB it took.

    On a virtual machine, guest memory the host has not backed yet (untouched since boot, or paged
    out by the host) costs a host page fault per page the first time (about 3 s/GiB on this
    project's VMs, 0.3-0.5 s/GiB once backed): a property of the machine's history, not of a plan,
    so studies touch what their runs will use before timing them and report the figure."""
    import mmap

    if gib <= 0:
        return 0.0
    t0 = time.perf_counter()
    remaining = int(gib * (1 << 30))
    while remaining > 0:
        chunk = min(remaining, 1 << 30)
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
        mmap.mmap(-1, chunk, flags=flags).close()
        remaining -= chunk
    return (time.perf_counter() - t0) / gib


def median(values):
    return statistics.median(values)


def scratch(prefix: str) -> str:
    return tempfile.mkdtemp(prefix=f"hpcadj-{prefix}-")


def write_csv(path: Path, rows: list[dict]) -> None:
    keys: list[str] = []
    for row in rows:
        for key in row:
            if key not in keys:
                keys.append(key)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})


def markdown_table(rows: list[dict], keys: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(fmt(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(out)


def single_steps(model, u, steps: int):
    """The end state of ``steps`` single ``model.step`` calls from ``u`` (as the driver takes them),
    every intermediate state destroyed as it is replaced; ``u`` is kept."""
    v = u
    for i in range(steps):
        w = model.step(i, v)
        if v is not u:
            v.destroy()
        v = w
    return v


def time_variants(comm, variants, steps: int, rounds: int, triad, cleanup) -> tuple[dict, dict, list]:
    """Under mpirun: ``rounds`` rounds of two triad samples, then every ``(name, fn)`` of ``variants``
    (the order rotated each round, so no variant always runs first), each between a barrier and the
    slowest rank's end. Returns the wall and CPU seconds a step of every round per name (slowest rank)
    and the triad's samples; ``cleanup()`` follows each variant (PETSc's collective garbage cleanup)."""
    times = {name: [] for name, _ in variants}
    cpu = {name: [] for name, _ in variants}
    bandwidth = []
    for r in range(rounds):
        bandwidth += triad.samples(2)
        for name, fn in variants[r % len(variants):] + variants[:r % len(variants)]:
            comm.Barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            out = fn(r)
            times[name].append(max(comm.allgather(time.perf_counter() - t0)) / steps)
            cpu[name].append(max(comm.allgather(time.process_time() - c0)) / steps)
            out.destroy()
            cleanup()
    return times, cpu, bandwidth


def variant_rows(grid: str, ranks: int, steps: int, times: dict, cpu: dict, bandwidth: list,
                 step_bytes: int) -> list[dict]:
    """One row a variant of :func:`time_variants`' result: seconds a step (minimum and median over the
    rounds), speed-ups over the variant ``step`` in wall and CPU time, and the effective bandwidth
    (``step_bytes`` a grid point over the time a step) against the triad's best sample."""
    points = 1
    for n in grid.split("x"):
        points *= int(n)
    triad_gbps = max(bandwidth)
    rows = []
    for name in times:
        best = min(times[name])
        gbps = step_bytes * points / best / 1e9
        rows.append({"grid": grid, "ranks": ranks, "variant": name, "steps": steps, "s_per_step_min": best,
                     "s_per_step_median": statistics.median(times[name]),
                     "speedup_vs_step": min(times["step"]) / best,
                     "speedup_median": statistics.median(times["step"]) / statistics.median(times[name]),
                     "cpu_s_per_step_min": min(cpu[name]), "cpu_speedup_vs_step": min(cpu["step"]) / min(cpu[name]),
                     "effective_GBps": gbps, "triad_GBps": triad_gbps, "ratio_to_triad": gbps / triad_gbps})
    return rows


def measure_variants(comm, grid: str, variants, steps: int, rounds: int, triad, step_bytes: int) -> None:
    """Under mpirun: :func:`time_variants` with PETSc's garbage cleanup after each variant, then rank 0
    prints :func:`variant_rows`' rows, one JSON object a line (what a study's host side reads back)."""
    from hpcadj.imports import petsc

    times, cpu, bandwidth = time_variants(comm, variants, steps, rounds, triad, lambda: petsc().garbage_cleanup(comm))
    if comm.rank == 0:
        for row in variant_rows(grid, comm.size, steps, times, cpu, bandwidth, step_bytes):
            print(json.dumps(row), flush=True)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def run_configs(configs: list[tuple[str, list]], ranks: int, repeats: int, timeout: float = 900,
                env: dict | None = None) -> tuple[list[dict], list[dict]]:
    """Run every ``(label, hpcadj run args)`` ``repeats`` times, rotating the order each repeat so
    drifting machine load does not favour one configuration. Returns (raw rows, one median row per
    label): wall_s, the phases and peak RSS are medians; counts are taken from the first run (they
    are deterministic)."""
    raw = []
    for rep in range(repeats):
        shift = rep % len(configs)
        for label, args in configs[shift:] + configs[:shift]:
            tmp = scratch("run")
            args = [os.path.join(tmp, "logs") if a == "@LOGDIR" else os.path.join(tmp, "ckpt.h5")
                    if a == "@PFSFILE" else tmp if a == "@LOCALDIR" else a for a in args]
            try:
                info = hpcadj_run(ranks, args, timeout, env)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            info["label"], info["repeat"] = label, rep
            raw.append(info)
            log(f"  [{rep}] {label:28s} wall {info['wall_s']:8.3f} s  fwd {info['forward_steps']:5d}  "
                f"rss {info['peak_rss_bytes'] / 2**20:7.1f} MiB")
    summary = []
    for label, _ in configs:
        rs = [r for r in raw if r["label"] == label]
        first = rs[0]
        row = {"label": label, "schedule": first["schedule"], "ranks": first["ranks"],
               "forward_steps": first["forward_steps"], "recomputed_steps": first["recomputed_steps"],
               "adjoint_steps": first["adjoint_steps"],
               "wall_s": median([r["wall_s"] for r in rs]),
               "wall_min_s": min(r["wall_s"] for r in rs), "wall_max_s": max(r["wall_s"] for r in rs),
               "peak_rss_mib": median([r["peak_rss_bytes"] for r in rs]) / 2**20,
               "snapshot_bytes": first["snapshot_bytes"], "J": first["J"], "grad_norm": first["grad_norm"],
               "repeats": len(rs)}
        for phase in ("forward", "recompute", "adjoint", "io_wait"):
            row[f"{phase}_s"] = median([r["phase_s"][phase] for r in rs])
        for lv in first["levels"]:
            name = lv["name"]
            row[f"{name}_slots"] = lv["slots"]
            row[f"{name}_writes"] = lv["writes"]
            row[f"{name}_reads"] = lv["reads"]
            row[f"{name}_peak_slots"] = lv["peak_slots"]
            row[f"{name}_write_s"] = median([next(x for x in r["levels"] if x["name"] == name)["write_s"] for r in rs])
            row[f"{name}_read_s"] = median([next(x for x in r["levels"] if x["name"] == name)["read_s"] for r in rs])
            row[f"{name}_wait_s"] = median([next(x for x in r["levels"] if x["name"] == name)["wait_s"] for r in rs])
        if "energy" in first and first["energy"]:
            row["energy_j"] = median([r["energy"]["joules"] for r in rs])
            row["energy_source"] = first["energy"].get("source")
        summary.append(row)
    return raw, summary


def study_parser(doc: str, here: Path, *, model: str, ram: int | None = None):
    """The options every model study shares: --quick, --model, --grid, --steps, [--ram], --repeats,
    --ranks and --out (default: the study's own folder)."""
    import argparse

    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small size (a few minutes)")
    p.add_argument("--model", default=model)
    p.add_argument("--grid", default=None)
    p.add_argument("--steps", type=int, default=None)
    if ram is not None:
        p.add_argument("--ram", type=int, default=ram)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--out", default=str(here))
    return p
