"""Durable progress for restartable gradients: the run directory, its manifest and adjoint states.

A run directory holds:

- ``manifest.json`` — replaced atomically (write, fsync, rename) by rank 0 at every durable point:
  the run's identity (model, grid, steps, dt, ..., a fingerprint of the controls), a fingerprint of
  its trajectory (:func:`trajectory_fingerprint`: u_1, one adjoint step, the objective), the rank count,
  the level set-up (run id, node-local directory, HDF5 file), the last durable point, and which
  snapshots each durable level held, complete and verified, at that point. Its ``crc32`` field is
  the CRC-32 of the rest (canonical JSON); the generation it replaced stays as
  ``manifest.prev.json``.
- ``adjoint-<m>.h5`` — lambda_m and the parameter gradients accumulated down to step m, as global
  natural-ordered, checksummed datasets (parallel HDF5, written under a temporary name then
  renamed; :mod:`hpcadj.fieldio`), so a run can resume on a different number of ranks. The files
  named by the two manifest generations are kept, older ones removed.
- ``lock.json`` — while a run uses the directory: rank 0's host and pid and the SLURM job id
  (:class:`RunLock`); a second run is refused, a lock left by a run that is gone is taken over.

Every read is verified. A resume takes the newest durable point whose manifest and adjoint file
check out: the current generation, else the previous one, else the forward points, else a fresh
start. Each fallback is reported (``RunDirectory.faults``), so the gradient is bitwise the one an
uninterrupted run gives, or the run stops with a clear error, never a silently wrong one.

Durable points: in the forward sweep after a snapshot lands on a durable level (node-local or HDF5)
at the frontier — J so far is recorded with it; in the reverse sweep every ``every`` adjoint steps;
and whenever the run is asked to stop.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import time
import zlib

import numpy as np

from ..collective import agree_or_raise
from ..fieldio import CorruptFile, verify_fields, write_fields
from ..stack import h5py
from .driver import RunObserver

MANIFEST = "manifest.json"
PREVIOUS = "manifest.prev.json"
LOCK = "lock.json"
DURABLE_KINDS = ("local", "pfs")
FORMAT = 3
#: identity keys compared first, most basic first; the others follow in name order
IDENTITY_ORDER = ("model", "grid", "shape", "steps", "dt")
#: relative agreement of the trajectory fingerprint's sums on another rank count (rounding only)
TRAJECTORY_RTOL = 1e-8


class RunDirError(ValueError):
    """The run directory cannot be used: unwritable, from another configuration, or broken."""


def controls_fingerprint(model, controls, comm) -> list[float]:
    """Two numbers per control that do not depend on the rank layout (weighted by natural index)."""
    out = []
    layouts = model.control_layout()
    for name in sorted(controls):
        layout = layouts[name]
        values = controls[name].getArray(readonly=True).reshape(layout.shape)
        grids = np.meshgrid(*[np.arange(s, s + m) for s, m in zip(layout.start, layout.shape)], indexing="ij")
        natural = np.ravel_multi_index(grids, layout.global_shape) if values.size else np.zeros(values.shape)
        weights = np.sin(0.7 + 1.3 * natural)
        out.extend([comm.allreduce(float(values.sum())), comm.allreduce(float((values * weights).sum()))])
    return out


def _same_fingerprint(a, b) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-12 * max(1.0, abs(x), abs(y)) for x, y in zip(a, b))


def _natural_index(layout) -> np.ndarray:
    """The natural (global, C-order) index of every point of this rank's block, as float64 (one
    block-sized array: the axes' offsets are broadcast, not expanded)."""
    out = np.zeros(layout.shape, dtype=np.float64)
    stride = 1
    for axis in reversed(range(len(layout.shape))):
        shape = [1] * len(layout.shape)
        shape[axis] = layout.shape[axis]
        start = layout.start[axis]
        out += (np.arange(start, start + layout.shape[axis], dtype=np.float64) * stride).reshape(shape)
        stride *= layout.global_shape[axis]
    return out


