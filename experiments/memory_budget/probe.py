"""One measured gradient (run under mpirun): peak RSS per phase on every rank, as one JSON line.

    mpirun -n R python experiments/memory_budget/probe.py --model heat --grid 128x128x128 \
        --steps 10 --ram 3 [--disk 2 --local-dir DIR]

The process baseline is the resident set after imports and a warm-up gradient of the same model on
a tiny grid (PETSc's and numba's one-off allocations, JIT code), before the measured model exists.
Each phase's peak comes from /proc/self/status VmHWM, reset before the phase by writing 5 to
/proc/self/clear_refs (tracemalloc does not see PETSc's allocations; petsc4py 3.18 exposes no
memory counters). Phases: ``construct`` (the model object), ``controls`` (default controls and
set_controls: operator assembly), ``gradient`` (the driver's whole forward and reverse sweep).
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
import tempfile
import time


def status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M).group(1))


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def build(cls, comm, grid, steps, extra=()):
    parser = argparse.ArgumentParser()
    parser.add_argument("--grid")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--dt", type=float)
    parser.add_argument("--adaptive", action="store_true", default=False)  # the shared run options
    parser.add_argument("--t-final", type=float, default=None)             # a model adapter reads
    cls.add_arguments(parser)
    args = parser.parse_args(["--grid", grid, "--steps", str(steps), *extra])
    return cls.build(comm, args)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--grid", required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--ram", type=int, default=3, help="RAM slots")
    p.add_argument("--disk", type=int, default=0, help="node-local async slots (multilevel plan)")
    p.add_argument("--local-dir", default=None)
    p.add_argument("--queue-depth", type=int, default=2)
    p.add_argument("--prefetch-depth", type=int, default=1)
    args = p.parse_args()

    from hpcadj.imports import mpi, petsc

    PETSc = petsc([])
    comm = mpi().COMM_WORLD
    from hpcadj.adjoint.driver import Driver
    from hpcadj.checkpoint.memory import LevelSpec, plan_memory
    from hpcadj.adjoint.verify import compute_gradient
    from hpcadj.checkpoint.schedules import make_schedule
    from hpcadj.checkpoint.storage.factory import make_level
    from hpcadj.cli.models import model_cli

    cls = model_cli(args.model)
    dim = len(args.grid.split("x"))
    tiny = build(cls, comm, "x".join(["8"] * dim), 2)
    compute_gradient(tiny, tiny.default_controls())
    del tiny
    gc.collect()
    PETSc.garbage_cleanup(comm)
    baseline = status_kib("VmRSS") * 1024
    out = {"rank": comm.rank, "ranks": comm.size, "model": args.model, "grid": args.grid,
           "steps": args.steps, "ram": args.ram, "disk": args.disk, "baseline_bytes": baseline}

    def phase(name, fn):
        reset_peak()
        t0 = time.perf_counter()
        result = fn()
        out[f"{name}_s"] = time.perf_counter() - t0
        out[f"{name}_peak_bytes"] = status_kib("VmHWM") * 1024
        out[f"{name}_after_bytes"] = status_kib("VmRSS") * 1024
        return result

    model = phase("construct", lambda: build(cls, comm, args.grid, args.steps))
    layout = model.snapshot_layout()
    state = sum(f.local_nbytes for f in layout.values())
    out["state_bytes"] = state

    def controls_phase():
        controls = model.default_controls()
        model.set_controls(controls)
        return controls

    controls = phase("controls", controls_phase)
    plans = [LevelSpec("ram", "ram", args.ram)]
    levels = [make_level("ram", args.ram, layout, comm)]
    local_dir = None
    if args.disk:
        local_dir = args.local_dir or tempfile.mkdtemp(prefix="hpcadj-membudget-")
        plans.append(LevelSpec("disk", "local", args.disk, queue_depth=args.queue_depth,
                               prefetch_depth=args.prefetch_depth))
        levels.append(make_level("local", args.disk, layout, comm, local_dir=local_dir, name="disk",
                                 queue_depth=args.queue_depth, prefetch_depth=args.prefetch_depth))
    schedule = make_schedule("revolve" if not args.disk else "multilevel", args.steps,
                             [pl.slots for pl in plans])

    def gradient():
        try:
            return Driver(model, levels).run(schedule, controls)
        finally:
            for level in levels:
                level.close()

    result = phase("gradient", gradient)
    out["forward_steps"] = result.forward_steps
    out["J"] = result.J
    peak = max(out[f"{k}_peak_bytes"] for k in ("construct", "controls", "gradient"))
    out["peak_bytes"] = peak
    out["states_measured"] = (peak - baseline) / state
    mem = plan_memory(model, plans)
    out["predicted"] = mem.as_dict()
    out["states_predicted"] = mem.total_bytes / state
    if local_dir and not args.local_dir:
        import shutil
        shutil.rmtree(local_dir, ignore_errors=True)
    lines = comm.gather(json.dumps(out), root=0)
    if comm.rank == 0:
        for line in lines:
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
