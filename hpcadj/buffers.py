"""Memory a process's models hold between runs, and the call that gives it back.

Models recycle their output buffers in pools (``hpcadj.models.kernels.VecPool``), which register
here; :func:`release_idle_buffers` trims every pool and returns the heap's free pages, so that a
caller running one gradient session after another (an inversion, Hessian products) measures each
session's memory baseline without the last session's buffers. Imports nothing of hpcadj's: any
layer may call it.
"""

from __future__ import annotations

import weakref


def release_free_memory() -> None:
    """Give the heap's free pages back to the system (glibc ``malloc_trim``; elsewhere nothing).

    A model's construction makes full-size transients (coordinates, the true model, index maps
    for the halos) that glibc keeps resident once freed, as holes below live allocations: 2.5
    state-equivalents per rank for wave 128^3 on 2 ranks, counted in every later peak."""
    if _libc is not None:
        _libc.malloc_trim(0)


def _glibc():
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc if libc is not None and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_libc = _glibc()

#: every buffer pool alive in this process (weakly): objects with a ``trim() -> int`` method
_POOLS: weakref.WeakSet = weakref.WeakSet()


def register_pool(pool) -> None:
    """Let :func:`release_idle_buffers` trim ``pool`` (held weakly: a dropped pool leaves the set)."""
    _POOLS.add(pool)


def release_idle_buffers() -> int:
    """Trim every registered buffer pool in this process (each drops the buffers only it refers
    to) and give the heap's free pages back (:func:`release_free_memory`); the number of buffers
    dropped. Collective over nothing: what a rank holds is its own."""
    dropped = sum(pool.trim() for pool in list(_POOLS))
    release_free_memory()
    return dropped


#: idle buffers a pool keeps when memory is given back mid-run: the next steps' outputs
IDLE_KEPT = 2


def trim_idle_buffers(keep: int, but=None, data: bool = True) -> int:
    """Drop the idle buffers of every registered pool (except ``but``, and pools marked
    ``holds_data`` unless ``data``) beyond ``keep`` per pool (the next steps' outputs): a plan that
    stores steps' adjoint data where it held restart states earlier (or the reverse) would
    otherwise keep both memories. The number dropped."""
    return sum(pool.trim(keep) for pool in list(_POOLS)
               if pool is not but and (data or not getattr(pool, "holds_data", False)))