def _field_print(arrays: dict, layouts: dict, comm) -> dict:
    """A fingerprint of distributed fields: per field, the CRC-32 of every rank's block in rank order
    (bitwise, for the same rank count) and three sums that do not depend on the rank layout
    (sum |x| and two weighted sums, for another rank count, compared to rounding)."""
    out = {}
    for name in sorted(layouts):
        values = np.asarray(arrays[name]).reshape(layouts[name].shape)
        x = values.astype(np.float64, copy=False)
        natural = _natural_index(layouts[name])
        weights = np.sin(0.7 + 1.3 * natural)
        local = [np.abs(x).sum(), np.vdot(x, weights)]
        np.cos(0.2 + 0.9 * natural, out=weights)
        local = np.array(local + [np.vdot(x, weights)])
        crcs = comm.allgather(zlib.crc32(np.ascontiguousarray(values).tobytes()))
        out[name] = {"crc32": zlib.crc32(np.asarray(crcs, dtype=np.uint32).tobytes()),
                     "sums": [float(v) for v in comm.allreduce(local)]}
    return out


def _probe_state(model):
    """A state with fixed values given by the natural index (the same field on any rank count)."""
    blocks = {}
    for name, layout in model.snapshot_layout().items():
        blocks[name] = np.sin(0.3 + 0.77 * _natural_index(layout)).astype(layout.dtype, copy=False)
    return model.restore(blocks)


def trajectory_fingerprint(model, controls, comm) -> dict:
    """What the run's first step and one adjoint step give, to recognise the run on resume.

    ``describe()`` lists what its author thought of; a setting it leaves out (a velocity, a rate
    constant) still changes the trajectory. So at creation and on every resume the model takes
    u_1 = step(0, u_0) from the controls, one adjoint step lambda_0 = adjoint_step(0, u_0, u_1, w)
    from a fixed field w (with the parameter gradient it adds), and the objective at u_0 and u_1
    (as state 1 and as state n): one forward and one adjoint step each time. A model with adaptive
    steps gets its step record back as it was (the first sweep decides it). Collective.
    """
    record = getattr(model, "step_record", lambda: None)()
    model.set_controls(controls)
    u0 = model.initial_state()
    u1 = model.step(0, u0)
    n = model.n_steps
    objective = [float(model.objective(0, u0)), float(model.objective(1, u1))]
    if n is not None and n > 1:
        objective.append(float(model.objective(n, u1)))
    grad = {name: vec.duplicate() for name, vec in controls.items()}
    for vec in grad.values():
        vec.set(0.0)
    probe = _probe_state(model)
    lam0 = model.adjoint_step(0, u0, u1 if getattr(model, "adjoint_reads_next", True) else None, probe, grad)
    layouts = model.snapshot_layout()
    out = {"u1": _field_print(model.snapshot(u1), layouts, comm),
           "lambda0": _field_print(model.snapshot(lam0), layouts, comm),
           "grad": _field_print(model.control_arrays(grad), model.control_layout(), comm),
           "objective": objective}
    if record is not None:
        model.load_step_record(record)
    return out  # the Vecs go with their references (a model may hand out one it keeps, e.g. u_0)


#: what each part of the trajectory fingerprint is, for the refusal
_TRAJECTORY_PARTS = (("u1", "its first step u_1 = step(0, u_0) differs"),
                     ("lambda0", "its adjoint step differs"),
                     ("grad", "its parameter gradient from one adjoint step differs"),
                     ("objective", "its objective differs"))


