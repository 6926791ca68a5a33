"""Devito's checkpointed FWI gradient (pyrevolve) for the comparison in run.py; runs in a separate
venv with devito, pyrevolve and devito-examples (never a dependency of hpcadj).

The problem mirrors ``hpcadj run --model wave``: an n^3 computational grid (the damping layer
inside it, 10 % a side), float64, second-order stencil, one Ricker source at depth 0.2 and a
line of receivers along x at the source's depth, ``steps`` time steps. The observed data come from
a model with a Gaussian velocity anomaly (made before the timer starts). The timed gradient is one
forward sweep through pyrevolve (storing its checkpoints and sampling the receivers), the residual,
and the reverse sweep (recomputation and adjoint), with as many checkpoints as fit in ``--ram``.
Prints one JSON line: wall seconds (forward, reverse, total), checkpoints, peak RSS.

    OMP_NUM_THREADS=2 DEVITO_LANGUAGE=openmp /work/wt/dv/bin/python devito_gradient.py --n 128 --steps 300
"""

import argparse
import json
import resource
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=128)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--ram", type=float, default=512.0, help="MiB of checkpoints")
    args = p.parse_args()

    from devito import CheckpointOperator, DevitoCheckpoint, Function, TimeFunction
    from examples.seismic import AcquisitionGeometry, Model, Receiver
    from examples.seismic.acoustic import AcousticWaveSolver
    from pyrevolve import Revolver

    n, nbl = args.n, max(1, args.n // 10)
    inner = n - 2 * nbl
    spacing = (10.0, 10.0, 10.0)
    extent = [(inner - 1) * h for h in spacing]
    x = [np.linspace(0, e, inner) for e in extent]
    X, Y, Z = np.meshgrid(*x, indexing="ij")
    r2 = ((X / extent[0] - 0.5) ** 2 + (Y / extent[1] - 0.5) ** 2 + (Z / extent[2] - 0.5) ** 2)
    vp_true = 1.5 * (1.0 + 0.1 * np.exp(-r2 / (2 * 0.1 ** 2)))
    common = dict(origin=(0.0, 0.0, 0.0), spacing=spacing, shape=(inner,) * 3, space_order=2, nbl=nbl,
                  bcs="damp", dtype=np.float64)
    true = Model(vp=vp_true, **common)
    smooth = Model(vp=np.full((inner,) * 3, 1.5), **common)
    dt = true.critical_dt
    tn = dt * (args.steps + 1)  # nt = steps + 2 samples: revolve takes nt - 2 = steps steps
    src = np.array([[extent[0] / 2, extent[1] / 2, 0.2 * extent[2]]])
    nrec = int(0.8 * inner)
    rec = np.zeros((nrec, 3))
    rec[:, 0] = np.linspace(0.1 * extent[0], 0.9 * extent[0], nrec)
    rec[:, 1] = extent[1] / 2
    rec[:, 2] = 0.2 * extent[2]
    geometry = AcquisitionGeometry(smooth, rec, src, t0=0.0, tn=tn, f0=0.010, src_type="Ricker")
    solver = AcousticWaveSolver(smooth, geometry, space_order=2)
    vp_true_padded = Function(name="vp", grid=smooth.grid, space_order=2)
    vp_true_padded.data[:] = true.vp.data
    observed, _, _ = solver.forward(vp=vp_true_padded, dt=dt)
    d_obs = observed.data.copy()

    grid = smooth.grid
    u = TimeFunction(name="u", grid=grid, time_order=2, space_order=2)
    v = TimeFunction(name="v", grid=grid, time_order=2, space_order=2)
    grad = Function(name="grad", grid=grid)
    synthetic = Receiver(name="rec", grid=grid, time_range=geometry.time_axis, coordinates=rec)
    residual = Receiver(name="rec", grid=grid, time_range=geometry.time_axis, coordinates=rec)
    cp = DevitoCheckpoint([u])
    n_checkpoints = max(1, int(args.ram * 2 ** 20 // (cp.size * np.dtype(np.float64).itemsize)))
    fw = CheckpointOperator(solver.op_fwd(save=False), src=geometry.src, u=u, rec=synthetic, vp=smooth.vp, dt=dt)
    rev = CheckpointOperator(solver.op_grad(save=False), u=u, v=v, rec=residual, grad=grad, vp=smooth.vp, dt=dt)
    nt = d_obs.shape[0]
    n_checkpoints = min(n_checkpoints, nt - 2)
    wrp = Revolver(cp, fw, rev, n_checkpoints, nt - 2)
    t0 = time.perf_counter()
    wrp.apply_forward()
    t1 = time.perf_counter()
    residual.data[:] = synthetic.data - d_obs
    J = 0.5 * float(np.sum(residual.data ** 2))
    wrp.apply_reverse()
    t2 = time.perf_counter()
    print(json.dumps({"tool": "devito", "n": n, "steps": nt - 2, "J": J, "checkpoints": n_checkpoints,
                      "checkpoint_MiB": cp.size * 8 / 2 ** 20, "forward_s": t1 - t0, "reverse_s": t2 - t1,
                      "wall_s": t2 - t0, "grad_norm": float(np.linalg.norm(grad.data)),
                      "peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
