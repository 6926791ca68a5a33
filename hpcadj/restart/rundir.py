"""The run directory's format: its manifest (two generations, checksummed), adjoint and forward
state files, and the lock that keeps one run at a time in it."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import zlib

import numpy as np

from ..collective import agree_or_raise
from ..fieldio import verify_fields, write_fields
from ..imports import h5py
from .identity import identity_mismatch, trajectory_refusal
from ..checkpoint.storage.local import purge_node_local
from ..checkpoint.storage.pfs_attach import remove_dead_file

MANIFEST = "manifest.json"
#: the level files a run owns outside its directory (run id, node-local base, HDF5 path)
OWNED = "owned.json"
PREVIOUS = "manifest.prev.json"
LOCK = "lock.json"
FORMAT = 3


class RunDirError(ValueError):
    """The run directory cannot be used: unwritable, from another configuration, or broken."""


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a zombie, killed but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, field 22 of ``/proc/PID/stat``), or
    None where that cannot be read: with the pid it names one process, since pids are reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _slurm_job_gone(job: str) -> bool | None:
    """Whether SLURM no longer runs ``job`` (None: cannot tell, no squeue here)."""
    squeue = shutil.which("squeue")
    if squeue is None:
        return None
    try:
        proc = subprocess.run([squeue, "-h", "-j", str(job), "-o", "%T"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    state = proc.stdout.strip()
    return proc.returncode != 0 or not state or state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


class RunLock:
    """One run at a time in a run directory: ``lock.json`` with rank 0's host, pid, the pid's start
    time and SLURM job.

    Rank 0 creates it atomically (written beside, then hard-linked into place, which fails if it
    exists) and every rank learns the outcome. A lock is taken over when the run that left it is
    gone: on this host its pid no longer exists, or now names a process started at another time
    (the pid was reused; a lock without a start time counts as held while its pid exists); on another host its SLURM job is this job at an
    earlier requeue (``SLURM_RESTART_COUNT`` differs) or ``squeue`` no longer lists it. A lock on
    another host without a job id, or where ``squeue`` cannot tell, is refused with the file to
    remove. Released when the session ends, however it ends (an ``atexit`` hook as the last resort).
    """

    _held: set = set()  # lock paths this process holds

    def __init__(self, directory: str, comm):
        self.path = os.path.join(directory, LOCK)
        self.comm = comm
        self.taken_over: str | None = None  # the line saying whose stale lock was taken over
        self.held = False

    @staticmethod
    def _me() -> dict:
        return {"host": socket.gethostname(), "pid": os.getpid(), "start": _start_time(os.getpid()),
                "job": os.environ.get("SLURM_JOB_ID"),
                "restart": os.environ.get("SLURM_RESTART_COUNT"), "since": time.time()}

    def acquire(self) -> None:
        """Take the lock (collective); RunDirError on every rank while another run holds it."""
        error, note = None, None
        if self.comm.rank == 0:
            try:
                error, note = self._take()
            except OSError as exc:
                error = f"cannot lock run directory {os.path.dirname(self.path)}: {exc.strerror or exc}"
        agree_or_raise(self.comm, self.comm.bcast(error, root=0), RunDirError, first=True)
        self.taken_over = self.comm.bcast(note, root=0)
        self.held = True

    def _take(self):
        """Rank 0: (error, note), error None once the lock is ours."""
        me, note = self._me(), None
        tmp = f"{self.path}.{me['host']}.{me['pid']}.tmp"
        with open(tmp, "w") as f:
            json.dump(me, f)
        try:
            for _ in range(3):
                try:
                    os.link(tmp, self.path)
                    RunLock._held.add(self.path)
                    return None, note
                except FileExistsError:
                    pass
                holder = self._holder()
                why_gone = self._gone_soon(holder, me)
                if why_gone is None:
                    return self._in_use(holder), None
                if self._holder() == holder:  # not replaced meanwhile by a run taking it over too
                    os.unlink(self.path)
                note = f"took over the lock of run directory {os.path.dirname(self.path)}: {why_gone}"
            return f"cannot lock run directory {os.path.dirname(self.path)}: another run keeps taking it", None
        finally:
            os.unlink(tmp)

    def _holder(self) -> dict | None:
        try:
            with open(self.path) as f:
                holder = json.load(f)
            return holder if isinstance(holder, dict) else {}
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}

    #: seconds a holder on this host is given to exit: mpirun may return before a killed job's
    #: other ranks have (a resume started at once found rank 0 of the killed run still exiting)
    EXIT_GRACE_S = 5.0

    def _gone_soon(self, holder: dict | None, me: dict) -> str | None:
        """:meth:`_gone`, waiting up to ``EXIT_GRACE_S`` for a live holder on this host to exit."""
        why_gone = self._gone(holder, me)
        deadline = time.monotonic() + self.EXIT_GRACE_S
        while (why_gone is None and holder and holder.get("host") == me["host"]
               and holder.get("pid") != me["pid"] and time.monotonic() < deadline):
            time.sleep(0.1)
            why_gone = self._gone(holder, me)
        return why_gone

    def _gone(self, holder: dict | None, me: dict) -> str | None:
        """Why the holder's run is gone (its lock may be taken over), or None while it may run."""
        if holder is None:
            return "the lock went away"
        if not holder:
            return "the lock file was unreadable"
        host, pid, job = holder.get("host"), holder.get("pid"), holder.get("job")
        who = f"pid {pid} on {host}" + (f" (SLURM job {job})" if job else "")
        if host == me["host"]:
            if pid == me["pid"] and self.path not in RunLock._held:
                return f"{who} is this process, which no longer uses it"
            if isinstance(pid, int) and pid != me["pid"] and not _pid_alive(pid):
                return f"{who} is gone"
            start = holder.get("start")
            if isinstance(pid, int) and isinstance(start, int) and _start_time(pid) not in (None, start):
                return f"{who} is gone (the pid now names another process)"
            return None
        if job and job == me["job"] and holder.get("restart") != me["restart"]:
            return f"{who} was this job before it was requeued"
        if job and _slurm_job_gone(job):
            return f"{who} is gone (squeue no longer lists the job)"
        return None

    def _in_use(self, holder: dict) -> str:
        directory = os.path.dirname(self.path)
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
        job = f", SLURM job {holder['job']}" if holder.get("job") else ""
        return (f"run directory {directory} is in use by the run of pid {holder.get('pid')} on "
                f"{holder.get('host')}{job} since {since}: wait for it to end, or remove {self.path} "
                f"if that run is gone")

    def release(self) -> None:
        """Give the lock up (rank 0 removes the file if it is still this process's); not collective."""
        if not self.held:
            return
        self.held = False
        if self.comm.rank == 0:
            _release(self.path)