def _trajectory_mismatch(saved: dict, now: dict, same_ranks: bool) -> str | None:
    """Which part of the trajectory fingerprint differs (None: none): bitwise on the same rank count,
    to rounding (TRAJECTORY_RTOL of sum |x|) on another."""
    def close(a, b, scale):
        return a == b or abs(a - b) <= TRAJECTORY_RTOL * scale

    for part, what in _TRAJECTORY_PARTS:
        a, b = saved.get(part), now.get(part)
        if part == "objective":
            same = len(a) == len(b) and all(
                (x == y) if same_ranks else close(x, y, max(abs(x), abs(y), 1e-300)) for x, y in zip(a, b))
        elif set(a) != set(b):
            same = False
        elif same_ranks:
            same = all(a[k]["crc32"] == b[k]["crc32"] for k in a)
        else:
            same = all(all(close(x, y, max(a[k]["sums"][0], b[k]["sums"][0], 1e-300))
                           for x, y in zip(a[k]["sums"], b[k]["sums"])) for k in a)
        if not same:
            return what
    return None


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
    """One run at a time in a run directory: ``lock.json`` with rank 0's host, pid and SLURM job.

    Rank 0 creates it atomically (written beside, then hard-linked into place, which fails if it
    exists) and every rank learns the outcome. A lock is taken over when the run that left it is
    gone: on this host its pid no longer exists; on another host its SLURM job is this job at an
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
        return {"host": socket.gethostname(), "pid": os.getpid(), "job": os.environ.get("SLURM_JOB_ID"),
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
                why_gone = self._gone(holder, me)
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
        self.save()

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

    def check_trajectory(self, trajectory: dict) -> None:
        """RunDirError on every rank when this run's :func:`trajectory_fingerprint` is not the recorded one."""
        saved = self.manifest.get("trajectory") or {}
        why = _trajectory_mismatch(saved, trajectory, self.manifest["ranks"] == self.comm.size)
        if why is not None:
            why = (f"run directory {self.path} belongs to another configuration: {why} (a setting the "
                   f"model's describe() does not list, e.g. a coefficient or a velocity, is not the "
                   f"run's): resume with the run's settings, or use another run directory")
        self._agree_error(why)

    def open(self, identity: dict) -> dict:
        """Load the manifest of the run to resume; refuse one from another configuration.

        A manifest failing its checksum gives way to the previous generation (reported in
        ``faults``); when neither checks out the run cannot resume, and says so.
        """
        error, found, faults = None, (None, None), []
        if self.comm.rank == 0:
            current, why = _load_manifest(self.manifest_path)
            previous, why_prev = _load_manifest(self.previous_path)
            if current is None and previous is None:
                if why.endswith("does not exist") and why_prev.endswith("does not exist"):
                    error = f"nothing to resume: {self.manifest_path} does not exist"
                elif "older hpcadj" in why:
                    error = why
                else:
                    error = (f"cannot resume from {self.path}: {why}; {why_prev}; remove the "
                             f"directory to start afresh")
            elif current is None:
                faults.append(f"{why}: resuming from the previous generation {PREVIOUS}")
                current, previous = previous, None
            if error is None:
                error = self._identity_mismatch(current["identity"], identity)
            found = (current, previous)
        self._agree_error(self.comm.bcast(error, root=0))
        self.manifest, self.previous = self.comm.bcast(found, root=0)
        self.faults += self.comm.bcast(faults, root=0)
        return self.manifest

    @staticmethod
    def _identity_mismatch(saved: dict, current: dict) -> str | None:
        """The most basic difference first: model, grid/shape, steps, dt, then the rest by name."""
        keys = (set(saved) | set(current)) - {"controls"}
        ordered = [k for k in IDENTITY_ORDER if k in keys] + sorted(keys - set(IDENTITY_ORDER))
        for key in ordered:
            if saved.get(key) != current.get(key):
                return (f"run directory belongs to another configuration: {key} was "
                        f"{saved.get(key)!r}, now {current.get(key)!r}")
        if not _same_fingerprint(saved.get("controls", []), current.get("controls", [])):
            return "run directory belongs to another configuration: the controls differ"
        return None

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
                    json.dump({**body, "crc32": _manifest_crc(body)}, f, indent=1)
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


#: the mean time between failures ``--durable-interval auto`` assumes for a job (seconds)
DEFAULT_MTBF_S = 4 * 3600.0


def young_daly_interval(cost_s: float, mtbf_s: float = DEFAULT_MTBF_S) -> float:
    """Young's optimal checkpoint interval sqrt(2 C M) for a durable point costing ``cost_s``."""
    return (2.0 * max(cost_s, 1e-6) * mtbf_s) ** 0.5


