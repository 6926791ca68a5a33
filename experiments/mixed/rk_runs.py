"""A user's RK4 TS (allen_cahn.py) under hpcadj against TSAdjointSolve, side by side in one process.

Per grid and rank count, one ``mpirun -n RANKS`` process (the worker below) runs, alternated (odd repeats
hpcadj first) and each from a clean start (earlier runs' garbage freed off the clock), ``--repeats`` times:
TSSolve + TSAdjointSolve (the memory trajectory, keeping every step's stages), hpcadj's mixed store-all
(every step's stages kept as adjoint data, ``--schedule mixed`` without a budget), with ``--states``
today's hpcadj store-all (every state; each adjoint step re-runs its step), and the mixed session's data
check alone (part of its wall). Then, with ``--budgets``, RAM budgets of a fraction of store-all's stage
bytes ((n − 1)·s states): the mixed plan against today's revolve plan with the same bytes in states, and
what PETSc's own trajectory does with ``-ts_trajectory_max_cps_ram``.
Wall and CPU seconds are the slowest rank's, forward steps PETSc's ``TSStep`` count (the steps re-run inside
today's adjoint steps included); every gradient is compared bitwise with TSAdjointSolve's.

    python experiments/mixed/rk_runs.py --grid 128 --ranks 1 --steps 200 --repeats 3 [--states] [--budgets 0.5 0.25 0.1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _gathered(comm, vec):
    import numpy as np

    return np.concatenate(comm.allgather(vec.getArray(readonly=True).copy()))


def _clean_start(comm) -> None:
    """Free what earlier runs left (Python cycles, petsc4py's parked objects) before a timed run starts:
    otherwise the first garbage cleanup inside hpcadj's run destroys the previous TSAdjointSolve's TS and
    trajectory on its clock (15-50 ms here), and TSAdjointSolve never pays for hpcadj's leftovers."""
    import gc

    from hpcadj.imports import petsc

    gc.collect()
    petsc().garbage_cleanup(comm)
    comm.Barrier()


def _ts_counters():
    """() -> (TSStep calls, seconds inside TSStep and TSAdjointStep) on this rank, from PETSc's log: the
    seconds both sides spend in PETSc's steps (with the user's callbacks), the rest is their own work."""
    from hpcadj.imports import petsc

    step, adjoint = petsc().Log.Event("TSStep"), petsc().Log.Event("TSAdjointStep")

    def counters():
        info = step.getPerfInfo()
        return info["count"], info["time"] + adjoint.getPerfInfo()["time"]

    return counters


def _timed(comm, run):
    """run() from a clean start: ((wall, CPU, seconds in PETSc's steps), its result, TSStep calls), the
    slowest rank's seconds and the largest count."""
    counters = _ts_counters()
    steps0, in_ts0 = counters()
    _clean_start(comm)
    t0, c0 = time.perf_counter(), time.process_time()
    result = run()
    cpu = time.process_time() - c0
    steps, in_ts = counters()
    comm.Barrier()
    wall = time.perf_counter() - t0
    top = [comm.allreduce(x, op=_max()) for x in (wall, cpu, in_ts - in_ts0, steps - steps0)]
    return tuple(top[:3]), result, top[3]


def _petsc(comm, m, n, options=None):
    """TSSolve + TSAdjointSolve on a fresh TS: ((wall, CPU, in PETSc's steps), (λ_0, μ) or the error's first
    line, TSStep calls)."""
    from hpcadj.imports import petsc
    from hpcadj.ts.check import tsadjoint_gradient

    import allen_cahn

    opts = petsc().Options()
    for key, value in (options or {}).items():
        opts[key] = value
    ts, u0, k_vec, _, objective = allen_cahn.make_ts(comm, m, steps=n)
    if options:
        ts.setSaveTrajectory()
        ts.setFromOptions()  # the trajectory reads its (unprefixed) options here

    def run():
        try:
            if options:
                ts.setMaxSteps(n)
                u = u0.copy()
                ts.solve(u)
                lam, mu = objective[1](u), k_vec.duplicate()
                mu.set(0.0)
                ts.setCostGradients([lam], [mu])
                ts.adjointSolve()
                return lam, mu
            got = tsadjoint_gradient(ts, u0, n, objective, parameters=k_vec)
            return got.lam0, got.mu
        except petsc().Error as exc:  # PETSc's refusal, reported as its first line
            return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        finally:
            for key in options or {}:
                opts.delValue(key)

    return _timed(comm, run)


def _max():
    from hpcadj.imports import mpi

    return mpi().MAX


def _hpcadj(comm, stepper, schedule, ram=None):
    from hpcadj.adjoint.session import Checkpointing, GradientSession

    controls = stepper.default_controls()
    times, outcome, steps = _timed(
        comm, lambda: GradientSession(stepper, Checkpointing(schedule=schedule, ram=ram), controls=controls).solve())
    assert outcome.status == "complete", outcome.message
    return times, outcome, steps


def _data_check(comm, stepper):
    """Seconds of the data check a mixed session runs first (refuse_untrusted_data), alone."""
    from hpcadj.adjoint.data_check import refuse_untrusted_data

    controls = stepper.default_controls()
    _clean_start(comm)
    t0 = time.perf_counter()
    refuse_untrusted_data(stepper, controls)
    comm.Barrier()
    return time.perf_counter() - t0


def _same(comm, outcome, reference) -> bool:
    import numpy as np

    if isinstance(reference, str):
        return False
    g = outcome.result.gradient
    return bool(np.array_equal(_gathered(comm, g["u0"]), _gathered(comm, reference[0]))
                and np.array_equal(_gathered(comm, g["k"]), _gathered(comm, reference[1])))


def worker(args) -> None:
    from hpcadj.imports import mpi, petsc

    petsc().Log.begin()
    sys.path.insert(0, str(HERE))
    import allen_cahn

    comm = mpi().COMM_WORLD
    m, n = args.grid, args.steps
    stepper = allen_cahn.build(comm, argparse.Namespace(grid=str(m), steps=n))
    rows = []

    def emit(**row):
        row.update(grid=f"{m}x{m}", ranks=comm.size, n=n)
        rows.append(row)
        if comm.rank == 0:
            print("ROW " + json.dumps(row), flush=True)

    for rep in range(args.repeats):
        if rep % 2:  # odd repeats run hpcadj first: neither side always runs first
            (wall_m, cpu_m, ts_m), mixed, steps_m = _hpcadj(comm, stepper, "mixed")
            (wall_p, cpu_p, ts_p), ref, steps_p = _petsc(comm, m, n)
        else:
            (wall_p, cpu_p, ts_p), ref, steps_p = _petsc(comm, m, n)
            (wall_m, cpu_m, ts_m), mixed, steps_m = _hpcadj(comm, stepper, "mixed")
        row = dict(part="store-all", repeat=rep, petsc_s=wall_p, petsc_cpu_s=cpu_p, petsc_steps=steps_p,
                   petsc_ts_s=ts_p, mixed_ts_s=ts_m, hpcadj_first=bool(rep % 2),
                   mixed_s=wall_m, mixed_cpu_s=cpu_m, mixed_steps=steps_m, check_s=_data_check(comm, stepper),
                   mixed_ratio=wall_m / wall_p, mixed_cpu_ratio=cpu_m / cpu_p, mixed_bitwise=_same(comm, mixed, ref))
        if args.states:
            # restart states alone (store-all of a model with data would keep its stages): revolve with room for all
            (wall_s, cpu_s, _), states, steps_s = _hpcadj(comm, stepper, "revolve", ram=n)
            row.update(states_s=wall_s, states_cpu_s=cpu_s, states_steps=steps_s, states_ratio=wall_s / wall_p,
                       states_cpu_ratio=cpu_s / cpu_p, states_bitwise=_same(comm, states, ref))
        emit(**row)
    if not args.budgets:
        return
    _, ref, _ = _petsc(comm, m, n)
    info = _hpcadj(comm, stepper, "mixed")[1].info["mixed"]
    r, d = info["restart_bytes"], info["data_bytes"]
    full = (n - 1) * d
    for fraction in args.budgets:
        budget = int(full * fraction)
        slots = min(budget // r, n - 1)
        (wall_m, cpu_m, _), mixed, steps_m = _hpcadj(comm, stepper, "mixed", ram=f"{budget}B")
        (wall_r, cpu_r, _), today, steps_r = _hpcadj(comm, stepper, "revolve" if slots < n - 1 else "store-all",
                                                  ram=slots)
        emit(part="budget", fraction=fraction, budget_states=budget / r, mixed_s=wall_m, mixed_cpu_s=cpu_m,
             today_cpu_s=cpu_r, mixed_steps=steps_m,
             mixed_plan_steps=mixed.result.forward_steps, data_writes=mixed.info["mixed"]["data_writes"],
             restart_writes=mixed.info["mixed"]["restart_writes"], today_slots=slots, today_s=wall_r,
             today_steps=steps_r, mixed_bitwise=_same(comm, mixed, ref), today_bitwise=_same(comm, today, ref))
        cps = max(1, int(budget // (r * (d // r + 1))))  # checkpoints of a state and its stages
        for memory_type in ("revolve", "petsc"):
            (wall, cpu, _), got, steps = _petsc(comm, m, n, {"ts_trajectory_type": "memory",
                                                   "ts_trajectory_max_cps_ram": str(cps),
                                                   "ts_trajectory_memory_type": memory_type})
            emit(part="petsc-own", fraction=fraction, memory_type=memory_type, max_cps_ram=cps, wall_s=wall,
                 cpu_s=cpu, steps=steps if not isinstance(got, str) else None, outcome=got if isinstance(got, str) else "ran",
                 bitwise=not isinstance(got, str) and _same_vecs(comm, got, ref))


def _same_vecs(comm, got, ref) -> bool:
    import numpy as np

    return bool(np.array_equal(_gathered(comm, got[0]), _gathered(comm, ref[0]))
                and np.array_equal(_gathered(comm, got[1]), _gathered(comm, ref[1])))


def tables(path: str) -> None:
    """The README's tables (markdown) from the rows in ``path``."""
    rows = [json.loads(line) for line in open(path)]
    print("| grid, ranks, n | TSAdjointSolve wall (s) | mixed store-all wall (s) | wall ratio: median, best-of | "
          "CPU ratio median | outside PETSc's steps, ms a step: PETSc / mixed | today's store-all CPU ratio "
          "| data check (s) | TSStep calls (PETSc / mixed / today) | bitwise | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    keys = sorted({(r["grid"], r["ranks"], r["n"], r["when"]) for r in rows if r["part"] == "store-all"},
                  key=lambda k: (int(k[0].split("x")[0]), k[1], k[3]))
    for key in keys:  # one line per grid, ranks, n and run
        rs = [r for r in rows if r["part"] == "store-all" and (r["grid"], r["ranks"], r["n"], r["when"]) == key]
        med = statistics.median
        states = [r["states_cpu_ratio"] for r in rs if "states_cpu_ratio" in r]
        split = [r for r in rs if "mixed_ts_s" in r]
        outside = (f"{med((r['petsc_s'] - r['petsc_ts_s']) / r['n'] for r in split) * 1e3:.2f} / "
                   f"{med((r['mixed_s'] - r['mixed_ts_s']) / r['n'] for r in split) * 1e3:.2f}" if split else "-")
        print(f"| {key[0]}, {key[1]}, {key[2]} | {med(r['petsc_s'] for r in rs):.2f} | {med(r['mixed_s'] for r in rs):.2f} "
              f"| {med(r['mixed_ratio'] for r in rs):.3f}, "
              f"{min(r['mixed_s'] for r in rs) / min(r['petsc_s'] for r in rs):.3f} "
              f"| {med(r['mixed_cpu_ratio'] for r in rs):.3f} | {outside} | {f'{med(states):.3f}' if states else '-'} "
              f"| {med(r['check_s'] for r in rs):.2f} | {rs[0]['petsc_steps']} / {rs[0]['mixed_steps']} / "
              f"{rs[0].get('states_steps', '-')} | {all(r['mixed_bitwise'] and r.get('states_bitwise', True) for r in rs)} "
              f"| {rs[0]['load_before'][0]:.1f}-{rs[-1]['load_after'][0]:.1f} ({len(rs)} repeats) |")
    print()
    print("| grid, ranks | budget (of store-all's stage bytes) | mixed: TSStep calls (plan's), wall, CPU (s) "
          "| data / restart writes | today: plan, TSStep calls, wall, CPU (s) | PETSc max_cps_ram N | bitwise | load |")
    print("|---|---|---|---|---|---|---|---|")
    for r in (r for r in rows if r["part"] == "budget"):
        own = {o["memory_type"]: o for o in rows if o["part"] == "petsc-own" and o["fraction"] == r["fraction"]
               and o["ranks"] == r["ranks"] and o["grid"] == r["grid"] and o["when"] == r["when"]}
        petsc_text = "; ".join(f"{t}: {o['outcome'] if o['outcome'] != 'ran' else 'stores every step, ' + str(o['steps']) + ' TSStep'}"
                               for t, o in own.items())
        plan = f"{'revolve' if r['today_slots'] < r['n'] - 1 else 'store-all'} {r['today_slots']} states"
        print(f"| {r['grid']}, {r['ranks']} | {r['fraction']} ({r['budget_states']:.0f} states) | {r['mixed_steps']} "
              f"({r['mixed_plan_steps']}), {r['mixed_s']:.2f}, {r['mixed_cpu_s']:.2f} | {r['data_writes']} / "
              f"{r['restart_writes']} | {plan}, {r['today_steps']}, {r['today_s']:.2f}, {r['today_cpu_s']:.2f} "
              f"| N = {next(iter(own.values()))['max_cps_ram'] if own else '-'}: {petsc_text} "
              f"| {r['mixed_bitwise'] and r['today_bitwise']} | {r['load_before'][0]:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=int, default=128)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budgets", type=float, nargs="*", default=[])
    parser.add_argument("--states", action="store_true", help="also today's store-all of states (steps re-run)")
    parser.add_argument("--out", default=str(HERE / "rk_runs.jsonl"), help="rows appended here (JSON lines)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tables", metavar="FILE", help="print the README's tables from FILE's rows, run nothing")
    args = parser.parse_args()
    if args.tables:
        tables(args.tables)
        return
    if args.worker:
        worker(args)
        return
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", PYTHONUNBUFFERED="1")
    load = os.getloadavg()
    cmd = ["mpirun", "-n", str(args.ranks), str(ROOT / ".venv/bin/python"), __file__, "--worker",
           "--grid", str(args.grid), "--steps", str(args.steps), "--repeats", str(args.repeats),
           "--budgets", *map(str, args.budgets), *(["--states"] if args.states else [])]
    with tempfile.TemporaryDirectory() as tmp:  # PETSc's trajectories write their directories here
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp, timeout=3600)
    if proc.returncode:
        sys.exit(f"worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("ROW ")]
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with open(args.out, "a") as out:
        for row in rows:
            row.update(when=stamp, load_before=[round(x, 2) for x in load],
                       load_after=[round(x, 2) for x in os.getloadavg()])
            out.write(json.dumps(row) + "\n")
    for row in rows:
        print(json.dumps(row))
    store = [row for row in rows if row["part"] == "store-all"]
    if store:
        best = min(r["mixed_s"] for r in store) / min(r["petsc_s"] for r in store)
        print(f"mixed/TSAdjointSolve wall: median {statistics.median(r['mixed_ratio'] for r in store):.3f}, "
              f"best-of {best:.3f}; CPU median {statistics.median(r['mixed_cpu_ratio'] for r in store):.3f}; "
              f"load {load[0]:.1f} -> {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
