"""Compressed levels in a run: codecs per level, sizes from a probe, capacities, costs, report.

The probe encodes u_0, u_4 and :data:`PROBE_POINTS` evenly spaced states up to u_K (K =
``probe_steps``, default :data:`PROBE_STEPS`, at most n) with each level's codec (states that
spread detail over time, such as wave's, compress worse later: probe further in for them).

File levels keep fixed slots (their layouts and collective writes need them): a slot holds the
size the probe's curve gives u_n (:func:`size_curve`) times a margin ($HPCADJ_COMPRESS_MARGIN, default
:data:`DEFAULT_MARGIN`: 1.15 lossless, 1.5 lossy), never more than the raw snapshot's frame, and a
byte budget buys ``budget // slot`` slots. The RAM level is a byte pool
(:class:`~hpcadj.checkpoint.storage.compressed.PooledLevel`): each snapshot takes its own size, and
the planner's slot count is the largest whose plan, simulated with every snapshot at its probed
size (:func:`size_curve`) times the margin, never holds more than the pool
(:func:`pooled_capacity`). A run whose states compress worse than probed overflows the pool on
every rank alike and re-plans. Costs: a compressed level's measured write/read seconds are scaled
by the stored fraction and the codec's measured encode/decode seconds added.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from ..snapshot import layout_bytes
from ..levelkinds import LEVEL_NAMES
from .storage.codec import Codec, parse_codec
from .storage.compressed import CompressedLevel, PooledLevel, framed_nbytes
from ..imports import mpi, petsc
from .memory import process_rss_bytes
from .schedules.actions import Free, Move, Store
from .schedules.storeall import store_all_slots

#: slot bytes = probed compressed bytes x this, per codec kind (later states may compress worse than
#: the probed ones; a lossy codec's size follows the field's detail far more than a lossless one's)
DEFAULT_MARGIN = {"lossless": 1.15, "lossy": 1.5}
#: forward steps the probe advances by default to find later, less compressible states
PROBE_STEPS = 4
#: the probe encodes u_0, u_4 and this many evenly spaced states up to u_K (the size curve)
PROBE_POINTS = 8
#: the frame's own bytes beyond a raw snapshot's (headers): the slot never needs more
FRAME_SLACK = 4096


@dataclass(frozen=True)
class Probe:
    """What the probe measured of one level's codec (every field the same on every rank).

    ``sizes`` are ``(step, bytes)`` of the largest rank's framed encoding at each probed step;
    ``slot_bytes`` a fixed slot: u_n's size on their curve (:func:`size_curve`) times ``margin``,
    never more than ``cap_bytes`` (the raw frame); ``encode_s``/``decode_s`` a snapshot's codec
    seconds on the slowest rank.
    """

    codec: Codec
    slot_bytes: int
    probed_bytes: int
    raw_bytes: int
    sizes: tuple
    margin: float
    cap_bytes: int
    encode_s: float
    decode_s: float


def level_codecs(spec: str | None, per_level: dict) -> dict:
    """Level name -> Codec (levels with ``none`` left out); ValueError with one line on a bad spec."""
    out = {}
    for name in LEVEL_NAMES:
        text = per_level.get(name) or spec
        if text is None:
            continue
        try:
            codec = parse_codec(text)
        except ImportError as exc:
            raise ValueError(f"--compress{'-' + name if per_level.get(name) else ''} {text}: "
                             f"codec library missing ({exc})") from None
        except ValueError as exc:
            raise ValueError(f"--compress{'-' + name if per_level.get(name) else ''}: {exc}") from None
        if codec.spec != "none":
            out[name] = codec
    return out


def margin(codec) -> float:
    """The slot margin: $HPCADJ_COMPRESS_MARGIN, else :data:`DEFAULT_MARGIN` of the codec's kind."""
    text = os.environ.get("HPCADJ_COMPRESS_MARGIN", str(DEFAULT_MARGIN["lossy" if codec.lossy else "lossless"]))
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value >= 1.0:
        raise ValueError(f"HPCADJ_COMPRESS_MARGIN must be a number >= 1, got {text!r}")
    return value


#: resident bytes the codec libraries' code and data take once imported (numcodecs' Blosc and zfpy
#: measured 2.6 MiB on this VM), added to the codec warm-up's growth (see :func:`codec_footprint`)
CODEC_LIBRARY_BYTES = 4 * 2 ** 20