def predicted_durable_seconds(schedule, plans, profile, every: int, interval: float | None,
                              makespan_s: float, mtbf_s: float = DEFAULT_MTBF_S) -> float:
    """What making progress durable adds to a plan's predicted makespan (seconds).

    Counts the durable points the plan triggers: every ``every``-th store on a node-local or HDF5
    level at the first sweep's frontier, one every ``every`` adjoint steps, and one per ``interval``
    of ``makespan_s`` (Young's interval for ``None``). Each costs a write and a read-back (the
    checksums) of one snapshot on the dearest durable level of ``profile``, the HDF5 one when present.
    """
    from ..checkpoint.schedules.actions import Advance, EndForward, Store

    kinds = [p.kind for p in plans]
    costs = {lv.name: lv for lv in profile.levels}
    durable = [costs[p.name] for p in plans if p.kind in DURABLE_KINDS and p.name in costs]
    point_s = max((lv.write_s + lv.read_s for lv in durable), default=0.0)
    frontier, stores = 0, 0
    for action in schedule.actions():
        if isinstance(action, EndForward):
            break
        if isinstance(action, Advance):
            frontier = max(frontier, action.n1)
        elif isinstance(action, Store) and action.n == frontier and kinds[action.level] in DURABLE_KINDS:
            stores += 1
    step_points = stores // max(1, every) + schedule.n_steps // max(1, every)
    seconds = interval if interval is not None else young_daly_interval(point_s, mtbf_s)
    timed_points = int(makespan_s // seconds) if seconds > 0 else 0
    return (step_points + timed_points) * point_s


class Durability(RunObserver):
    """The driver's durability observer: records durable points in the run directory.

    Forward sweep: J is remembered for each snapshot stored on a durable level at the frontier;
    every ``every`` such stores (and at a stop) the durable levels are flushed and the manifest
    lists the snapshots and J at each. Besides, once ``interval`` seconds have passed since the
    last durable point, the state at the frontier itself is written to ``forward-<k>.h5`` (a
    plan whose stores near the frontier all go to RAM otherwise left a kill late in the sweep to
    redo most of it). ``interval=None`` is Young's interval sqrt(2 C M) from the measured cost C
    of a durable point and ``mtbf_s`` M. Reverse sweep: every ``every`` adjoint steps, or
    ``interval`` seconds, lambda and the gradient so far are written, then the manifest.
    ``seconds`` and ``points`` say what durability cost.
    """

    def __init__(self, rundir: RunDirectory, model, levels, every: int = 10,
                 interval: float | None = None, mtbf_s: float = DEFAULT_MTBF_S):
        self.rundir = rundir
        self.model = model
        self.levels = levels
        self.every = max(1, int(every))
        self.fixed_interval = interval
        self.mtbf_s = float(mtbf_s)
        self.seconds = 0.0
        self.points = 0
        self._cost = None
        self._last = time.perf_counter()
        self._since = 0
        self._forward_J: dict[int, float] = {}

    @property
    def interval(self) -> float:
        """Seconds between time-driven durable points (Young's interval until one was measured:
        the first comes after a minute)."""
        if self.fixed_interval is not None:
            return self.fixed_interval
        return 60.0 if self._cost is None else young_daly_interval(self._cost, self.mtbf_s)

    def _due(self) -> bool:
        """Whether the interval has passed, agreed by rank 0's clock (every rank acts alike)."""
        due = time.perf_counter() - self._last >= self.interval
        return bool(self.rundir.comm.bcast(due, root=0))

    def _timed(self, fn) -> None:
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        self._cost = t1 - t0
        self.seconds += self._cost
        self.points += 1
        self._last = t1

    def _durable_snapshots(self) -> dict:
        """Flush the durable levels and list their complete snapshots (the same on every rank)."""
        from ..checkpoint.storage.base import LevelError
        from ..checkpoint.storage.survey import survey

        out = {}
        for level in self.levels:
            if level.kind in DURABLE_KINDS:
                left, = survey([level], self.rundir.comm, discard=False)
                if left.failed:
                    # every rank leaves together; the driver re-plans around the failed level
                    raise left.error or LevelError(f"{level.name}: a write failed on another rank")
                out[level.name] = sorted(left.steps)
        return out

    def _record(self, durable: dict) -> None:
        m = self.rundir.manifest
        m["snapshots"] = self._durable_snapshots()
        stored = {step for steps in m["snapshots"].values() for step in steps}
        m["forward_points"] = {str(step): J for step, J in self._forward_J.items() if step in stored}
        m["durable"] = durable
        record = getattr(self.model, "step_record", lambda: None)()
        if record is not None:  # adaptive steps: the accepted dt sequence so far, replayed on resume
            m["adaptive_steps"] = record
        self.rundir.save()

    def stored(self, step: int, level, J: float) -> None:
        """After a store at the frontier: a durable point every ``every`` durable stores."""
        self._forward_J[step] = J  # kept for any level: a Move may carry the snapshot to a durable one
        if level.kind not in DURABLE_KINDS:
            return
        self._since += 1
        if self._since >= self.every:
            self._since = 0
            self._timed(lambda: self._record({"phase": "forward"}))

    def moved(self, step: int, level) -> None:
        """A first-sweep snapshot moved to ``level`` (online multi-level plans store fast, then move
        down): a durable store like :meth:`stored` when it lands on a durable level."""
        if level.kind in DURABLE_KINDS and step in self._forward_J:
            self.stored(step, level, self._forward_J[step])

    def advanced(self, step: int, state, J: float) -> None:
        """After a first-sweep Advance: the frontier state made durable once the interval passed."""
        n = self.model.n_steps  # None while adaptive steps have not reached t_final
        if (n is not None and step >= n) or not self._due():
            return

        def write():
            name = self.rundir.write_state(self.model, step, state, J)
            self._record({"phase": "forward", "forward": name, "frontier": step, "J": J})

        self._timed(write)

    def adjoint(self, step: int, lam, grad: dict, J: float, force: bool = False) -> None:
        """After an adjoint step: lambda and the gradient so far, every ``every`` steps or interval."""
        self._since += 1
        if not force and self._since < self.every and step != 0 and not self._due():
            return
        self._since = 0

        def write():
            name = self.rundir.write_adjoint(self.model, step, lam, grad)
            self._record({"phase": "reverse", "J": J, "lam_step": step, "adjoint": name})

        self._timed(write)

    def stopping(self, step: int | None, lam, grad: dict, J: float) -> None:
        """Make everything durable before a requested stop."""
        if step is not None:
            self.adjoint(step, lam, grad, J, force=True)
        else:
            self._record({"phase": "forward"})
        self.rundir.manifest["status"] = "stopped"
        self.rundir.save()

    def finished(self) -> None:
        self.rundir.manifest["status"] = "complete"
        self.rundir.save()


def resume_point(rundir: RunDirectory, model, controls, levels, costs=None, online=None):
    """The residual plan and :class:`ResumePoint` that continue the run recorded in ``rundir``.

    ``levels`` are the run's levels reopened on their existing snapshots; every snapshot not used
    (not listed durable in the manifest, not valid on every rank, or beyond the resume point) is
    discarded from them. Returns ``(plan, point)``; ``point`` is None when nothing durable exists
    (the run starts over with its ordinary plan). ``online`` is the run's online plan
    (:class:`~hpcadj.checkpoint.schedules.online_plans.OnlinePlan`): a first sweep of unknown length
    continues with its residual (:meth:`OnlinePlan.resumed`).
    """
    from ..checkpoint.schedules.resume import Residual
    from ..checkpoint.storage.survey import survey
    from .driver import ResumePoint

    manifest = rundir.manifest
    record = manifest.get("adaptive_steps")
    if record is not None and hasattr(model, "load_step_record"):
        model.load_step_record(record)  # replay the accepted steps exactly
    n = model.n_steps  # None: adaptive steps not yet at t_final, the first sweep continues online
    generations = [m for m in (manifest, rundir.previous) if m is not None]
    listed = [{step for m in generations for step in m.get("snapshots", {}).get(level.name, [])}
              for level in levels]
    valid = {}
    for index, left in enumerate(survey(levels, rundir.comm, flush=False, listed=listed, discard=False)):
        for step in left.steps:
            valid.setdefault(step, index)
    point = _reverse_point(rundir, model, controls, generations, n)
    if point is not None:
        top = point.lam_step
    else:
        forward = {}
        for m in reversed(generations):  # the current generation's J wins where both list a step
            forward.update({int(k): J for k, J in m.get("forward_points", {}).items() if int(k) in valid})
        frontier = _forward_file_point(rundir, model, generations, levels, valid)
        if frontier is not None and frontier[0] > max(forward, default=-1):
            s, J, index = frontier
            valid[s] = index
            forward[s] = J
        if forward:
            s = max(forward)
            point = ResumePoint(frontier=s, J=forward[s])
            top = s + 1
    keep = {step: index for step, index in valid.items() if point is not None and step < top}
    for index, level in enumerate(levels):
        for step in sorted(level.valid_steps()):
            if keep.get(step) != index:
                level.discard(step)
    if point is None:
        return None, None
    capacities = [level.capacity for level in levels]
    if n is None:
        if online is None:
            raise RunDirError("this run's step count is unknown until it ends (adaptive steps): "
                              "resume it with --schedule online")
        return online.resumed(capacities, keep, costs=costs), point
    return Residual(n, capacities, keep, lam_step=point.lam_step, costs=costs), point


def _verified(rundir: RunDirectory, generations, file_key: str, step_key: str, read, what: str):
    """Yield ``(durable, step, payload)`` for each generation, newest first, whose durable point names
    a ``file_key`` file that ``read(name) -> (step, *payload)`` verifies and whose step is the one the
    manifest records under ``step_key``; each that does not check out is reported in ``rundir.faults``."""
    for m in generations:
        durable = m.get("durable") or {}
        name = durable.get(file_key)
        if not name:
            continue
        try:
            step, *payload = read(name)
            if step != durable.get(step_key):
                raise CorruptFile(f"{name} holds step {step}, the manifest says {durable.get(step_key)}")
        except (CorruptFile, OSError, KeyError) as exc:
            rundir.faults.append(f"durable {what} state of step {durable.get(step_key)} unusable "
                                 f"({exc}): falling back to an older durable point")
            continue
        yield durable, step, payload


def _reverse_point(rundir: RunDirectory, model, controls, generations, n: int):
    """The newest reverse-sweep durable point whose adjoint file checks out, else None."""
    from .driver import ResumePoint

    for durable, lam_step, (lam, grad) in _verified(
            rundir, generations, "adjoint", "lam_step",
            lambda name: rundir.read_adjoint(model, controls, name), "adjoint"):
        return ResumePoint(frontier=n, J=durable["J"], lam_step=lam_step, lam=lam, grad=grad)
    return None


def _manifest_crc(body: dict) -> int:
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
    if manifest.get("crc32") != _manifest_crc(body):
        return None, f"{path} fails its checksum"
    return manifest, None


def _forward_file_point(rundir: RunDirectory, model, generations, levels, valid):
    """The newest forward state written at an interval that checks out, placed in a level slot.

    Returns ``(step, J, level index)`` or None. The state goes into the level with the most free
    slots (those not taken by ``valid`` snapshots), so the residual plan can restore it.
    """
    from ..checkpoint.storage.base import LevelError

    for durable, step, (snapshot,) in _verified(rundir, generations, "forward", "frontier",
                                                lambda name: rundir.read_state(model, name), "forward"):
        free = [level.capacity - sum(1 for i in valid.values() if i == index)
                for index, level in enumerate(levels)]
        index = max(range(len(levels)), key=lambda i: (free[i], -i))
        if free[index] < 1 or step in valid:
            return None
        try:
            levels[index].write(step, snapshot)
            levels[index].flush()
        except LevelError as exc:
            rundir.faults.append(f"durable forward state of step {step} could not be placed ({exc})")
            return None
        return step, durable["J"], index
    return None