def _release(path: str) -> None:
    if path not in RunLock._held:
        return
    RunLock._held.discard(path)
    try:
        with open(path) as f:
            holder = json.load(f)
        if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
            os.unlink(path)
    except (OSError, ValueError):
        pass


@atexit.register
def _release_all() -> None:
    for path in list(RunLock._held):
        _release(path)



class RunDirectory:
    """One run's directory (every rank calls every method; rank 0 writes the manifest)."""

    def __init__(self, path: str, comm):
        self.path = os.path.abspath(path)
        self.comm = comm
        self.manifest_path = os.path.join(self.path, MANIFEST)
        self.previous_path = os.path.join(self.path, PREVIOUS)
        self.manifest: dict | None = None
        self.previous: dict | None = None   # the generation before, when it checks out
        self.faults: list[str] = []         # durable artifacts found corrupt, and what was used instead
        self.lock = RunLock(self.path, comm)
        self.created = False                # rank 0: this run made the directory

    # -- opening ---------------------------------------------------------------------------
    def _agree_error(self, message: str | None) -> None:
        agree_or_raise(self.comm, message, RunDirError, first=True)

    def exists(self) -> bool:
        return os.path.isfile(self.manifest_path)

    def acquire(self, create: bool) -> None:
        """Lock the directory for this run (``create``: make it first); RunDirError while another run
        uses it. A directory that does not exist is left alone on resume (:meth:`open` says so)."""
        error = None
        if self.comm.rank == 0:
            try:
                if create:
                    self.created = not os.path.isdir(self.path)
                    os.makedirs(self.path, exist_ok=True)
            except OSError as exc:
                error = f"cannot create run directory {self.path}: {exc.strerror}"
        self._agree_error(self.comm.bcast(error, root=0))
        if self.comm.bcast(os.path.isdir(self.path) if self.comm.rank == 0 else None, root=0):
            self.lock.acquire()

    def release(self) -> None:
        self.lock.release()

    def create(self, identity: dict, setup: dict, trajectory: dict | None = None) -> None:
        """Start a fresh run here (refused if the directory already holds one)."""
        error = None
        if self.comm.rank == 0:
            try:
                os.makedirs(self.path, exist_ok=True)
                if self.exists():
                    error = (f"run directory {self.path} already holds a run: add --resume to continue "
                             f"it, or choose another --run-dir")
                elif not os.access(self.path, os.W_OK | os.X_OK):
                    error = f"run directory {self.path} is not writable"
            except OSError as exc:
                error = f"cannot create run directory {self.path}: {exc.strerror}"
        self._agree_error(self.comm.bcast(error, root=0))
        self.manifest = {"format": FORMAT, "identity": identity, "trajectory": trajectory, "setup": setup,
                         "ranks": self.comm.size, "status": "running", "durable": None, "snapshots": {},
                         "created": time.time()}
        record_owned(self.path, self.comm, setup["run_id"], setup.get("local_dir"), setup.get("pfs_file"))
        self.save()

    def withdraw(self) -> None:
        """Undo a fresh start that was refused before any work: the manifest, the owned-files record,
        the lock, and the directory when this run made it, so the same command can simply be run
        again (rank 0 removes; collective only through the lock's release)."""
        if self.comm.rank == 0:
            for name in (MANIFEST, PREVIOUS, OWNED):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self.path, name))
        self.lock.release()
        if self.comm.rank == 0 and self.created:
            with contextlib.suppress(OSError):
                os.rmdir(self.path)

    def nothing_durable(self) -> bool:
        """Whether the opened run never reached a durable point (killed in start-up, say)."""
        return all((m or {}).get("durable") is None for m in (self.manifest, self.previous))

    def start_afresh(self) -> None:
        """Make the opened run, which has nothing durable, a fresh start in the same set-up."""
        self.manifest.update(status="running", durable=None, snapshots={}, created=time.time(),
                             ranks=self.comm.size)
        self.manifest.pop("forward_points", None)
        self.manifest.pop("adaptive_steps", None)
        self.manifest["setup"].pop("compression", None)
        self.previous = None
        self.save()

    @property
    def recorded_ranks(self) -> int:
        """The rank count the opened run's snapshots were written with."""
        return self.manifest["ranks"]

    def recorded_setup(self) -> dict:
        """Where the opened run's levels keep their files: ``run_id``, ``local_dir``, ``pfs_file``."""
        setup = self.manifest["setup"]
        return {"run_id": setup["run_id"], "local_dir": setup.get("local_dir"), "pfs_file": setup.get("pfs_file")}

    def recorded_compression(self) -> dict:
        """Level name -> {"codec", "slot_bytes"} the opened run's compressed levels were sized with."""
        return self.manifest["setup"].get("compression") or {}

    def record_compression(self, compression: dict) -> None:
        """Record the compressed levels' codecs and slot sizes, so a resume sizes its slots alike."""
        self.manifest["setup"]["compression"] = compression
        self.save()

    def check_trajectory(self, trajectory: dict) -> None:
        """RunDirError on every rank when this run's :func:`trajectory_fingerprint` is not the recorded one."""
        self._agree_error(trajectory_refusal(self.path, self.manifest.get("trajectory") or {}, trajectory,
                                             self.manifest["ranks"], self.comm.size))

    def open(self, identity: dict) -> dict:
        """Load the manifest of the run to resume; refuse one from another configuration.

        A manifest failing its checksum gives way to the previous generation (reported in
        ``faults``); when neither checks out the run cannot resume, and says so.
        """
        error, found, faults, broken = None, (None, None), [], False
        if self.comm.rank == 0:
            current, why = _load_manifest(self.manifest_path)
            previous, why_prev = _load_manifest(self.previous_path)
            if current is None and previous is None:
                if why.endswith("does not exist") and why_prev.endswith("does not exist"):
                    error = f"nothing to resume: {self.manifest_path} does not exist"
                elif "older hpcadj" in why:
                    error = why
                else:
                    error = f"cannot resume from {self.path}: {why}; {why_prev}"
                    broken = True
            elif current is None:
                faults.append(f"{why}: resuming from the previous generation {PREVIOUS}")
                current, previous = previous, None
            if error is None:
                error = identity_mismatch(current["identity"], identity)
            found = (current, previous)
        error, broken = self.comm.bcast((error, broken), root=0)
        if broken:  # the run cannot continue: what it owns outside the directory must not block the next
            removed = remove_owned(self.comm, read_owned(self.path, self.comm))
            error += f"{'; ' + '; '.join(removed) if removed else ''}; remove the directory to start afresh"
        self._agree_error(error)
        self.manifest, self.previous = self.comm.bcast(found, root=0)
        self.faults += self.comm.bcast(faults, root=0)
        return self.manifest

    # -- writing ---------------------------------------------------------------------------
    def save(self) -> None:
        """Replace the manifest atomically (rank 0), keeping the one it replaces as the previous
        generation, and remove adjoint files neither generation names; then every rank goes on."""
        error = None
        if self.comm.rank == 0:
            tmp = self.manifest_path + ".tmp"
            body = {k: v for k, v in self.manifest.items() if k != "crc32"}
            try:
                with open(tmp, "w") as f:
                    json.dump({**body, "crc32": json_crc32(body)}, f, indent=1)
                    f.flush()
                    os.fsync(f.fileno())
                if os.path.exists(self.manifest_path):
                    os.replace(self.manifest_path, self.previous_path)
                os.replace(tmp, self.manifest_path)
                self._remove_stale_adjoints()
            except OSError as exc:
                error = f"cannot write {self.manifest_path}: {exc.strerror}"
        self._agree_error(self.comm.bcast(error, root=0))

    def _remove_stale_adjoints(self) -> None:
        """Rank 0: delete the adjoint files that neither manifest generation names."""
        keep = set()
        for path in (self.manifest_path, self.previous_path):
            durable = ((_load_manifest(path)[0] or {}).get("durable") or {})
            keep |= {durable.get("adjoint"), durable.get("forward")}
        for entry in os.listdir(self.path):
            if entry.startswith(("adjoint-", "forward-")) and entry.endswith((".h5", ".h5.partial")) \
                    and entry not in keep:
                os.remove(os.path.join(self.path, entry))

    def adjoint_path(self, step: int) -> str:
        return os.path.join(self.path, f"adjoint-{step:08d}.h5")

    def write_adjoint(self, model, step: int, lam, grad: dict) -> str:
        """Write lambda_step and the gradient so far (collective, atomic by rename); its file name."""
        layouts = {"lambda/" + k: v for k, v in model.snapshot_layout().items()}
        arrays = {"lambda/" + k: v for k, v in model.snapshot(lam).items()}
        controls = model.control_layout()
        for name, vec in grad.items():
            layouts["grad/" + name] = controls[name]
            arrays["grad/" + name] = vec.getArray(readonly=True).reshape(controls[name].shape)
        path = self.adjoint_path(step)
        try:
            write_fields(path, self.comm, layouts, arrays, attrs={"step": step})
        except OSError as exc:
            raise RunDirError(str(exc)) from None
        return os.path.basename(path)

    def write_state(self, model, step: int, u, J: float) -> str:
        """Write the forward state u_step (collective, checksummed, atomic); its file name."""
        layouts = {"u/" + k: v for k, v in model.snapshot_layout().items()}
        arrays = {"u/" + k: v for k, v in model.snapshot(u).items()}
        path = os.path.join(self.path, f"forward-{step:08d}.h5")
        try:
            write_fields(path, self.comm, layouts, arrays, attrs={"step": step, "J": J})
        except OSError as exc:
            raise RunDirError(str(exc)) from None
        return os.path.basename(path)

    def read_state(self, model, name: str):
        """(step, snapshot of this rank's blocks) from the forward file ``name``, verified."""
        path = os.path.join(self.path, name)
        verify_fields(path, self.comm)
        with h5py().File(path, "r", driver="mpio", comm=self.comm) as f:
            step = int(f.attrs["step"])
            snapshot = {k: np.array(f["u/" + k][v.slices]) for k, v in model.snapshot_layout().items()}
        return step, snapshot

    def read_adjoint(self, model, grad_like: dict, name: str):
        """(step, lambda Vec, gradient Vecs) from the adjoint file ``name``, verified, read in this
        run's layout; :class:`~hpcadj.fieldio.CorruptFile` on every rank if it does not check out."""
        path = os.path.join(self.path, name)
        verify_fields(path, self.comm)
        with h5py().File(path, "r", driver="mpio", comm=self.comm) as f:
            step = int(f.attrs["step"])
            snapshot = {k: np.array(f["lambda/" + k][v.slices]) for k, v in model.snapshot_layout().items()}
            grad = {}
            controls = model.control_layout()
            for name, like in grad_like.items():
                vec = like.duplicate()
                vec.getArray().reshape(controls[name].shape)[...] = f["grad/" + name][controls[name].slices]
                grad[name] = vec
        return step, model.restore(snapshot), grad


