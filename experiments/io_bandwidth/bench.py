"""Parallel-HDF5 snapshot write bandwidth against ``dd ... conv=fsync``, and how much write time
asynchronous I/O hides behind compute. Run under mpirun (2 ranks); rank 0 prints and writes the CSV.

    mpirun -n 2 .venv/bin/python experiments/io_bandwidth/bench.py --dir /tmp --out results.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from mpi4py import MPI  # first: MPI_THREAD_MULTIPLE, so the HDF5 level may run asynchronously

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from hpcadj.checkpoint.storage import make_level
from hpcadj.snapshot import FieldLayout

comm = MPI.COMM_WORLD


def layout_for(mib_per_rank: float) -> dict:
    """One float64 field of shape (rows, 1024), rows split evenly over the ranks."""
    rows = max(1, int(mib_per_rank * 2**20 / 8 / 1024))
    return {"u": FieldLayout((rows * comm.size, 1024), (rows * comm.rank, 0), (rows, 1024))}


def snapshot(layout, step):
    lay = layout["u"]
    return {"u": np.full(lay.shape, float(step)) + np.arange(lay.shape[1])}


def timed(fn) -> float:
    """Wall seconds of ``fn`` on all ranks (dirty pages synced and a barrier before, max over ranks)."""
    os.sync()
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def pfs_bandwidth(path, layout, count, collective) -> tuple[float, int]:
    """Seconds and bytes to write ``count`` snapshots, close the file and fsync it once, as
    ``dd conv=fsync`` syncs once at the end."""
    level = make_level("pfs", count, layout, comm, path=path, keep=True, async_io=False,
                       collective=collective)

    data = snapshot(layout, 0)

    def run():
        for step in range(count):
            level.write(step, data)
        level.close()
        if comm.rank == 0:
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)

    seconds = timed(run)
    if comm.rank == 0:
        os.remove(path)
    return seconds, count * layout["u"].global_nbytes


def dd_bandwidth(path, nbytes) -> float:
    """Seconds for rank 0's ``dd`` to write ``nbytes`` sequentially with a final fsync."""
    seconds = 0.0
    if comm.rank == 0:
        t0 = time.perf_counter()
        subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=4M", f"count={nbytes // 2**22}",
                        "conv=fsync"], check=True, capture_output=True)
        seconds = time.perf_counter() - t0
        os.remove(path)
    return comm.bcast(seconds, root=0)


def busy(seconds: float, work: str) -> None:
    """The compute stand-in: sleep, or numpy arithmetic on a 4 MiB array for ``seconds``."""
    if work == "sleep":
        time.sleep(seconds)
        return
    a = np.random.default_rng(0).random(2**19)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = np.sqrt(a * a + 1.0) - 0.5


