"""Energy-aware planning (issue 6): a case where the energy-optimal plan differs from the
time-optimal one, both run for real through ``hpcadj run`` on 2 ranks.

The case: a small RAM budget (3 slots) plus a second level with room for every state. Writing a
snapshot there is cheap in *time* (about a millisecond, and asynchronous I/O hides most of it behind
the next steps: the planner charges ``write_s x (1 - overlap)``), but in *energy* it costs the whole
write plus the bytes moved at the site's joules per byte. The site model here (``site_energy.toml``)
is the documented default except that second level's per-byte cost: 0.4 uJ/B written, 0.3 uJ/B read
(a "node-local" level that is really a network-attached burst buffer whose power is charged per
byte; 130x the default NVMe figure). Storing a 512 KiB snapshot there and reading it back then costs
about as much energy as three forward steps, while it saves far more than three steps of time.
With the default constants the two plans coincide on this VM (printed too).

Steps:
1. ``hpcadj calibrate`` (2 ranks, HDF5 and node-local levels) with ``HPCADJ_ENERGY_MODEL`` pointing
   at the site model -> ``profile.json`` (seconds measured; joules = model).
2. Plan with ``--minimize time`` and ``--minimize energy`` (the same planner, two cost vectors);
   predicted time and energy of both plans via the simulator.
3. Run both with ``hpcadj run --schedule auto --costs profile.json --minimize ... --log-dir ...
   --energy-model site_energy.toml`` (3 repeats each, alternating; medians): measured wall time and
   the run log's modeled energy (phase core-seconds x 12 W + bytes x J/B).

    .venv/bin/python experiments/energy_plan/run.py [--quick]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import _harness as H  # noqa: E402

SITE_MODEL = HERE / "site_energy.toml"


def plans(profile, n, slots):
    """(schedule name, summary) of the time- and energy-optimal plans, and both costs of each."""
    from hpcadj.checkpoint.schedules import make_schedule, simulate

    out = {}
    for goal in ("time", "energy"):
        sched = make_schedule("auto", n, slots, costs=profile.vector(goal))
        summ = simulate(sched.actions(), n, slots)
        out[goal] = {"schedule": sched.name, "forward_steps": summ.forward_steps,
                     "writes": list(summ.writes), "reads": list(summ.reads),
                     "predicted_s": summ.cost(profile.vector("time")),
                     "predicted_j": summ.cost(profile.vector("energy"))}
    return out


def with_model(profile, model, nbytes_local: int, nbytes_global: int, cores: int):
    """The profile's joules recomputed with another energy model (same measured seconds)."""
    from hpcadj.checkpoint.schedules import CostProfile

    data = profile.to_dict()
    data["forward_j"] = model.forward_step_joules(profile.forward_s, cores)
    data["adjoint_j"] = model.adjoint_step_joules(profile.adjoint_s, cores)
    kinds = {"ram": "ram", "disk": "local", "pfs": "pfs"}
    for lv in data["levels"]:
        kind = kinds[lv["name"]]
        nbytes = nbytes_global if kind == "pfs" else nbytes_local
        lv["write_j"] = model.write_joules(kind, nbytes, lv["write_s"], cores)
        lv["read_j"] = model.read_joules(kind, nbytes, lv["read_s"], cores)
    return CostProfile.from_dict(data)


