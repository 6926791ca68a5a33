"""Build a level by kind, as the driver and ``hpcadj run`` do."""

from __future__ import annotations

from ...snapshot import SnapshotLayout
from ...levelkinds import STORAGE_KINDS as KINDS
from .base import Level
from .local import LocalLevel
from .pfs import PfsLevel
from .pfs_async import AsyncPfsLevel
from .ram import RamLevel


def make_level(kind: str, capacity: int, layout: SnapshotLayout, comm=None, *,
               path: str | None = None, local_dir: str | None = None, async_io: bool = True,
               keep: bool = False, run_id: str | None = None, fsync: bool = False,
               name: str | None = None, queue_depth: int = 2, prefetch_depth: int = 1,
               verify: bool = False, collective: str = "auto", attach: bool = False,
               purge_run_id: str | None = None, codec=None, slot_bytes: int | None = None,
               pool_bytes: int | None = None, margin: float = 1.15) -> Level:
    """A ``ram``, ``local`` (node-local files) or ``pfs`` (parallel HDF5 at ``path``) level.

    Collective: every rank of ``comm`` must call it (file levels agree on a run id and check their
    directory/file on all ranks). ``async_io`` applies to file levels; ``verify`` to RAM (file
    levels always verify); ``collective`` (auto|always|never) is the HDF5 level's raw-data mode.
    ``comm`` may be an mpi4py or petsc4py communicator, or None (serial).

    ``attach=True`` (``local`` and ``pfs``; ignored for ``ram``) reopens the snapshots an earlier
    process left under the same ``run_id`` and ``local_dir``/``path``, verifies each (checksums and
    headers stored in the files) and holds the valid ones (``valid_steps()``); invalid, partial and
    temporary files are removed. The pfs level attaches on any rank count; the local level refuses
    another rank count or layout; ``purge_run_id`` then names the run whose node-local files it
    removes instead (a resume on another rank count must not leave them behind).

    ``codec`` (a :class:`~.codec.Codec` other than ``none``) with ``slot_bytes`` gives a
    :class:`~.compressed.CompressedLevel`: the level of ``kind`` holds one ``slot_bytes`` uint8 block
    per rank, the encoded snapshot. A ``ram`` level with a codec and ``pool_bytes`` is instead a
    byte pool (:class:`~.compressed.PooledLevel`): each snapshot takes its own encoded size, and
    ``margin`` is the headroom its sizes were planned with.
    """
    if comm is not None and hasattr(comm, "tompi4py"):
        comm = comm.tompi4py()
    if codec is not None and codec.spec != "none" and kind == "ram" and pool_bytes is not None:
        from .compressed import PooledLevel

        return PooledLevel(codec, layout, capacity, pool_bytes, comm, name=name or kind, margin=margin)
    if codec is not None and codec.spec != "none":
        from .compressed import CompressedLevel, slot_layout

        if not slot_bytes or slot_bytes < 1:
            raise ValueError("a compressed level needs its slot size in bytes")
        inner = make_level(kind, capacity, slot_layout(slot_bytes, comm), comm, path=path,
                           local_dir=local_dir, async_io=async_io, keep=keep, run_id=run_id, fsync=fsync,
                           name=name, queue_depth=queue_depth, prefetch_depth=prefetch_depth,
                           verify=verify, collective=collective, attach=attach, purge_run_id=purge_run_id)
        return CompressedLevel(inner, codec, layout, slot_bytes, comm)
    name = name or kind
    if kind == "ram":
        return RamLevel(capacity, layout, name=name, verify=verify)
    opts = dict(run_id=run_id, keep=keep, fsync=fsync, async_io=async_io, name=name,
                queue_depth=queue_depth, prefetch_depth=prefetch_depth)
    if kind == "local":
        return LocalLevel(capacity, layout, comm, local_dir=local_dir, attach=attach,
                          purge_run_id=purge_run_id, **opts)
    if kind == "pfs":
        cls = AsyncPfsLevel if opts.pop("async_io") else PfsLevel
        return cls(capacity, layout, comm, path, collective=collective, attach=attach, **opts)
    raise ValueError(f"unknown level kind {kind!r}; expected one of {', '.join(KINDS)}")

