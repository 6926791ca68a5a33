"""Inversions on real problems, analysed with ``hpcadj analyze``: heat (kappa from observed
intermediate states), Gray-Scott (the initial state from a final-time observation, and how its
recovery depends on the final time; grayscott-ts the same inversion on PETSc's ex5 TS through
hpcadj.ts.TSStepper), FWI (a layered velocity model with an anomaly from the traces of several
shots, started from a smoothed model, with a frequency continuation and a depth preconditioner),
wave3d (two 3-D shots at 32 MiB a snapshot per rank).

    .venv/bin/python experiments/inversion/run.py heat|grayscott|grayscott-ts|fwi|wave3d|all [--quick]
        [--config JSON] [--out DIR]

Each problem writes into experiments/inversion/<problem>/ (or DIR/<problem>/): ``log*/inversion.jsonl``
(hpcadj invert's or the library's log; FWI one per frequency stage), ``convergence.png`` (``hpcadj
analyze --plot``), ``fields.png`` (true, initial, recovered) and ``results.json`` (the figures in
README.md). ``--config`` replaces keys of either Gray-Scott's or FWI's configuration (the
ablations in README.md). Scratch (checkpoint files, observations, controls) goes to a temporary directory removed
at the end. The solves run under mpirun on 2 ranks: heat and wave3d through ``hpcadj invert``,
Gray-Scott (both) and FWI through :class:`hpcadj.inversion.Inversion` / ``ShotInversion`` in this script's
``_solve`` mode (they need a start, a misfit or a preconditioner the command line does not offer).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import _harness as H  # noqa: E402

RANKS = 2
QUICK = [False]  # set by main(): results.json says whether it holds a --quick run
OUT = [HERE]  # --out: where the problems' directories go
OVERRIDES = [{}]  # --config: keys replacing the problem's configuration (the ablations in README.md)


# -- shared ---------------------------------------------------------------------------------
def analyze(out: Path, logs=None):
    """``hpcadj analyze`` on the problem's log (or the logs named in ``logs``, one inversion each):
    its JSON figures (a list with ``logs``), and the convergence plot."""
    import subprocess

    dirs = [str(out / name) for name in (logs or ["log"])]
    cmd = [str(H.HPCADJ), "analyze", *dirs, "--json", "--plot", str(out / "convergence.png")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=H.mpi_env(), cwd=H.ROOT, timeout=300)
    if proc.returncode:
        raise RuntimeError(proc.stderr)
    found = json.loads(proc.stdout)["inversions"]
    if logs:
        return found
    (inv,) = found
    return inv


def field_plot(path: Path, fields: list[tuple[str, object]], cmap: str, extent=None, vrange=None) -> None:
    plt = H.pyplot()
    fig, axes = plt.subplots(1, len(fields), figsize=(3.3 * len(fields), 3.0))
    lo, hi = vrange or (min(float(f.min()) for _, f in fields), max(float(f.max()) for _, f in fields))
    for ax, (title, f) in zip(axes, fields):
        im = ax.imshow(f, origin="upper" if extent == "depth" else "lower", cmap=cmap, vmin=lo, vmax=hi)
        ax.set_title(title, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(im, ax=list(axes), shrink=0.8)
    fig.savefig(path, dpi=70)
    plt.close(fig)


def rel_error(field, truth) -> float:
    import numpy as np

    return float(np.linalg.norm(field - truth) / np.linalg.norm(truth))


def summarise(name: str, out: Path, inv: dict, errors: dict, extra: dict) -> dict:
    res = {"problem": name, "machine": H.machine(), **extra,
           "iterations": inv["last_iteration"], "misfit_first": inv["misfit_first"],
           "misfit_last": inv["misfit_last"], "misfit_reduction": inv["misfit_reduction"],
           "misfit_monotone": inv["misfit_monotone"], "forward_steps": inv["forward_steps"],
           "forward_steps_per_iteration": inv["forward_steps_per_iteration"],
           "naive_forward_steps": inv["naive_forward_steps"],
           "naive_forward_steps_per_iteration": inv["naive_forward_steps_per_iteration"],
           "wall_seconds": inv["wall_seconds"], "seconds_per_iteration": inv["seconds_per_iteration"],
           "joules_model": inv["joules"], "peak_rss_MiB": inv["max_rss_MiB"], **errors}
    res["error_reduction"] = errors["error_initial"] / errors["error_recovered"]
    res["quick"] = QUICK[0]
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    H.log(json.dumps(res))
    return res


def fresh(out: Path) -> None:
    for old in out.glob("log*"):
        shutil.rmtree(old)
    out.mkdir(parents=True, exist_ok=True)


# -- heat: kappa from intermediate states ----------------------------------------------------
HEAT = {"grid": (192, 192), "steps": 30, "dt": 2e-3, "every": 5, "max_it": 25, "memory": "700MiB"}
HEAT_QUICK = {"grid": (48, 48), "steps": 20, "dt": 2e-3, "every": 5, "max_it": 8, "memory": "700MiB"}


def kappa_true(y, x):
    import numpy as np

    return (1.0 + 0.8 * np.exp(-((x - 0.35) ** 2 + (y - 0.6) ** 2) / (2 * 0.1 ** 2))
            - 0.35 * np.exp(-((x - 0.7) ** 2 + (y - 0.3) ** 2) / (2 * 0.08 ** 2)))


def heat_observe(cfg: dict, path: str) -> None:
    """(serial, under mpirun -n 1) the heat states at every ``every``-th step with kappa_true."""
    import numpy as np

    from hpcadj.imports import h5py, mpi
    from hpcadj.models.heat import HeatModel

    model = HeatModel(mpi().COMM_WORLD, grid=tuple(cfg["grid"]), n_steps=cfg["steps"], dt=cfg["dt"])
    c = model.default_controls()
    y, x = model.grid.node_coordinates()
    model.grid.owned(c["kappa"])[...] = kappa_true(y, x)
    model.set_controls(c)
    steps = list(range(cfg["every"], cfg["steps"] + 1, cfg["every"]))
    u, states = model.initial_state(), []
    for i in range(cfg["steps"]):
        u = model.step(i, u)
        if i + 1 in steps:
            states.append(model.grid.owned_view(u).copy())
    with h5py().File(path, "w") as f:
        f["steps"] = np.array(steps)
        f["u"] = np.array(states)


def heat(quick: bool, scratch: Path) -> dict:
    import numpy as np

    from hpcadj.imports import h5py

    cfg = HEAT_QUICK if quick else HEAT
    out = HERE / "heat"
    fresh(out)
    obs, controls = scratch / "obs.h5", scratch / "kappa.h5"
    H.mpirun(1, [H.PY, __file__, "_observe", json.dumps(cfg), obs], timeout=900)
    grid = "x".join(map(str, cfg["grid"]))
    t0 = time.perf_counter()
    text = H.hpcadj_cmd(RANKS, "invert", [
        "--grid", grid, "--steps", cfg["steps"], "--dt", cfg["dt"], "--observations", obs,
        "--invert", "kappa", "--bounds", "kappa:0.3:3", "--max-it", cfg["max_it"], "--memory", cfg["memory"],
        "--local-dir", scratch, "--controls-out", controls, "--log-dir", out / "log", "--json"], timeout=3000)
    wall = time.perf_counter() - t0
    summary = json.loads([line for line in text.splitlines() if line.startswith("{")][-1])
    ny, nx = cfg["grid"]
    y = ((np.arange(ny) + 1) / (ny + 1))[:, None]
    x = ((np.arange(nx) + 1) / (nx + 1))[None, :]
    truth = kappa_true(y, x)
    with h5py().File(controls, "r") as f:
        recovered = np.array(f["kappa"][...])
    start = np.ones_like(truth)
    field_plot(out / "fields.png", [("true κ", truth), ("initial κ = 1", start),
                                    (f"recovered κ ({summary['iterations']} it.)", recovered)], "viridis")
    errors = {"error_initial": rel_error(start, truth), "error_recovered": rel_error(recovered, truth)}
    return summarise("heat", out, analyze(out), errors,
                     {"config": cfg, "ranks": RANKS, "status": summary.get("status"), "command_wall_s": wall,
                      "snapshot_MiB_per_rank": ny * nx * 8 / RANKS / 2**20})


# -- Gray-Scott: the initial state from the final one -----------------------------------------
# dt = 1/4 and u0 within [0, 1] (blmvm): the step's Jacobian I - dt (D lap + K) keeps v's diagonal
# 1 - dt (2 u v - F - k) >= 1/2, where lmvm's trial states (or dt = 1 within the bounds) drove it to
# zero and BiCGStab/Jacobi failed in the first step (SNES reason -3).
# The final time: at t = 40 (160 steps) the reaction saturates and the observed state no longer pins
# the initial amplitude (v0 went to its bound); at t = 10 (40 steps) the initial state is still
# determined. GS_HORIZON measures the recovery against the final time (and Tikhonov at t = 40).
GS = {"grid": (256, 256), "steps": 40, "dt": 0.25, "max_it": 40, "memory": "700MiB", "tao": "blmvm",
      "bounds": {"u0": (0.0, 1.0)}, "regularization": 0.0}
GS_QUICK = {"grid": (32, 32), "steps": 40, "dt": 0.25, "max_it": 5, "memory": "700MiB", "tao": "blmvm",
            "bounds": {"u0": (0.0, 1.0)}, "regularization": 0.0}
GS_HORIZON = {"grid": (96, 96), "runs": [[20, 0.0], [40, 0.0], [80, 0.0], [160, 0.0], [160, 1e-5], [160, 1e-4]]}


def gs_initial(model, spots):
    """u = 1 - g/2, v = g/4 with g a sum of Gaussian spots (centre, width) on the periodic square."""
    import numpy as np

    side = model.length
    y, x = (side * c for c in model.grid.node_coordinates())
    g = sum(np.exp(-((x - cx * side) ** 2 + (y - cy * side) ** 2) / (2 * (w * side) ** 2)) for cx, cy, w in spots)
    vec = model.grid.create_vec()
    w = model.grid.owned(vec)
    w[..., 0] = 1.0 - 0.5 * g
    w[..., 1] = 0.25 * g
    return vec


GS_TRUE = [(0.35, 0.55, 0.07), (0.65, 0.4, 0.09), (0.5, 0.75, 0.05)]
GS_START = [(0.5, 0.5, 0.15)]


def gs_solve(cfg: dict, work: str) -> None:
    """(under mpirun) the Gray-Scott inversion: u0 from the final state of the true u0's run."""
    import numpy as np

    from hpcadj import Checkpointing
    from hpcadj.fieldio import write_fields
    from hpcadj.imports import mpi
    from hpcadj.inversion import Inversion
    from hpcadj.models.grayscott import GrayScottModel

    comm = mpi().COMM_WORLD

    class Observed(GrayScottModel):
        """Gray-Scott with J = 1/2 |w_n - d|^2 (both species, cell-weighted), d the observed final state."""

        target = None

        def objective(self, i, u):
            if i != self.n_steps:
                return 0.0
            d = self.grid.owned(u) - self.target
            return self.comm.allreduce(0.5 * self.cell_volume * float(np.sum(d * d)))

        def objective_gradient(self, i, u):
            if i != self.n_steps:
                return None
            g = self.grid.create_vec()
            self.grid.owned(g)[...] = self.cell_volume * (self.grid.owned(u) - self.target)
            return g

    model = Observed(comm, grid=tuple(cfg["grid"]), n_steps=cfg["steps"], dt=cfg["dt"])
    truth = model.default_controls()
    truth["u0"] = gs_initial(model, GS_TRUE)
    model.set_controls(truth)
    u = model.initial_state()
    for i in range(cfg["steps"]):
        u = model.step(i, u)
    model.target = model.grid.owned(u).copy()
    start = model.default_controls()
    start["u0"] = gs_initial(model, GS_START)
    inv = Inversion(model, ["u0"], Checkpointing(memory=cfg["memory"], local_dir=work), controls=start,
                    tao_type=cfg["tao"], bounds={k: tuple(v) for k, v in cfg["bounds"].items()}, max_it=cfg["max_it"],
                    regularization=cfg.get("regularization", 0.0), log=os.path.join(cfg["out"], "log", "inversion.jsonl"))
    result = inv.solve()
    layout = model.control_layout()["u0"]
    write_fields(os.path.join(work, "u0.h5"), comm, {k: layout for k in ("true", "start", "recovered")},
                 {"true": model.control_arrays(truth)["u0"], "start": model.control_arrays(start)["u0"],
                  "recovered": model.control_arrays(result.controls)["u0"]}, attrs={"status": result.status})


