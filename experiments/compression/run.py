"""Compression study (issue 18), part 1: how well each model's states compress, and how fast.

    python experiments/compression/run.py            # wave 128^3, heat 128^3, burgers 1024^2, grayscott 512^2
    python experiments/compression/run.py --quick    # small grids, for make experiments

For each model at its size, the forward sweep runs ``steps`` steps from the default controls on one
rank (so the snapshot is one rank's whole block), then every codec of ``CODECS`` encodes and decodes
that snapshot ``--repeats`` times: ratio (raw bytes / stored payload bytes), compress and decompress
throughput (raw MiB per second, median), and the largest pointwise error, checked here against the
decoded arrays (not the codec's own report). Writes results.csv beside this file (or --out).
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

CASES = {
    # model, grid, forward steps before the snapshot (wave: about half its default run, so the
    # wavefront has crossed much of the domain; the others: states well away from their smooth start)
    "full": [("wave", (128, 128, 128), 260), ("heat", (128, 128, 128), 20),
             ("burgers", (1024, 1024), 300), ("grayscott", (512, 512), 20)],
    "quick": [("wave", (32, 32, 32), 60), ("heat", (32, 32, 32), 5), ("burgers", (128, 128), 40),
              ("grayscott", (64, 64), 5)],
}
CODECS = ["none", "lossless", "lossless:zstd", "lossless:zlib", "lossless:zfp",
          "lossy:1e-3", "lossy:1e-4", "lossy:1e-5", "lossy:1e-6", "lossy:1e-8", "lossy:1e-10"]
FIELDS = ["model", "grid", "steps", "field_max_abs", "raw_mib", "codec", "tolerance", "methods",
          "ratio", "compress_mib_s", "decompress_mib_s", "max_abs_error", "max_rel_error",
          "step_s", "blosc_threads", "machine"]


def state_after(name: str, grid, steps: int):
    """This model's snapshot after ``steps`` forward steps from its default controls, and s/step."""
    from hpcadj.models import model_class
    from hpcadj.imports import mpi

    comm = mpi().COMM_WORLD
    model = model_class(name)(comm, grid=grid, n_steps=steps)
    model.set_controls(model.default_controls())
    u = model.initial_state()
    t0 = time.perf_counter()
    for i in range(steps):
        u = model.step(i, u)
    step_s = (time.perf_counter() - t0) / steps
    snap = {k: np.array(v, copy=True) for k, v in model.snapshot(u).items()}
    return snap, step_s


def measure(snap: dict, spec: str, repeats: int) -> dict:
    from hpcadj.checkpoint.storage import codec as C

    from numcodecs import blosc

    codec = C.parse_codec(spec)
    threads = blosc.get_nthreads()  # after the codec set them (one per process unless $HPCADJ_CODEC_THREADS)
    raw = sum(a.nbytes for a in snap.values())
    enc_t, dec_t = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        enc = C.encode_snapshot(snap, codec)
        enc_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        back = C.decode_snapshot(enc)
        dec_t.append(time.perf_counter() - t0)
    err = max(float(np.max(np.abs(back[k] - snap[k]))) for k in snap)
    top = max(float(np.max(np.abs(a))) for a in snap.values())
    if not codec.lossy:
        assert all(back[k].tobytes() == np.ascontiguousarray(snap[k]).tobytes() for k in snap), spec
    assert err <= codec.tolerance, (spec, err)
    mib = raw / 2**20
    return {"codec": spec, "blosc_threads": threads, "tolerance": codec.tolerance, "raw_mib": round(mib, 3),
            "methods": "+".join(sorted({e.method for e in enc.values()})),
            "ratio": round(raw / C.encoded_nbytes(enc), 3),
            "compress_mib_s": round(mib / statistics.median(enc_t), 1),
            "decompress_mib_s": round(mib / statistics.median(dec_t), 1),
            "max_abs_error": f"{err:.3e}", "max_rel_error": f"{err / top:.3e}" if top else "0"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small grids (a smoke run)")
    ap.add_argument("--out", type=Path, default=HERE, help="directory for results.csv")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", default="", help="comma-separated subset of the models")
    args = ap.parse_args(argv)
    machine = f"{platform.node()} {os.cpu_count()} cores"
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, grid, steps in CASES["quick" if args.quick else "full"]:
        if args.models and name not in args.models.split(","):
            continue
        snap, step_s = state_after(name, grid, steps)
        top = max(float(np.max(np.abs(a))) for a in snap.values())
        for spec in CODECS:
            row = {"model": name, "grid": "x".join(map(str, grid)), "steps": steps,
                   "field_max_abs": f"{top:.4g}", "step_s": round(step_s, 4),
                   "machine": machine,
                   **measure(snap, spec, args.repeats)}
            rows.append(row)
            print(", ".join(f"{k}={row[k]}" for k in ("model", "codec", "ratio", "compress_mib_s",
                                                       "decompress_mib_s", "max_abs_error")),
                  flush=True)
        del snap
    with open(args.out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.out / 'results.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
