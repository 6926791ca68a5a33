"""The few PETSc C functions petsc4py 3.18 does not wrap, called through ctypes on ``obj.handle``.

The library is the ``libpetsc*`` this process already loaded (found in ``/proc/self/maps``, so no
soname or version is written here); PetscInt's size comes from ``PETSc.IntType``.
"""

from __future__ import annotations

import ctypes
import functools

from ..imports import petsc


@functools.lru_cache(maxsize=None)
def _lib():
    petsc()  # loads the library
    paths = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and "/libpetsc" in fields[-1] and fields[-1] not in paths:
                paths.append(fields[-1])
    if not paths:
        raise RuntimeError("cannot find the PETSc library this process loaded (no libpetsc in /proc/self/maps)")
    return ctypes.CDLL(paths[0])


@functools.lru_cache(maxsize=None)
def _int_type():
    import numpy as np

    return ctypes.c_int64 if np.dtype(petsc().IntType).itemsize == 8 else ctypes.c_int32


def _call(name: str, *args) -> None:
    code = getattr(_lib(), name)(*args)
    if code:
        raise RuntimeError(f"PETSc {name} failed with error code {code}")


def _h(obj) -> ctypes.c_void_p:
    return ctypes.c_void_p(obj.handle)


def stage_handles(ts) -> list[int]:
    """TSGetStages: the C handles of the method's stage Vecs (the TS owns them)."""
    n = _int_type()()
    vecs = ctypes.POINTER(ctypes.c_void_p)()
    _call("TSGetStages", _h(ts), ctypes.byref(n), ctypes.byref(vecs))
    return [vecs[k] for k in range(n.value)]


def vec_copy_into(src, dst_handle: int) -> None:
    """VecCopy from a petsc4py Vec into a Vec known by its C handle."""
    _call("VecCopy", _h(src), ctypes.c_void_p(dst_handle))


def _trajectory(ts) -> ctypes.c_void_p:
    tj = ctypes.c_void_p()
    _call("TSGetTrajectory", _h(ts), ctypes.byref(tj))
    return tj


def use_memory_trajectory(ts) -> None:
    """Give ``ts`` a trajectory of type 'memory' (creates no directory; ``TSStep`` never fills it).

    ``TSAdjointStep`` needs a trajectory object; PETSc's default, 'basic', makes an empty
    ``TS-data-XXXXXX`` directory in the working directory at set-up, removed only by ``TSDestroy``
    (never, for a TS alive at exit). A trajectory the TS already had is destroyed and made anew
    (which removes a basic one's directory) before its type is set.
    """
    ts.setSaveTrajectory()
    kind = ctypes.c_char_p()
    _call("TSTrajectoryGetType", _trajectory(ts), _h(ts), ctypes.byref(kind))
    if kind.value == b"memory":
        return
    if kind.value:
        _call("TSResetTrajectory", _h(ts))
    _call("TSTrajectorySetType", _trajectory(ts), _h(ts), ctypes.c_char_p(b"memory"))


def _adapt(ts) -> ctypes.c_void_p:
    adapt = ctypes.c_void_p()
    _call("TSGetAdapt", _h(ts), ctypes.byref(adapt))
    return adapt


def adapt_type(ts) -> str:
    """The TSAdapt's type name ('none', 'basic', ...)."""
    name = ctypes.c_char_p()
    _call("TSAdaptGetType", _adapt(ts), ctypes.byref(name))
    return (name.value or b"").decode()


def set_always_accept(ts, flag: bool) -> None:
    """TSAdaptSetAlwaysAccept: accept every step at the dt it was given (replays)."""
    _call("TSAdaptSetAlwaysAccept", _adapt(ts), ctypes.c_int(1 if flag else 0))


def rk_weights(ts) -> list[float]:
    """The b weights of the TS's RK tableau (TSRKGetTableau)."""
    s = _int_type()()
    b = ctypes.POINTER(ctypes.c_double)()
    a, c, e, bi = (ctypes.POINTER(ctypes.c_double)() for _ in range(4))
    p, fsal = _int_type()(), ctypes.c_int()
    _call("TSRKGetTableau", _h(ts), ctypes.byref(s), ctypes.byref(a), ctypes.byref(b), ctypes.byref(c),
          ctypes.byref(e), ctypes.byref(p), ctypes.byref(bi), ctypes.byref(fsal))
    return [b[k] for k in range(s.value)]


#: MatInfo: ten PetscLogDoubles (block_size, nz_allocated, nz_used, ...); MAT_LOCAL is 1
_MATINFO_DOUBLES, _MAT_LOCAL = 10, 1


def mat_local_bytes(handle: int) -> int:
    """Bytes a matrix holds on this rank: its allocated nonzeros (value and column index) and row arrays."""
    if not handle:
        return 0
    info = (ctypes.c_double * _MATINFO_DOUBLES)()
    _call("MatGetInfo", ctypes.c_void_p(handle), ctypes.c_int(_MAT_LOCAL), info)
    rows, cols = _int_type()(), _int_type()()
    _call("MatGetLocalSize", ctypes.c_void_p(handle), ctypes.byref(rows), ctypes.byref(cols))
    index = ctypes.sizeof(_int_type())
    return int(info[1] * (8 + index) + 3 * rows.value * index)


def rhs_jacobian_p(ts) -> int:
    """The C handle of the TS's RHSJacobianP matrix (TSGetRHSJacobianP), 0 if none."""
    mat = ctypes.c_void_p()
    _call("TSGetRHSJacobianP", _h(ts), ctypes.byref(mat), None, None)
    return mat.value or 0


