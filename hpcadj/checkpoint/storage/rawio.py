"""Raw positional I/O of a rank's block inside a contiguous, C-ordered dataset of a shared file.

A rank's block of a global array is a sequence of contiguous byte runs in the file. ``os.pwrite``
and ``os.preadv`` move them without the GIL and without MPI, so an I/O thread can move snapshot data
while the solver thread runs collective MPI calls (see :mod:`.pfs_async`).
"""

from __future__ import annotations

import os

import numpy as np


def file_runs(global_shape, start, shape, itemsize: int, offset: int = 0) -> list[tuple[int, int]]:
    """(file offset, nbytes) of every contiguous run of a block, in the block's C order.

    ``offset`` is where the dataset's data begins in the file. The runs concatenated are the
    block's bytes in C order, so a C-contiguous block maps onto them in one pass.
    """
    global_shape, start, shape = tuple(global_shape), tuple(start), tuple(shape)
    if 0 in shape:
        return []
    partial = [k for k in range(len(shape)) if shape[k] != global_shape[k]]
    if not partial:
        return [(offset, int(np.prod(shape)) * itemsize)]
    k = partial[-1]
    run = int(np.prod(shape[k:])) * itemsize  # axes after k are whole: one run per leading index
    tail = (start[k],) + (0,) * (len(shape) - k - 1)
    runs = []
    for index in np.ndindex(*shape[:k]):
        first = tuple(s + i for s, i in zip(start, index)) + tail
        runs.append((offset + int(np.ravel_multi_index(first, global_shape)) * itemsize, run))
    merged = [runs[0]]
    for off, n in runs[1:]:
        last_off, last_n = merged[-1]
        if last_off + last_n == off:
            merged[-1] = (last_off, last_n + n)
        else:
            merged.append((off, n))
    return merged


def write_runs(fd: int, block: np.ndarray, runs) -> None:
    """Write C-contiguous ``block`` to ``runs`` of ``fd`` (short writes continued)."""
    data = memoryview(np.ascontiguousarray(block).reshape(-1).view(np.uint8))
    pos = 0
    for off, n in runs:
        done = 0
        while done < n:
            done += os.pwrite(fd, data[pos + done:pos + n], off + done)
        pos += n


def read_runs(fd: int, block: np.ndarray, runs) -> None:
    """Fill C-contiguous ``block`` from ``runs`` of ``fd``; EOFError if the file ends early."""
    data = memoryview(block.reshape(-1).view(np.uint8))
    pos = 0
    for off, n in runs:
        done = 0
        while done < n:
            got = os.preadv(fd, [data[pos + done:pos + n]], off + done)
            if got == 0:
                raise EOFError(f"file ends at byte {off + done}, the block needs {off + n}")
            done += got
        pos += n


class RawFile:
    """A shared file opened for positional I/O of this rank's blocks: no MPI, no HDF5, so an I/O
    thread may use it while the solver thread runs collective calls. OSError if it cannot be opened."""

    def __init__(self, path: str):
        self.path = path
        self.fd: int | None = os.open(path, os.O_RDWR)

    def write_block(self, block: np.ndarray, runs) -> None:
        """Write this rank's block of one field (a hook fault-injection tests replace)."""
        write_runs(self.fd, block, runs)

    def read_block(self, block: np.ndarray, runs) -> None:
        read_runs(self.fd, block, runs)

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
