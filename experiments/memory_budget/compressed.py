"""One `hpcadj run` with --memory and --compress (run under mpirun): every rank's peak RSS against
the budget, as one JSON line on stdout from rank 0.

    mpirun -n 2 python experiments/memory_budget/compressed.py --memory 600MiB -- \
        --model wave --grid 128x128x128 --steps 200 --compress lossless

The arguments after ``--`` go to ``hpcadj run`` (in this process, through ``hpcadj.cli.main``; its
``--json`` output is captured). Each rank's peak is its VmHWM at exit (/proc/self/status: the whole
process, PETSc's allocations included); ``--trace`` also samples VmRSS every 20 ms from a thread
and reports when (seconds from the start, and Unix time to match a --log-dir's events) each
rank was at its highest.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import threading
import time


def status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M).group(1)) * 1024


class Sampler(threading.Thread):
    """VmRSS every ``every`` seconds: the highest reading and when it was taken."""

    def __init__(self, every: float = 0.02):
        super().__init__(daemon=True)
        self.every, self.t0, self.best, self.when, self.at = every, time.perf_counter(), 0, 0.0, 0.0
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(self.every):
            rss = status_bytes("VmRSS")
            if rss > self.best:
                self.best, self.when, self.at = rss, time.perf_counter() - self.t0, time.time()


def main() -> int:
    if "--" not in sys.argv:
        print("usage: compressed.py --memory BYTES [--trace] -- RUN-OPTIONS", file=sys.stderr)
        return 2
    split = sys.argv.index("--")
    p = argparse.ArgumentParser()
    p.add_argument("--memory", required=True)
    p.add_argument("--trace", action="store_true")
    args = p.parse_args(sys.argv[1:split])
    run_args = sys.argv[split + 1:]

    from hpcadj.checkpoint.budget import parse_budget
    from hpcadj.cli import main as cli_main
    from hpcadj.imports import mpi

    comm = mpi().COMM_WORLD
    sampler = Sampler() if args.trace else None
    if sampler is not None:
        sampler.start()
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        rc = cli_main(["run", *run_args, "--memory", args.memory, "--json", "--quiet"])
    wall = time.perf_counter() - t0
    if sampler is not None:
        sampler.done.set()
        sampler.join()
    budget = parse_budget(args.memory).nbytes
    peak = status_bytes("VmHWM")
    ranks = comm.gather({"peak_rss": peak, "ratio": peak / budget,
                         "highest_at_s": None if sampler is None else round(sampler.when, 2),
                         "highest_at_unix": None if sampler is None else sampler.at}, root=0)
    if comm.rank == 0:
        result = json.loads(out.getvalue()) if rc == 0 else {}
        comp = result.get("compression", {}).get("ram", {})
        line = {"args": run_args, "memory": args.memory, "budget_bytes": budget, "rc": rc, "ranks": ranks,
                "max_ratio": max(r["ratio"] for r in ranks), "forward_steps": result.get("forward_steps"),
                "steps": result.get("steps"), "wall_s": round(wall, 2), "run_wall_s": result.get("wall_s"),
                "snapshot_bytes": result.get("snapshot_bytes"), "faults": len(result.get("faults", [])),
                "pool_bytes": comp.get("pool_bytes"), "peak_pool_bytes": comp.get("peak_pool_bytes"),
                "ratio": comp.get("ratio"), "largest_bytes": comp.get("largest_bytes"),
                "overflows": comp.get("overflows"), "plan": result.get("memory")}
        print(json.dumps(line))
    return rc


if __name__ == "__main__":
    sys.exit(main())