def record_owned(path: str, comm, run_id: str, local_dir: str | None, pfs_file: str | None) -> dict:
    """Record in directory ``path`` the level files a run owns outside it, before it creates any:
    its node-local directories (``hpcadj-<run_id>`` under ``local_dir``, on the ``hosts`` its ranks
    run on) and its HDF5 file (only when nothing exists at ``pfs_file`` yet: a file already there is
    someone else's). Collective."""
    hosts = _hosts(comm)
    record = None
    if comm.rank == 0:
        pfs = os.path.abspath(pfs_file) if pfs_file else None
        record = {"run_id": run_id, "local_dir": os.path.abspath(local_dir) if local_dir else None,
                  "pfs_file": pfs if pfs and not os.path.lexists(pfs) else None, "hosts": hosts}
    return _write_owned(path, comm, record)


def record_hosts(path: str, comm, record: dict) -> dict:
    """``record`` (read by :func:`read_owned`) with the hosts this job runs on added, written back to
    ``path`` before a resume creates node-local files there: after a requeue onto other nodes the
    record still names every host that may hold the run's files. Collective."""
    hosts = sorted(set(record.get("hosts") or []) | set(_hosts(comm)))
    if hosts == record.get("hosts"):
        return record
    return _write_owned(path, comm, {**record, "hosts": hosts} if comm.rank == 0 else None)