def grayscott(quick: bool, scratch: Path) -> dict:
    import numpy as np

    from hpcadj.imports import h5py

    cfg = {**(GS_QUICK if quick else GS), **OVERRIDES[0]}
    out = OUT[0] / "grayscott"
    fresh(out)
    cfg["out"] = str(out)
    H.mpirun(RANKS, [H.PY, __file__, "_solve", "grayscott", json.dumps(cfg), scratch], timeout=3000)
    with h5py().File(scratch / "u0.h5", "r") as f:
        truth, start, recovered = (np.array(f[k][...]) for k in ("true", "start", "recovered"))
    field_plot(out / "fields.png", [("true v₀", truth[..., 1]), ("initial v₀", start[..., 1]),
                                    ("recovered v₀", recovered[..., 1])], "magma")
    errors = {"error_initial": rel_error(start, truth), "error_recovered": rel_error(recovered, truth),
              "error_v0_initial": rel_error(start[..., 1], truth[..., 1]),
              "error_v0_recovered": rel_error(recovered[..., 1], truth[..., 1])}
    ny, nx = cfg["grid"]
    res = summarise("grayscott", out, analyze(out), errors,
                    {"config": {k: v for k, v in cfg.items() if k != "out"}, "ranks": RANKS, "final_time": cfg["steps"] * cfg["dt"],
                     "snapshot_MiB_per_rank": ny * nx * 2 * 8 / RANKS / 2**20})
    if not quick and not OVERRIDES[0]:
        gs_horizon(cfg, scratch, out / "final-time.csv")
    return res


