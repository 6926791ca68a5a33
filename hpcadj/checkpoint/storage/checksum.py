"""Checksums of rank blocks: zlib's CRC-32 over the block's bytes in C order.

CRC-32 comes from the standard library (no extra dependency) and releases the GIL on large
buffers, so an I/O thread can checksum while the solver runs. A user can recompute it from a file:
``zlib.crc32(np.ascontiguousarray(block).tobytes())``.
"""

from __future__ import annotations

import zlib

import numpy as np

ALGORITHM = "crc32"


def block_checksum(block: np.ndarray) -> int:
    """CRC-32 of ``block``'s bytes in C order (an unsigned 32-bit int)."""
    data = np.ascontiguousarray(block).reshape(-1).view(np.uint8)
    return zlib.crc32(memoryview(data)) & 0xFFFFFFFF
