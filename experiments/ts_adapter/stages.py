"""Stages stored with the snapshot, or the step recomputed before each adjoint step? (issue 29)

For a method whose adjoint reads stages other than u_i and u_{i+1} (RK) the adapter re-runs the
forward step from u_i before ``TSAdjointStep``; θ-midpoint's one stage it reconstructs from u_i and
u_{i+1} (X = u_i + θ (u_{i+1} - u_i)). The alternative keeps the s stage
vectors with each snapshot: an adjoint step then copies them in and runs ``TSAdjointStep`` alone,
but every slot is (s + 1) states. Measured here per method on ex5adj (Gray–Scott) at a size where a
state is 8 MiB per rank, in one process, alternated:

- ``forward_s``: one ``TSStep`` (restarted) from a restored state;
- ``adjoint_recompute_s``: the step re-run from u_i, then ``TSAdjointStep`` (RK's adjoint step as it runs);
- ``adjoint_reconstructed_s`` (θ-midpoint): :meth:`TSStepper.adjoint_step` as it runs (the stage
  reconstructed, then ``TSAdjointStep``), and ``reconstructed_vs_recompute``, the largest difference
  of the two variants' λ_0 relative to its largest entry;
- ``adjoint_stored_s``: the stored-stage variant, timed for real: the s stages and u_{i+1} copied in
  from held copies (``VecCopy``), then ``TSAdjointStep``.

Then, per memory budget of B states per rank, the time of a gradient of n steps with revolve under
each variant: recompute has B slots (forward evaluations ``min_forward_steps(n, B)``, each adjoint
step ``adjoint_recompute_s``), reconstructed the same slots and ``adjoint_reconstructed_s``; stored
stages has B // (s + 1) slots and ``adjoint_stored_s``.

    mpirun -n 2 python experiments/ts_adapter/stages.py --grid 1024 --steps 100
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

#: (TS type, RK tableau or θ, dt): RK4 needs dt < 0.026 at 1024^2 (stability); θ-midpoint takes ex5adj's 0.5
METHODS = {"rk4": ("rk", "4", 0.01), "theta-mid": ("theta", 0.5, 0.5)}


def _timed(comm, fn, repeats):
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        comm.Barrier()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(comm, kind, grid, repeats):
    from hpcadj.imports import petsc
    from hpcadj.ts import _capi
    from hpcadj.ts.examples import GrayScott

    ts_type, arg, dt = METHODS[kind]
    gs = GrayScott(comm, m=grid, ts_type=ts_type, dt=dt)
    if ts_type == "rk":
        gs.ts.setRKType(arg)
    else:
        gs.ts.setTheta(arg)
        gs.ts.setThetaEndpoint(False)
    stepper = gs.stepper(10)
    assert stepper.recomputes_in_adjoint == (ts_type == "rk")
    controls = stepper.default_controls()
    stepper.set_controls(controls)
    u0 = stepper.initial_state()
    u1 = stepper.step(0, u0)
    lam0 = stepper._final[1](u1)                          # a λ that is not zero: J's derivative at u_1
    grad = {k: v.duplicate() for k, v in controls.items()}

    def forward():
        stepper.step(0, u0)

    ts = stepper.ts
    sol = u1.duplicate()

    def adjoint_from(x):
        ts.setSolution(x)
        ts.setTime(stepper.time(1))
        ts.setTimeStep(-stepper._dt(0))
        ts.setStepNumber(1)
        ts.setCostGradients([lam0.copy()], [grad["gamma"]])
        ts.adjointStep()

    def adjoint_recompute():
        u0.copy(sol)
        stepper._take_step(0, sol, stepper._dt(0))       # leaves u_1 in sol and the step's stages in the TS
        adjoint_from(sol)

    def adjoint_reconstructed():
        stepper.adjoint_step(0, u0, u1, lam0, grad)

    # the stored variant: the stages of step 0 as they were after the step, held as copies
    stepper.step(0, u0)
    handles = _capi.stage_handles(ts)
    held = [u1.duplicate() for _ in handles]
    for h, v in zip(handles, held):
        _capi.vec_copy_into_vec(h, v)

    def adjoint_stored():
        for v, h in zip(held, handles):
            _capi.vec_copy_into(v, h)
        u1.copy(sol)
        adjoint_from(sol)

    def result(variant):
        variant()
        return ts.getCostGradients()[0][0].getArray(readonly=True).copy()

    import numpy as np

    recomputed = result(adjoint_recompute)
    assert np.array_equal(recomputed, result(adjoint_stored)), "the variants' λ_0 differ"
    out = {"method": kind, "stages": len(handles), "state_mib": u0.getLocalSize() * 8 / 2 ** 20}
    if not stepper.recomputes_in_adjoint:
        diff = comm.allreduce(float(np.abs(result(adjoint_reconstructed) - recomputed).max()), op=_max())
        out["reconstructed_vs_recompute"] = diff / comm.allreduce(float(np.abs(recomputed).max()), op=_max())
    for _ in range(2):       # alternated: each measured twice, the medians of the last round kept
        out["forward_s"] = _timed(comm, forward, repeats)
        out["adjoint_recompute_s"] = _timed(comm, adjoint_recompute, repeats)
        if not stepper.recomputes_in_adjoint:
            out["adjoint_reconstructed_s"] = _timed(comm, adjoint_reconstructed, repeats)
        out["adjoint_stored_s"] = _timed(comm, adjoint_stored, repeats)
    petsc().garbage_cleanup(comm)
    return out


def _max():
    from hpcadj.imports import mpi

    return mpi().MAX


def gradient_times(row, n, budgets):
    """Predicted wall of an n-step gradient under each variant, per budget of B states per rank."""
    from hpcadj.checkpoint.schedules import min_forward_steps

    s = row["stages"]
    out = []
    for b in budgets:
        rec = min_forward_steps(n, min(b, n)) * row["forward_s"] + n * row["adjoint_recompute_s"]
        slots = b // (s + 1)
        sto = (min_forward_steps(n, min(slots, n)) * row["forward_s"] + n * row["adjoint_stored_s"]
               if slots >= 1 else None)
        row_b = {"budget_states": b, "recompute_s": rec, "stored_s": sto,
                 "stored_over_recompute": None if sto is None else sto / rec}
        if "adjoint_reconstructed_s" in row:
            row_b["reconstructed_s"] = (min_forward_steps(n, min(b, n)) * row["forward_s"]
                                        + n * row["adjoint_reconstructed_s"])
            row_b["reconstructed_over_recompute"] = row_b["reconstructed_s"] / rec
        out.append(row_b)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", type=int, default=1024)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--methods", default=",".join(METHODS))
    args, _ = p.parse_known_args()
    from hpcadj.imports import mpi

    comm = mpi().COMM_WORLD
    budgets = [5, 10, 20, 50, args.steps + 1, 5 * (args.steps + 1)]
    for kind in args.methods.split(","):
        row = measure(comm, kind, args.grid, args.repeats)
        row.update(grid=args.grid, ranks=comm.size, steps=args.steps,
                   by_budget=gradient_times(row, args.steps, budgets))
        if comm.rank == 0:
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
