"""A TS run's memory baseline: ``hpcadj run`` on a user's TS against the same user's plain petsc4py script.

The user's TS (a 1-D reaction–diffusion, CN, periodic DMDA, as in docs/ts.md) is written once here.
Run plain (``python baseline.py --plain``) it is the user's script: ``import petsc4py;
petsc4py.init(sys.argv)``, TSSolve with a memory trajectory, then TSAdjointSolve. Run through
``hpcadj run --model baseline.py:build`` it is the same TS under hpcadj (store-all). Either way every
rank reports its resident set at the TS's first RHS evaluation, i.e. with everything set up and
before the first state is computed, the seconds since its process started, and its peak at exit.

    python experiments/ts_adapter/baseline.py            # both, 1 and 2 ranks, alternated, 3 repeats

writes baseline.csv beside this file and prints the table of the README's section E.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TAG = "BASELINE "
N, STEPS = 4096, 20


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def _since_start() -> float:
    """Seconds since this process started (/proc: its start tick against the uptime)."""
    with open("/proc/self/stat") as f:
        start = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        return float(f.read().split()[0]) - start / os.sysconf("SC_CLK_TCK")


def _report(rank: int, what: str, **fields) -> None:
    print(TAG + json.dumps({"rank": rank, "what": what, **fields}), file=sys.stderr, flush=True)


def make_ts(comm, PETSc, n=N, k=2.0):
    """The user's TS: u_t = D u_xx + k u (1 - u), periodic, CN, assembled tridiagonal Jacobian."""
    import numpy as np

    da = PETSc.DMDA().create(dim=1, sizes=(n,), dof=1, boundary_type="periodic", stencil_width=1, comm=comm)
    h, D = 1.0 / n, 1e-3
    local, (xs, xe) = da.createLocalVec(), da.getRanges()[0]
    lo = xs - da.getGhostRanges()[0][0]
    first = [True]

    def rhs(ts, t, u, f):
        if first[0]:
            first[0] = False
            _report(comm.rank, "first_rhs", rss_kib=_status_kib("VmRSS"), hwm_kib=_status_kib("VmHWM"),
                    since_start_s=round(_since_start(), 3))
        da.globalToLocal(u, local)
        g = local.getArray(readonly=True)
        w = g[lo:lo + xe - xs]
        f.getArray()[:] = D * (g[lo - 1:lo - 1 + xe - xs] - 2 * w + g[lo + 1:lo + 1 + xe - xs]) / h**2 + k * w * (1 - w)

    rows = np.arange(xs, xe, dtype=PETSc.IntType)
    cols = np.stack([(rows - 1) % n, rows, (rows + 1) % n], axis=1).ravel().astype(PETSc.IntType)
    ptr = np.arange(0, 3 * len(rows) + 1, 3, dtype=PETSc.IntType)

    def jacobian(ts, t, u, A, B):
        w = u.getArray(readonly=True)
        vals = np.empty((len(w), 3))
        vals[:, 0] = vals[:, 2] = D / h**2
        vals[:, 1] = -2 * D / h**2 + k * (1 - 2 * w)
        A.setValuesCSR(ptr, cols, vals.ravel())
        A.assemble()
        return True

    u0 = da.createGlobalVec()
    x = (np.arange(xs, xe) + 0.5) * h
    u0.getArray()[:] = 0.3 + 0.2 * np.sin(2 * np.pi * x)
    ts = PETSc.TS().create(comm=comm)
    ts.setDM(da)
    ts.setType("cn")
    ts.setRHSFunction(rhs, u0.duplicate())
    ts.setRHSJacobian(jacobian, da.createMatrix())
    ts.setTimeStep(0.01)
    ts.setMaxSteps(STEPS)
    ts.setMaxTime(1.0)
    ts.setExactFinalTime(PETSc.TS.ExactFinalTime.MATCHSTEP)
    ts.setFromOptions()
    return ts, u0


def _peak_at_exit(rank: int) -> None:
    atexit.register(lambda: _report(rank, "exit", hwm_kib=_status_kib("VmHWM")))


def build(comm, args=None):
    """``hpcadj run --model baseline.py:build``: the user's TS as a TSStepper, J = h/2 |u_n|^2."""
    from hpcadj.imports import petsc
    from hpcadj.ts import TSStepper

    _peak_at_exit(comm.rank)
    ts, u0 = make_ts(comm, petsc())
    return TSStepper(ts, u0, getattr(args, "steps", None) or STEPS,
                     final=(lambda u: u.dot(u) / (2 * N), lambda u: u * (1.0 / N)), name="baseline")


