"""The checkpointed FWI gradient, hpcadj against Devito + pyrevolve, alternated in one sitting.

hpcadj: ``hpcadj run --model wave --grid NxNxN --steps S --ram 512MiB`` on 2 ranks (float64,
wavefront-tiled recomputation at the automatic depth). Devito: ``devito_gradient.py`` in a separate
venv (``--devito-python``), float64, OMP_NUM_THREADS=2, DEVITO_LANGUAGE=openmp, its own
checkpointed gradient through pyrevolve with the checkpoints that fit in the same 512 MiB. One
untimed warm-up of each (numba and Devito's JIT caches), then ``--repeats`` alternations. Per run:
wall seconds, phases, peak RSS (hpcadj: the largest rank's, times 2 for both; Devito: its process).
Writes results.csv and prints a table.

    .venv/bin/python experiments/vs_devito/run.py --devito-python /work/wt/dv/bin/python
        [--n 128] [--steps 300] [--repeats 3] [--time-tiles auto,1] [--no-devito] [--out results.csv]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import _harness as H  # noqa: E402


def hpcadj(n: int, steps: int, tile: str = "auto") -> dict:
    extra = [] if tile == "auto" else ["--time-tile", tile]
    info = H.hpcadj_run(2, ["--model", "wave", "--grid", f"{n}x{n}x{n}", "--steps", steps, "--ram", "512MiB",
                            *extra], timeout=1800)
    return {"tool": "hpcadj" if tile == "auto" else f"hpcadj --time-tile {tile}", "wall_s": info["wall_s"],
            "phases": json.dumps(info.get("phase_s", {})), "J": info["J"],
            "peak_rss_MiB": 2 * info["peak_rss_bytes"] / 2 ** 20, "forward_steps": info.get("forward_steps"),
            "recomputed_steps": info.get("recomputed_steps")}


def devito(python: str, n: int, steps: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="2", DEVITO_LANGUAGE="openmp", DEVITO_LOGGING="ERROR")
    proc = subprocess.run([python, str(HERE / "devito_gradient.py"), "--n", str(n), "--steps", str(steps),
                           "--ram", "512"], capture_output=True, text=True, env=env, timeout=1800, cwd="/tmp")
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    row = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    row["phases"] = json.dumps({"forward": row.pop("forward_s"), "reverse": row.pop("reverse_s")})
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devito-python", default="")
    p.add_argument("--n", type=int, default=128)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--time-tiles", default="auto", help="hpcadj runs per round: 'auto' and/or depths")
    p.add_argument("--no-devito", action="store_true", help="hpcadj's runs only (the tiling's share)")
    p.add_argument("--out", default="results.csv")
    args = p.parse_args()
    tiles = args.time_tiles.split(",")
    runs = [(f"hpcadj {t}", lambda t=t: hpcadj(args.n, args.steps, t)) for t in tiles]
    if not args.no_devito:
        runs.append(("devito", lambda: devito(args.devito_python, args.n, args.steps)))
    H.log("warm-up")
    for _name, fn in runs:
        fn()
    rows = []
    for r in range(args.repeats):
        for name, fn in runs:
            load = os.getloadavg()[0]
            row = fn()
            row.update(round=r, loadavg_1m_before=load, loadavg_1m_after=os.getloadavg()[0])
            H.log(f"{name}: {row['wall_s']:.1f} s, peak RSS {row['peak_rss_MiB']:.0f} MiB, load {load:.1f}")
            rows.append(row)
    info = H.machine()
    for row in rows:
        row.update(date=info["date"], n=args.n, steps=args.steps)
    H.write_csv(HERE / args.out, rows)
    print(H.markdown_table(rows, ["round", "tool", "wall_s", "phases", "peak_rss_MiB", "loadavg_1m_before"]))
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