def hiding(kind, args, layout, work, donate) -> dict:
    """Hidden fraction of write time, two ways. Across runs: 1 - (async wall - compute) / (sync wall -
    compute), with the compute per step ``compute_factor`` x the write time per step of a synchronous
    loop. In the async run alone: 1 - (seconds the compute thread spent inside write/flush, staging
    copies included) / (seconds the I/O thread spent writing); immune to the disk's drift between runs."""
    steps = args.steps
    opts = dict(local_dir=args.dir, path=os.path.join(args.dir, "hide.h5"))

    compute_s = 0.0

    def run(async_io):
        level = make_level(kind, steps, layout, comm, async_io=async_io, **opts) if async_io is not None else None

        data = snapshot(layout, 0)
        inside = [0.0]  # seconds the compute thread spent in level calls (staging copy, waits, flush)

        def loop():
            for step in range(steps):
                busy(compute_s, work)
                if level is not None:
                    t0 = time.perf_counter()
                    level.write(step, data, donate=donate and async_io)
                    inside[0] += time.perf_counter() - t0
            if level is not None:
                t0 = time.perf_counter()
                level.flush()
                inside[0] += time.perf_counter() - t0

        seconds = timed(loop)
        if level is not None:
            level.close()
            level.inside_s = inside[0]
        return seconds, level

    write_only, _ = run(False)
    write_s = write_only / steps
    compute_s = args.compute_factor * write_s
    compute_only, _ = run(None)
    sync_wall, sync_level = run(False)
    async_wall, async_level = run(True)
    exposed_sync = sync_wall - compute_only
    exposed_async = async_wall - compute_only
    # in-run: of the seconds the I/O thread spent writing, the share the compute thread never saw
    written = comm.allreduce(async_level.stats.write_s, op=MPI.MAX)
    seen = comm.allreduce(async_level.inside_s, op=MPI.MAX)
    return {"kind": kind, "work": work, "buffers": "donated" if donate else "copied", "steps": steps,
            "write_s_per_snapshot": write_s,
            "async_write_s_per_snapshot": written / steps, "async_inside_s": seen,
            "hidden_in_run": 1.0 - seen / written if written > 0 else float("nan"),
            "compute_s_per_step": compute_s, "compute_only_s": compute_only,
            "sync_wall_s": sync_wall, "async_wall_s": async_wall,
            "async_wait_s": comm.allreduce(async_level.stats.wait_s, op=MPI.MAX),
            "hidden_fraction": 1.0 - exposed_async / exposed_sync if exposed_sync > 0 else float("nan")}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/tmp", help="directory on the disk under test")
    p.add_argument("--mib-per-rank", type=float, default=64.0, help="snapshot MiB per rank (bandwidth)")
    p.add_argument("--count", type=int, default=6, help="snapshots per bandwidth measurement")
    p.add_argument("--repeats", type=int, default=3, help="interleaved pfs/dd repetitions (0: no bandwidth part)")
    p.add_argument("--hide-mib-per-rank", type=float, default=16.0, help="snapshot MiB per rank (hiding)")
    p.add_argument("--steps", type=int, default=12, help="steps per hiding run")
    p.add_argument("--compute-factor", type=float, default=1.2, help="compute per step / write time")
    p.add_argument("--kinds", nargs="+", default=["pfs", "local"], choices=["pfs", "local"],
                   help="levels whose async hiding is measured")
    p.add_argument("--hide-repeats", type=int, default=3, help="repetitions of every hiding measurement")
    p.add_argument("--buffers", nargs="+", default=["donated", "copied"], choices=["donated", "copied"],
                   help="hand the snapshot over (as the driver does) or let the level copy it first")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results.csv"))
    args = p.parse_args()
    rows = []

    layout = layout_for(args.mib_per_rank)
    ratios = {"auto": [], "always": []}
    for rep in range(args.repeats):
        for mode in ratios:
            seconds, nbytes = pfs_bandwidth(os.path.join(args.dir, "bw.h5"), layout, args.count, mode)
            dd_s = dd_bandwidth(os.path.join(args.dir, "dd.bin"), nbytes)
            pfs, dd = nbytes / seconds / 1e6, nbytes / dd_s / 1e6
            ratios[mode].append(pfs / dd)
            rows.append({"measurement": "bandwidth", "collective": mode, "repeat": rep,
                         "ranks": comm.size, "bytes": nbytes, "pfs_s": seconds, "dd_s": dd_s,
                         "pfs_MBps": pfs, "dd_MBps": dd, "ratio": pfs / dd})

    hide_layout = layout_for(args.hide_mib_per_rank)
    hides = []
    for rep in range(args.hide_repeats):
        for kind in args.kinds:
            for work in ("sleep", "numpy"):
                for buffers in args.buffers:
                    h = hiding(kind, args, hide_layout, work, donate=buffers == "donated")
                    h["repeat"] = rep
                    # the target's condition, checked in the run itself: compute per step >= the
                    # time the I/O thread actually took per write (the disk drifts between runs)
                    h["compute_ge_write"] = h["compute_s_per_step"] >= h["async_write_s_per_snapshot"]
                    hides.append(h)
                    rows.append({"measurement": "async_hiding", "ranks": comm.size, **h})

    if comm.rank == 0:
        fields = []
        for r in rows:
            fields += [k for k in r if k not in fields]
        with open(args.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
        print(f"ranks {comm.size}, {args.count} snapshots of {layout['u'].global_nbytes / 2**20:.0f} MiB")
        for r in rows[:2 * args.repeats]:
            print(f"  collective={r['collective']:6s} pfs {r['pfs_MBps']:.0f} MB/s, "
                  f"dd {r['dd_MBps']:.0f} MB/s, ratio {r['ratio']:.2f}")
        for mode, values in ratios.items() if args.repeats else ():
            print(f"parallel-HDF5 (collective={mode}) / dd conv=fsync bandwidth ratio, median of "
                  f"{args.repeats}: {statistics.median(values):.2f}")
        for h in hides:
            print(f"async hiding {h['kind']:5s} compute={h['work']:5s} {h['buffers']:7s}: write {h['write_s_per_snapshot']*1e3:.1f} ms, "
                  f"compute {h['compute_s_per_step']*1e3:.1f} ms/step, sync {h['sync_wall_s']:.2f} s, "
                  f"async {h['async_wall_s']:.2f} s, compute-only {h['compute_only_s']:.2f} s, "
                  f"hidden {100 * h['hidden_fraction']:.0f} %; in-run: thread wrote "
                  f"{h['async_write_s_per_snapshot']*1e3:.1f} ms/snapshot, compute thread blocked "
                  f"{h['async_inside_s']:.2f} s in all, hidden {100 * h['hidden_in_run']:.0f} %"
                  + ("" if h["compute_ge_write"] else " [compute < write in this run]"))
        print("median over repeats (in-run share: runs where compute >= write only):")
        for key in dict.fromkeys((h["kind"], h["work"], h["buffers"]) for h in hides):
            group = [h for h in hides if (h["kind"], h["work"], h["buffers"]) == key]
            fair = [h["hidden_in_run"] for h in group if h["compute_ge_write"]]
            print(f"  {key[0]:5s} compute={key[1]:5s} {key[2]:7s}: hidden (wall) "
                  f"{100 * statistics.median(h['hidden_fraction'] for h in group):.0f} %, in-run "
                  + (f"{100 * statistics.median(fair):.0f} % ({len(fair)} of {len(group)} runs)"
                     if fair else f"n/a (compute < write in all {len(group)} runs)"))


if __name__ == "__main__":
    main()
