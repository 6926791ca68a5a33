"""A small sweep of real gradient runs, logged with Telemetry + RunLog, for ``hpcadj analyze``.

The heat model (theta scheme, CG) on a 2-D grid: store-all on RAM, node-local disk and parallel
HDF5, and Revolve with 3, 6 and 12 RAM slots. Every run writes its own log directory under
``OUT/logs``; the script then leaves the analysis to ``hpcadj analyze``. Run it with
``mpirun -n 2 .venv/bin/python experiments/telemetry/sweep.py OUT`` (see README.md here).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

from hpcadj.imports import mpi, petsc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="output directory (logs go to OUT/logs/<run>)")
    parser.add_argument("--grid", default="192x192")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()

    petsc()
    comm = mpi().COMM_WORLD
    from hpcadj.adjoint import compute_gradient
    from hpcadj.checkpoint.schedules.revolve import Revolve
    from hpcadj.checkpoint.schedules.storeall import StoreAll, store_all_slots
    from hpcadj.checkpoint.storage.factory import make_level
    from hpcadj.models.heat import HeatModel
    from hpcadj.telemetry import Telemetry, open_run_log

    grid = tuple(int(x) for x in args.grid.split("x"))
    n = args.steps
    scratch = comm.bcast(tempfile.mkdtemp(prefix="hpcadj-sweep-") if comm.rank == 0 else None)
    runs = [("store-all ram", "ram", None), ("store-all local", "local", None),
            ("store-all pfs", "pfs", None), ("revolve 12 ram", "ram", 12),
            ("revolve 6 ram", "ram", 6), ("revolve 3 ram", "ram", 3)]
    for label, kind, slots in runs:
        model = HeatModel(comm, grid, n_steps=n, dt=1e-4)
        layout = model.snapshot_layout()
        capacity = slots or store_all_slots(n)
        level = make_level(kind, capacity, layout, comm, path=os.path.join(scratch, f"{label}.h5".replace(" ", "_")),
                           local_dir=scratch)
        schedule = StoreAll(n, [capacity]) if slots is None else Revolve(n, [capacity])
        record = {"label": label, "argv": sys.argv, **model.describe(), "ranks": comm.size,
                  "schedule": schedule.name, "levels": [{"name": level.name, "kind": kind, "capacity": capacity}],
                  "snapshot_bytes": model.snapshot_bytes()}
        log_dir = os.path.join(args.out, "logs", label.replace(" ", "-"))
        log = open_run_log(log_dir, comm, record, overwrite=True)
        result = compute_gradient(model, model.default_controls(), schedule, [level], Telemetry(sinks=[log]))
        stats = {level.name: {"kind": kind, **result.level_stats[0].as_dict()}}
        summary = log.close({"J": result.J, "forward_steps": result.forward_steps,
                             "recomputed_steps": result.recomputed_steps, "levels": stats})
        if comm.rank == 0:
            print(f"{label:16s} wall {summary['wall_seconds']:.3f} s, energy "
                  f"{summary['energy']['total']['joules']:.2f} J ({summary['energy']['total']['source']}), "
                  f"{result.recomputed_steps} recomputed", flush=True)
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
