"""Node-local level: one file per rank per snapshot under a node-local directory.

Files live in ``<dir>/hpcadj-<run id>/rank<r>/step_<n>.snap``, where ``<dir>`` is the explicit
``local_dir``, else $HPCADJ_LOCAL_DIR, $SLURM_TMPDIR, $TMPDIR, /tmp. Nothing is shared between
ranks. A file is written under a temporary name and renamed into place (optionally fsync'ed
first), so a partial file is never taken for a snapshot.

File format (little endian): 8 bytes magic ``HPCADJS1``, uint64 header length, a UTF-8 JSON header
(``run_id``, ``nonce``, ``rank``, ``step``, ``time``, ``checksum: "crc32"`` and per field ``name``,
``dtype``, ``shape``, ``nbytes``, ``crc32``), then each field's raw C-order bytes in header order.
A read checks the header's run id, per-level nonce, step and rank (a stale file from another run is
rejected), the sizes (truncation) and the CRC-32 of every block against the one recorded when it
was written.
"""

from __future__ import annotations

import json
import os
import struct
import uuid

import numpy as np

from ...snapshot import Snapshot, SnapshotLayout
from .aio import AsyncLevel
from .base import CorruptSnapshot, LevelError, agree_run_id
from .checksum import ALGORITHM, block_checksum

MAGIC = b"HPCADJS1"
_PREFIX = struct.Struct("<8sQ")
ENV_VARS = ("HPCADJ_LOCAL_DIR", "SLURM_TMPDIR", "TMPDIR")


def resolve_local_dir(local_dir: str | None = None) -> str:
    """The node-local base directory: ``local_dir``, else the first set of ENV_VARS, else /tmp."""
    if local_dir:
        return str(local_dir)
    for var in ENV_VARS:
        if os.environ.get(var):
            return os.environ[var]
    return "/tmp"


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def _read_exact(f, buf: memoryview) -> int:
    """Fill ``buf`` from ``f``; return how many bytes were read (short only at end of file)."""
    got = 0
    while got < len(buf):
        n = f.readinto(buf[got:])
        if not n:
            break
        got += n
    return got


