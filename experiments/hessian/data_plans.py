"""One wave H v under restart states alone against the composite's adjoint data (u^i, du^i): forward
steps, wall time and peak RSS per rank, and whether the products are bitwise equal.

Plans (HessianSession, one uncompressed RAM level): ``states-all`` (revolve with a pair slot for every
step: the states-only store-all), ``data-all`` (store-all, which now keeps every step's data),
``states-half`` / ``data-half`` (revolve / ``--schedule mixed`` with RAM for one pair of fields a step,
n / 2 pair slots, about half the states-only store-all's bytes). One plan per process, so each peak RSS
is its own; prints one JSON line (the H v's sha256 over all ranks for the bitwise comparison).

    mpirun -n 2 python experiments/hessian/data_plans.py --grid 384x384 --steps 40 --plan data-half
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import numpy as np

from hpcadj.imports import mpi, petsc

petsc()
from hpcadj.adjoint import hessian as H  # noqa: E402
from hpcadj.adjoint import verify as V  # noqa: E402
from hpcadj.checkpoint.options import Checkpointing  # noqa: E402
from hpcadj.models.wave import WaveModel  # noqa: E402
from hpcadj.telemetry.jsonlog import peak_rss_bytes  # noqa: E402

PLANS = {"states-all": lambda n: Checkpointing(ram=str(n), schedule="revolve"),
         "data-all": lambda n: Checkpointing(),
         "states-half": lambda n: Checkpointing(ram=str(n // 2), schedule="revolve"),
         "data-half": lambda n: Checkpointing(ram=str(n // 2), schedule="mixed")}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grid", default="384x384")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--plan", choices=sorted(PLANS), required=True)
    args = p.parse_args()
    comm = mpi().COMM_WORLD
    model = WaveModel(comm, tuple(int(x) for x in args.grid.split("x")), n_steps=args.steps)
    controls = model.default_controls()
    controls["c"].scale(0.97)  # not the defaults
    v = V.scaled_direction(model, controls, 11, scale={k: 0.1 for k in controls})
    session = H.HessianSession(model, PLANS[args.plan](args.steps))
    comm.Barrier()
    start = time.perf_counter()
    result = session.hessian_action(controls, v)
    comm.Barrier()
    wall = time.perf_counter() - start
    info = session.last_outcome.info
    blocks = comm.gather({k: np.array(vec.getArray(readonly=True)) for k, vec in result.hessian.items()})
    peak = comm.allreduce(peak_rss_bytes(), op=mpi().MAX)
    if comm.rank == 0:
        digest = hashlib.sha256()
        for name in sorted(blocks[0]):
            for block in blocks:
                digest.update(block[name].tobytes())
        print(json.dumps({"plan": args.plan, "grid": args.grid, "steps": args.steps, "ranks": comm.size,
                          "schedule": info["schedule"], "forward_steps": info["forward_steps"],
                          "wall_s": round(wall, 2), "peak_rss_mib": round(peak / 2 ** 20, 1),
                          "J": result.J, "hv_sha256": digest.hexdigest()[:16]}))


if __name__ == "__main__":
    main()
