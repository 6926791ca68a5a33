"""What time-driven durable points cost without faults and save with them (issue 12, item 4).

Burgers 1024x1024 (16 MiB a snapshot), 100 steps, ``--ram 4 --disk 16 --pfs 32``, run-dir mode, 2
ranks, with one cost profile measured by ``hpcadj calibrate`` at the start and used by every run
(the plan is then the same in every row). For each ``--durable-interval`` setting: the fault-free wall time and durable seconds, then
a run killed (kill -9, rank 0) when the first sweep reaches step 97, resumed: the step it resumed
from and the total seconds (killed run + resume).

    .venv/bin/python experiments/soak/durable_forward.py [--grid 512x512] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import _harness as H  # noqa: E402
from run import json_of, launch  # noqa: E402

SETTINGS = {"off (1e9 s)": "1e9", "auto": "auto", "1 s": "1", "0.3 s": "0.3"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", default="1024x1024")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--kill-at", type=int, default=97)
    p.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="hpcadj-durable-"))
    model = ["--model", "burgers", "--grid", args.grid, "--steps", args.steps]
    costs = work / "profile.json"
    (work / "cal").mkdir()
    H.hpcadj_cmd(2, "calibrate", [*model, "--out", costs, "--local-dir", work / "cal",
                                  "--pfs-file", work / "cal" / "ck.h5"])
    base = [*model, "--ram", "4", "--disk", "16", "--pfs", "32", "--costs", costs, "--quiet", "--json"]
    rows = []
    try:
        for label, interval in SETTINGS.items():
            row = {"durable_interval": label}
            for mode in ("clean", "killed"):
                rundir, local, shared = work / "rd", work / "local", work / "shared"
                local.mkdir()
                shared.mkdir()
                run = [*base, "--run-dir", rundir, "--local-dir", local, "--pfs-file", shared / "ck.h5",
                       "--durable-interval", interval]
                t0 = time.perf_counter()
                if mode == "clean":
                    code, out, err, _ = launch(2, run, 900)
                    info = json_of(out)
                    row.update(clean_wall_s=round(info["wall_s"], 2),
                               durable_points=info["durable"]["points"],
                               durable_s=round(info["durable"]["seconds"], 2))
                else:
                    launch(2, run, 900, env={"HPCADJ_INJECT_KILL": f"0:frontier={args.kill_at}"})
                    manifest = json.loads((rundir / "manifest.json").read_text())
                    durable = manifest.get("durable") or {}
                    resumed_from = durable.get("frontier", max(map(int, manifest.get("forward_points") or {0: 0})))
                    code, out, err, _ = launch(2, [*run, "--resume"], 900)
                    info = json_of(out)
                    row.update(resumed_from_step=resumed_from,
                               redone_first_sweep_steps=info["forward_steps"] - info["recomputed_steps"],
                               killed_total_s=round(time.perf_counter() - t0, 1))
                if code != 0:
                    raise RuntimeError(f"{label} {mode}: exit {code}: {err[-1500:]}")
                for path in (rundir, local, shared):
                    shutil.rmtree(path, ignore_errors=True)
            rows.append(row)
            H.log(json.dumps(row))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    H.write_csv(args.out / "durable_forward.csv", rows)
    print(H.markdown_table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
