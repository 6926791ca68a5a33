"""One H v of the wave model by HessianSession, as its own process under mpirun (for the tests that
kill it or measure its memory): each rank saves its owned blocks of H v and dJ/dm to
``OUT.rank<r>.npz``; rank 0 prints one JSON line (J, steps, the session's memory figures, peak RSS).

    mpirun -n N python tests/mpi/ranks/hessian_job.py OUT [--grid 12x10] [--steps 24] [--disk 3
        --local-dir L] [--run-dir D [--resume]] [--memory 200MiB]
"""

import argparse
import json
import resource
import sys

import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--grid", default="12x10")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--ram", default=None)
    p.add_argument("--disk", default=None)
    p.add_argument("--local-dir", default=None)
    p.add_argument("--run-dir", default=None)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--memory", default=None)
    args = p.parse_args()
    from hpcadj.imports import mpi, petsc

    petsc()
    from hpcadj.adjoint import hessian as H
    from hpcadj.adjoint import verify as V
    from hpcadj.adjoint.session import Checkpointing, ConfigError, Restart
    from hpcadj.models.wave import WaveModel

    comm = mpi().COMM_WORLD
    model = WaveModel(comm, tuple(int(x) for x in args.grid.split("x")), n_steps=args.steps)
    controls = model.default_controls()
    shift = V.scaled_direction(model, controls, 7, scale={k: 0.05 for k in controls})
    for k in controls:
        controls[k].axpy(1.0, shift[k])
    v = V.scaled_direction(model, controls, 11, scale={k: 0.1 for k in controls})
    checkpointing = Checkpointing(ram=args.ram, disk=args.disk, local_dir=args.local_dir, memory=args.memory,
                                  schedule="revolve" if args.disk and not args.ram else None)
    options = {}
    if args.run_dir:
        options["restart"] = Restart(args.run_dir, resume=args.resume, durable_every=2)
    session = H.HessianSession(model, checkpointing, **options)
    try:
        result = session.hessian_action(controls, v)
    except ConfigError as exc:
        if comm.rank == 0:
            print(json.dumps({"error": str(exc)}))
        sys.exit(2)
    arrays = {f"h_{k}": a for k, a in H.owned_arrays(model, result.hessian).items()}
    arrays.update({f"g_{k}": a for k, a in H.owned_arrays(model, result.gradient).items()})
    np.savez(f"{args.out}.rank{comm.rank}.npz", **arrays)
    info = session.last_outcome.info
    peak = comm.allreduce(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, op=mpi().MAX)
    if comm.rank == 0:
        print(json.dumps({"J": result.J.hex(), "forward_steps": result.result.forward_steps,
                          "actions": info.get("actions"), "memory": info.get("memory"), "peak_rss_bytes": peak}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
