"""Overhead of the driver beyond the ideal cost, RAM-only plans (issue 5).

ideal = forward evaluations x (measured seconds per forward step)
      + adjoint steps       x (measured seconds per adjoint step)

The step and adjoint-step times come from a bare loop in the same process, right before the plans
run (model.step / model.adjoint_step chained over the whole trajectory, states kept in a Python
list: no snapshot copies, no plan, no telemetry). Each plan then runs through the real
``hpcadj.adjoint.Driver`` with a RAM level. Overhead = wall / ideal - 1, median over the repeats;
every repeat measures its own ideal and runs the plans in a rotated order.

    .venv/bin/python experiments/overhead/run.py [--quick]

launches ``mpirun -n 2`` on itself (``--worker``) and writes results.csv, overhead.png here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import _harness as H  # noqa: E402


def worker(args) -> None:
    from hpcadj.stack import mpi, petsc

    petsc()
    MPI = mpi()
    comm = MPI.COMM_WORLD
    from hpcadj.adjoint import Driver
    from hpcadj.checkpoint.schedules import make_schedule, store_all_slots
    from hpcadj.checkpoint.storage.factory import make_level
    from hpcadj.models.heat import HeatModel

    grid = tuple(int(x) for x in args.grid.split("x"))
    n = args.steps
    model = HeatModel(comm, grid, n_steps=n, dt=1e-4)
    controls = model.default_controls()
    layout = model.snapshot_layout()
    plans = [("store-all", store_all_slots(n))] + [("revolve", s) for s in args.slots]

    def slowest(t):
        return comm.allreduce(t, op=MPI.MAX)

    def ideal_costs():
        comm.Barrier()
        t0, c0 = time.perf_counter(), time.thread_time()
        model.set_controls(controls)  # the driver does this too (heat: assembles A(kappa))
        t_set, c_set = slowest(time.perf_counter() - t0), slowest(time.thread_time() - c0)
        u = model.initial_state()
        states = [u]
        comm.Barrier()
        t0, c0 = time.perf_counter(), time.thread_time()
        for i in range(n):
            u = model.step(i, u)
            model.objective(i + 1, u)
            states.append(u)
        t_fwd = slowest(time.perf_counter() - t0) / n
        c_fwd = slowest(time.thread_time() - c0) / n
        grad = {k: v.duplicate() for k, v in controls.items()}
        for v in grad.values():
            v.set(0.0)
        lam = model.objective_gradient(n, states[n])
        comm.Barrier()
        t0, c0 = time.perf_counter(), time.thread_time()
        for i in range(n - 1, -1, -1):
            lam = model.adjoint_step(i, states[i], states[i + 1], lam, grad)
            dj = model.objective_gradient(i, states[i])
            if dj is not None:
                lam.axpy(1.0, dj)
        t_adj = slowest(time.perf_counter() - t0) / n
        c_adj = slowest(time.thread_time() - c0) / n
        return t_fwd, t_adj, c_fwd, c_adj, t_set, c_set

    # warm-up: first calls (page faults, PETSc set-up, Python caches) are not part of any figure
    ideal_costs()
    Driver(model, [make_level("ram", plans[0][1], layout, comm)]).run(make_schedule("store-all", n, [plans[0][1]]),
                                                                      controls)
    rows = []
    for rep in range(args.repeats):
        before = ideal_costs()
        order = plans[rep % len(plans):] + plans[:rep % len(plans)]
        runs = []
        for name, slots in order:
            level = make_level("ram", slots, layout, comm)
            schedule = make_schedule(name, n, [slots])
            comm.Barrier()
            t0, c0 = time.perf_counter(), time.thread_time()
            result = Driver(model, [level]).run(schedule, controls)
            wall = slowest(time.perf_counter() - t0)
            cpu = slowest(time.thread_time() - c0)
            level.close()
            runs.append((name, slots, result, wall, cpu))
        after = ideal_costs()
        # the bare loop's step times, averaged over a measurement before and one after the plans
        t_fwd, t_adj, c_fwd, c_adj, t_set, c_set = ((b + a) / 2 for b, a in zip(before, after))
        for name, slots, result, wall, cpu in runs:
            ideal = t_set + result.forward_steps * t_fwd + result.adjoint_steps * t_adj
            ideal_cpu = c_set + result.forward_steps * c_fwd + result.adjoint_steps * c_adj
            rows.append({"repeat": rep, "schedule": name, "slots": slots, "forward_steps": result.forward_steps,
                         "adjoint_steps": result.adjoint_steps, "step_s": t_fwd, "adjoint_step_s": t_adj,
                         "set_controls_s": t_set,
                         "ideal_s": ideal, "wall_s": wall, "overhead": wall / ideal - 1.0,
                         "ideal_cpu_s": ideal_cpu, "cpu_s": cpu, "cpu_overhead": cpu / ideal_cpu - 1.0,
                         "J": result.J})
            if comm.rank == 0:
                H.log(f"  repeat {rep} {name:9s} s={slots:3d}: wall {wall:.3f} s, ideal {ideal:.3f} s, "
                      f"overhead {100 * (wall / ideal - 1):+.2f} %")
    if comm.rank == 0:
        Path(args.worker).write_text(json.dumps(rows))


def summarise(raw: list[dict], ranks: int) -> list[dict]:
    out = []
    keys = []
    for r in raw:
        if (r["schedule"], r["slots"]) not in keys:
            keys.append((r["schedule"], r["slots"]))
    for name, slots in keys:
        rs = [r for r in raw if r["schedule"] == name and r["slots"] == slots]
        out.append({"ranks": ranks, "schedule": name, "slots": slots, "forward_steps": rs[0]["forward_steps"],
                    "adjoint_steps": rs[0]["adjoint_steps"],
                    "step_ms": 1e3 * H.median([r["step_s"] for r in rs]),
                    "adjoint_step_ms": 1e3 * H.median([r["adjoint_step_s"] for r in rs]),
                    "ideal_s": H.median([r["ideal_s"] for r in rs]), "wall_s": H.median([r["wall_s"] for r in rs]),
                    "overhead_pct": 100 * H.median([r["overhead"] for r in rs]),
                    "overhead_min_pct": 100 * min(r["overhead"] for r in rs),
                    "overhead_max_pct": 100 * max(r["overhead"] for r in rs),
                    "min_ratio_overhead_pct": 100 * (min(r["wall_s"] for r in rs) / min(r["ideal_s"] for r in rs) - 1),
                    "cpu_overhead_pct": 100 * H.median([r["cpu_overhead"] for r in rs]), "repeats": len(rs)})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small size (about a minute)")
    p.add_argument("--grid", default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--slots", type=int, nargs="+", default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    p.add_argument("--out", default=str(HERE))
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.grid = args.grid or ("192x192" if args.quick else "320x320")
    args.steps = args.steps or (30 if args.quick else 60)
    args.slots = args.slots or ([8, 4] if args.quick else [16, 8, 4])
    args.repeats = args.repeats or (3 if args.quick else 7)
    if args.worker:
        worker(args)
        return 0

    info = H.machine()
    rows, raw_all = [], []
    for ranks in args.ranks:
        H.log(f"overhead: heat {args.grid}, {args.steps} steps, {ranks} rank(s), {args.repeats} repeats; "
              f"load {H.machine()['loadavg_1m']}")
        tmp = Path(H.scratch("overhead")) / "rows.json"
        H.mpirun(ranks, [H.PY, __file__, "--worker", tmp, "--grid", args.grid, "--steps", args.steps,
                         "--slots", *args.slots, "--repeats", args.repeats], timeout=3600)
        raw = json.loads(tmp.read_text())
        raw_all += [{"ranks": ranks, **r} for r in raw]
        rows += summarise(raw, ranks)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    H.write_csv(out / "raw.csv", raw_all)
    H.write_csv(out / "results.csv", rows)
    plot(rows, out / "overhead.png", args, info)
    print(H.markdown_table(rows, ["ranks", "schedule", "slots", "forward_steps", "step_ms", "adjoint_step_ms",
                                  "ideal_s", "wall_s", "overhead_pct", "overhead_min_pct", "overhead_max_pct",
                                  "min_ratio_overhead_pct", "cpu_overhead_pct"]))
    print(f"\nmachine: {info} (load at the end {H.machine()['loadavg_1m']})")
    for ranks in args.ranks:
        worst = max(r["overhead_pct"] for r in rows if r["ranks"] == ranks)
        print(f"{ranks} rank(s): worst median wall-time overhead {worst:+.2f} % (target <= 5 %): "
              f"{'MET' if worst <= 5 else 'NOT MET'}")
    return 0


def plot(rows, path, args, info) -> None:
    plt = H.pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4))
    plans = []
    for r in rows:
        if (r["schedule"], r["slots"]) not in plans:
            plans.append((r["schedule"], r["slots"]))
    width = 0.8 / (2 * len(args.ranks))
    k = 0
    for ranks in args.ranks:
        for metric, label in (("overhead_pct", "wall time"), ("cpu_overhead_pct", "thread CPU time")):
            vals = [next(r[metric] for r in rows if r["ranks"] == ranks and (r["schedule"], r["slots"]) == pl)
                    for pl in plans]
            xs = [i - 0.4 + (k + 0.5) * width for i in range(len(plans))]
            ax.bar(xs, vals, width=width, label=f"{ranks} rank(s), {label}")
            k += 1
    ax.axhline(5, color="red", ls="--", lw=1, label="target 5 %")
    ax.axhline(0, color="black", lw=0.5)
    ax.set_xticks(range(len(plans)), [f"{n}\n{s} slots" for n, s in plans])
    ax.set_ylabel(f"overhead over ideal, % (median of {args.repeats})")
    ax.set_title(f"Driver overhead, heat {args.grid}, {args.steps} steps, RAM only ({info['nproc']}-core VM)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
