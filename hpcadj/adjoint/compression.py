"""Compressed levels in a run: codecs per level, slot sizes from a probe, costs, levels, report.

The probe encodes u_0, u_4 and u_K (K = ``probe_steps``, default :data:`PROBE_STEPS`, at most n)
with each level's codec (states that spread detail over time, such as wave's, compress worse later:
probe further in for them); a slot holds the
largest rank's framed encoding times a margin ($HPCADJ_COMPRESS_MARGIN, default
:data:`DEFAULT_MARGIN`: 1.15 lossless, 1.5 lossy), never more than the raw snapshot's frame. A byte budget then buys
``budget // slot`` slots. Costs: a compressed level's measured write/read seconds are scaled by the
stored fraction and the codec's measured encode/decode seconds added.
"""

from __future__ import annotations

import os
import time

from ..checkpoint.storage.codec import Codec, parse_codec
from ..checkpoint.storage.compressed import CompressedLevel, framed_nbytes

#: slot bytes = probed compressed bytes x this, per codec kind (later states may compress worse than
#: the probed ones; a lossy codec's size follows the field's detail far more than a lossless one's)
DEFAULT_MARGIN = {"lossless": 1.15, "lossy": 1.5}
#: forward steps the probe advances by default to find later, less compressible states
PROBE_STEPS = 4
#: the frame's own bytes beyond a raw snapshot's (headers): the slot never needs more
FRAME_SLACK = 4096


def level_codecs(spec: str | None, per_level: dict) -> dict:
    """Level name -> Codec (levels with ``none`` left out); ValueError with one line on a bad spec."""
    out = {}
    for name in ("ram", "disk", "pfs"):
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


def probe(model, controls, codecs: dict, comm, probe_steps: int | None = None) -> dict:
    """Per compressed level: slot bytes (same on every rank), probed ratio, encode/decode seconds."""
    from ..stack import mpi, petsc

    MPI = mpi()
    if not codecs:
        return {}
    model.set_controls(controls)
    u = model.initial_state()
    states = [model.snapshot(u)]
    last = min(model.n_steps, max(PROBE_STEPS, probe_steps or PROBE_STEPS))
    keep = {min(model.n_steps, PROBE_STEPS), last}
    v = u
    for i in range(last):
        v = model.step(i, v)
        if i + 1 in keep:
            states.append({k: a.copy() for k, a in model.snapshot(v).items()})
    raw_frame = max(framed_nbytes(s, Codec())[0] for s in states)
    raw = sum(a.nbytes for a in states[0].values())
    out = {}
    for name, codec in codecs.items():
        factor = margin(codec)
        sizes, enc_s, dec_s = [], 0.0, 0.0
        for s in states:
            t0 = time.perf_counter()
            n, encoded = framed_nbytes(s, codec)
            t1 = time.perf_counter()
            base = Codec()
            for e in encoded.values():
                base.decode(e)
            dec_s += time.perf_counter() - t1
            enc_s += t1 - t0
            sizes.append(n)
        probed = comm.allreduce(max(sizes), op=MPI.MAX)
        cap = comm.allreduce(raw_frame, op=MPI.MAX) + FRAME_SLACK
        slot = min(int(probed * factor) + 64, cap)
        out[name] = {"codec": codec, "slot_bytes": slot, "probed_bytes": probed,
                     "raw_bytes": comm.allreduce(raw, op=MPI.MAX),
                     "encode_s": comm.allreduce(enc_s / len(states), op=MPI.MAX),
                     "decode_s": comm.allreduce(dec_s / len(states), op=MPI.MAX)}
    del states, u, v
    petsc().garbage_cleanup(comm)
    return out


def resized_plans(plans, budgets: dict, probed: dict, comm, ram_fixed: bool):
    """The plans with each compressed level's byte budget divided by its slot bytes (a budget in
    slots stays slots; ``ram_fixed``: the memory budget sized RAM, kept)."""
    from ..checkpoint.budget import parse_budget
    from .manager import LevelPlan

    out = []
    for p in plans:
        info = probed.get(p.name)
        text = budgets.get(p.name)
        if info is None or text is None or (p.kind == "ram" and ram_fixed):
            out.append(p)
            continue
        per = info["slot_bytes"] * (comm.size if p.kind == "pfs" else 1)
        out.append(LevelPlan(p.name, p.kind, max(p.slots, parse_budget(text).to_slots(per))))
    return out


def adjust_profile(profile, plans, probed: dict):
    """Codec seconds added to each compressed level's write/read, its transfer scaled by the stored
    fraction (in place; returns the profile)."""
    for plan, lv in zip(plans, profile.levels):
        info = probed.get(plan.name)
        if info is None:
            continue
        frac = min(1.0, info["slot_bytes"] / max(1, info["raw_bytes"]))
        lv.write_s = lv.write_s * frac + info["encode_s"]
        lv.read_s = lv.read_s * frac + info["decode_s"]
    return profile


def summary(comm, levels) -> dict:
    """``run --json``'s ``compression``: per compressed level its codec, ratio (raw/stored bytes
    over all ranks), slot bytes, the largest measured pointwise error and codec seconds."""
    from ..stack import mpi

    MPI = mpi()
    out = {}
    for level in levels:
        if not isinstance(level, CompressedLevel):
            continue
        s = level.summary()
        raw, stored = comm.allreduce(s["raw_bytes"]), comm.allreduce(s["stored_bytes"])
        out[level.name] = {"codec": s["codec"], "lossy": s["lossy"], "tolerance": s["tolerance"],
                           "ratio": raw / stored if stored else None, "slot_bytes": s["slot_bytes"],
                           "slot_ratio": comm.allreduce(sum(f.local_nbytes for f in level.layout.values()),
                                                        op=MPI.MAX) / s["slot_bytes"],
                           "max_error": comm.allreduce(s["max_error"], op=MPI.MAX),
                           "overflows": s["overflows"],
                           "largest_bytes": comm.allreduce(s["largest_bytes"], op=MPI.MAX),
                           "encode_s": comm.allreduce(s["encode_s"], op=MPI.MAX),
                           "decode_s": comm.allreduce(s["decode_s"], op=MPI.MAX)}
    return out