def codec_footprint(codecs: dict, layout) -> int:
    """Resident bytes the codecs keep after first use: :data:`CODEC_LIBRARY_BYTES` plus the growth
    of this process's resident set over two encode/decode rounds of a synthetic snapshot of
    ``layout``'s local blocks (the allocator pools and buffers a run's codec keeps). Its transient
    buffers during a write or read are counted apart (:data:`~hpcadj.checkpoint.provision.CODEC_STATES`)."""
    if not codecs:
        return 0
    snapshot = {}
    for name, f in layout.items():
        n = int(np.prod(f.shape, dtype=np.int64))
        snapshot[name] = np.sin(np.linspace(0.0, 40.0, n)).astype(f.dtype).reshape(f.shape)
    before = process_rss_bytes() or 0
    for _ in range(2):
        for codec in codecs.values():
            _, encoded = framed_nbytes(snapshot, codec)
            for e in encoded.values():
                Codec().decode(e)
            del encoded
    after = process_rss_bytes() or 0
    return CODEC_LIBRARY_BYTES + max(0, after - before)


def codec_memory_bytes(snapshot_bytes: int, largest_field: int, file_levels: bool) -> int:
    """The codecs' buffers per rank at their peak, for the memory plan.

    The RAM pool keeps a scratch buffer of the largest field (``scratch_bytes``, written by every
    lossless encode) and encodes a field at a time, copying it into its arena (at most
    :func:`~hpcadj.checkpoint.storage.codec.transient_bytes` of the largest field beside, for the
    codecs that cannot use the scratch); it decodes a read into a new snapshot before the driver
    takes it (one snapshot). A compressed file level (``file_levels``) holds every encoded field
    of a snapshot (at most the snapshot's bytes) while it encodes the last one and frames them."""
    from .storage.codec import scratch_bytes, transient_bytes

    write = transient_bytes(largest_field) + (int(snapshot_bytes) if file_levels else 0)
    return scratch_bytes(largest_field) + max(write, int(snapshot_bytes))


def slot_bytes(encoded_bytes: float, codec, cap: int) -> int:
    """One fixed slot for snapshots encoded to about ``encoded_bytes``: times the codec's
    :func:`margin`, plus a frame header's bytes, at most ``cap`` (the raw frame)."""
    return min(int(encoded_bytes * margin(codec)) + 64, int(cap))


def probe_points(n_steps: int, probe_steps: int | None) -> list[int]:
    """The steps the probe encodes: u_0, u_4 and :data:`PROBE_POINTS` evenly spaced up to u_K."""
    last = min(n_steps, max(PROBE_STEPS, probe_steps or PROBE_STEPS))
    points = {0, min(n_steps, PROBE_STEPS), last}
    points |= {round(last * j / PROBE_POINTS) for j in range(1, PROBE_POINTS)}
    return sorted(points)


def probe(model, controls, codecs: dict, comm, probe_steps: int | None = None) -> dict[str, Probe]:
    """Level name -> :class:`Probe` of its codec on the model's first states (collective)."""
    MPI = mpi()
    if not codecs:
        return {}
    model.set_controls(controls)
    points = probe_points(model.n_steps, probe_steps)
    sizes = {name: [] for name in codecs}
    times = {name: [0.0, 0.0] for name in codecs}
    raw_frame = raw = 0
    v = model.initial_state()
    cleanup = petsc().garbage_cleanup
    for i in range(points[-1] + 1):
        if i > 0:
            v = model.step(i - 1, v)
            cleanup(comm)  # the states left behind now, not parked for the run's lifetime
        if i not in points:
            continue
        state = model.snapshot(v)
        raw_frame = max(raw_frame, framed_nbytes(state, Codec())[0])
        raw = max(raw, sum(a.nbytes for a in state.values()))
        for name, codec in codecs.items():
            t0 = time.perf_counter()
            n, encoded = framed_nbytes(state, codec)
            t1 = time.perf_counter()
            base = Codec()
            for e in encoded.values():
                base.decode(e)
            times[name][0] += t1 - t0
            times[name][1] += time.perf_counter() - t1
            sizes[name].append(n)
        del state
    cap = comm.allreduce(raw_frame, op=MPI.MAX) + FRAME_SLACK
    out = {}
    for name, codec in codecs.items():
        curve = [max(column) for column in zip(*comm.allgather(sizes[name]))]
        probed = max(curve)
        final = size_curve(list(zip(points, curve)), cap)(model.n_steps)
        out[name] = Probe(codec=codec, slot_bytes=slot_bytes(final, codec, cap), probed_bytes=probed,
                          raw_bytes=comm.allreduce(raw, op=MPI.MAX), sizes=tuple(zip(points, curve)),
                          margin=margin(codec), cap_bytes=cap,
                          encode_s=comm.allreduce(times[name][0] / len(points), op=MPI.MAX),
                          decode_s=comm.allreduce(times[name][1] / len(points), op=MPI.MAX))
    del v
    petsc().garbage_cleanup(comm)
    return out