def gs_horizon(base: dict, scratch: Path, csv_path: Path) -> None:
    """The recovery against the final time observed (and Tikhonov weight), at GS_HORIZON's grid."""
    import numpy as np

    from hpcadj.imports import h5py

    rows = []
    for k, (steps, weight) in enumerate(GS_HORIZON["runs"]):
        work = scratch / f"horizon-{k}"
        work.mkdir()
        cfg = {**base, "grid": GS_HORIZON["grid"], "steps": steps, "regularization": weight, "out": str(work)}
        H.mpirun(RANKS, [H.PY, __file__, "_solve", "grayscott", json.dumps(cfg), work], timeout=3000)
        with h5py().File(work / "u0.h5", "r") as f:
            truth, start, recovered = (np.array(f[key][...]) for key in ("true", "start", "recovered"))
        log = [json.loads(line) for line in (work / "log" / "inversion.jsonl").read_text().splitlines()]
        e0, e1 = rel_error(start, truth), rel_error(recovered, truth)
        v0, v1 = rel_error(start[..., 1], truth[..., 1]), rel_error(recovered[..., 1], truth[..., 1])
        rows.append({"final_time": steps * base["dt"], "steps": steps, "regularization": weight,
                     "iterations": log[-1]["iteration"], "misfit_first": log[0]["misfit"], "misfit_last": log[-1]["misfit"],
                     "error_initial": e0, "error_recovered": e1, "error_reduction": e0 / e1,
                     "error_v0_initial": v0, "error_v0_recovered": v1, "error_v0_reduction": v0 / v1,
                     "v0_max_true": float(truth[..., 1].max()), "v0_max_recovered": float(recovered[..., 1].max())})
        H.log(json.dumps(rows[-1]))
    H.write_csv(csv_path, rows)


