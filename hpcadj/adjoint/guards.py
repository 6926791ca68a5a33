"""Cheap guards a run keeps on its model: a step that changed its input, and non-finite numbers.

A broken Stepper contract or an overflow must end a run with one line naming the step, never with
a plausible wrong gradient. Both errors are :class:`~hpcadj.models.base.SolverError` subclasses, so
every command reports them as its one error line with exit status 2, and a session that raises one
writes no gradient file. Each check is local (a CRC or ``np.isfinite`` over this rank's owned
blocks); the driver agrees on its outcome with one small reduction.
"""

from __future__ import annotations

import zlib

import numpy as np

from ..models.base import SolverError


class InputModified(SolverError):
    """``step()`` changed the state it was given (the stored checkpoint of u_i would change too)."""


class NonFinite(SolverError):
    """A state, lambda, the objective or the gradient holds inf or NaN."""


def local_blocks(stepper, state) -> list:
    """This rank's owned values of ``state``: the Vec's local array, else the model's snapshot."""
    get = getattr(state, "getArray", None)
    if callable(get):
        return [get(readonly=True)]
    return list(stepper.snapshot(state).values())


def checksum(stepper, state) -> int:
    """zlib.crc32 over this rank's owned blocks of ``state`` (no copy for contiguous blocks)."""
    crc = 0
    for block in local_blocks(stepper, state):
        crc = zlib.crc32(np.ascontiguousarray(block).view(np.uint8).reshape(-1), crc)
    return crc


def finite(arrays) -> bool:
    """Whether every value of ``arrays`` (numpy arrays or PETSc Vecs) is finite, on this rank."""
    for array in arrays:
        get = getattr(array, "getArray", None)
        values = get(readonly=True) if callable(get) else array
        if values.size and not np.isfinite(values).all():
            return False
    return True
