"""Import the MPI/PETSc/HDF5 stack the same way everywhere.

Debian's petsc4py finds PETSc through ``/usr/lib/petsc``, which only ``petsc-dev`` and
``scripts/setup.sh`` (run as root) create; without it we point ``PETSC_DIR`` at the newest installed
``/usr/lib/petscdir/petsc*/*-real`` holding petsc4py (found by glob, never a hard-coded version). Debian's h5py picks its MPI build only under mpirun unless
``H5PY_ALWAYS_USE_MPI`` is set, so we set it: the parallel HDF5 level needs the MPI build even on one
rank.
"""

from __future__ import annotations

import glob
import os
import re
import sys

os.environ.setdefault("H5PY_ALWAYS_USE_MPI", "1")
os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")

_petsc = None
#: options :func:`petsc` gave PETSc, with the values they replaced (None: unset)
_inserted: list[tuple[str, str | None]] = []


def _version(petsc_dir: str) -> tuple[int, ...]:
    """(3, 18) of ``/usr/lib/petscdir/petsc3.18/x86_64-linux-gnu-real``: 3.18 sorts after 3.9."""
    return tuple(int(part) for part in re.findall(r"\d+", petsc_dir.split("/")[4]))


def _debian_petsc_dir() -> str | None:
    candidates = [d for d in glob.glob("/usr/lib/petscdir/petsc[0-9]*/*-real")  # petsc64-*: 64-bit indices
                  if not d.startswith("/usr/lib/petscdir/petsc64-")
                  and os.path.isdir(os.path.join(d, "lib", "python3", "dist-packages", "petsc4py"))]
    return max(candidates, key=_version) if candidates else None


def petsc(options: list[str] | None = None):
    """Return ``petsc4py.PETSc``, initialised on first use with ``options`` (else ``sys.argv``).

    Once PETSc runs (an earlier command in this process, or a caller's own petsc4py), ``options``
    go into its options database instead. Either way :func:`clear_options` takes them out again.
    """
    global _petsc
    if _petsc is None and "petsc4py.PETSc" in sys.modules:  # initialised by whoever imported it
        mpi()
        _petsc = sys.modules["petsc4py.PETSc"]
    if _petsc is not None:
        if options:
            _insert_options(_petsc, options)
        return _petsc
    # MPI must be initialised by mpi4py (THREAD_MULTIPLE), not by PETSc (which asks for less):
    # the background HDF5 I/O thread needs it.
    mpi()
    try:
        import petsc4py
    except ImportError:
        petsc_dir = os.environ.get("PETSC_DIR") or _debian_petsc_dir()
        if petsc_dir is None:
            raise
        os.environ["PETSC_DIR"] = petsc_dir
        path = os.path.join(petsc_dir, "lib", "python3", "dist-packages")
        if path not in sys.path:
            sys.path.append(path)
        import petsc4py
    petsc4py.init(sys.argv if options is None else [sys.argv[0], *options])
    from petsc4py import PETSc

    _petsc = PETSc
    _inserted.extend((name, None) for name, _ in option_pairs(options or []))
    return PETSc


def option_pairs(options: list[str]) -> list[tuple[str, str | None]]:
    """``[("-ksp_type", "cg"), ("-log_view", None)]`` of a PETSc command line: a value follows its
    option unless it is an option itself (a negative number is a value)."""
    pairs: list[tuple[str, str | None]] = []
    for token in options:
        if token.startswith("-") and not is_number(token):
            pairs.append((token, None))
        elif pairs and pairs[-1][1] is None:
            pairs[-1] = (pairs[-1][0], token)
    return pairs


def _insert_options(PETSc, options: list[str]) -> None:
    """Set ``options`` in the running PETSc's database, remembering what each replaced."""
    database = PETSc.Options()
    for name, value in option_pairs(options):
        if not any(seen == name for seen, _ in _inserted):
            _inserted.append((name, database.getString(name) if database.hasName(name) else None))
        database.setValue(name, value)


def clear_options() -> None:
    """Take the options :func:`petsc` gave PETSc out again (earlier values restored), so the next
    command in this process starts from the options database it found."""
    if _petsc is None or _petsc.Sys.isFinalized():
        _inserted.clear()
        return
    database = _petsc.Options()
    while _inserted:
        name, previous = _inserted.pop()
        if previous is None:
            database.delValue(name)
        else:
            database.setValue(name, previous or None)


def finalize() -> None:
    """Collective: destroy what PETSc still holds, then finalise PETSc, alike on every rank.

    PetscFinalize runs the collective garbage cleanup of PETSC_COMM_WORLD only on a rank whose
    communicator still carries a garbage list; left to interpreter exit, whether it does depends on
    the order in which that rank's last PETSc objects die, and a rank that skipped it left the
    others waiting forever in MPI_Allreduce. Here every rank first collects reference cycles and
    cleans up, with one small object keeping the communicator (and so its garbage list) alive on
    every rank, so that PetscFinalize then takes the same path everywhere. Call it on the solver
    thread, on every rank, once the command is done; later PETSc calls are not allowed.
    """
    import gc

    if _petsc is None or _petsc.Sys.isFinalized():
        return
    PETSc = _petsc
    gc.collect()
    anchor = PETSc.Vec().createMPI(1 if PETSc.COMM_WORLD.rank == 0 else 0, comm=PETSc.COMM_WORLD)
    PETSc.garbage_cleanup(PETSc.COMM_WORLD)
    PETSc._finalize()
    del anchor


def is_number(token: str) -> bool:
    """Whether a command-line token is a number (``-3``, ``1e-8``): a PETSc option's value, never
    an option name, though it may start with a minus sign."""
    try:
        float(token)
    except ValueError:
        return False
    return True


def mpi():
    """Return ``mpi4py.MPI``."""
    from mpi4py import MPI

    return MPI


def h5py():
    """Return h5py, insisting on its MPI build (the parallel HDF5 level and gradient files need it)."""
    import h5py as _h5py

    if not _h5py.get_config().mpi:
        raise RuntimeError("h5py was not built with MPI support; install python3-h5py-mpi "
                           "or build h5py with HDF5_MPI=ON")
    return _h5py


def check() -> None:
    """Import every part of the stack and print one line of versions (used by ``make setup``)."""
    PETSc = petsc()
    MPI = mpi()
    h5 = h5py()
    import numpy

    print("stack: PETSc %d.%d.%d, %s, h5py %s (HDF5 %s, mpi), numpy %s, Python %s" % (
        *PETSc.Sys.getVersion(), MPI.Get_library_version().split(",")[0].strip(),
        h5.__version__, h5.version.hdf5_version, numpy.__version__, sys.version.split()[0]))