# -- Gray-Scott through the TS adapter: PETSc's ex5 as a user's TS, ex5opt_ic's inversion ------
# hpcadj.ts.examples.GrayScott is PETSc's ex5adj (Crank-Nicolson on a periodic DMDA with dof 2, the
# assembled AIJ Jacobian, GMRES with PETSc's default preconditioner) wrapped as a TSStepper: every
# evaluation is a checkpointed session replaying the user's TS step by step and PETSc's own
# TSAdjointStep backwards. The inversion is ex5opt_ic's: (u0, v0) from the final state, here with
# the built-in problem's spots (one wide spot as the start), J = h^2/2 |w_n - d|^2, blmvm in [0, 1].
GS_TS = {"grid": (384, 384), "steps": 10, "dt": 1.0, "ts_type": "cn", "max_it": 30, "memory": "600MiB", "ram": 4,
         "tao": "blmvm", "bounds": {"u0": (0.0, 1.0)}, "petsc_options": {}}
GS_TS_QUICK = {"grid": (32, 32), "steps": 6, "dt": 1.0, "ts_type": "cn", "max_it": 4, "memory": "700MiB", "ram": 3,
               "tao": "blmvm", "bounds": {"u0": (0.0, 1.0)}, "petsc_options": {}}


def gsts_spots(gs, spots):
    """The TS's (u, v) = (1 - g/2, g/4) on this rank's block of ex5's DMDA (side 2.5, nodes j h)."""
    import numpy as np

    side, m = 2.5, gs.m
    h = side / m
    y = (np.arange(gs.ys, gs.ys + gs.ym) * h)[:, None]
    x = (np.arange(gs.xs, gs.xs + gs.xm) * h)[None, :]
    g = sum(np.exp(-((x - cx * side) ** 2 + (y - cy * side) ** 2) / (2 * (w * side) ** 2)) for cx, cy, w in spots)
    vec = gs.u0.duplicate()
    a = vec.getArray().reshape(gs.ym, gs.xm, 2)
    a[..., 0] = 1.0 - 0.5 * g
    a[..., 1] = 0.25 * g
    return vec


def gsts_solve(cfg: dict, work: str) -> None:
    """(under mpirun) (u0, v0) of ex5's TS from the final state of the true (u0, v0)'s run."""
    from hpcadj import Checkpointing
    from hpcadj.fieldio import write_fields
    from hpcadj.imports import mpi, petsc
    from hpcadj.inversion import Inversion
    from hpcadj.inversion.cache import EvaluationCache
    from hpcadj.ts import TSStepper
    from hpcadj.ts.examples import GrayScott

    comm = mpi().COMM_WORLD
    database = petsc().Options()
    for key, value in cfg.get("petsc_options", {}).items():  # read by the TS's setFromOptions
        database.setValue(key, value)
    m = cfg["grid"][0]
    gs = GrayScott(comm, m=m, dt=cfg["dt"], ts_type=cfg["ts_type"])
    h2 = (2.5 / m) ** 2
    target = gs.u0.duplicate()

    def value(u):
        d = u.copy()
        d.axpy(-1.0, target)
        return 0.5 * h2 * d.dot(d)

    def gradient(u):
        g = u.copy()
        g.axpy(-1.0, target)
        g.scale(h2)
        return g

    stepper = TSStepper(gs.ts, gs.u0, cfg["steps"], final=(value, gradient), name="ex5opt_ic",
                        working_set_extra=24.0)
    truth = {"u0": gsts_spots(gs, GS_TRUE)}
    stepper.set_controls(truth)
    u = stepper.initial_state()
    for i in range(cfg["steps"]):
        u = stepper.step(i, u)
    u.copy(target)
    start = {"u0": gsts_spots(gs, GS_START)}
    plans = []

    class Recorded(EvaluationCache):
        """The inversion's cache, noting each session's plan (levels, RAM slots, predicted memory)."""

        def _calibrated(self, session):
            super()._calibrated(session)
            run, mem = session.planned, session.planned.memory
            plan = {"levels": [[p.kind, p.slots] for p in run.plans], "schedule": type(run.schedule).__name__,
                    "forward_steps": getattr(run.summary, "forward_steps", None)}
            if mem is not None:
                plan.update({"baseline_MiB": mem.baseline_bytes / 2**20, "fixed_MiB": mem.fixed_bytes / 2**20,
                             "predicted_peak_MiB": mem.peak_bytes / 2**20, "ram_slots_fit": mem.ram_slots_fit})
            same = ("levels", "schedule", "forward_steps")
            if not plans or any(plan[k] != plans[-1][k] for k in same):
                plans.append({**plan, "sessions": 0})
            plans[-1]["sessions"] += 1  # a run of sessions with the same plan: its first one's figures

    checkpointing = Checkpointing(memory=cfg["memory"], ram=cfg.get("ram"), local_dir=work)
    inv = Inversion(stepper, ["u0"], checkpointing, controls=start,
                    tao_type=cfg["tao"], bounds={k: tuple(v) for k, v in cfg["bounds"].items()},
                    max_it=cfg["max_it"], log=os.path.join(cfg["out"], "log", "inversion.jsonl"),
                    evaluations=Recorded)
    result = inv.solve()
    layout = stepper.control_layout()["u0"]
    write_fields(os.path.join(work, "u0.h5"), comm, {k: layout for k in ("true", "start", "recovered")},
                 {"true": stepper.control_arrays(truth)["u0"], "start": stepper.control_arrays(start)["u0"],
                  "recovered": stepper.control_arrays(result.controls)["u0"]},
                 attrs={"status": result.status, "describe": json.dumps(stepper.describe(), default=str),
                        "working_set_states": stepper.working_set_states(),
                        "counts": json.dumps(result.counts), "plans": json.dumps(plans)})


