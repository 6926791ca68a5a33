"""Write distributed fields to one HDF5 file in natural ordering, in parallel (h5py, MPI-IO driver).

Each field becomes a global dataset; every rank writes its own block collectively. The file is
written under a temporary name and renamed when complete, so a failed run never leaves a file that
looks like a result.

Every dataset carries checksums of its bytes as stored: attribute ``crc32`` holds the zlib CRC-32
of each consecutive ``crc32_chunk``-byte piece of the dataset's contiguous storage (the last piece
may be shorter). They do not depend on the rank layout, so a file written on 4 ranks is verified
on 3 (:func:`verify_fields`); each rank checks every size-th piece, reading raw bytes (no HDF5
collective). ``h5dump -a /name/crc32`` shows them.
"""

from __future__ import annotations

import math
import os
import zlib

import numpy as np

from .snapshot import Snapshot, SnapshotLayout
from .imports import h5py
from .checkpoint.storage.space import METADATA_MARGIN, preallocate, reserve


def _write_block(dset, slices, block) -> None:
    """Write this rank's block inside a collective context; an empty block (a scalar owned by another
    rank) still joins the collective call, which h5py's ``dset[...] = `` skips and so would deadlock."""
    if block.size:
        dset[slices] = block
        return
    h5s = h5py().h5s
    fspace = dset.id.get_space()
    fspace.select_none()
    mspace = h5s.create_simple((1,))
    mspace.select_none()
    dset.id.write(mspace, fspace, np.zeros(1, dtype=dset.dtype), dxpl=dset._dxpl)


CHUNK_BYTES = 1 << 22


class CorruptFile(ValueError):
    """A field file is missing, unreadable, or its bytes fail their checksums."""


class WriteError(OSError):
    """A field file could not be written (no space, an I/O error): the same on every rank, nothing
    left behind."""


def _agree(comm, problem: str | None, path: str, cleanup=None) -> None:
    """Raise the same :class:`WriteError` on every rank if any rank has a problem (after
    ``cleanup``, on every rank)."""
    failed = [p for p in comm.allgather(problem) if p]
    if failed:
        if cleanup is not None:
            cleanup()
        raise WriteError(f"cannot write {path}: {failed[0]}")


def write_fields(path: str, comm, layouts: SnapshotLayout, arrays: Snapshot, attrs: dict | None = None,
                 prefix: str = "") -> None:
    """Collectively write ``arrays`` (this rank's blocks) as checksummed datasets ``prefix + name``.

    The file's room is allocated before HDF5 writes anything, and every step's outcome is agreed,
    so a full file system (or any I/O error) raises the same :class:`WriteError` on every rank,
    with the partial file removed, instead of leaving one rank in a collective call.
    """
    tmp = f"{path}.partial"
    names = sorted(arrays)
    need = METADATA_MARGIN + sum(int(np.prod(layouts[n].global_shape)) * np.dtype(layouts[n].dtype).itemsize
                                 + 4096 for n in names)
    rank0 = comm.rank == 0

    def remove_tmp():
        if rank0:
            try:
                os.remove(tmp)
            except OSError:
                pass

    _agree(comm, preallocate(tmp, need) if rank0 else None, path, remove_tmp)
    f, problem = None, None
    try:
        f = h5py().File(tmp, "w", driver="mpio", comm=comm)
    except Exception as exc:  # noqa: BLE001 - agreed next
        problem = f"{type(exc).__name__}: {exc}"
    _agree(comm, problem, path, remove_tmp)  # a rank that did open it cannot close it alone
    extents = []

    def close_and_remove():
        try:
            f.close()
        except Exception:  # noqa: BLE001 - the agreed error says what failed
            pass
        remove_tmp()

    if rank0:
        problem = reserve(tmp, [(0, need)])
    _agree(comm, problem, path, close_and_remove)
    try:
        for key, value in (attrs or {}).items():
            f.attrs[key] = value
        h5 = h5py()
        dcpl = h5.h5p.create(h5.h5p.DATASET_CREATE)
        dcpl.set_fill_time(h5.h5d.FILL_TIME_NEVER)  # the blocks below overwrite all of it
        dcpl.set_alloc_time(h5.h5d.ALLOC_TIME_EARLY)
        dsets = [(name, f.create_dataset(prefix + name, shape=layouts[name].global_shape,
                                         dtype=layouts[name].dtype, dcpl=dcpl)) for name in names]
    except Exception as exc:  # noqa: BLE001 - agreed next
        problem, dsets = f"{type(exc).__name__}: {exc}", []
    _agree(comm, problem, path, close_and_remove)
    for name, dset in dsets:
        try:
            with dset.collective:
                _write_block(dset, layouts[name].slices, arrays[name])
        except Exception as exc:  # noqa: BLE001 - agreed below; the collective calls still match
            problem = problem or f"{type(exc).__name__}: {exc}"
        extents.append((prefix + name, dset.id.get_offset(), int(dset.id.get_storage_size())))
    _agree(comm, problem, path, close_and_remove)
    try:
        f.close()
    except Exception as exc:  # noqa: BLE001 - agreed next
        problem = f"{type(exc).__name__}: {exc}"
    _agree(comm, problem, path, remove_tmp)
    crcs, problem = _chunk_crcs(tmp, extents, comm)
    error = problem
    if comm.rank == 0 and error is None:
        try:
            reason = reserve(tmp, [], at_end=METADATA_MARGIN)  # the checksum attributes' room
            if reason is not None:
                raise OSError(reason)
            with h5py().File(tmp, "a") as f:
                for name, values in crcs.items():
                    f[name].attrs["crc32"] = np.array(values, dtype=np.uint32)
                    f[name].attrs["crc32_chunk"] = CHUNK_BYTES
            os.replace(tmp, path)
        except Exception as exc:  # noqa: BLE001 - rank 0 alone: broadcast below
            error = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    error = comm.bcast(error, root=0)
    if error is not None:
        remove_tmp()
        raise WriteError(error if error.startswith("cannot write") else f"cannot write {path}: {error}")


