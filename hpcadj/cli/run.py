"""``hpcadj run``: J and its gradient for a model, with a checkpoint plan over storage levels."""

from __future__ import annotations

import json
import time

from . import CliError
from .common import add_model_arguments, build_model, world


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("run", help="compute J and its gradient",
                              description="Compute the objective J and dJ/d(controls) with an exact "
                                          "discrete adjoint. Unknown single-dash options go to PETSc.")
    add_model_arguments(p)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    p.add_argument("--gradient-out", metavar="FILE.h5", default=None,
                   help="write the gradients as global datasets grad_<control> (parallel HDF5)")
    p.set_defaults(func=main)


def gradient_norms(result) -> dict:
    """2-norms of every control's gradient."""
    return {name: result.gradient[name].norm() for name in sorted(result.gradient)}


def summary(model, comm, result, wall_s: float) -> dict:
    """The run's facts as the ``--json`` object."""
    norms = gradient_norms(result)
    out = {**model.describe(), "ranks": comm.size, "J": result.J,
           "grad_norm": norms.get("u0", next(iter(norms.values()))),
           "forward_steps": result.forward_steps, "recomputed_steps": result.recomputed_steps,
           "adjoint_steps": result.adjoint_steps, "snapshot_bytes": model.snapshot_bytes(),
           "wall_s": wall_s}
    for name, value in norms.items():
        if name != "u0":
            out[f"grad_{name}_norm"] = value
    out["grad_norms"] = norms
    return out


def print_human(info: dict) -> None:
    print(f"hpcadj run: {info['model']} {info['grid']}, {info['steps']} steps, {info['ranks']} rank(s)")
    print(f"  J = {info['J']:.12e}")
    for name, value in info["grad_norms"].items():
        print(f"  |dJ/d{name}| = {value:.12e}")
    print(f"  forward steps {info['forward_steps']} ({info['recomputed_steps']} recomputed), "
          f"adjoint steps {info['adjoint_steps']}, wall {info['wall_s']:.3f} s")


def main(args) -> int:
    from ..adjoint import compute_gradient
    from ..fieldio import check_writable, write_fields
    from ..telemetry import Telemetry

    comm = world(args)
    if args.gradient_out:
        try:
            check_writable(args.gradient_out)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    model = build_model(args, comm)
    controls = model.default_controls()
    comm.Barrier()
    t0 = time.perf_counter()
    result = compute_gradient(model, controls, telemetry=Telemetry())
    wall_s = comm.allreduce(time.perf_counter() - t0, op=_max(comm))
    info = summary(model, comm, result, wall_s)
    if args.gradient_out:
        layouts = {f"grad_{k}": v for k, v in model.control_layout().items()}
        arrays = {f"grad_{k}": v for k, v in model.control_arrays(result.gradient).items()}
        write_fields(args.gradient_out, comm, layouts, arrays,
                     attrs={"J": result.J, "model": model.name, "steps": model.n_steps})
    if comm.rank == 0:
        if args.json:
            print(json.dumps(info))
        else:
            print_human(info)
    return 0


def _max(comm):
    from ..stack import mpi

    return mpi().MAX
