"""Node-local level: one file per rank per snapshot under a node-local directory.

Files live in ``<dir>/hpcadj-<run id>/rank<r>/step_<n>.snap``, where ``<dir>`` is the explicit
``local_dir``, else $HPCADJ_LOCAL_DIR, $SLURM_TMPDIR, $TMPDIR, /tmp. Nothing is shared between
ranks. A file is written under a temporary name and renamed into place (optionally fsync'ed
first), so a partial file is never taken for a snapshot.

File format (little endian): 8 bytes magic ``HPCADJS1``, uint64 header length, a UTF-8 JSON header
(``run_id``, ``nonce``, ``rank``, ``nranks``, ``step``, ``time``, ``checksum: "crc32"`` and per field
``name``, ``dtype``, ``shape``, ``start``, ``global_shape``, ``nbytes``, ``crc32``), then each
field's raw C-order bytes in header order. A read checks the header's run id, nonce, step and rank
(a stale file from another run is rejected), the sizes (truncation) and the CRC-32 of every block
against the one recorded when it was written.

Each rank directory also holds ``LAYOUT.json`` (rank count, this rank's blocks and the CRC-32 of
both, ``crc32``), written when the level is created. One damaged on any rank (unreadable, or
failing its CRC) makes the level's node-local snapshots unusable: every rank removes its own, the
level starts empty and ``attach_dropped`` says why (the run recomputes what they held). ``attach=True`` (a restart with the same run id and ``local_dir``) refuses a rank
directory written by another rank count or layout, removes temporary and invalid files, verifies
every snapshot file against the CRCs in its own header, and holds the steps valid on every rank
(the nonce and CRCs of the file's header are adopted, so later reads check them again).

:class:`RankFiles` is the transport (every operation plain file I/O, so all may run on the I/O
thread); :class:`LocalLevel` composes it with the I/O queue, asynchronous by default.
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import uuid
import zlib

import numpy as np

from ...collective import agree_or_raise, allgather, detail, problems
from ...snapshot import Snapshot, SnapshotLayout
from .aio import QueuedLevel, Transport
from .base import CorruptSnapshot, LevelError, agree_run_id
from .checksum import ALGORITHM, block_checksum
from ...imports import mpi

#: run ids of scratch levels (calibration): swept by any later node-local level once their owner died
SCRATCH_PREFIX = "calibrate-"
OWNER = ".owner"
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


def sweep_dead_scratch(base_dir: str, own_run: str | None = None) -> int:
    """Remove the rank directories of scratch levels (``hpcadj-calibrate-*``) under ``base_dir``
    whose owner process is gone (its lock on ``.owner`` released, by exit or by a kill); the
    number of snapshot files removed. A live owner's directory is left alone, and so is run
    ``own_run``'s (the caller's ranks may be creating theirs at this moment)."""
    removed = 0
    try:
        runs = [e for e in os.listdir(base_dir) if e.startswith("hpcadj-" + SCRATCH_PREFIX)
                and e != f"hpcadj-{own_run}"]
    except OSError:
        return 0
    for run in runs:
        run_dir = os.path.join(base_dir, run)
        try:
            ranks = [e for e in os.listdir(run_dir) if e.startswith("rank")]
        except OSError:
            continue
        for entry in ranks:
            rank_dir = os.path.join(run_dir, entry)
            try:
                fd = os.open(os.path.join(rank_dir, OWNER), os.O_RDONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # its owner still runs
                os.close(fd)
                continue
            try:
                for name in os.listdir(rank_dir):
                    if name.endswith((".snap", ".tmp")) or name == "LAYOUT.json" or name.startswith(OWNER):
                        _remove(os.path.join(rank_dir, name))
                        removed += name.endswith(".snap")
            finally:
                os.close(fd)
            _rmdir(rank_dir)
        _rmdir(run_dir)
    return removed


def purge_node_local(comm, local_dir: str | None, run_id: str) -> tuple[int, int, str]:
    """Remove the node-local snapshots run ``run_id`` left (a resume that has no node-local level:
    nothing else would); (snapshot files, bytes) removed over all nodes and the directory they were
    in. Collective over ``comm``; one rank per node removes."""
    files = RankFiles("local", comm, None, local_dir=local_dir, run_id=run_id)
    return (*files.purge_run(run_id), os.path.join(files.base_dir, f"hpcadj-{run_id}"))


def layout_crc(record: dict) -> int:
    """CRC-32 of a LAYOUT.json record without its own ``crc32`` entry (keys sorted)."""
    body = {k: v for k, v in record.items() if k != "crc32"}
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())


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


class RankFiles(Transport):
    """This rank's snapshot files under ``<base>/hpcadj-<run id>/rank<r>/`` (the format above)."""

    def __init__(self, name: str, comm, layout: SnapshotLayout | None, *, local_dir: str | None = None,
                 run_id: str | None = None, keep: bool = False, fsync: bool = False):
        self.name = name
        self.comm = comm
        self.rank = comm.rank if comm is not None else 0
        self.size = comm.size if comm is not None else 1
        self.layout = layout
        self.keep = bool(keep)
        self.fsync = bool(fsync)
        self.base_dir = resolve_local_dir(local_dir)
        #: the base directory and its parents that did not exist (the set-up creates them; they go
        #: with it), seen by every rank before any rank creates one
        self._made = _missing(self.base_dir)
        if comm is not None:
            comm.Barrier()
        self._layout_written = False
        self.run_id = agree_run_id(comm, run_id)
        self.run_dir = os.path.join(self.base_dir, f"hpcadj-{self.run_id}")
        self.directory = os.path.join(self.run_dir, f"rank{self.rank}")
        self._nonce = uuid.uuid4().hex
        self._owner: int | None = None  # a scratch level's lock, held while this process lives
        self._crc: dict[int, dict[str, int]] = {}
        self._nonces: dict[int, str] = {}  # adopted from files of an earlier process (attach)
        self.attach_note: str | None = None
        self.attach_dropped: list[str] = []  # why snapshots found on attach were not taken

    def purge_run(self, run_id: str) -> tuple[int, int]:
        """Remove the node-local snapshots an earlier process of this run left (not reattached).

        One rank per node does it (the directory is node-local); only this project's file names
        are removed, and what went is reported in ``attach_note`` and returned: (snapshot files,
        bytes) over all nodes.
        """
        node = self.comm.Split_type(mpi().COMM_TYPE_SHARED) if self.comm is not None else None
        removed = [0, 0]
        if node is None or node.rank == 0:
            old = os.path.join(self.base_dir, f"hpcadj-{run_id}")
            for entry in sorted(os.listdir(old)) if os.path.isdir(old) else []:
                rank_dir = os.path.join(old, entry)
                if not (entry.startswith("rank") and entry[4:].isdigit() and os.path.isdir(rank_dir)):
                    continue
                for name in os.listdir(rank_dir):
                    if name.endswith((".snap", ".tmp")) or name == "LAYOUT.json":
                        path = os.path.join(rank_dir, name)
                        try:
                            size = os.path.getsize(path)
                            os.remove(path)
                            removed[0] += name.endswith(".snap")
                            removed[1] += size
                        except OSError:
                            pass
                _rmdir(rank_dir)
            _rmdir(old)
        if node is not None:
            node.Free()
        everyone = self._gather(tuple(removed))
        files, nbytes = sum(n for n, _ in everyone), sum(b for _, b in everyone)
        if files:
            self.attach_note = (f"removed {files} node-local snapshot file(s) ({nbytes / 2**20:.1f} MiB) "
                                f"that run {run_id} left on another rank layout")
        return files, nbytes

    def _gather(self, value):
        return allgather(self.comm, value)

    def _layout_record(self) -> dict:
        fields = {} if self.layout is None else {
            k: {"dtype": np.dtype(v.dtype).str, "shape": [int(n) for n in v.shape],
                "start": [int(n) for n in v.start], "global_shape": [int(n) for n in v.global_shape]}
            for k, v in sorted(self.layout.items())}
        return {"run_id": self.run_id, "nranks": self.size, "rank": self.rank, "fields": fields}

    def _layout_path(self) -> str:
        return os.path.join(self.directory, "LAYOUT.json")

    def write_layout(self, replace: bool) -> None:
        if not replace and os.path.exists(self._layout_path()):
            return
        tmp = self._layout_path() + ".tmp"
        record = self._layout_record()
        self._layout_written = True
        with open(tmp, "w") as f:
            json.dump({**record, "crc32": layout_crc(record)}, f)
        os.replace(tmp, self._layout_path())

    def layout_damage(self) -> str | None:
        """Why this rank's LAYOUT.json cannot be trusted (unreadable, fails its CRC), else None."""
        try:
            with open(self._layout_path()) as f:
                saved = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            return f"{self._layout_path()} is unreadable ({exc})"
        if not isinstance(saved, dict):
            return f"{self._layout_path()} is not a layout record"
        if "crc32" in saved and saved["crc32"] != layout_crc(saved):
            return f"{self._layout_path()} fails its checksum"
        return None

    def drop_all(self) -> tuple[int, int]:
        """Remove this rank's snapshot and temporary files (a damaged level): (files, bytes)."""
        files = nbytes = 0
        try:
            entries = os.listdir(self.directory)
        except OSError:
            entries = []
        for name in entries:
            if name.endswith((".snap", ".tmp")):
                path = os.path.join(self.directory, name)
                try:
                    size = os.path.getsize(path)
                    os.remove(path)
                    files, nbytes = files + name.endswith(".snap"), nbytes + size
                except OSError:
                    pass
        return files, nbytes

    def layout_problem(self) -> str | None:
        """Why this rank cannot attach its directory (another rank count or block), else None."""
        try:
            others = [e for e in os.listdir(self.run_dir) if e.startswith("rank")
                      and e[4:].isdigit() and int(e[4:]) >= self.size]
        except FileNotFoundError:
            others = []
        if others:
            return f"{self.run_dir} holds {', '.join(sorted(others))}: written by more ranks"
        if self.layout_damage() is not None:  # a damaged record is a lost level, not a refusal
            return None
        try:
            with open(self._layout_path()) as f:
                saved = json.load(f)
        except FileNotFoundError:
            return None
        mine = self._layout_record()
        if saved.get("nranks") != mine["nranks"]:
            return f"written by {saved.get('nranks')} rank(s), attaching on {mine['nranks']}"
        if saved.get("fields") != mine["fields"]:
            return f"{self._layout_path()}: this rank's blocks differ from the ones written"
        return None

    def attach(self) -> dict:
        """The snapshot files an earlier process left that are valid on every rank: {step: time}."""
        found: dict[int, tuple] = {}
        held: dict[int, float | None] = {}
        rejected: list[str] = []
        for entry in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, entry)
            if entry.endswith(".tmp") or entry.startswith(".probe-"):
                _remove(path)
                continue
            if not (entry.startswith("step_") and entry.endswith(".snap")):
                continue
            try:
                step = int(entry[5:-5])
                header, crcs = self._verify_file(path, step)
            except (ValueError, CorruptSnapshot, OSError) as exc:
                rejected.append(f"rank {self.rank}: {exc}")
                _remove(path)
                continue
            found[step] = (header, crcs)
        self.attach_dropped = [r for rs in self._gather(rejected) for r in rs]
        common = set(found)
        for other in self._gather(sorted(found)):
            common &= set(other)
        for step in sorted(found):
            header, crcs = found[step]
            if step not in common:
                _remove(self.path(step))
                continue
            self._crc[step] = crcs
            self._nonces[step] = header["nonce"]
            held[step] = header.get("time")
        dropped = len(found) - len(common)
        if dropped:
            self.attach_dropped.append(f"rank {self.rank}: {dropped} snapshot(s) not valid on every rank")
        self.attach_note = (f"attached {len(common)} snapshot(s) of run {self.run_id}"
                            + (f", removed {dropped} not valid on every rank" if dropped else "")
                            + (f", removed {len(rejected)} corrupt or unreadable" if rejected else ""))
        return held

    def _verify_file(self, path: str, step: int):
        """(header, CRCs) of a snapshot file of this run, rank and layout; CorruptSnapshot if not."""
        snapshot, header = self._read_file(path, step, nonce=None, expected=None)
        return header, {f["name"]: f["crc32"] for f in header["fields"]}

    def probe(self) -> str | None:
        """Create this rank's directory and write a probe file; the reason on failure. A scratch
        level locks its ``.owner`` file first; dead scratch levels' files are swept."""
        sweep_dead_scratch(self.base_dir, own_run=self.run_id)
        try:
            os.makedirs(self.directory, exist_ok=True)
            if self.run_id.startswith(SCRATCH_PREFIX) and self._owner is None:
                # locked under a private name, then renamed: a sweep never finds an unlocked .owner
                taking = os.path.join(self.directory, f"{OWNER}.{self._nonce}")
                self._owner = os.open(taking, os.O_RDWR | os.O_CREAT, 0o600)
                fcntl.flock(self._owner, fcntl.LOCK_EX)
                os.rename(taking, os.path.join(self.directory, OWNER))
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

    def store(self, step: int, snapshot: Snapshot, t, token=None) -> tuple[int, None]:
        blocks = {k: np.ascontiguousarray(v) for k, v in snapshot.items()}
        crcs = {k: block_checksum(a) for k, a in blocks.items()}
        header = json.dumps({
            "format": "hpcadj-snapshot-1", "run_id": self.run_id, "nonce": self._nonce,
            "rank": self.rank, "nranks": self.size, "step": int(step), "time": t,
            "checksum": ALGORITHM,
            "fields": [{"name": k, "dtype": a.dtype.str, "shape": list(a.shape),
                        **self._block_info(k), "nbytes": int(a.nbytes), "crc32": crcs[k]}
                       for k, a in blocks.items()],
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
        self._nonces.pop(step, None)
        return sum(a.nbytes for a in blocks.values()), None

    def _block_info(self, key: str) -> dict:
        if self.layout is None or key not in self.layout:
            return {}
        lay = self.layout[key]
        return {"start": [int(n) for n in lay.start],
                "global_shape": [int(n) for n in lay.global_shape]}

    def _corrupt(self, step: int, reason: str) -> CorruptSnapshot:
        return CorruptSnapshot(self.name, step, [self.rank], reason)

    def load(self, step: int, token=None) -> Snapshot:
        expected = self._crc.get(step)
        if expected is None:
            raise self._corrupt(step, "no checksum recorded (the write did not complete)")
        snapshot, _ = self._read_file(self.path(step), step,
                                      nonce=self._nonces.get(step, self._nonce), expected=expected)
        return snapshot

    def _read_file(self, path: str, step: int, *, nonce: str | None, expected: dict | None):
        """Read and verify a snapshot file: (snapshot, header). ``nonce=None`` accepts any nonce
        (attach), ``expected=None`` checks the CRCs of the file's own header only."""
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
                if not isinstance(header, dict) or not isinstance(header.get("fields"), list):
                    raise ValueError("no field list")
            except ValueError as exc:
                raise self._corrupt(step, f"{path}: bad header ({exc})") from None
            mine = (self.run_id, self.rank, int(step))
            theirs = tuple(header.get(k) for k in ("run_id", "rank", "step"))
            if theirs != mine or (nonce is not None and header.get("nonce") != nonce):
                raise self._corrupt(step, f"{path} belongs to another run or step "
                                          f"(run {theirs[0]}, step {theirs[2]})")
            if nonce is None:  # attach: the file must match this rank's layout exactly
                if header.get("nranks") != self.size:
                    raise self._corrupt(step, f"{path} was written by {header.get('nranks')} ranks")
                for field in header["fields"]:
                    info = self._block_info(field.get("name"))
                    lay = (self.layout or {}).get(field.get("name"))
                    if lay is None or any(field.get(k) != v for k, v in info.items()) or \
                            list(field.get("shape", ())) != [int(n) for n in lay.shape] or \
                            np.dtype(field.get("dtype")) != np.dtype(lay.dtype):
                        raise self._corrupt(step, f"{path}: field {field.get('name')!r} does not "
                                                  f"match this rank's block")
            snapshot: Snapshot = {}
            for field in header["fields"]:
                name = field["name"]
                arr = np.empty(field["shape"], dtype=np.dtype(field["dtype"]))
                if _read_exact(f, memoryview(arr.reshape(-1).view(np.uint8))) < arr.nbytes:
                    raise self._corrupt(step, f"{path} is truncated in field {name!r}")
                crc = block_checksum(arr)
                if crc != field["crc32"] or (expected is not None and crc != expected.get(name)):
                    raise self._corrupt(step, f"checksum mismatch in field {name!r} of {path}")
                snapshot[name] = arr
            if f.read(1):
                raise self._corrupt(step, f"{path} has trailing bytes")
        wanted = set(expected) if expected is not None else set(self.layout or snapshot)
        if set(snapshot) != wanted:
            raise self._corrupt(step, f"{path} holds fields {sorted(snapshot)}")
        return snapshot, header

    def drop(self, step: int) -> None:
        self._crc.pop(step, None)
        self._nonces.pop(step, None)
        try:
            os.remove(self.path(step))
        except FileNotFoundError:
            pass

    def shutdown(self) -> None:
        """Remove this level's files unless kept (best effort: a read-only directory keeps them)."""
        if self.keep:
            return
        for step in list(self._crc):
            try:
                self.drop(step)
            except OSError:
                pass
        try:
            leftovers = [e for e in os.listdir(self.directory)
                         if e.endswith(".tmp") or e in ("LAYOUT.json", OWNER)]
        except OSError:
            leftovers = []
        for entry in leftovers:
            _remove(os.path.join(self.directory, entry))
        self._release_owner()
        for d in (self.directory, self.run_dir, *self._made):
            _rmdir(d)

    def withdraw(self) -> None:
        """Take back a refused set-up, whatever ``keep`` says: the LAYOUT.json this process wrote,
        its owner lock, then (once every rank has removed its own) the directories if empty, the
        base directory the set-up created included. An earlier process's files stay. Collective."""
        if self._layout_written:
            _remove(self._layout_path())
        if self._owner is not None:
            _remove(os.path.join(self.directory, OWNER))
        self._release_owner()
        _rmdir(self.directory)
        if self.comm is not None:
            self.comm.Barrier()
        for d in (self.run_dir, *self._made):
            _rmdir(d)

    def _release_owner(self) -> None:
        if self._owner is not None:
            os.close(self._owner)
            self._owner = None


class LocalLevel(QueuedLevel):
    """Per-rank snapshot files on node-local disk (:class:`RankFiles`); asynchronous by default."""

    kind = "local"
    _from_transport = ("fsync", "base_dir", "run_id", "run_dir", "directory", "path", "attach_note",
                       "attach_dropped")

    def __init__(self, capacity: int, layout: SnapshotLayout | None, comm=None, *,
                 local_dir: str | None = None, run_id: str | None = None, keep: bool = False,
                 fsync: bool = False, async_io: bool = True, queue_depth: int = 2,
                 prefetch_depth: int = 1, name: str = "local", attach: bool = False,
                 purge_run_id: str | None = None):
        super().__init__(name, capacity, layout, comm, async_io=async_io,
                         queue_depth=queue_depth, prefetch_depth=prefetch_depth)
        files = self.transport = RankFiles(name, self.comm, layout, local_dir=local_dir, run_id=run_id,
                                           keep=keep, fsync=fsync)
        agree_or_raise(self.comm, files.probe(), LevelError,
                       f"{name}: node-local directory is not usable ({{detail}}); choose another "
                       f"with local_dir/--local-dir or $HPCADJ_LOCAL_DIR", cleanup=self._withdraw)
        damaged = problems(self.comm, files.layout_damage()) if attach else []
        if damaged:  # every rank drops its snapshots: the level starts empty, the run recomputes
            removed = allgather(self.comm, files.drop_all())
            count, nbytes = sum(n for n, _ in removed), sum(b for _, b in removed)
            files.attach_dropped = [f"every node-local snapshot of run {files.run_id}: LAYOUT.json "
                                    f"damaged ({detail(damaged)})"]
            files.attach_note = (f"removed {count} node-local snapshot file(s) ({nbytes / 2**20:.1f} MiB) "
                                 f"of run {files.run_id}: LAYOUT.json damaged on rank(s) "
                                 f"{', '.join(str(r) for r, _ in damaged)}")
            attach = False
        agree_or_raise(self.comm, files.layout_problem() if attach else None, LevelError,
                       f"{name}: cannot attach the node-local snapshots of run {files.run_id} on "
                       f"{self.size} rank(s): {{detail}}; attach the parallel-HDF5 level instead "
                       f"(node-local files need the same rank count and layout)",
                       cleanup=self._withdraw)
        problem = None
        try:
            files.write_layout(replace=not attach)
        except OSError as exc:
            problem = f"{files.directory}: {exc.strerror or exc}"
        agree_or_raise(self.comm, problem, LevelError,
                       f"{name}: node-local directory is not usable ({{detail}})", cleanup=self._withdraw)
        if attach:
            self._adopt(files.attach())
        elif purge_run_id and purge_run_id != files.run_id:
            files.purge_run(purge_run_id)


    def _withdraw(self) -> None:
        """A refused set-up: end the I/O thread, take back what the set-up created (collective)."""
        self._abandon()
        self.transport.withdraw()


def _missing(path: str) -> list[str]:
    """``path`` and its parents that do not exist, deepest first."""
    missing, path = [], os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