def gmres_restart(ksp) -> int:
    """KSPGMRESGetRestart: the Krylov vectors a GMRES KSP allocates at most."""
    restart = _int_type()()
    _call("KSPGMRESGetRestart", _h(ksp), ctypes.byref(restart))
    return int(restart.value)


def vec_copy_into_vec(src_handle: int, dst) -> None:
    """VecCopy from a Vec known by its C handle into a petsc4py Vec."""
    _call("VecCopy", ctypes.c_void_p(src_handle), _h(dst))


def mat_columns(handle: int) -> tuple[int, int]:
    """A matrix's global and local (this rank's) number of columns."""
    rows, cols, lrows, lcols = (_int_type()() for _ in range(4))
    _call("MatGetSize", ctypes.c_void_p(handle), ctypes.byref(rows), ctypes.byref(cols))
    _call("MatGetLocalSize", ctypes.c_void_p(handle), ctypes.byref(lrows), ctypes.byref(lcols))
    return int(cols.value), int(lcols.value)


def adapt_step_limits(ts) -> tuple[float, float]:
    """TSAdaptGetStepLimits: the TSAdapt's smallest and largest step (-ts_adapt_dt_min/max)."""
    low, high = ctypes.c_double(), ctypes.c_double()
    _call("TSAdaptGetStepLimits", _adapt(ts), ctypes.byref(low), ctypes.byref(high))
    return float(low.value), float(high.value)


def _two_reals(name: str, ts) -> tuple[float, float]:
    a, b = ctypes.c_double(), ctypes.c_double()
    _call(name, _adapt(ts), ctypes.byref(a), ctypes.byref(b))
    return float(a.value), float(b.value)


def _one_real(name: str, ts) -> float:
    a = ctypes.c_double()
    _call(name, _adapt(ts), ctypes.byref(a))
    return float(a.value)


def adapt_settings(ts) -> dict:
    """What the TSAdapt decides a step with, from its getters: safety factors, clip, step limits,
    the error ratio it ignores below and the shrink after a failed solve."""
    safety, reject_safety = _two_reals("TSAdaptGetSafety", ts)
    clip_low, clip_high = _two_reals("TSAdaptGetClip", ts)
    dt_min, dt_max = adapt_step_limits(ts)
    return {"type": adapt_type(ts), "safety": safety, "reject_safety": reject_safety, "clip": [clip_low, clip_high],
            "dt_min": dt_min, "dt_max": dt_max, "max_ignore": _one_real("TSAdaptGetMaxIgnore", ts),
            "scale_solve_failed": _one_real("TSAdaptGetScaleSolveFailed", ts)}


def rk_stages_read(ts) -> int:
    """How many of an RK tableau's stages ``TSAdjointStep_RK`` reads: all s, or s - 1 for a tableau
    with the FSAL property (its adjoint skips the last stage, which equals u_{i+1})."""
    s = _int_type()()
    fsal = ctypes.c_int()
    _call("TSRKGetTableau", _h(ts), ctypes.byref(s), None, None, None, None, None, None, ctypes.byref(fsal))
    return int(s.value) - (1 if fsal.value else 0)


def _local_size(handle) -> int:
    n = _int_type()()
    _call("VecGetLocalSize", handle, ctypes.byref(n))
    return int(n.value)


def stage_arrays(ts, count: int) -> list:
    """Copies of this rank's entries of the TS's first ``count`` stage Vecs (TSGetStages): one
    ``VecGetArrayRead`` and one copy each."""
    import numpy as np

    dtype = np.dtype(petsc().ScalarType)
    handles = stage_handles(ts)[:count]
    n = _local_size(ctypes.c_void_p(handles[0])) if handles else 0  # stages are duplicates of one Vec
    out = []
    ptr = ctypes.c_void_p()
    for handle in handles:
        vec = ctypes.c_void_p(handle)
        _call("VecGetArrayRead", vec, ctypes.byref(ptr))
        try:
            if n and not ptr.value:
                raise RuntimeError("PETSc VecGetArrayRead gave no array for a stage Vec with entries")
            out.append(np.frombuffer((ctypes.c_char * (n * dtype.itemsize)).from_address(ptr.value), dtype).copy()
                       if n else np.empty(0, dtype))
        finally:
            _call("VecRestoreArrayRead", vec, ctypes.byref(ptr))
    return out


def place_stages(ts, arrays) -> list[int]:
    """``VecPlaceArray`` the arrays (this rank's entries, contiguous, of the scalar type and the stage's
    local size; the caller keeps them alive) into the TS's first stage Vecs: no copy. Returns the handles
    placed, for :func:`reset_stages` right after the step that reads them."""
    handles = stage_handles(ts)
    if len(arrays) > len(handles):
        raise RuntimeError(f"{len(arrays)} stages given, the TS has {len(handles)}")
    placed = []
    n = _local_size(ctypes.c_void_p(handles[0])) if arrays else 0  # stages are duplicates of one Vec
    try:
        for handle, array in zip(handles, arrays):
            if array.size != n or not array.flags.c_contiguous:
                raise RuntimeError(f"a stage of {array.size} entries on this rank for a stage Vec of {n}")
            _call("VecPlaceArray", ctypes.c_void_p(handle), ctypes.c_void_p(array.ctypes.data))
            placed.append(handle)
    except BaseException:
        reset_stages(placed)
        raise
    return placed


def reset_stages(handles) -> None:
    """``VecResetArray``: the stage Vecs get their own arrays back (after :func:`place_stages`)."""
    for handle in handles:
        _call("VecResetArray", ctypes.c_void_p(handle))
