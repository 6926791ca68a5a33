"""hpcadj under a user's TS (hpcadj.ts) against PETSc 3.18's own trajectory on PETSc's ex5adj (Gray–Scott).

Two studies, each case a separate ``mpirun -n RANKS`` process (so peak RSS is the case's own):

A. store-all: hpcadj's gradient (every state in RAM) against TSSolve + TSAdjointSolve with the memory
   trajectory, CN and RK4, both in one process, alternated, ``--repeats`` times: wall ratio per repeat.
B. a budget of about a tenth of store-all's states: hpcadj (RAM slots, revolve) against what this
   PETSc can do: its memory trajectory storing all, its two-level stride scheme, solution-only, and the
   basic (file) trajectory: wall, peak RSS over the process's RSS before the run, bytes on disk,
   forward steps over n.
C. (``--equal STRIDE ...``) equal memory: PETSc's stride scheme (what this PETSc permits without
   revolve) against hpcadj's revolve plan with as many RAM slots as that scheme holds states.

    python experiments/ts_adapter/run.py                 # the defaults: A at 512^2, B at 256^2
    python experiments/ts_adapter/run.py --grid-a 64 --grid-b 64 --steps-b 20 --repeats 1   # quick
    python experiments/ts_adapter/run.py --equal 4 8 --grid-b 256 --steps-b 64               # C
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def _peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _dir_bytes(path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


# -- worker (inside mpirun) -------------------------------------------------------------------------
def _petsc_options(case: str, n: int, budget: int, tmp: str) -> dict:
    if case == "petsc-memory":
        return {"ts_trajectory_type": "memory"}
    if case == "petsc-stride":
        # without revolve, the scheme this build accepts: a checkpoint every `budget` steps, a stride's
        # states recomputed and held during its adjoint (stride > max_cps_ram fails: "revolve is needed")
        return {"ts_trajectory_type": "memory", "ts_trajectory_max_cps_ram": str(budget),
                "ts_trajectory_stride": str(budget), "ts_trajectory_save_stack": "0"}
    if case == "petsc-solution-only":
        return {"ts_trajectory_type": "memory", "ts_trajectory_solution_only": "1"}
    if case == "petsc-basic":
        return {"ts_trajectory_type": "basic", "ts_trajectory_dirname": os.path.join(tmp, "traj")}
    raise ValueError(case)


#: time steps: ex5adj's 0.5 for CN; RK4 is stable on these grids only with a smaller one
DT = {"cn": 0.5, "rk": 0.05}


def _petsc_gradient(comm, m, ts_type, n, options, disk_dir=None):
    """TSSolve + TSAdjointSolve with ``options``: wall, the result, TSStep calls, bytes the trajectory
    left on disk after TSSolve (the basic trajectory deletes its files when the adjoint is done)."""
    from hpcadj.imports import petsc
    from hpcadj.ts.check import PetscGradient
    from hpcadj.ts.examples import GrayScott

    opts = petsc().Options()          # PETSc 3.18's trajectory reads no TS prefix: plain options
    for key, value in options.items():
        opts[key] = value
    gs = GrayScott(comm, m=m, ts_type=ts_type, dt=DT[ts_type])
    gs.ts.setSaveTrajectory()
    gs.ts.setFromOptions()
    for key in options:
        opts.delValue(key)
    event = petsc().Log.Event("TSStep")
    before = event.getPerfInfo()["count"]
    value, gradient = gs.objective()
    ts, u = gs.ts, gs.u0.copy()
    ts.setMaxSteps(n)
    comm.Barrier()
    t0 = time.perf_counter()
    ts.solve(u)
    J, lam = value(u), gradient(u)
    disk = _dir_bytes(disk_dir) if disk_dir and comm.rank == 0 and os.path.isdir(disk_dir) else 0
    mu = gs.p.duplicate()
    mu.set(0.0)
    ts.setCostGradients([lam], [mu])
    ts.adjointSolve()
    comm.Barrier()
    wall = time.perf_counter() - t0
    steps = comm.allreduce(event.getPerfInfo()["count"] - before, op=mpi_max())
    return wall, PetscGradient(J, lam, mu, n), steps, disk


def mpi_max():
    from hpcadj.imports import mpi

    return mpi().MAX


def _hpcadj_gradient(comm, stepper, checkpointing):
    from hpcadj.adjoint.session import GradientSession

    controls = stepper.default_controls()
    comm.Barrier()
    t0 = time.perf_counter()
    outcome = GradientSession(stepper, checkpointing, controls=controls).solve()
    comm.Barrier()
    assert outcome.status == "complete", outcome.message
    return time.perf_counter() - t0, outcome


def worker(args) -> None:
    from hpcadj.adjoint.session import Checkpointing
    from hpcadj.imports import mpi, petsc
    from hpcadj.ts.examples import GrayScott

    petsc().Log.begin()
    comm = mpi().COMM_WORLD
    out = {"case": args.case, "ts_type": args.ts_type, "grid": args.grid, "steps": args.steps, "ranks": comm.size}
    base = comm.allreduce(_rss_kib(), op=mpi().MAX)
    if args.case == "storeall-pair":
        ratios, walls_h, walls_p = [], [], []
        gs = GrayScott(comm, m=args.grid, ts_type=args.ts_type, dt=DT[args.ts_type])
        stepper = gs.stepper(args.steps)
        for r in range(args.repeats):
            wp, theirs, _, _ = _petsc_gradient(comm, args.grid, args.ts_type, args.steps, {"ts_trajectory_type": "memory"})
            wh, outcome = _hpcadj_gradient(comm, stepper, None)
            walls_h.append(wh)
            walls_p.append(wp)
            ratios.append(wh / wp)
            diff = (outcome.result.gradient["u0"] - theirs.lam0).norm() / theirs.lam0.norm()
            del theirs
            petsc().garbage_cleanup(comm)
        out.update(hpcadj_wall_s=statistics.median(walls_h), petsc_wall_s=statistics.median(walls_p),
                   ratio=statistics.median(ratios), ratios=ratios, gradient_rel_diff=diff)
    else:
        tmp = comm.bcast(tempfile.mkdtemp(prefix="tsad-", dir=args.tmp) if comm.rank == 0 else None)
        if args.case.startswith("petsc"):
            wall, result, forward, disk = _petsc_gradient(comm, args.grid, args.ts_type, args.steps,
                                                          _petsc_options(args.case, args.steps, args.budget, tmp),
                                                          os.path.join(tmp, "traj"))
        else:
            gs = GrayScott(comm, m=args.grid, ts_type=args.ts_type, dt=DT[args.ts_type])
            stepper = gs.stepper(args.steps)
            if args.case == "hpcadj-storeall":
                ck = None
            elif args.case == "hpcadj-memory":   # a whole-process budget per rank: hpcadj sizes its RAM slots
                ck = Checkpointing(memory=f"{args.memory_mib}MiB", ram=args.steps, schedule="revolve")
            else:
                ck = Checkpointing(ram=args.budget, schedule="revolve")
            wall, outcome = _hpcadj_gradient(comm, stepper, ck)
            forward, disk = outcome.result.forward_steps, 0
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        out.update(wall_s=wall, forward_steps=forward, disk_bytes=disk, budget_states=args.budget,
                   memory_budget_mib=args.memory_mib)
    peak = comm.allreduce(_peak_kib(), op=mpi().MAX)
    out.update(baseline_rss_mib=base / 1024, peak_rss_mib=peak / 1024, peak_over_baseline_mib=(peak - base) / 1024,
               state_mib=args.grid * args.grid * 2 * 8 / 2 ** 20 / comm.size)
    if comm.rank == 0:
        print("RESULT " + json.dumps(out), flush=True)


# -- driver -----------------------------------------------------------------------------------------
def launch(ranks, argv, timeout=3600) -> dict:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    cmd = ["mpirun", "--oversubscribe", "-n", str(ranks), sys.executable, str(Path(__file__)), "--worker", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{' '.join(cmd)} failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--case")
    p.add_argument("--ts-type", default="cn")
    p.add_argument("--grid", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--budget", type=int, default=0)
    p.add_argument("--memory-mib", type=float)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tmp", default=tempfile.gettempdir())
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--grid-a", type=int, default=512)
    p.add_argument("--steps-a", type=int, default=10)
    p.add_argument("--grid-b", type=int, default=256)
    p.add_argument("--steps-b", type=int, default=40)
    p.add_argument("--out", default=str(HERE))
    p.add_argument("--equal", type=int, nargs="*", metavar="STRIDE",
                   help="study C only: PETSc's stride scheme at these strides against hpcadj with as many RAM slots")
    args, _petsc_args = p.parse_known_args()
    if args.worker:
        worker(args)
        return
    if args.equal is not None:
        equal_memory(args)
        return
    rows = []
    for ts_type in ("cn", "rk"):
        r = launch(args.ranks, ["--case", "storeall-pair", "--ts-type", ts_type, "--grid", str(args.grid_a),
                                "--steps", str(args.steps_a), "--repeats", str(args.repeats)])
        print(json.dumps(r), flush=True)
        rows.append(r)
    budget = max(args.steps_b // 10, 2)
    for ts_type in ("cn", "rk"):
        for case in ("hpcadj-storeall", "hpcadj-budget", "hpcadj-memory", "petsc-memory", "petsc-stride",
                     "petsc-solution-only", "petsc-basic"):
            extra = []
            if case == "hpcadj-memory":
                # store-all's peak with its snapshots cut to a tenth: the whole-process budget per rank
                full = next(r for r in rows if r["case"] == "hpcadj-storeall" and r["ts_type"] == ts_type)
                extra = ["--memory-mib", f"{full['peak_rss_mib'] - 0.9 * args.steps_b * full['state_mib']:.1f}"]
            r = launch(args.ranks, ["--case", case, "--ts-type", ts_type, "--grid", str(args.grid_b),
                                    "--steps", str(args.steps_b), "--budget", str(budget), *extra])
            print(json.dumps(r), flush=True)
            rows.append(r)
    out = Path(args.out)
    keys = ["case", "ts_type", "grid", "steps", "ranks", "budget_states", "ratio", "hpcadj_wall_s", "petsc_wall_s",
            "wall_s", "forward_steps", "peak_rss_mib", "baseline_rss_mib", "peak_over_baseline_mib", "disk_bytes",
            "state_mib", "memory_budget_mib", "gradient_rel_diff"]
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    plot(rows, out / "ts_adapter.png")


def petsc_stride_states(n: int, stride: int) -> int:
    """States PETSc's stride scheme (no revolve) holds at its peak: a checkpoint every ``stride`` steps
    (the ones at steps 0, stride, ... below n) and, in the reverse sweep, one stride's states."""
    return -(-n // stride) + stride


def equal_memory(args) -> None:
    """C: PETSc's stride scheme at a slot budget against hpcadj's revolve plan with as many RAM slots,
    each case its own process, the ratios of forward steps per n and of wall printed side by side."""
    rows = []
    for ts_type in ("cn", "rk"):
        for stride in args.equal or [4, 8]:
            slots = petsc_stride_states(args.steps_b, stride)
            common = ["--ts-type", ts_type, "--grid", str(args.grid_b), "--steps", str(args.steps_b)]
            theirs = launch(args.ranks, ["--case", "petsc-stride", *common, "--budget", str(stride)])
            mine = launch(args.ranks, ["--case", "hpcadj-budget", *common, "--budget", str(slots)])
            row = {"ts_type": ts_type, "grid": args.grid_b, "steps": args.steps_b, "ranks": args.ranks,
                   "petsc_stride": stride, "slots": slots,
                   "petsc_steps_per_n": theirs["forward_steps"] / args.steps_b,
                   "hpcadj_steps_per_n": mine["forward_steps"] / args.steps_b,
                   "petsc_wall_s": theirs["wall_s"], "hpcadj_wall_s": mine["wall_s"],
                   "steps_ratio": mine["forward_steps"] / theirs["forward_steps"],
                   "wall_ratio": mine["wall_s"] / theirs["wall_s"],
                   "petsc_peak_over_base_mib": theirs["peak_over_baseline_mib"],
                   "hpcadj_peak_over_base_mib": mine["peak_over_baseline_mib"]}
            print(json.dumps(row), flush=True)
            rows.append(row)
    with open(Path(args.out) / "equal_memory.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def plot(rows, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, ts_type in zip(axes, ("cn", "rk")):
        sel = [r for r in rows if r["ts_type"] == ts_type and "wall_s" in r]
        labels = [r["case"].replace("petsc-", "PETSc ").replace("hpcadj-", "hpcadj ") for r in sel]
        x = range(len(sel))
        ax.bar([i - 0.2 for i in x], [r["wall_s"] for r in sel], 0.4, label="wall (s)", color="tab:blue")
        ax2 = ax.twinx()
        ax2.bar([i + 0.2 for i in x], [r["peak_over_baseline_mib"] for r in sel], 0.4, label="peak RSS over baseline (MiB)",
                color="tab:orange")
        budget_mib = sel[0]["budget_states"] * sel[0]["state_mib"] if sel else 0
        ax2.axhline(budget_mib, color="tab:orange", ls="--", lw=1, label=f"budget ({sel[0]['budget_states']} states)")
        for i, r in enumerate(sel):
            if r.get("disk_bytes"):
                ax2.text(i + 0.2, r["peak_over_baseline_mib"], f"{r['disk_bytes'] / 2 ** 20:.0f} MiB\non disk",
                         ha="center", va="bottom", fontsize=7)
            if r.get("forward_steps"):
                ax.text(i - 0.2, r["wall_s"], f"x{r['forward_steps'] / r['steps']:.2f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(x), labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("wall (s)")
        ax2.set_ylabel("peak RSS over baseline (MiB, max over ranks)")
        ax.set_title(f"ex5adj {sel[0]['grid']}^2, {sel[0]['steps']} steps, {ts_type.upper()}, {sel[0]['ranks']} ranks"
                     if sel else ts_type)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