def _write_owned(path: str, comm, record: dict | None) -> dict:
    """Write rank 0's ``record`` as ``path``/owned.json (checksummed); every rank gets it back."""
    error = None
    if comm.rank == 0:
        try:
            _write_json(os.path.join(path, OWNED), {**record, "crc32": json_crc32(record)})
        except OSError as exc:
            error = f"cannot write {os.path.join(path, OWNED)}: {exc.strerror}"
    agree_or_raise(comm, comm.bcast(error, root=0), RunDirError, first=True)
    return comm.bcast(record, root=0)


def _hosts(comm) -> list[str]:
    """The hosts ``comm``'s ranks run on, sorted (collective)."""
    return sorted(set(comm.allgather(socket.gethostname())))


def read_owned(path: str, comm) -> dict | None:
    """The record :func:`record_owned` wrote in ``path`` (None: none, or it fails its checksum)."""
    record = None
    if comm.rank == 0:
        try:
            with open(os.path.join(path, OWNED)) as f:
                record = json.load(f)
            body = {k: v for k, v in record.items() if k != "crc32"}
            record = body if record.get("crc32") == json_crc32(body) else None
        except (OSError, ValueError, AttributeError):
            record = None
    return comm.bcast(record, root=0)


def products_run_id(run_id: str) -> str:
    """The run id under which a run's Hessian products keep their node-local states (beside its
    evaluations' levels, so a resume finds and removes what a killed product left)."""
    return f"{run_id}-hv"


