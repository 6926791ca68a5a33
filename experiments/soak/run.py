"""Soak: many gradients at realistic snapshot sizes, every level mix, async and sync, 1/2/3 ranks.

Each checkpointed run is checked for (a) exiting within 2x its own wall time plus 10 s (a hang at
exit is killed at that limit and counted), (b) a gradient bitwise equal to the store-all one of
the same model, size and rank count, (c) no file left behind in the node-local directory or
beside the HDF5 file. Then a kill -9 sweep: one rank killed at random actions of a 30-60 s run
with all three levels asynchronous, each resumed with ``--resume`` and compared bitwise.

    .venv/bin/python experiments/soak/run.py            # the study (about 15 min on 2 cores)
    .venv/bin/python experiments/soak/run.py --quick    # a few runs at >= 4 MiB per rank

Exits 1 if any check fails; writes results.csv (one row per run) and kills.csv.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import _harness as H  # noqa: E402

#: makes the multilevel planner use every level it is given (no calibration run needed)
PROFILE = {"forward_s": 1.0, "adjoint_s": 2.0, "source": "soak",
           "levels": [{"name": "ram", "write_s": 0.01, "read_s": 0.01},
                      {"name": "disk", "write_s": 0.05, "read_s": 0.05},
                      {"name": "pfs", "write_s": 0.1, "read_s": 0.1}]}
MIXES = {"ram": ["--ram", "3"], "ram+disk": ["--ram", "2", "--disk", "4"],
         "ram+pfs": ["--ram", "2", "--pfs", "4"], "ram+disk+pfs": ["--ram", "2", "--disk", "3", "--pfs", "4"]}


def gradients(path: Path) -> dict:
    h5py = __import__("h5py")
    with h5py.File(path, "r") as f:
        return {name: f[name][...] for name in f}


def launch(ranks: int, args: list[str], timeout: float, env: dict | None = None):
    """(returncode, stdout, stderr, elapsed s); a run past ``timeout`` is killed: returncode None."""
    cmd = ["mpirun", "--oversubscribe", "-n", str(ranks), str(H.HPCADJ), "run", *map(str, args)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**H.mpi_env(), **(env or {})}, cwd=H.ROOT, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        import os
        import signal

        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    return code, out, err, time.perf_counter() - t0


def json_of(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def leftovers(*dirs: Path, keep: tuple = ()) -> list[str]:
    found = []
    for d in dirs:
        found += [str(p) for p in d.rglob("*") if p.name not in keep]
    return found


def soak_case(work: Path, model: list[str], ranks: int, mix: str, async_io: bool, ref: dict,
              costs: Path) -> dict:
    """One checkpointed gradient against the store-all reference ``ref``."""
    tag = f"{mix}-{'async' if async_io else 'sync'}-{ranks}"
    local, shared = work / f"local-{tag}", work / f"shared-{tag}"
    local.mkdir()
    shared.mkdir()
    grad = work / f"grad-{tag}.h5"
    pfs_file = ["--pfs-file", shared / "ck.h5"] if "--pfs" in MIXES[mix] else []  # refused without --pfs
    args = [*model, *MIXES[mix], "--local-dir", local, *pfs_file, "--costs", costs,
            "--gradient-out", grad, "--json", "--quiet", *([] if async_io else ["--no-async"])]
    code, out, err, elapsed = launch(ranks, args, timeout=max(120.0, 4 * ref["wall_s"] + 60))
    info = json_of(out)
    wall = info.get("wall_s", ref["wall_s"])
    limit = 2 * wall + 10
    row = {"model": model[1], "grid": info.get("grid", ""), "ranks": ranks, "mix": mix,
           "async": async_io, "snapshot_mib_per_rank": round(ref["snapshot_bytes"] / ranks / 2**20, 1),
           "wall_s": round(wall, 2), "elapsed_s": round(elapsed, 2), "exit": code,
           "exited_in_time": code == 0 and elapsed <= limit}
    same = bool(info) and info.get("J") == ref["J"] and grad.exists()
    if same:
        mine = gradients(grad)
        same = set(mine) == set(ref["grad"]) and all(np.array_equal(mine[k], ref["grad"][k]) for k in mine)
    row["bitwise"] = same
    left = leftovers(local, shared)
    row["files_left"] = len(left)
    row["ok"] = row["exited_in_time"] and same and not left
    if not row["ok"]:
        row["detail"] = (err.strip().splitlines() or [""])[-1][:200] + (f" left: {left[:3]}" if left else "")
    shutil.rmtree(local, ignore_errors=True)
    shutil.rmtree(shared, ignore_errors=True)
    grad.unlink(missing_ok=True)
    return row


def reference(work: Path, model: list[str], ranks: int) -> dict:
    """The store-all gradient (RAM only, every state kept)."""
    grad = work / f"ref-{ranks}.h5"
    code, out, err, elapsed = launch(ranks, [*model, "--gradient-out", grad, "--json", "--quiet"], 900)
    if code != 0:
        raise RuntimeError(f"store-all reference failed on {ranks} rank(s) (exit {code}): "
                           f"{err[-2000:]}{out[-1000:]}")
    info = json_of(out)
    info["grad"] = gradients(grad)
    grad.unlink()
    return info


def kill_sweep(work: Path, model: list[str], ranks: int, points: int, costs: Path, seed: int) -> list[dict]:
    """kill -9 one rank at random actions of an all-three-levels async run; resume; compare."""
    ref = reference(work, model, ranks)
    local, shared = work / "kill-local", work / "kill-shared"
    base = [*model, *MIXES["ram+disk+pfs"], "--costs", costs, "--quiet"]
    local.mkdir()
    shared.mkdir()
    code, out, err, _ = launch(ranks, [*base, "--local-dir", local, "--pfs-file", shared / "ck.h5",
                                       "--json"], 900)
    actions = json_of(out)["actions"]
    shutil.rmtree(local)
    shutil.rmtree(shared)
    rng = random.Random(seed)
    rows = []
    for k in sorted(rng.sample(range(2, actions - 1), points)):
        victim = rng.randrange(ranks)
        rundir, local, shared = work / f"rd{k}", work / f"l{k}", work / f"s{k}"
        local.mkdir()
        shared.mkdir()
        args = [*base, "--local-dir", local, "--pfs-file", shared / "ck.h5", "--run-dir", rundir]
        code, _out, _err, t_kill = launch(ranks, [*args, "--json"], 900, env={"HPCADJ_INJECT_KILL": f"{victim}:{k}"})
        grad = work / f"g{k}.h5"
        rcode, out, err, t_resume = launch(ranks, [*args, "--resume", "--json", "--gradient-out", grad], 900)
        info = json_of(out)
        same = rcode == 0 and info.get("J") == ref["J"] and grad.exists()
        if same:
            mine = gradients(grad)
            same = all(np.array_equal(mine[n], ref["grad"][n]) for n in ref["grad"])
        left = leftovers(local, shared)
        rows.append({"action": k, "of": actions, "rank": victim, "killed": code not in (0, None),
                     "resumed": rcode == 0, "bitwise": same, "files_left": len(left),
                     "kill_run_s": round(t_kill, 1), "resume_s": round(t_resume, 1),
                     "faults": len(info.get("faults", []))})
        H.log(f"kill at action {k}/{actions} rank {victim}: resumed {rcode == 0}, bitwise {same}")
        for path in (rundir, local, shared):
            shutil.rmtree(path, ignore_errors=True)
        grad.unlink(missing_ok=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a few runs at >= 4 MiB per rank (make test)")
    p.add_argument("--out", type=Path, default=HERE, help="where results.csv and kills.csv go")
    p.add_argument("--kills", type=int, default=None, help="kill points (default 10; 0 with --quick)")
    p.add_argument("--scratch", default=None, help="directory for the runs' files (default: a temp dir)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.quick:  # wave 96^3: 13.5 MiB a snapshot, 6.8 MiB per rank on 2, 4.5 on 3
        model, grid_ranks, mixes = ["--model", "wave", "--grid", "96x96x96", "--steps", "12"], [2, 3], \
            [("ram+disk+pfs", True), ("ram+disk+pfs", False)]
        kill_model, kills = None, args.kills or 0
    else:  # wave 128^3: 32 MiB a snapshot, 32 / 16 / 10.7 MiB per rank on 1 / 2 / 3 ranks
        model, grid_ranks = ["--model", "wave", "--grid", "128x128x128", "--steps", "20"], [1, 2, 3]
        mixes = [(m, a) for m in MIXES for a in (True, False) if not (m == "ram" and not a)]
        kill_model = ["--model", "wave", "--grid", "128x128x128", "--steps", "100"]
        kills = 10 if args.kills is None else args.kills
    work = Path(tempfile.mkdtemp(prefix="hpcadj-soak-", dir=args.scratch))
    costs = work / "profile.json"
    costs.write_text(json.dumps(PROFILE))
    rows = []
    try:
        for ranks in grid_ranks:
            ref = reference(work, model, ranks)
            for mix, async_io in mixes:
                row = soak_case(work, model, ranks, mix, async_io, ref, costs)
                rows.append(row)
                H.log(f"{row['mix']:>13} {'async' if async_io else 'sync ':5} {ranks} rank(s) "
                      f"{row['snapshot_mib_per_rank']:5.1f} MiB/rank: exit {row['exit']} in "
                      f"{row['elapsed_s']} s (wall {row['wall_s']} s), bitwise {row['bitwise']}, "
                      f"files left {row['files_left']}")
        H.write_csv(args.out / "results.csv", rows)
        kill_rows = kill_sweep(work, kill_model, 2, kills, costs, seed=12) if kills and kill_model else []
        if kill_rows:
            H.write_csv(args.out / "kills.csv", kill_rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    passed = sum(r["ok"] for r in rows)
    hangs = sum(r["exit"] is None for r in rows)
    print(f"soak: {passed} of {len(rows)} runs passed (exits in time {sum(r['exited_in_time'] for r in rows)}, "
          f"hangs {hangs}, bitwise {sum(r['bitwise'] for r in rows)}, with files left "
          f"{sum(r['files_left'] > 0 for r in rows)})")
    if kill_rows:
        print(f"kill sweep: {len(kill_rows)} points, {sum(r['resumed'] for r in kill_rows)} resumed, "
              f"{sum(r['bitwise'] for r in kill_rows)} bitwise, "
              f"{sum(r['files_left'] > 0 for r in kill_rows)} with files left")
    ok = passed == len(rows) and all(r["bitwise"] and not r["files_left"] for r in kill_rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
