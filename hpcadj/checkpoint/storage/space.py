"""Room on the file system before HDF5 writes: a full file system becomes a clean, agreed refusal.

Parallel HDF5 cannot survive a write failing on one rank only: after ENOSPC inside a collective
write, a metadata flush or a close, one rank leaves the call while another waits in its barrier,
forever. So the blocks an HDF5 operation will write are allocated first (``posix_fallocate``, a
plain file call on one rank whose outcome the caller agrees on): when the file system is full the
reservation fails before any HDF5 call, and every rank takes the same decision. Writes into
allocated blocks cannot fail for lack of space.
"""

from __future__ import annotations

import errno
import os

#: room kept beyond the end of an HDF5 file for the metadata one operation may allocate
METADATA_MARGIN = 1 << 18

#: file systems that cannot preallocate: nothing to reserve, writes go on unguarded
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


def reserve(path: str, ranges, *, at_end: int = 0) -> str | None:
    """Allocate the blocks of ``path`` in every ``(offset, length)`` of ``ranges`` and ``at_end``
    bytes past its current end; None, or the reason it failed (``"No space left on device"``).

    The file's size grows with the reservation (HDF5 truncates the file back to what it uses
    when it next flushes or closes it). Not collective: one rank calls it, the caller agrees.
    """
    wanted = [(int(o), int(n)) for o, n in ranges if n > 0]
    return _allocate(path, os.O_WRONLY, wanted, at_end=int(at_end))


def preallocate(path: str, nbytes: int) -> str | None:
    """Create (or truncate) ``path`` and allocate ``nbytes`` in it; None or why it failed.

    Used before a file is created by HDF5 (which truncates it): it proves the room exists, and
    frees it for the HDF5 file to take at once.
    """
    return _allocate(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, [(0, max(1, int(nbytes)))])


def _allocate(path: str, flags: int, ranges, at_end: int = 0) -> str | None:
    """posix_fallocate each range of ``path`` (opened with ``flags``) and ``at_end`` bytes past its
    end; None when done or when the file system cannot preallocate, else the reason it failed."""
    try:
        fd = os.open(path, flags, 0o644)
        try:
            if at_end > 0:
                ranges = [*ranges, (os.fstat(fd).st_size, at_end)]
            for offset, length in ranges:
                os.posix_fallocate(fd, offset, length)
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return None
        return exc.strerror or str(exc)
    return None