def grayscott_ts(quick: bool, scratch: Path) -> dict:
    import numpy as np

    from hpcadj.imports import h5py

    cfg = {**(GS_TS_QUICK if quick else GS_TS), **OVERRIDES[0]}
    out = OUT[0] / "grayscott-ts"
    fresh(out)
    cfg["out"] = str(out)
    load_start = round(os.getloadavg()[0], 2)
    H.mpirun(RANKS, [H.PY, __file__, "_solve", "grayscott-ts", json.dumps(cfg), scratch], timeout=3000)
    with h5py().File(scratch / "u0.h5", "r") as f:
        truth, start, recovered = (np.array(f[k][...]) for k in ("true", "start", "recovered"))
        status, describe = str(f.attrs["status"]), json.loads(f.attrs["describe"])
        working = float(f.attrs["working_set_states"])
        counts, plans = json.loads(f.attrs["counts"]), json.loads(f.attrs["plans"])
    field_plot(out / "fields.png", [("true v₀", truth[..., 1]), ("initial v₀", start[..., 1]),
                                    ("recovered v₀", recovered[..., 1])], "magma")
    errors = {"error_initial": rel_error(start, truth), "error_recovered": rel_error(recovered, truth),
              "error_v0_initial": rel_error(start[..., 1], truth[..., 1]),
              "error_v0_recovered": rel_error(recovered[..., 1], truth[..., 1])}
    ny, nx = cfg["grid"]
    state = ny * nx * 2 * 8 / RANKS / 2**20
    return summarise("grayscott-ts", out, analyze(out), errors,
                     {"config": {k: v for k, v in cfg.items() if k != "out"}, "ranks": RANKS, "status": status,
                      "final_time": cfg["steps"] * cfg["dt"], "ts": describe, "loadavg_1m_start": load_start,
                      "working_set_states": working, "working_set_MiB_per_rank": working * state,
                      "counts": counts, "plans": plans,
                      "snapshot_MiB_per_rank": state})


# -- FWI: a layered model with an anomaly, several shots -------------------------------------
# What FWI practice does, each piece switchable for the ablations in README.md: a record long enough
# for the deepest layer's reflections to come back (t_final), a frequency continuation (one
# inversion per peak frequency, each started from the last one's model), and a depth preconditioner
# (hpcadj.inversion.space.Scaling: TAO steps in c / s, so an update moves c by s^2 times the
# gradient; s^2 rises from ~0 at the sources' and receivers' depth to 1 at the depth "deep").
# dt is `cfl` times the leapfrog's limit h / (c_max sqrt 2) at the upper bound c_max.
FWI = {"grid": (192, 192), "shots": 8, "c_bounds": (0.9, 2.4), "smooth": 0.06, "memory": "1GiB",
       "t_final": 1.6, "cfl": 0.8, "stages": [[4.0, 10], [10.0, 16]],
       "scaling": {"top": 0.22, "deep": 0.7, "floor": 0.01}, "regularization": 0.0}
FWI_QUICK = {"grid": (40, 40), "shots": 2, "c_bounds": (0.9, 2.4), "smooth": 0.06, "memory": "1GiB",
             "t_final": 1.2, "cfl": 0.8, "stages": [[3.0, 2], [5.0, 2]],
             "scaling": {"top": 0.22, "deep": 0.7, "floor": 0.01}, "regularization": 0.0}


