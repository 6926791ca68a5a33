"""Re-attaching a parallel-HDF5 checkpoint file to a restarted run (:class:`~.pfs.H5File`).

Attach (``attach=True``, a restart with the same run id and path): the file is reopened, its
format, run id and fields checked (another run's file is refused), and every linked snapshot
verified against the per-rank CRC-32 table stored with each dataset, on any rank count: old rank
block ``r`` is checked by new rank ``r % size`` and verdicts are agreed, so a snapshot is held only
if every old block checks out. Invalid links are removed, and so are revoked ones (a snapshot whose
free failed, listed in the root attribute ``revoked``). When the rank layout differs, each rank
records the CRC of its new block, and a slot written again gets the new rank tables. A file that
cannot be opened at all is replaced by an empty one (``attach_note`` says so).
"""

from __future__ import annotations

import math
import os

import numpy as np

from ...imports import h5py
from .base import LevelError
from .checksum import block_checksum

#: the file's format tag, written when the file is created and checked when it is attached
FORMAT = "hpcadj-checkpoints-1"


def attach_file(h5file) -> None:
    """Reopen the file of this run (an :class:`~.pfs.H5File`'s), verify every linked snapshot, hold
    the valid ones."""
    exists = h5file.comm.bcast(os.path.isfile(h5file.path) if h5file.rank == 0 else None, root=0)
    if not exists:
        h5file.create()
        h5file.attach_note = f"no file {h5file.path} to attach: started empty"
        return
    f, problem = _open(h5file)
    problem = next((p for p in h5file.comm.allgather(problem) if p), None)
    if problem is not None:
        if f is not None:
            f.close()
        if not problem.startswith("broken"):
            raise LevelError(problem)
        h5file.create(replace=True)  # the manifest names it: this run's own file, unreadable
        h5file.attach_dropped = [f"the whole file: {problem}"]
        h5file.attach_note = f"{h5file.path} could not be attached ({problem}): started empty"
        return
    h5file._file = f
    h5file._created = True
    h5file.reserve_margin()
    f.attrs["nranks"] = h5file.size
    slots = {int(name[5:]): f["slots"][name] for name in sorted(f["slots"])
             if name.startswith("slot_") and name[5:].isdigit()}
    h5file._next_slot = max(slots, default=-1) + 1
    revoked = {(int(step), int(k)) for step, k in np.asarray(f.attrs.get("revoked", np.zeros((0, 2)))).reshape(-1, 2)}
    linked, stale = _links(f, slots, revoked)
    bad = set(_verify(h5file, linked, slots))
    for other in h5file.comm.allgather(sorted(bad)):
        bad |= set(other)
    _hold(h5file, f, slots, linked, stale, bad)


def _open(h5file):
    """``(file, problem)``: the file opened, and this rank's problem with it: None, ``"broken ..."``
    (this run's own file, unreadable or not hpcadj's format) or why it is not this run's."""
    f = None
    try:
        f = h5py().File(h5file.path, "r+", driver="mpio", comm=h5file.comm)
        fmt = f.attrs.get("format")
        run_id = f.attrs.get("run_id")
        fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
        run_id = run_id.decode() if isinstance(run_id, bytes) else run_id
        fields = sorted(x.decode() if isinstance(x, bytes) else str(x)
                        for x in f.attrs.get("fields", []))
        if fmt != FORMAT or "slots" not in f or "snapshots" not in f:
            return f, "broken"
        if run_id != h5file.run_id:
            return f, f"the file belongs to run {run_id}, not {h5file.run_id}"
        if fields != h5file.fields:
            return f, f"the file holds fields {fields}, this run has {h5file.fields}"
    except Exception as exc:  # noqa: BLE001 - an unreadable file after a crash: start over
        return f, f"broken ({type(exc).__name__}: {exc})"
    return f, None


def _links(f, slots: dict, revoked: set) -> tuple[dict[int, int], list[str]]:
    """``({step: slot}, stale)``: the step links that name a slot recording that step, one link a
    slot, none revoked (a free that failed: ``(step, slot)`` pairs), and the names of the others."""
    ids = {g.id: k for k, g in slots.items()}
    linked: dict[int, int] = {}
    stale: list[str] = []
    for link in sorted(f["snapshots"]):
        g = f["snapshots"][link]
        k = ids.get(g.id)
        try:
            step = int(link[5:])
        except ValueError:
            step = None
        if k is None or step is None or not link.startswith("step_") or \
                int(g.attrs.get("step", -1)) != step or k in linked.values() or (step, k) in revoked:
            stale.append(link)
        else:
            linked[step] = k
    return linked, stale