def verify_fields(path: str, comm) -> None:
    """Check every dataset of ``path`` against its stored checksums (collective, any rank count).

    Raises :class:`CorruptFile` on every rank, naming what failed.
    """
    expected, error = None, None
    if comm.rank == 0:
        try:
            expected = []
            with h5py().File(path, "r") as f:
                names = []
                f.visit(lambda n: names.append(n) if isinstance(f[n], h5py().Dataset) else None)
                for name in sorted(names):
                    dset = f[name]
                    if "crc32" not in dset.attrs or int(dset.attrs.get("crc32_chunk", 0)) != CHUNK_BYTES:
                        raise CorruptFile(f"{path}: dataset {name} has no checksums")
                    expected.append((name, dset.id.get_offset(), int(dset.id.get_storage_size()),
                                     [int(c) for c in dset.attrs["crc32"]]))
        except (OSError, KeyError, ValueError) as exc:
            error = str(exc) if isinstance(exc, CorruptFile) else f"{path}: unreadable ({exc})"
    error = comm.bcast(error, root=0)
    if error is not None:
        raise CorruptFile(error)
    expected = comm.bcast(expected, root=0)
    crcs, problem = _chunk_crcs(path, [(n, o, b) for n, o, b, _ in expected], comm)
    if problem is not None:
        raise CorruptFile(problem)
    bad = [name for name, _o, _b, want in expected if crcs[name] != want]
    if bad:
        raise CorruptFile(f"{path}: checksum mismatch in {', '.join(bad)}")


def _chunk_crcs(path: str, extents, comm):
    """CRC-32 of every CHUNK_BYTES piece of each (name, byte offset, byte size) extent of ``path``.

    Rank r reads the pieces r, r + size, ...; the pieces of all ranks are gathered on every rank.
    Returns ``({name: [crc, ...]}, problem or None)``, the same on every rank.
    """
    mine, problem = {}, None
    try:
        with open(path, "rb", buffering=0) as f:
            for name, offset, nbytes in extents:
                if nbytes and offset is None:
                    raise OSError(f"dataset {name} has no contiguous storage")
                for j in range(comm.rank, math.ceil(nbytes / CHUNK_BYTES), comm.size):
                    want = min(CHUNK_BYTES, nbytes - j * CHUNK_BYTES)
                    data = os.pread(f.fileno(), want, offset + j * CHUNK_BYTES)
                    if len(data) != want:
                        raise OSError(f"dataset {name} is truncated")
                    mine[(name, j)] = zlib.crc32(data)
    except OSError as exc:
        problem = f"{path}: {exc.strerror or exc}"
    merged, problems = {}, []
    for part, trouble in comm.allgather((mine, problem)):
        merged.update(part)
        problems += [trouble] if trouble else []
    problem = problems[0] if problems else None
    if problem is not None:
        return {}, problem
    return {name: [merged[(name, j)] for j in range(math.ceil(nbytes / CHUNK_BYTES))]
            for name, _offset, nbytes in extents}, None
