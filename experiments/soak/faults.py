"""Soak under storage faults (issue 27): full file systems and early kills with compression.

A real tmpfs (root only: ``mount -t tmpfs``) stands for a file system that fills up mid-run:
- ``pfs-full`` / ``disk-full``: the HDF5 file or the node-local directory on it, its level
  overflowing: the run must re-plan and give the store-all gradient bitwise;
- ``run-dir-full`` / ``gradient-out-full``: the run directory or the gradient file on it, nearly
  full: one line on stderr, exit status 2, no ``.partial`` file left;
- ``kill-compressed`` (not on the tmpfs): ``--compress lossless`` on every level, one rank SIGKILLed
  early (actions 2-8), ``--resume`` with the same arguments: bitwise, nothing left.
Every run has a timeout (a run past it is killed and counted as a hang).

    .venv/bin/python experiments/soak/faults.py           # burgers 768^2, 40 steps, 2 and 3 ranks
    .venv/bin/python experiments/soak/faults.py --quick   # burgers 256^2

Writes faults.csv (one row per try); exits 1 if any try misbehaved.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import _harness as H  # noqa: E402
from run import PROFILE, gradients, json_of, launch  # noqa: E402

TIMEOUT = 300


def mounted(size_mib: int, where: Path):
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(where)], check=True)


def fill(where: Path, free: int) -> None:
    st = os.statvfs(where)
    with open(where / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, st.f_bavail * st.f_frsize - free)


def empty(where: Path) -> None:
    for entry in where.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def same_as(ref: dict, info: dict, grad: Path) -> bool:
    if not info or info.get("J") != ref["J"] or not grad.exists():
        return False
    mine = gradients(grad)
    return set(mine) == set(ref["grad"]) and all(np.array_equal(mine[k], ref["grad"][k]) for k in mine)


def stderr_lines(err: str) -> list[str]:
    return [line for line in err.split("-" * 74)[0].splitlines() if line.strip()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=HERE)
    p.add_argument("--tries", type=int, default=2, help="kill points per rank count")
    args = p.parse_args(argv)
    grid, tmpfs_mib = ("256x256", 4) if args.quick else ("768x768", 64)
    model = ["--model", "burgers", "--grid", grid, "--steps", "40"]
    work = Path(tempfile.mkdtemp(prefix="hpcadj-faults-"))
    fs = work / "tmpfs"
    fs.mkdir()
    costs = work / "profile.json"
    costs.write_text(json.dumps(PROFILE))
    mounted(tmpfs_mib, fs)
    rows, rng = [], random.Random(27)
    try:
        for ranks in (2, 3):
            grad_ref = work / f"ref{ranks}.h5"
            code, out, err, _ = launch(ranks, [*model, "--gradient-out", grad_ref, "--json", "--quiet"], TIMEOUT)
            ref = json_of(out)
            ref["grad"] = gradients(grad_ref)
            mib = round(ref["snapshot_bytes"] / ranks / 2**20, 1)
            cases = {
                "pfs-full async": ([*model, "--ram", "3", "--disk", "6", "--pfs", "12",
                                    "--pfs-file", fs / "ck.h5"], None, "ok"),
                "pfs-full sync": ([*model, "--ram", "3", "--disk", "6", "--pfs", "12", "--no-async",
                                   "--pfs-file", fs / "ck.h5"], None, "ok"),
                "disk-full": ([*model, "--ram", "3", "--disk", "12", "--local-dir", fs], None, "ok"),
                "run-dir-full": ([*model, "--ram", "3", "--run-dir", fs / "run", "--durable-every", "2"],
                                 ref["snapshot_bytes"] // 2, "refused"),
                "gradient-out-full": ([*model, "--ram", "3"], ref["snapshot_bytes"] // 8, "refused"),
            }
            for name, (argv_, free, want) in cases.items():
                empty(fs)
                if free is not None:
                    fill(fs, free)
                grad = (fs / "grad.h5") if name == "gradient-out-full" else work / "grad.h5"
                local = work / "local"
                local.mkdir(exist_ok=True)
                extra = [] if "--local-dir" in argv_ else ["--local-dir", local]
                code, out, err, elapsed = launch(ranks, [*argv_, *extra, "--costs", costs, "--json", "--quiet",
                                                         "--gradient-out", grad], TIMEOUT)
                info = json_of(out)
                lines = stderr_lines(err)
                left = [str(q) for q in fs.rglob("*") if q.name != "filler" and not q.name.startswith("manifest")
                        and q.name not in ("run", "LOCK")] + [str(q) for q in local.rglob("*")]
                if want == "refused":
                    left = [q for q in left if q.endswith(".partial") or q.endswith("grad.h5")]
                row = {"case": name, "ranks": ranks, "mib_per_rank": mib, "exit": code,
                       "hang": code is None, "refused": code == 2 and len(lines) == 1,
                       "bitwise": same_as(ref, info, grad) if want == "ok" else "",
                       "faults": len(info.get("faults", [])), "files_left": len(left),
                       "elapsed_s": round(elapsed, 1)}
                row["ok"] = not row["hang"] and not left and (
                    row["bitwise"] is True and row["faults"] > 0 if want == "ok" else row["refused"])
                if not row["ok"]:
                    row["detail"] = (lines or [""])[-1][:200] + (f" left: {left[:3]}" if left else "")
                rows.append(row)
                H.log(f"{name:>18} {ranks} ranks: exit {code}, ok {row['ok']} ({elapsed:.1f} s)")
                shutil.rmtree(local, ignore_errors=True)
                (work / "grad.h5").unlink(missing_ok=True)
            empty(fs)
            klocal, kpfs, rundir = work / "klocal", work / "kck.h5", work / "rd"
            base = [*model, "--ram", "2", "--disk", "4", "--pfs", "6", "--compress", "lossless",
                    "--costs", costs, "--quiet", "--local-dir", klocal, "--pfs-file", kpfs]
            for k in sorted(rng.sample(range(2, 9), args.tries)):
                klocal.mkdir(exist_ok=True)
                victim = rng.randrange(ranks)
                code, _o, _e, _t = launch(ranks, [*base, "--run-dir", rundir, "--json"], TIMEOUT,
                                          env={"HPCADJ_INJECT_KILL": f"{victim}:{k}"})
                grad = work / "g.h5"
                rcode, out, err, elapsed = launch(ranks, [*base, "--run-dir", rundir, "--resume", "--json",
                                                          "--gradient-out", grad], TIMEOUT)
                shutil.rmtree(rundir, ignore_errors=True)
                left = [str(q) for q in klocal.rglob("*")] + ([str(kpfs)] if kpfs.exists() else [])
                row = {"case": f"kill-compressed @{k}", "ranks": ranks, "mib_per_rank": mib, "exit": rcode,
                       "hang": code is None or rcode is None, "refused": False,
                       "bitwise": same_as(ref, json_of(out), grad), "faults": len(json_of(out).get("faults", [])),
                       "files_left": len(left), "elapsed_s": round(elapsed, 1)}
                row["ok"] = code not in (0, None) and rcode == 0 and row["bitwise"] and not left
                if not row["ok"]:
                    row["detail"] = (stderr_lines(err) or [""])[-1][:200] + (f" left: {left[:3]}" if left else "")
                rows.append(row)
                H.log(f"kill-compressed @{k} rank {victim}, {ranks} ranks: resumed {rcode == 0}, ok {row['ok']}")
                grad.unlink(missing_ok=True)
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    H.write_csv(args.out / "faults.csv", rows)
    print(f"faults: {sum(r['ok'] for r in rows)} of {len(rows)} tries passed, hangs {sum(r['hang'] for r in rows)}, "
          f"refused {sum(r['refused'] for r in rows)}, files left {sum(r['files_left'] > 0 for r in rows)}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