def marmousi_like(n0: int, n1: int):
    """(depth, x) velocity: dipping and folded layers 1.0 -> 2.2 with a fault, plus a slow lens."""
    import numpy as np

    z = ((np.arange(n0) + 1) / (n0 + 1))[:, None]
    x = ((np.arange(n1) + 1) / (n1 + 1))[None, :]
    c = np.full((n0, n1), 1.0)
    tops = [0.28, 0.38, 0.5, 0.62, 0.75, 0.86]
    speeds = [1.25, 1.45, 1.35, 1.7, 1.95, 2.2]
    for k, (top, speed) in enumerate(zip(tops, speeds)):
        fold = 0.04 * np.sin(2 * np.pi * (x + 0.15 * k)) + 0.08 * (x - 0.5)
        fault = np.where(x > 0.62, 0.05, 0.0) if k >= 2 else 0.0
        c = np.where(z >= top + fold + fault, speed, c)
    lens = np.exp(-((x - 0.4) ** 2 / (2 * 0.06 ** 2) + (z - 0.56) ** 2 / (2 * 0.035 ** 2)))
    return c * (1.0 - 0.18 * lens)


def smoothed(c, sigma_frac: float):
    from scipy.ndimage import gaussian_filter

    return gaussian_filter(c, sigma=sigma_frac * c.shape[0], mode="nearest")


def depth_weight(n0: int, n1: int, top: float, deep: float, floor: float):
    """s on the (depth, x) grid: s^2 = floor above ``top`` (the acquisition's depth, where a raw
    gradient is largest), rising linearly to 1 at ``deep`` and 1 below."""
    import numpy as np

    z = ((np.arange(n0) + 1) / (n0 + 1))[:, None]
    ramp = np.clip((z - top) / (deep - top), 0.0, 1.0)
    return np.broadcast_to(np.sqrt(floor + (1.0 - floor) * ramp), (n0, n1)).copy()


def shot_misfit(layout, problem, c_g, block) -> float:
    """The misfit summed over every shot at the (depth, x) model ``c_g``: one forward sweep per shot."""
    from hpcadj.imports import petsc

    J = 0.0
    for shot in layout.shots:
        model = problem.models[shot]
        controls = model.default_controls()
        controls["c"].destroy()
        controls["c"] = block(model, c_g)
        model.set_controls(controls)
        u = model.initial_state()
        J += model.objective(0, u)
        for i in range(model.n_steps):
            u = model.step(i, u)
            J += model.objective(i + 1, u)
            petsc().garbage_cleanup(problem.comm)  # the state just left: back to the model's pool
        u.destroy()
        for vec in controls.values():
            vec.destroy()
        petsc().garbage_cleanup(problem.comm)
    return layout.cross_comm.allreduce(J if layout.member == 0 else 0.0)


def fwi_solve(cfg: dict, work: str) -> None:
    """(under mpirun) FWI: observed traces of every shot from the layered model, c from a smoothed
    start, one inversion per stage (peak frequency, iterations), each from the last one's c."""
    from hpcadj import Checkpointing
    from hpcadj.imports import mpi, petsc
    from hpcadj.inversion.shots import ShotInversion, ShotLayout, ShotProblem, shot_positions
    from hpcadj.models.wave import WaveModel

    comm = mpi().COMM_WORLD
    n0, n1 = cfg["grid"]
    truth_g = marmousi_like(n0, n1)
    current_g = smoothed(truth_g, cfg["smooth"])
    h = 1.0 / (max(n0, n1) + 1)
    dt = cfg["cfl"] * h / (cfg["c_bounds"][1] * math.sqrt(2.0))
    steps = int(math.ceil(cfg["t_final"] / dt))
    positions = shot_positions(cfg["shots"])
    layout = ShotLayout(comm, cfg["shots"], 1)  # one rank per shot: every rank holds the whole grid
    options = Checkpointing(memory=cfg["memory"], local_dir=work)
    weight = depth_weight(n0, n1, **cfg["scaling"]) if cfg.get("scaling") else None

    def block(model, g):
        sl = tuple(slice(s, s + m) for s, m in zip(model.field.start, model.field.shape))
        return model.field.vec_from(g[sl])

    results = []
    for stage, (freq, max_it) in enumerate(cfg["stages"]):
        def observed_model(shot_comm, k, freq=freq):
            model = WaveModel(shot_comm, grid=(n0, n1), n_steps=steps, dt=dt, frequency=freq,
                              source_x=positions[k])
            truth = model.default_controls()
            truth["c"].destroy()
            truth["c"] = block(model, truth_g)
            model.observed = model.traces(truth)  # the layered model's traces, not the built-in anomaly's
            return model

        log = os.path.join(cfg["out"], f"log-{stage + 1}", "inversion.jsonl")
        inv = ShotInversion(comm, observed_model, cfg["shots"], ["c"], options, ranks_per_shot=1,
                            tao_type="blmvm", bounds={"c": tuple(cfg["c_bounds"])}, max_it=max_it, log=log,
                            regularization=cfg.get("regularization", 0.0))
        inv.layout = layout
        inv.problem = model = ShotProblem(layout, observed_model)
        start = model.default_controls()
        start["c"] = block(model, current_g)
        inv.options["controls"] = start
        if weight is not None:
            inv.options["scaling"] = {"c": block(model, weight)}
        if stage == len(cfg["stages"]) - 1:  # the last frequency's misfit of the smoothed start, for the table
            first_misfit = shot_misfit(layout, model, smoothed(truth_g, cfg["smooth"]), block)
        result = inv.solve()
        current_g = model.control_arrays(result.controls)["c"].reshape(n0, n1)
        results.append({"stage": stage + 1, "frequency": freq, "status": result.status,
                        "iterations": result.iterations})
        del inv, model, start, result
        gc.collect()  # this stage's shot models and their pools, before the next stage's
        petsc().garbage_cleanup(comm)
    results.append({"misfit_start_last_frequency": first_misfit})
    if comm.rank == 0:  # a whole grid on every rank (one rank per shot)
        import numpy as np

        np.save(os.path.join(work, "c.npy"), current_g)
        with open(os.path.join(work, "c.json"), "w") as fh:
            json.dump({"steps": steps, "dt": dt, "shots": cfg["shots"], "stages": results}, fh)
