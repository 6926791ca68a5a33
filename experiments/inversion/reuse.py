"""Forward steps per TAO iteration with checkpoints reused across evaluations, against a naive loop.

Heat, kappa recovered from observed states (observations of a run at the true kappa, made here),
lmvm under two line searches (More-Thuente: f and g together at every trial; Armijo: f at trials, g
at the accepted point) and the three cache policies: ``keep`` (an objective-only request runs the
first sweep and keeps its levels; the gradient at that point runs the reverse sweep from them),
``gradient`` (an objective-only request runs the whole gradient), ``forward`` (one forward sweep, no
snapshot; the gradient reruns the whole session). The naive loop pays n steps per objective request
and a whole session per gradient request. Every policy must give the same iterates bitwise.

    .venv/bin/python experiments/inversion/reuse.py                    # 2 ranks, 8 MiB per rank
    .venv/bin/python experiments/inversion/reuse.py --quick            # 1 rank, a few seconds

The parent launches one ``mpirun`` of this file (``--worker``) and prints the table; results.csv
beside this file unless ``--out DIR``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: line searches: label -> TAO options (an initial step of 8 makes Armijo reject trials)
SEARCHES = {"more-thuente": ["-tao_ls_type", "more-thuente"], "armijo": ["-tao_ls_type", "armijo"],
            "armijo, step 8": ["-tao_ls_type", "armijo", "-tao_ls_stepinit", "8"]}
POLICIES = ("keep", "gradient", "forward")
FIELDS = ["line_search", "policy", "iterations", "forward_steps", "forward_per_iteration",
          "naive_forward_steps", "naive_per_iteration", "naive_over_steps", "adjoint_steps", "sessions",
          "kept_sweeps", "reverse_from_kept", "forward_sweeps", "hits", "seconds", "seconds_per_iteration",
          "J", "same_iterates"]


def worker(args) -> None:
    """Under mpirun: the observations, then every (line search, policy) inversion; rows on rank 0."""
    import numpy as np

    from hpcadj.adjoint.session import Checkpointing
    from hpcadj.imports import h5py, mpi
    from hpcadj.inversion import Inversion
    from hpcadj.models.heat import HeatModel
    from hpcadj.models.observations import Observations

    comm = mpi().COMM_WORLD
    grid = tuple(int(v) for v in args.grid.split("x"))
    observed = sorted({max(1, args.steps * k // 4) for k in (1, 2, 3, 4)})
    truth = HeatModel(comm, grid=grid, n_steps=args.steps, dt=args.dt)
    c = truth.default_controls()
    y, x = truth.grid.node_coordinates()
    truth.grid.owned(c["kappa"])[...] = 1.0 + 0.5 * np.sin(np.pi * x) * np.sin(np.pi * y)
    truth.set_controls(c)
    u, states = truth.initial_state(), {}
    for i in range(args.steps):
        u = truth.step(i, u)
        if i + 1 in observed:
            states[i + 1] = truth.grid.owned_view(u).copy()
    path = os.path.join(args.scratch, "observations.h5")
    with h5py().File(path, "w", driver="mpio", comm=comm) as f:
        f.create_dataset("steps", data=np.array(observed))
        d = f.create_dataset("u", shape=(len(observed),) + truth.grid.global_shape, dtype="f8")
        for k, step in enumerate(observed):
            with d.collective:
                d[(k, *truth.grid.layout().slices)] = states[step]
    del truth, u, states
    model = HeatModel(comm, grid=grid, n_steps=args.steps, dt=args.dt, observations=Observations.from_file(path))
    snapshot = comm.allreduce(model.snapshot_bytes() // comm.size, op=mpi().MAX)
    rows = []
    for search, options in ((k, SEARCHES[k]) for k in args.searches.split(";")):
        reference = None
        # More-Thuente asks f and g together: every policy runs the same sessions (tests/mpi check it)
        policies = args.policies.split(",") if search != "more-thuente" or args.all else ["keep"]
        for policy in policies:
            ck = Checkpointing(ram=args.ram, disk=args.disk, local_dir=os.path.join(args.scratch, "local"),
                               schedule="multilevel" if args.disk else "revolve")
            comm.Barrier()
            t0 = time.perf_counter()
            bounds = {"kappa": (args.kappa_min, args.kappa_max)} if args.tao == "blmvm" else None
            r = Inversion(model, ["kappa"], ck, tao_type=args.tao, bounds=bounds, max_it=args.iterations, gatol=0.0,
                          grtol=0.0, gttol=0.0, policy=policy, tao_options=options).solve()
            seconds = comm.allreduce(time.perf_counter() - t0, op=mpi().MAX)
            kappa = r.controls["kappa"].getArray(readonly=True).tobytes()
            same = comm.allreduce(int(reference is None or kappa == reference), op=mpi().MIN)
            reference = reference if reference is not None else kappa
            its, cnt = max(r.iterations, 1), r.counts
            rows.append({"line_search": search, "policy": policy, "iterations": r.iterations,
                         "forward_steps": cnt["forward_steps"],
                         "forward_per_iteration": round(cnt["forward_steps"] / its, 1),
                         "naive_forward_steps": cnt["naive_forward_steps"],
                         "naive_per_iteration": round(cnt["naive_forward_steps"] / its, 1),
                         "naive_over_steps": round(cnt["naive_forward_steps"] / cnt["forward_steps"], 3),
                         "adjoint_steps": cnt["adjoint_steps"], "sessions": cnt["sessions"],
                         "kept_sweeps": cnt["kept_sweeps"], "reverse_from_kept": cnt["reverse_from_kept"],
                         "forward_sweeps": cnt["forward_sweeps"], "hits": cnt["hits"],
                         "seconds": round(seconds, 2), "seconds_per_iteration": round(seconds / its, 2),
                         "J": r.J, "same_iterates": bool(same)})
    if comm.rank == 0:
        print(json.dumps({"snapshot_bytes_per_rank": snapshot, "rows": rows}))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--grid", default="1024x2048", help="NYxNX (default: 8 MiB per rank on 2 ranks)")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--dt", type=float, default=1e-6)
    p.add_argument("--ram", type=int, default=4, help="RAM slots per rank")
    p.add_argument("--disk", type=int, default=0, help="node-local slots per rank (0: RAM only, revolve)")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--searches", default=";".join(SEARCHES), help="line searches, ';'-separated: " + "; ".join(SEARCHES))
    p.add_argument("--tao", choices=("lmvm", "blmvm"), default="lmvm",
                   help="blmvm keeps kappa within --kappa-min/--kappa-max (an lmvm trial can make it negative)")
    p.add_argument("--kappa-min", type=float, default=0.3)
    p.add_argument("--kappa-max", type=float, default=3.0)
    p.add_argument("--all", action="store_true", help="every policy under More-Thuente too")
    p.add_argument("--quick", action="store_true", help="1 rank, 64x64, 24 steps, 3 iterations, every policy")
    p.add_argument("--out", default=str(HERE))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--scratch", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = [k for k in args.searches.split(";") if k not in SEARCHES]
    if unknown:
        p.error(f"--searches: unknown line search {unknown[0]!r} (known: {'; '.join(SEARCHES)})")
    if args.worker:
        worker(args)
        return 0
    sys.path.insert(0, str(HERE.parent))
    import tempfile

    from _harness import PY, machine, mpirun

    if args.quick:
        args.ranks, args.grid, args.iterations, args.all, args.steps, args.dt = 1, "64x64", 3, True, 24, 2e-5
    with tempfile.TemporaryDirectory(prefix="hpcadj-reuse-") as scratch:
        argv_worker = [PY, __file__, "--worker", "--scratch", scratch, "--grid", args.grid, "--steps", args.steps,
                       "--dt", args.dt, "--ram", args.ram, "--disk", args.disk, "--iterations", args.iterations,
                       "--policies", args.policies, "--searches", args.searches, "--tao", args.tao,
                       "--kappa-min", args.kappa_min, "--kappa-max", args.kappa_max, *(["--all"] if args.all else [])]
        out = mpirun(args.ranks, argv_worker, timeout=3600)
    found = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    rows = found["rows"]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    m = machine()
    print(f"# heat {args.grid}, {args.steps} steps, {args.ranks} rank(s), snapshot "
          f"{found['snapshot_bytes_per_rank'] / 2**20:.1f} MiB per rank, RAM {args.ram} slots"
          f"{f', disk {args.disk}' if args.disk else ''}; {args.tao}, {args.iterations} iterations; "
          f"{m['cpu']} ({m['nproc']} cores), load {m['loadavg_1m']}, {m['date']}")
    print("| line search | policy | iterations | forward steps (per it.) | naive loop (per it.) | naive / cache "
          "| adjoint steps | sessions | kept sweeps | reverse from kept | hits | s per it. | same iterates |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['line_search']} | {r['policy']} | {r['iterations']} | {r['forward_steps']} "
              f"({r['forward_per_iteration']}) | {r['naive_forward_steps']} ({r['naive_per_iteration']}) | "
              f"{r['naive_over_steps']:.2f} | {r['adjoint_steps']} | {r['sessions']} | {r['kept_sweeps']} | "
              f"{r['reverse_from_kept']} | {r['hits']} | {r['seconds_per_iteration']} | {r['same_iterates']} |")
    return 0 if all(r["same_iterates"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