def size_curve(sizes, cap: float = float("inf")):
    """bytes(step) from the probed ``(step, bytes)``: their running maximum (a state is never
    planned smaller than an earlier probed one), linear in between, and past the last probed step
    extrapolated along the last segment's slope, up to ``cap`` (the raw frame): states whose
    detail grows keep growing, unless the probe went as far as the run (``--compress-probe n``)."""
    steps = [s for s, _ in sizes]
    envelope = np.maximum.accumulate([b for _, b in sizes])
    slope = (envelope[-1] - envelope[-2]) / (steps[-1] - steps[-2]) if len(steps) > 1 else 0.0

    def at(step: int) -> float:
        if step > steps[-1]:
            return float(min(cap, envelope[-1] + slope * (step - steps[-1])))
        return float(min(cap, np.interp(step, steps, envelope)))

    return at


def peak_bytes(actions, level: int, nbytes) -> float:
    """The most bytes level ``level`` holds at once in a plan, a snapshot of u_n taking nbytes(n)."""
    held, total, peak = {}, 0.0, 0.0
    for a in actions:
        if isinstance(a, Store) and a.level == level or isinstance(a, Move) and a.dst == level:
            held[a.n] = b = nbytes(a.n)
            total += b
            peak = max(peak, total)
        elif isinstance(a, Free) and a.level == level or isinstance(a, Move) and a.src == level:
            total -= held.pop(a.n, 0.0)
    return peak


#: schedules whose plan is known in full before the run (the pool's capacity is searched on them)
SEARCHED = ("auto", "revolve", "multilevel", "periodic")


def pooled_capacity(plans, index: int, pool_bytes: int, sizes, margin: float, planner, name: str,
                    n_steps: int, cap_bytes: float = float("inf")) -> int:
    """The most slots level ``index`` (a byte pool) can plan with: the largest count whose plan's
    peak held bytes, each snapshot at its probed size (:func:`size_curve` of ``sizes``) times
    ``margin``, fit ``pool_bytes``. Starts from the level's count (the worst size's, always safe)
    and searches up by bisection, each candidate planned by ``planner(plans)`` and simulated byte
    by byte."""
    from dataclasses import replace


    low = plans[index].slots
    if name not in SEARCHED or not sizes:
        return low
    at = size_curve(sizes, cap_bytes)
    smallest = max(1.0, min(b for _, b in sizes) * margin)
    high = max(low, min(store_all_slots(n_steps), int(pool_bytes // smallest)))

    def fits(c):
        try:
            actions = planner([replace(p, slots=c) if i == index else p for i, p in enumerate(plans)]).actions()
        except ValueError:
            return False
        return peak_bytes(actions, index, lambda step: at(step) * margin) <= pool_bytes

    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def adjusted_profile(profile, plans, probes: dict):
    """The profile with each compressed level's write/read scaled by its stored fraction and its
    codec seconds added (a new profile; ``plans`` and ``profile.levels`` in the same order)."""
    from dataclasses import replace

    levels = []
    for plan, lv in zip(plans, profile.levels):
        found = probes.get(plan.name)
        if found is not None:
            frac = min(1.0, found.slot_bytes / max(1, found.raw_bytes))
            lv = replace(lv, write_s=lv.write_s * frac + found.encode_s, read_s=lv.read_s * frac + found.decode_s,
                         fill_s=lv.fill_s * frac)
        levels.append(lv)
    return replace(profile, levels=levels)


def summary(comm, levels) -> dict:
    """``run --json``'s ``compression``: per compressed level its codec, ratio (raw/stored bytes
    over all ranks), slot bytes, the largest measured pointwise error and codec seconds."""
    MPI = mpi()
    out = {}
    for level in levels:
        if not isinstance(level, (CompressedLevel, PooledLevel)):
            continue
        s = level.summary()
        raw, stored = comm.allreduce(s["raw_bytes"]), comm.allreduce(s["stored_bytes"])
        out[level.name] = {"codec": s["codec"], "lossy": s["lossy"], "tolerance": s["tolerance"],
                           "ratio": raw / stored if stored else None, "slot_bytes": s["slot_bytes"],
                           "slot_ratio": comm.allreduce(layout_bytes(level.layout), op=MPI.MAX) / s["slot_bytes"],
                           "max_error": comm.allreduce(s["max_error"], op=MPI.MAX),
                           "overflows": s["overflows"],
                           "largest_bytes": comm.allreduce(s["largest_bytes"], op=MPI.MAX),
                           "encode_s": comm.allreduce(s["encode_s"], op=MPI.MAX),
                           "decode_s": comm.allreduce(s["decode_s"], op=MPI.MAX)}
        if "pool_bytes" in s:  # a RAM byte pool: slot_bytes is its bytes per planned slot
            out[level.name].update(pool_bytes=s["pool_bytes"], slots=level.capacity,
                                   peak_pool_bytes=comm.allreduce(s["peak_pool_bytes"], op=MPI.MAX))
    return out