def remove_owned(comm, record: dict | None, local_dir: str | None = None, pfs_file: str | None = None) -> list[str]:
    """Remove what a killed process of the run in ``record`` left: its node-local snapshots (one
    rank per node, on the hosts this job runs on) and its HDF5 file (``local_dir``, ``pfs_file``:
    where a level of that run put them, by default the recorded ones; an HDF5 file that no longer
    opens is taken as the run's only where ``record`` claims the path). Collective; what went, and
    the recorded hosts this job cannot reach (their node-local files stay there), for a report."""
    if not record:
        return []
    notes, hosts, base = [], _hosts(comm), None
    for run_id in (record["run_id"], products_run_id(record["run_id"])):
        files, nbytes, where = purge_node_local(comm, local_dir or record.get("local_dir"), run_id)
        base = base or where
        if files:
            notes.append(f"removed {files} node-local snapshot file(s) ({nbytes / 2**20:.1f} MiB) a killed "
                         f"process left in {where} on {', '.join(hosts)}")
    note = remove_dead_file(comm, pfs_file or record.get("pfs_file"), record["run_id"],
                            claimed=record.get("pfs_file") is not None)
    notes += [note] if note else []
    unreachable = sorted(set(record.get("hosts") or []) - set(hosts))
    if unreachable:
        notes.append(f"could not reach {', '.join(unreachable)} (this job does not run there): node-local files "
                     f"of the run may remain in {base}* on {'it' if len(unreachable) == 1 else 'them'}; they block "
                     f"nothing, remove them there or leave them to the node's scratch clean-up")
    return notes


def _write_json(path: str, obj) -> None:
    """``obj`` as JSON at ``path``, synced and renamed into place; no temporary file left on failure."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def json_crc32(body: dict) -> int:
    """The CRC-32 of ``body``'s canonical JSON (sorted keys): what a durable JSON state carries."""
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())


def _load_manifest(path: str):
    """(manifest, None) when ``path`` holds a manifest whose checksum checks out, else (None, why)."""
    try:
        with open(path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return None, f"{path} does not exist"
    except (OSError, ValueError) as exc:
        return None, f"{path} is unreadable ({exc})"
    version = manifest.get("format") if isinstance(manifest, dict) else None
    if isinstance(version, int) and 0 < version < FORMAT:
        return None, (f"{path} was written by an older hpcadj (format {version}; this one reads format "
                      f"{FORMAT}): finish that run with the version that started it, or remove "
                      f"{os.path.dirname(path)} to start afresh")
    if version != FORMAT:
        return None, f"{path}: not an hpcadj manifest (format {FORMAT})"
    body = {k: v for k, v in manifest.items() if k != "crc32"}
    if manifest.get("crc32") != json_crc32(body):
        return None, f"{path} fails its checksum"
    return manifest, None