def plain() -> None:
    """The user's own script: petsc4py as they import it, TSSolve and TSAdjointSolve."""
    import petsc4py

    petsc4py.init(sys.argv)
    from petsc4py import PETSc

    comm = PETSc.COMM_WORLD
    _peak_at_exit(comm.rank)
    ts, u0 = make_ts(comm, PETSc)
    if not PETSc.Options().hasName("ts_trajectory_type"):  # the default, basic, writes ./TS-data-*
        PETSc.Options().setValue("ts_trajectory_type", "memory")
    ts.setSaveTrajectory()
    ts.setFromOptions()  # again: the trajectory reads its type
    u = u0.copy()
    ts.solve(u)
    J, lam = u.dot(u) / (2 * N), u * (1.0 / N)
    ts.setCostGradients([lam])
    ts.adjointSolve()
    norm = lam.norm()  # collective: every rank
    if comm.rank == 0:
        print(f"J = {J:.12g}, |lambda_0| = {norm:.6e}")


def _figures(stderr: str) -> dict:
    rows = [json.loads(found) for found in re.findall(TAG + r"(\{[^}]*\})", stderr)]  # ranks' lines may interleave
    first = [r for r in rows if r["what"] == "first_rhs"]
    exits = [r for r in rows if r["what"] == "exit"]
    return {"rss_mib": max(r["rss_kib"] for r in first) / 1024,
            "since_start_s": max(r["since_start_s"] for r in first),
            "peak_mib": max(r["hwm_kib"] for r in exits) / 1024 if exits else float("nan")}


def main() -> None:
    import argparse
    import csv
    import statistics
    import shutil
    import subprocess
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--before", metavar="DIR", help="also run hpcadj from the checkout DIR (PYTHONPATH), "
                   "e.g. a worktree of the commit before a change")
    args = p.parse_args()
    venv = os.path.join(HERE, "..", "..", ".venv", "bin")
    # as a user runs: byte-code cached (a sandbox may set PYTHONDONTWRITEBYTECODE: every module compiled
    # at every start), each case run once before the timed repeats to write its caches
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
    commands = {"plain petsc4py": [os.path.join(venv, "python"), os.path.abspath(__file__), "--plain"],
                "hpcadj run": [os.path.join(venv, "hpcadj"), "run", "--model", f"{os.path.abspath(__file__)}:build",
                               "--steps", str(STEPS), "--quiet"]}
    envs = {label: env for label in commands}
    if args.before:
        label = f"hpcadj run ({os.path.basename(os.path.abspath(args.before))})"
        commands[label] = commands["hpcadj run"]
        envs[label] = {**env, "PYTHONPATH": os.path.abspath(args.before)}
    rows = []
    work = tempfile.mkdtemp(prefix="hpcadj-baseline-")  # the cases' working directory, removed after
    os.chdir(work)
    for label, cmd in commands.items():
        subprocess.run(cmd, env=envs[label], capture_output=True, timeout=600, check=True)
    for ranks in [int(r) for r in args.ranks.split(",")]:
        for repeat in range(args.repeats):
            for label, cmd in commands.items():  # alternated, so load drifts hit both alike
                proc = subprocess.run(["mpirun", "-n", str(ranks), "-x", "PYTHONPATH", *cmd] if "PYTHONPATH" in
                                      envs[label] else ["mpirun", "-n", str(ranks), *cmd], env=envs[label], text=True,
                                      capture_output=True, timeout=600)
                if proc.returncode != 0:
                    sys.exit(f"{label} on {ranks} rank(s) failed:\n{proc.stderr[-2000:]}")
                rows.append({"ranks": ranks, "repeat": repeat, "case": label, **_figures(proc.stderr)})
                print(json.dumps(rows[-1]), flush=True)
    os.chdir(HERE)
    shutil.rmtree(work)
    with open(os.path.join(HERE, "baseline.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print("| ranks | case | RSS at the first RHS (MiB, largest rank, median) | seconds from start | peak (MiB) |")
    print("|---|---|---|---|---|")
    for ranks in sorted({r["ranks"] for r in rows}):
        for label in commands:
            mine = [r for r in rows if r["ranks"] == ranks and r["case"] == label]
            med = {k: statistics.median(r[k] for r in mine) for k in ("rss_mib", "since_start_s", "peak_mib")}
            print(f"| {ranks} | {label} | {med['rss_mib']:.1f} | {med['since_start_s']:.2f} | {med['peak_mib']:.1f} |")


if __name__ == "__main__":
    if "--plain" in sys.argv:
        sys.argv.remove("--plain")
        plain()
    else:
        main()