class LocalLevel(AsyncLevel):
    """Per-rank snapshot files on node-local disk; asynchronous by default."""

    kind = "local"

    def __init__(self, capacity: int, layout: SnapshotLayout | None, comm=None, *,
                 local_dir: str | None = None, run_id: str | None = None, keep: bool = False,
                 fsync: bool = False, async_io: bool = True, queue_depth: int = 2,
                 prefetch_depth: int = 1, name: str = "local"):
        super().__init__(name, capacity, layout, comm, async_io=async_io,
                         queue_depth=queue_depth, prefetch_depth=prefetch_depth)
        self.keep = bool(keep)
        self.fsync = bool(fsync)
        self.base_dir = resolve_local_dir(local_dir)
        self.run_id = agree_run_id(self.comm, run_id)
        self.run_dir = os.path.join(self.base_dir, f"hpcadj-{self.run_id}")
        self.directory = os.path.join(self.run_dir, f"rank{self.rank}")
        self._nonce = uuid.uuid4().hex
        self._crc: dict[int, dict[str, int]] = {}
        problem = self._probe()
        problems = self.comm.allgather(problem) if self.comm is not None else [problem]
        failed = [(r, p) for r, p in enumerate(problems) if p]
        if failed:
            if self._worker is not None:
                self._release_worker()
            self._closed = True
            detail = "; ".join(f"rank {r}: {p}" for r, p in failed)
            raise LevelError(f"{name}: node-local directory is not usable ({detail}); choose "
                             f"another with local_dir/--local-dir or $HPCADJ_LOCAL_DIR")

    def _probe(self) -> str | None:
        """Create this rank's directory and write a probe file; the reason on failure."""
        try:
            os.makedirs(self.directory, exist_ok=True)
            probe = os.path.join(self.directory, f".probe-{self._nonce}")
            with open(probe, "wb") as f:
                f.write(b"ok")
            os.remove(probe)
        except OSError as exc:
            return f"{self.directory}: {exc.strerror or exc}"
        return None

    def path(self, step: int) -> str:
        """This rank's file for ``step``."""
        return os.path.join(self.directory, f"step_{step:08d}.snap")

    def _store(self, step: int, snapshot: Snapshot, t) -> int:
        blocks = {k: np.ascontiguousarray(v) for k, v in snapshot.items()}
        crcs = {k: block_checksum(a) for k, a in blocks.items()}
        header = json.dumps({
            "format": "hpcadj-snapshot-1", "run_id": self.run_id, "nonce": self._nonce,
            "rank": self.rank, "step": int(step), "time": t, "checksum": ALGORITHM,
            "fields": [{"name": k, "dtype": a.dtype.str, "shape": list(a.shape),
                        "nbytes": int(a.nbytes), "crc32": crcs[k]} for k, a in blocks.items()],
        }).encode()
        final = self.path(step)
        tmp = os.path.join(self.directory, f".step_{step:08d}.snap.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _write_all(fd, _PREFIX.pack(MAGIC, len(header)))
                _write_all(fd, header)
                for a in blocks.values():
                    _write_all(fd, a.reshape(-1).view(np.uint8))
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except OSError as exc:
            try:
                os.remove(tmp)
            except OSError:
                pass
            raise LevelError(f"{self.name}: writing step {step} on rank {self.rank} to {final} "
                             f"failed: {exc}") from exc
        self._crc[step] = crcs
        return sum(a.nbytes for a in blocks.values())

    def _corrupt(self, step: int, reason: str) -> CorruptSnapshot:
        return CorruptSnapshot(self.name, step, [self.rank], reason)

    def _load(self, step: int) -> Snapshot:
        path = self.path(step)
        expected = self._crc.get(step)
        try:
            f = open(path, "rb", buffering=0)
        except FileNotFoundError:
            raise self._corrupt(step, f"file {path} is missing") from None
        with f:
            prefix = bytearray(_PREFIX.size)
            if _read_exact(f, memoryview(prefix)) < _PREFIX.size:
                raise self._corrupt(step, f"{path} is truncated (no header)")
            magic, length = _PREFIX.unpack(prefix)
            if magic != MAGIC or length > 1 << 24:
                raise self._corrupt(step, f"{path} is not an hpcadj snapshot file")
            raw = bytearray(length)
            try:
                if _read_exact(f, memoryview(raw)) < length:
                    raise ValueError("truncated header")
                header = json.loads(raw)
            except ValueError as exc:
                raise self._corrupt(step, f"{path}: bad header ({exc})") from None
            mine = (self.run_id, self._nonce, self.rank, int(step))
            theirs = tuple(header.get(k) for k in ("run_id", "nonce", "rank", "step"))
            if theirs != mine:
                raise self._corrupt(step, f"{path} belongs to another run or step "
                                          f"(run {theirs[0]}, step {theirs[3]})")
            snapshot: Snapshot = {}
            for field in header["fields"]:
                name = field["name"]
                arr = np.empty(field["shape"], dtype=np.dtype(field["dtype"]))
                if _read_exact(f, memoryview(arr.reshape(-1).view(np.uint8))) < arr.nbytes:
                    raise self._corrupt(step, f"{path} is truncated in field {name!r}")
                crc = block_checksum(arr)
                if crc != field["crc32"] or expected is None or crc != expected.get(name):
                    raise self._corrupt(step, f"checksum mismatch in field {name!r} of {path}")
                snapshot[name] = arr
            if f.read(1):
                raise self._corrupt(step, f"{path} has trailing bytes")
        if expected is None or set(snapshot) != set(expected):
            raise self._corrupt(step, f"{path} holds fields {sorted(snapshot)}")
        return snapshot

    def _drop(self, step: int) -> None:
        self._crc.pop(step, None)
        try:
            os.remove(self.path(step))
        except FileNotFoundError:
            pass

    def _shutdown(self) -> None:
        if self.keep:
            return
        for step in list(self._crc):
            self._drop(step)
        try:
            leftovers = [e for e in os.listdir(self.directory) if e.endswith(".snap.tmp")]
        except FileNotFoundError:
            leftovers = []
        for entry in leftovers:
            os.remove(os.path.join(self.directory, entry))
        for d in (self.directory, self.run_dir):
            try:
                os.rmdir(d)
            except OSError:
                pass