def fwi(quick: bool, scratch: Path) -> dict:
    import numpy as np

    cfg = {**(FWI_QUICK if quick else FWI), **OVERRIDES[0]}
    out = OUT[0] / "fwi"
    fresh(out)
    cfg["out"] = str(out)
    H.mpirun(RANKS, [H.PY, __file__, "_solve", "fwi", json.dumps(cfg), scratch], timeout=3000)
    recovered = np.load(scratch / "c.npy")
    meta = json.loads((scratch / "c.json").read_text())
    truth = marmousi_like(*cfg["grid"])
    start = smoothed(truth, cfg["smooth"])
    field_plot(out / "fields.png", [("true c", truth), ("initial c (smoothed)", start),
                                    (f"recovered c ({', '.join(str(f) for f, _ in cfg['stages'])} Hz)", recovered)],
               "jet", extent="depth", vrange=(0.9, 2.3))
    below = slice(int(0.25 * cfg["grid"][0]), None)  # under the acquisition: the layers, lens and fault
    errors = {"error_initial": rel_error(start, truth), "error_recovered": rel_error(recovered, truth),
              "error_below_initial": rel_error(start[below], truth[below]),
              "error_below_recovered": rel_error(recovered[below], truth[below])}
    stages = [inv for inv in analyze(out, [f"log-{k + 1}" for k in range(len(cfg["stages"]))])]
    n0, n1 = cfg["grid"]
    return summarise("fwi", out, combine(stages, meta["stages"][-1]["misfit_start_last_frequency"]), errors,
                     {"config": {k: v for k, v in cfg.items() if k != "out"}, "ranks": RANKS, "steps": meta["steps"],
                      "shots_run": meta["shots"], "dt": meta["dt"], "stages": meta["stages"][:-1],
                      "stage_figures": [{k: inv[k] for k in ("misfit_first", "misfit_last", "misfit_reduction",
                                                               "misfit_monotone", "last_iteration")} for inv in stages],
                      "snapshot_MiB_per_rank": n0 * n1 * 2 * 8 / 2**20})


def combine(stages: list[dict], misfit_start: float) -> dict:
    """One row's figures from the stages' ``hpcadj analyze`` results: iterations, steps, wall and RSS
    summed or maxed; the misfit from the smoothed start's at the last frequency to the last stage's
    last; monotone if every stage is."""
    its = sum(inv["last_iteration"] for inv in stages)
    total = {k: sum(inv[k] for inv in stages) for k in ("forward_steps", "naive_forward_steps", "wall_seconds")}
    per_it = {k: sum(inv[k] * inv["last_iteration"] for inv in stages) / its for k in
              ("forward_steps_per_iteration", "naive_forward_steps_per_iteration", "seconds_per_iteration")}
    joules = [inv["joules"] for inv in stages]
    return {"last_iteration": its, "misfit_first": misfit_start, "misfit_last": stages[-1]["misfit_last"],
            "misfit_reduction": misfit_start / stages[-1]["misfit_last"],
            "misfit_monotone": all(inv["misfit_monotone"] for inv in stages), **total, **per_it,
            "joules": None if None in joules else sum(joules), "max_rss_MiB": max(inv["max_rss_MiB"] for inv in stages)}


# -- FWI 3-D at real size: two shots under --memory, through hpcadj invert -------------------
WAVE3D = {"grid": (128, 128, 128), "shots": 2, "max_it": 3, "c_bounds": (0.8, 2.0), "memory": "3GiB"}
WAVE3D_QUICK = {"grid": (24, 24, 24), "shots": 2, "max_it": 2, "c_bounds": (0.8, 2.0), "memory": "700MiB"}


def wave_true_3d(n: int):
    """The wave model's true velocity c_bg (1 + 0.1 g), c_bg = 1 + depth/2, g a Gaussian of width 0.1
    at the centre, on the (depth, y, x) grid of n^3 interior nodes."""
    import numpy as np

    x = (np.arange(n) + 1) / (n + 1)
    z, y, xx = np.meshgrid(x, x, x, indexing="ij")
    bg = 1.0 + 0.5 * z
    return bg, bg * (1.0 + 0.1 * np.exp(-((z - 0.5) ** 2 + (y - 0.5) ** 2 + (xx - 0.5) ** 2) / (2 * 0.1 ** 2)))