def _hold(h5file, f, slots: dict, linked: dict, stale: list, bad: set) -> None:
    """Remove the stale links and those of snapshots failing verification (``bad``), free their
    slots, hold the rest (slot, this rank's CRCs, model time) and say what was dropped."""
    for link in stale:
        del f["snapshots"][link]
    if "revoked" in f.attrs:  # their links are gone now and their slots freed below
        del f.attrs["revoked"]
    for k, g in slots.items():
        h5file.groups[k] = g
        if any(not np.array_equal(np.asarray(g[field].attrs.get("rank_starts", [])), h5file._ranks[field][0])
               or not np.array_equal(np.asarray(g[field].attrs.get("rank_shapes", [])), h5file._ranks[field][1])
               for field in h5file.fields):
            h5file._foreign.add(k)
    held = {step: k for step, k in linked.items() if step not in bad}
    for step, _ in sorted(linked.items()):
        if step in bad:
            del f["snapshots"][f"step_{step}"]
    for k, g in slots.items():
        if k not in held.values():
            g.attrs["step"] = -1
            h5file._free_slots.append(k)
    for step, k in sorted(held.items()):
        g = slots[k]
        h5file.slot_of[step] = k
        h5file.crc[step] = _rank_crcs(h5file, g, k)
        t = float(g.attrs.get("time", math.nan))
        h5file.attached[step] = None if math.isnan(t) else t
    f.flush()
    h5file.attach_dropped = [f"step {step}: failed verification" for step in sorted(bad)]
    h5file.attach_dropped += [f"link {link}: points at no valid slot" for link in stale]
    h5file.attach_note = (f"attached {len(held)} snapshot(s) of run {h5file.run_id} from {h5file.path}"
                          + (f", dropped {len(bad)} failing verification" if bad else ""))


def _verify(h5file, linked: dict, slots: dict) -> list[int]:
    """Steps whose share of old rank blocks checked here fails (structure or CRC)."""
    failed = []
    for step, k in sorted(linked.items()):
        g = slots[k]
        try:
            for field in h5file.fields:
                d = g[field]
                lay = h5file.layout[field]
                if tuple(d.shape) != tuple(lay.global_shape) or d.dtype != np.dtype(lay.dtype):
                    raise ValueError("shape or dtype")
                crc = np.asarray(d.attrs["crc32"]).reshape(-1)
                starts = np.asarray(d.attrs["rank_starts"]).reshape(len(crc), -1)
                shapes = np.asarray(d.attrs["rank_shapes"]).reshape(len(crc), -1)
                covered = 0
                for r in range(len(crc)):
                    covered += int(np.prod(shapes[r]))
                    if r % h5file.size != h5file.rank:
                        continue
                    sel = tuple(slice(int(a), int(a) + int(n)) for a, n in zip(starts[r], shapes[r]))
                    block = np.empty(tuple(int(n) for n in shapes[r]), dtype=d.dtype)
                    if block.size:
                        d.read_direct(block, source_sel=sel)
                    if block_checksum(block) != int(crc[r]):
                        raise ValueError(f"old rank {r}'s block fails its CRC")
                if covered != int(np.prod(lay.global_shape)):
                    raise ValueError("rank blocks do not cover the array")
        except Exception:  # noqa: BLE001 - any defect makes the snapshot invalid
            failed.append(step)
    return failed


def _rank_crcs(h5file, g, k: int) -> list[int]:
    """This rank's block CRCs of a verified attached slot (read anew if the layout changed)."""
    out = []
    for field in h5file.fields:
        d = g[field]
        starts, shapes = h5file._ranks[field]
        crc = np.asarray(d.attrs["crc32"]).reshape(-1)
        if k not in h5file._foreign and len(crc) == h5file.size:
            out.append(int(crc[h5file.rank]))
            continue
        lay = h5file.layout[field]
        block = np.empty(tuple(lay.shape), dtype=np.dtype(lay.dtype))
        if block.size:
            d.read_direct(block, source_sel=lay.slices)
        out.append(block_checksum(block))
    return out


def remove_dead_file(comm, path: str | None, run_id: str, claimed: bool = True) -> str | None:
    """Remove the checkpoint file a killed process of run ``run_id`` left at ``path`` (collective).

    A file that opens is removed when it is run ``run_id``'s; one that does not open (killed
    mid-write) when ``claimed``: the caller recorded ``path`` as the run's before any file existed
    there. Returns what was removed, for a report, or None."""
    note = None
    if path and comm.rank == 0 and os.path.lexists(path):
        try:
            with h5py().File(path, "r") as f:
                owner = f.attrs.get("run_id")
                owner = owner.decode() if isinstance(owner, bytes) else owner
                fmt = f.attrs.get("format")
                ours = owner == run_id and (fmt.decode() if isinstance(fmt, bytes) else fmt) == FORMAT
        except Exception:  # noqa: BLE001 - not an HDF5 file any more: the killed write's, if claimed
            ours = claimed
        if ours:
            try:
                size = os.path.getsize(path)
                os.remove(path)
                note = f"removed the checkpoint file {path} ({size / 2**20:.1f} MiB) a killed run left"
            except OSError:
                pass
    return comm.bcast(note, root=0)
