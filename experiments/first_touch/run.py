"""First touch of fresh memory: seconds per GiB to fault in RAM-slot-sized blocks, and what lowers it.

Variants, each allocating ``--blocks`` blocks of ``--block-mib`` MiB and holding them (as a RAM level
holds its slots), timed block by block, interleaved round by round:

- ``populate``: an anonymous mapping with MAP_POPULATE (``snapshot.mapped_empty`` today);
- ``touch``: an anonymous mapping written once (``fill``), 4 KiB pages faulted one by one;
- ``huge``: madvise(MADV_HUGEPAGE) on the mapping, then MADV_POPULATE_WRITE (2 MiB pages where the
  kernel has them: transparent huge pages in ``madvise`` mode);
- ``reuse``: the blocks of an arena faulted in before, written again (what a reused arena costs);
- ``background``: a compute loop (a 3-point stencil over a 16 MiB array) timed alone and while a
  thread faults the blocks in (MADV_POPULATE_WRITE through ctypes, which releases the GIL): the
  compute's slowdown against the faulting it hid.

    .venv/bin/python experiments/first_touch/run.py [--blocks 32] [--block-mib 16] [--rounds 3]

Prints one CSV row per variant and round (seconds per GiB) and a summary; ``results.csv``.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import mmap
import os
import statistics
import threading
import time
from pathlib import Path

import numpy as np

MADV_POPULATE_WRITE = 23
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def _address(mapping) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(mapping))


def _madvise(mapping, advice: int) -> None:
    if LIBC.madvise(_address(mapping), len(mapping), advice) != 0:
        raise OSError(ctypes.get_errno(), f"madvise {advice}")


def block(nbytes: int, variant: str):
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    if variant == "populate":
        return mmap.mmap(-1, nbytes, flags=flags | mmap.MAP_POPULATE)
    mapping = mmap.mmap(-1, nbytes, flags=flags)
    if variant == "touch":
        np.frombuffer(mapping, dtype=np.float64).fill(0.0)
    elif variant == "huge":
        mapping.madvise(mmap.MADV_HUGEPAGE)
        _madvise(mapping, MADV_POPULATE_WRITE)
    return mapping


def timed_blocks(variant: str, blocks: int, nbytes: int, arena=None) -> float:
    """Seconds per GiB to get ``blocks`` blocks ready to be written, all held until the end."""
    held, total = [], 0.0
    for k in range(blocks):
        t0 = time.perf_counter()
        if arena is not None:
            np.frombuffer(arena[k], dtype=np.float64).fill(1.0)
        else:
            held.append(block(nbytes, variant))
        total += time.perf_counter() - t0
    for m in held:
        m.close()
    return total / (blocks * nbytes / 2 ** 30)


def compute(a, b, sweeps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(sweeps):
        np.add(a[:-2], a[2:], out=b[1:-1])
        np.multiply(b, 0.5, out=a)
    return time.perf_counter() - t0


def background(blocks: int, nbytes: int, sweeps: int) -> tuple[float, float, float]:
    """(compute seconds alone, with a thread faulting ``blocks`` in, the thread's seconds)."""
    a = np.random.default_rng(0).random(2 * 2 ** 20)
    b = np.empty_like(a)
    alone = compute(a, b, sweeps)
    mappings = [mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) for _ in range(blocks)]
    spent = [0.0]

    def fault():
        t0 = time.perf_counter()
        for m in mappings:
            _madvise(m, MADV_POPULATE_WRITE)
        spent[0] = time.perf_counter() - t0

    thread = threading.Thread(target=fault)
    thread.start()
    together = compute(a, b, sweeps)
    thread.join()
    for m in mappings:
        m.close()
    return alone, together, spent[0]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, default=32)
    p.add_argument("--block-mib", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sweeps", type=int, default=60)
    args = p.parse_args()
    nbytes = args.block_mib * 2 ** 20
    arena = [block(nbytes, "populate") for _ in range(args.blocks)]
    rows, variants = [], ["populate", "touch", "huge", "reuse"]
    for r in range(args.rounds):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            s = timed_blocks(v, args.blocks, nbytes, arena if v == "reuse" else None)
            rows.append({"round": r, "variant": v, "s_per_gib": s})
            print(f"round {r} {v:<9} {s:.3f} s/GiB", flush=True)
        alone, together, spent = background(args.blocks, nbytes, args.sweeps)
        rows.append({"round": r, "variant": "background", "s_per_gib": spent / (args.blocks * nbytes / 2 ** 30),
                     "compute_alone_s": alone, "compute_with_thread_s": together})
        print(f"round {r} background: compute {alone:.3f} s alone, {together:.3f} s beside a thread that "
              f"faulted {args.blocks * args.block_mib} MiB in {spent:.3f} s", flush=True)
    for m in arena:
        m.close()
    out = Path(__file__).with_name("results.csv")
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, ["round", "variant", "s_per_gib", "compute_alone_s", "compute_with_thread_s"])
        w.writeheader()
        w.writerows(rows)
    for v in variants + ["background"]:
        vals = [row["s_per_gib"] for row in rows if row["variant"] == v]
        print(f"{v:<10} min {min(vals):.3f} median {statistics.median(vals):.3f} s/GiB")
    print("load average", os.getloadavg())


if __name__ == "__main__":
    main()
