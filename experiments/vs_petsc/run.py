"""hpcadj vs PETSc TS + TSAdjoint on the heat problem (issue 7, study 4), 2 ranks, one process.

The same matrix, theta = 1/2 (PETSc: TSTHETA with endpoint), CG + Jacobi to rtol 1e-13, objective
J = 1/2 h^2 |u_n|^2; PETSc's side is ``hpcadj.models.heat_ts.heat_ts_gradient``. At equal budgets:

- store-all: hpcadj store-all in RAM | TSTrajectory ``memory`` (no limit); hpcadj store-all on
  node-local files (synchronous) | TSTrajectory ``basic`` (one file per step, SA-data/).
- s RAM checkpoints: hpcadj revolve s and periodic s | TSTrajectory ``memory`` with
  ``-ts_trajectory_max_cps_ram s -ts_trajectory_stride s`` (save_stack 0 and 1). This Debian PETSc
  is built without the revolve library, so any ``max_cps_ram`` below the stride fails
  ("reconfigure with --download-revolve"): stride = s is the only budgeted mode available.

Forward-step counts: hpcadj's driver counter; PETSc's from the ``TSStep`` log event. Gradient
difference: |g_hpcadj - g_TS| / |g_TS| for dJ/du_0 (the control both compute). Wall time: the
slowest rank, each pair run back to back, 3 repeats; medians and the median of per-repeat ratios.

    .venv/bin/python experiments/vs_petsc/run.py [--quick]
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
    from hpcadj.imports import mpi, petsc

    PETSc = petsc()
    MPI = mpi()
    comm = MPI.COMM_WORLD
    PETSc.Log.begin()
    from hpcadj.adjoint import Driver
    from hpcadj.checkpoint.schedules import make_schedule, store_all_slots
    from hpcadj.checkpoint.storage.factory import make_level
    from hpcadj.models.heat import HeatModel
    from hpcadj.models.heat_ts import heat_ts_gradient

    work = comm.bcast(H.scratch("vspetsc") if comm.rank == 0 else None)
    os.chdir(work)  # TSTrajectory basic writes SA-data/ in the working directory
    grid = tuple(int(x) for x in args.grid.split("x"))
    n = args.steps
    model = HeatModel(comm, grid, n_steps=n, dt=1e-4, theta=0.5)
    controls = model.default_controls()
    layout = model.snapshot_layout()
    tsstep = PETSc.Log.Event("TSStep")
    opts = PETSc.Options()

    def slowest(t):
        return comm.allreduce(t, op=MPI.MAX)

    def run_hpcadj(name, slots, kind):
        level = make_level(kind, slots, layout, comm, local_dir=work, async_io=False)
        schedule = make_schedule(name, n, [slots])
        comm.Barrier()
        t0 = time.perf_counter()
        result = Driver(model, [level]).run(schedule, controls)
        wall = slowest(time.perf_counter() - t0)
        level.close()
        return wall, result.forward_steps, result.J, result.gradient["u0"]

    def run_ts(trajectory, options):
        for k, v in options.items():
            opts[k] = v
        try:
            c0 = tsstep.getPerfInfo()["count"]
            comm.Barrier()
            t0 = time.perf_counter()
            res = heat_ts_gradient(model, controls, trajectory=trajectory)
            wall = slowest(time.perf_counter() - t0)
            steps = comm.allreduce(tsstep.getPerfInfo()["count"] - c0, op=MPI.MAX)
        finally:
            for k in options:
                del opts[k]
        return wall, steps, res.J, res.grad_u0

    sa = store_all_slots(n)
    cases = [("store-all, RAM", f"store-all RAM ({sa} slots)", lambda: run_hpcadj("store-all", sa, "ram"),
              "TS memory (no limit)", lambda: run_ts("memory", {}))]
    cases.append(("store-all, files", f"store-all node-local sync ({sa} slots)",
                  lambda: run_hpcadj("store-all", sa, "local"), "TS basic (files)", lambda: run_ts("basic", {})))
    for s in args.slots:
        for stack in (0, 1):
            ts_opts = {"ts_trajectory_max_cps_ram": s, "ts_trajectory_stride": s, "ts_trajectory_save_stack": stack}
            for name in ("revolve", "periodic"):
                cases.append((f"{s} RAM checkpoints", f"{name} {s}", lambda name=name, s=s: run_hpcadj(name, s, "ram"),
                              f"TS memory stride {s}, max_cps_ram {s}, save_stack {stack}",
                              lambda o=ts_opts: run_ts("memory", o)))
    # warm-up, not measured
    cases[0][2]()
    cases[0][4]()
    rows = []
    for rep in range(args.repeats):
        for budget, hname, hrun, tname, trun in cases:
            hw, hsteps, hJ, hg = hrun()
            tw, tsteps, tJ, tg = trun()
            diff = hg.copy()
            diff.axpy(-1.0, tg)
            rel = diff.norm() / tg.norm()
            rows.append({"repeat": rep, "budget": budget, "hpcadj": hname, "petsc": tname,
                         "hpcadj_forward_steps": hsteps, "petsc_tsstep_count": tsteps,
                         "hpcadj_wall_s": hw, "petsc_wall_s": tw, "wall_ratio": hw / tw,
                         "grad_u0_rel_diff": rel, "J_rel_diff": abs(hJ - tJ) / abs(tJ)})
            if comm.rank == 0:
                H.log(f"  [{rep}] {hname:38s} {hw:7.3f} s {hsteps:5d} steps | {tname:48s} {tw:7.3f} s "
                      f"{tsteps:5d} steps | grad diff {rel:.2e}")
    if comm.rank == 0:
        Path(args.worker).write_text(json.dumps(rows))
        os.chdir("/")
        import shutil

        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--grid", default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--slots", type=int, nargs="+", default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--out", default=str(HERE))
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--replot", action="store_true", help="redraw the figure from OUT/results.csv")
    args = p.parse_args()
    args.grid = args.grid or ("128x128" if args.quick else "256x256")
    args.steps = args.steps or (40 if args.quick else 60)
    args.slots = args.slots or ([10] if args.quick else [10, 20])
    if args.worker:
        worker(args)
        return 0
    if args.replot:
        import csv

        with open(Path(args.out) / "results.csv") as fh:
            rows = [{k: (float(v) if k.endswith(("_s", "_ratio", "_steps", "_count")) else v) for k, v in r.items()}
                    for r in csv.DictReader(fh)]
        plot(rows, Path(args.out) / "vs_petsc.png", args, H.machine())
        return 0
    info = H.machine()
    H.log(f"vs_petsc: heat {args.grid}, {args.steps} steps, {args.ranks} ranks, load {info['loadavg_1m']}")
    tmp = Path(H.scratch("vspetsc-out")) / "rows.json"
    H.mpirun(args.ranks, [H.PY, __file__, "--worker", tmp, "--grid", args.grid, "--steps", args.steps,
                          "--slots", *args.slots, "--repeats", args.repeats], timeout=3600)
    raw = json.loads(tmp.read_text())
    rows = []
    for key in dict.fromkeys((r["hpcadj"], r["petsc"]) for r in raw):
        rs = [r for r in raw if (r["hpcadj"], r["petsc"]) == key]
        rows.append({"budget": rs[0]["budget"], "hpcadj": key[0], "petsc": key[1],
                     "hpcadj_forward_steps": rs[0]["hpcadj_forward_steps"],
                     "petsc_tsstep_count": rs[0]["petsc_tsstep_count"],
                     "hpcadj_wall_s": H.median([r["hpcadj_wall_s"] for r in rs]),
                     "petsc_wall_s": H.median([r["petsc_wall_s"] for r in rs]),
                     "wall_ratio": H.median([r["wall_ratio"] for r in rs]),
                     "grad_u0_rel_diff": max(r["grad_u0_rel_diff"] for r in rs),
                     "J_rel_diff": max(r["J_rel_diff"] for r in rs), "repeats": len(rs)})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    H.write_csv(out / "results.csv", rows)
    plot(rows, out / "vs_petsc.png", args, info)
    print(H.markdown_table(rows, ["budget", "hpcadj", "petsc", "hpcadj_forward_steps", "petsc_tsstep_count",
                                  "hpcadj_wall_s", "petsc_wall_s", "wall_ratio", "grad_u0_rel_diff"]))
    print(f"\nmachine: {info}; load at the end {H.machine()['loadavg_1m']}; medians of {args.repeats}")
    return 0


def plot(rows, path, args, info) -> None:
    plt = H.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    x = range(len(rows))
    ax1.bar([i - 0.2 for i in x], [r["hpcadj_wall_s"] for r in rows], width=0.4, label="hpcadj")
    ax1.bar([i + 0.2 for i in x], [r["petsc_wall_s"] for r in rows], width=0.4, label="PETSc TS + TSAdjoint")
    for i, r in zip(x, rows):
        ax1.annotate(f"x{r['wall_ratio']:.2f}", (i - 0.2, r["hpcadj_wall_s"]), ha="center", va="bottom", fontsize=7)
    ax1.set_xticks(list(x), [str(i + 1) for i in x])
    ax1.set_xlabel("case: see the README table")
    ax1.set_ylabel(f"wall time (s, median of {args.repeats}, slowest rank)")
    ax1.legend(fontsize=8)
    ax2.bar([i - 0.2 for i in x], [r["hpcadj_forward_steps"] for r in rows], width=0.4, label="hpcadj forward steps")
    ax2.bar([i + 0.2 for i in x], [r["petsc_tsstep_count"] for r in rows], width=0.4, label="PETSc TSStep count")
    ax2.set_xticks(list(x), [str(i + 1) for i in x])
    ax2.set_xlabel("case: see the README table")
    ax2.set_ylabel("forward step evaluations")
    ax2.legend(fontsize=8)
    fig.suptitle(f"hpcadj vs PETSc TSAdjoint: heat {args.grid}, {args.steps} steps, {args.ranks} ranks "
                 f"({info['nproc']}-core VM)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