def wave3d(quick: bool, scratch: Path) -> dict:
    """The built-in wave model in 3-D: c from the background, the true model's anomaly observed by two
    shots, one shot per rank (each rank holds a whole grid: a snapshot is the pair of fields)."""
    import numpy as np

    from hpcadj.imports import h5py

    cfg = WAVE3D_QUICK if quick else WAVE3D
    out = HERE / "wave3d"
    fresh(out)
    controls = scratch / "c.h5"
    grid = "x".join(map(str, cfg["grid"]))
    lo, hi = cfg["c_bounds"]
    t0 = time.perf_counter()
    text = H.hpcadj_cmd(RANKS, "invert", [
        "--model", "wave", "--grid", grid, "--shots", cfg["shots"], "--ranks-per-shot", 1, "--invert", "c",
        "--bounds", f"c:{lo}:{hi}", "--max-it", cfg["max_it"], "--memory", cfg["memory"], "--local-dir", scratch,
        "--controls-out", controls, "--log-dir", out / "log", "--json"], timeout=3000)
    wall = time.perf_counter() - t0
    summary = json.loads([line for line in text.splitlines() if line.startswith("{")][-1])
    n = cfg["grid"][0]
    start, truth = wave_true_3d(n)
    with h5py().File(controls, "r") as f:
        recovered = np.array(f["c"][...])
    mid = n // 2
    field_plot(out / "fields.png", [("true c (y = 1/2)", truth[:, mid, :]), ("initial c (background)", start[:, mid, :]),
                                    (f"recovered c ({summary['iterations']} it.)", recovered[:, mid, :])],
               "jet", extent="depth")
    # the anomaly is what the inversion can recover: errors against the truth relative to c_true - c_bg
    errors = {"error_initial": rel_error(start, truth), "error_recovered": rel_error(recovered, truth),
              "anomaly_error_initial": 1.0,
              "anomaly_error_recovered": float(np.linalg.norm(recovered - truth) / np.linalg.norm(truth - start))}
    return summarise("wave3d", out, analyze(out), errors,
                     {"config": cfg, "ranks": RANKS, "status": summary.get("status"), "command_wall_s": wall,
                      "steps": summary.get("steps"), "shots_run": cfg["shots"], "summary": summary,
                      "snapshot_MiB_per_rank": n ** 3 * 2 * 8 / 2**20})


PROBLEMS = {"heat": heat, "grayscott": grayscott, "grayscott-ts": grayscott_ts, "fwi": fwi, "wave3d": wave3d}


def report() -> str:
    """The README's results table from every problem's results.json."""
    rows = []
    for name in PROBLEMS:
        path = HERE / name / "results.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())
        cfg = r["config"]
        rows.append([name, "x".join(map(str, cfg["grid"])) + f", {r.get('steps', cfg.get('steps'))} steps"
                     + (f", {r['shots_run']} shots" if "shots_run" in r else "") + (" (--quick)" if r.get("quick") else ""),
                     f"{r['snapshot_MiB_per_rank']:.2g}", r["iterations"],
                     f"{r['misfit_first']:.3g} → {r['misfit_last']:.3g} ({r['misfit_reduction']:.3g}×)",
                     "yes" if r["misfit_monotone"] else "no",
                     f"{r['error_initial']:.3g} → {r['error_recovered']:.3g} ({r['error_reduction']:.3g}×)",
                     f"{r['forward_steps_per_iteration']:.0f} / {r['naive_forward_steps_per_iteration']:.0f}",
                     f"{r['seconds_per_iteration']:.2f}", f"{r['wall_seconds']:.0f}",
                     f"{r['peak_rss_MiB']:.0f} / {cfg['memory']}"])
    header = ["problem", "size", "snapshot MiB/rank", "iterations", "misfit (reduction)", "monotone",
              "relative error vs truth (reduction)", "forward steps/iter (naive loop)", "s/iter", "wall s",
              "peak RSS MiB / --memory"]
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(map(str, row)) + " |" for row in rows]) + "\n"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_observe":
        heat_observe(json.loads(sys.argv[2]), sys.argv[3])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_solve":
        {"grayscott": gs_solve, "grayscott-ts": gsts_solve, "fwi": fwi_solve}[sys.argv[2]](json.loads(sys.argv[3]), sys.argv[4])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "report":
        sys.stdout.write(report())
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("problem", choices=[*PROBLEMS, "all"])
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test of the script)")
    p.add_argument("--config", default="{}", help="JSON object of grayscott's, grayscott-ts's or fwi's configuration keys to replace")
    p.add_argument("--out", type=Path, default=HERE, help="where <problem>/ goes (default: beside this script)")
    args = p.parse_args()
    QUICK[0], OUT[0], OVERRIDES[0] = args.quick, args.out, json.loads(args.config)
    for name in PROBLEMS if args.problem == "all" else [args.problem]:
        scratch = Path(tempfile.mkdtemp(prefix=f"hpcadj-inversion-{name}-"))
        try:
            PROBLEMS[name](args.quick, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