def main() -> int:
    p = H.study_parser(__doc__, HERE, model="heat", ram=3)
    args = p.parse_args()
    from hpcadj.checkpoint.schedules import CostProfile
    from hpcadj.telemetry import load_model

    grid = args.grid or ("160x160" if args.quick else "256x256")
    n = args.steps or (40 if args.quick else 80)
    info = H.machine()
    work = H.scratch("energyplan")
    prof_path = os.path.join(work, "profile.json")
    env = H.mpi_env()
    env["HPCADJ_ENERGY_MODEL"] = str(SITE_MODEL)
    H.log(f"energy_plan: {args.model} {grid}, {n} steps, RAM {args.ram} + disk {n}, {args.ranks} ranks; calibrating")
    H.mpirun(args.ranks, [H.HPCADJ, "calibrate", "--model", args.model, "--grid", grid, "--steps", n,
                          "--local-dir", work, "--out", prof_path], env=env)
    profile = CostProfile.load(prof_path)
    # keep only the levels this case uses (ram, disk), named as `run` names them
    profile.levels = [lv for lv in profile.levels if lv.name in ("ram", "disk")]
    profile.save(prof_path)
    slots = [args.ram, n]

    gx, gy = (int(v) for v in grid.split("x"))
    snapshot_global = gx * gy * 8  # heat: one double per grid point
    site = plans(profile, n, slots)
    default = plans(with_model(profile, load_model(None), snapshot_global, snapshot_global, args.ranks), n, slots)
    H.log(f"  site model plans: {json.dumps(site)}")
    H.log(f"  default model plans: {json.dumps(default)}")

    base = ["--model", args.model, "--grid", grid, "--steps", n, "--schedule", "auto", "--costs", prof_path,
            "--ram", args.ram, "--disk", n, "--local-dir", "@LOCALDIR", "--log-dir", "@LOGDIR",
            "--energy-model", SITE_MODEL]
    configs = [("time-optimal plan", base + ["--minimize", "time"]),
               ("energy-optimal plan", base + ["--minimize", "energy"])]
    raw, rows = H.run_configs(configs, args.ranks, args.repeats, env=env)
    for row, goal in zip(rows, ("time", "energy")):
        row["minimize"] = goal
        row["predicted_s"] = site[goal]["predicted_s"]
        row["predicted_j"] = site[goal]["predicted_j"]
        row["default_model_plan_same_as_time_plan"] = default["energy"] == default["time"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    H.write_csv(out / "results.csv", rows)
    (out / "profile.json").write_text(Path(prof_path).read_text())
    (out / "plans.json").write_text(json.dumps({"site_model": site, "default_model": default}, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    plot(rows, out / "energy_plan.png", args, grid, n, info)
    keys = ["label", "forward_steps", "ram_writes", "disk_writes", "disk_reads", "predicted_s", "wall_s",
            "wall_min_s", "wall_max_s", "predicted_j", "energy_j", "energy_source"]
    print(H.markdown_table(rows, keys))
    t, e = rows
    print(f"\nenergy-optimal vs time-optimal: wall x{e['wall_s'] / t['wall_s']:.3f}, "
          f"modeled energy x{e['energy_j'] / t['energy_j']:.3f} (run logs); predicted time "
          f"x{e['predicted_s'] / t['predicted_s']:.3f}, predicted energy x{e['predicted_j'] / t['predicted_j']:.3f}")
    print(f"plans differ: {site['time'] != site['energy']}; with the default energy constants they "
          f"{'coincide' if default['time'] == default['energy'] else 'differ'}")
    print(f"machine: {info}; load at the end {H.machine()['loadavg_1m']}; medians of {args.repeats}")
    return 0


def plot(rows, path, args, grid, n, info) -> None:
    plt = H.pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2))
    names = [r["label"] for r in rows]
    x = range(len(rows))
    a1.bar([i - 0.2 for i in x], [r["predicted_s"] for r in rows], width=0.4, label="predicted (profile)")
    a1.bar([i + 0.2 for i in x], [r["wall_s"] for r in rows], width=0.4, label=f"measured (median of {args.repeats})")
    a1.set_ylabel("time of the gradient (s)")
    a2.bar([i - 0.2 for i in x], [r["predicted_j"] for r in rows], width=0.4, label="predicted (profile)")
    a2.bar([i + 0.2 for i in x], [r["energy_j"] for r in rows], width=0.4, label="run log (energy model)")
    a2.set_ylabel("energy (J, modeled: site_energy.toml)")
    for ax in (a1, a2):
        ax.set_xticks(list(x), [f"{nm}\n{r['forward_steps']} fwd, {r.get('disk_writes', 0)} disk writes"
                                for nm, r in zip(names, rows)], fontsize=8)
        ax.legend(fontsize=8)
    fig.suptitle(f"Time- vs energy-optimal plan: {args.model} {grid}, {n} steps, RAM {args.ram} + disk, "
                 f"{args.ranks} ranks ({info['nproc']}-core VM)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
