"""What a user's TS really holds, in states: hpcadj's contract probe on PETSc's ex5adj per TS type.

For each TS type the contract's probe (``working_set`` of :mod:`hpcadj.adjoint.contract`, with a factory) builds
the TS after a baseline, runs a few steps and adjoint steps, and reports the peak resident memory
less what the checker holds, in state-equivalents, beside what ``TSStepper.working_set_states()``
declares. Run under ``mpirun -n R``; one JSON line per TS type on rank 0.

    mpirun -n 2 python experiments/ts_adapter/working_set.py --grid 512
"""

from __future__ import annotations

import argparse
import json

TYPES = {"cn": ("cn", None, 0.5), "beuler": ("beuler", None, 0.5), "rk4": ("rk", "4", 0.05),
         "theta-mid": ("theta", None, 0.5)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--grid", type=int, default=512)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--types", default=",".join(TYPES))
    args, _ = p.parse_known_args()
    from hpcadj.adjoint.contract import _working_set
    from hpcadj.imports import mpi
    from hpcadj.ts.examples import GrayScott

    comm = mpi().COMM_WORLD
    for kind in args.types.split(","):
        ts_type, rk, dt = TYPES[kind]

        def factory():
            gs = GrayScott(comm, m=args.grid, ts_type=ts_type, dt=dt)
            if rk:
                gs.ts.setRKType(rk)
            return gs.stepper(args.steps)

        model = factory()
        result = _working_set(model, None, factory, args.steps, 0.25)
        if comm.rank == 0:
            print(json.dumps({"ts": kind, "grid": args.grid, "ranks": comm.size, "status": result.status,
                              "message": result.reason, **result.details}), flush=True)


if __name__ == "__main__":
    main()
