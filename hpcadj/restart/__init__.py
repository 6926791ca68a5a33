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
- ``lock.json`` — while a run uses the directory: rank 0's host, pid, the pid's start time and the
  SLURM job id (:class:`RunLock`); a second run is refused, a lock left by a run that is gone (its
  pid gone or reused by another process) is taken over.

Every read is verified. A resume takes the newest durable point whose manifest and adjoint file
check out: the current generation, else the previous one, else the forward points, else a fresh
start. Each fallback is reported (``RunDirectory.faults``), so the gradient is bitwise the one an
uninterrupted run gives, or the run stops with a clear error, never a silently wrong one.

Durable points: in the forward sweep after a snapshot lands on a durable level (node-local or HDF5)
at the frontier — J so far is recorded with it; in the reverse sweep every ``every`` adjoint steps;
and whenever the run is asked to stop.

The package holds the run directory's format (:mod:`.rundir`, with its lock), what identifies a run
(:mod:`.identity`), when progress is made durable (:mod:`.durability`) and how a run resumes from
what it finds (:mod:`.resume`).
"""

from .durability import DEFAULT_MTBF_S, Durability, predicted_durable_seconds, young_daly_interval
from .identity import controls_fingerprint, trajectory_fingerprint
from .resume import resume_point
from .rundir import RunDirectory, RunDirError, RunLock

__all__ = ["DEFAULT_MTBF_S", "Durability", "RunDirError", "RunDirectory", "RunLock", "controls_fingerprint",
           "predicted_durable_seconds", "resume_point", "trajectory_fingerprint", "young_daly_interval"]
