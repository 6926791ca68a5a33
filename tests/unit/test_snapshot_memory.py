"""mapped_empty: a mapping the system refuses for lack of memory is a MemoryError, as numpy's is."""

import numpy as np
import pytest

from hpcadj.snapshot import mapped_empty


def test_a_refused_mapping_is_a_memory_error():
    with pytest.raises(MemoryError, match="Unable to allocate"):
        mapped_empty((2 ** 57,), np.float64)  # 2^60 bytes: more than any address space here


def test_a_mapping_is_writable_and_sized():
    a = mapped_empty((300, 200), np.float64)
    a[...] = 1.5
    assert a.shape == (300, 200) and a.sum() == 1.5 * 300 * 200


def test_a_view_of_a_mapped_array_refers_to_it():
    """A mapped array's views refer to it (not to an array behind it): a pool that hands a buffer out
    again once nothing else refers to it must see a reshaped view as a holder."""
    import sys

    from hpcadj.snapshot import MAPPED_MIN_BYTES, mapped_empty

    n = MAPPED_MIN_BYTES // 8 * 2
    buf = mapped_empty((n,), np.float64)
    before = sys.getrefcount(buf)
    view = buf.reshape((2, n // 2))
    assert sys.getrefcount(buf) > before and view.base is buf
    shaped = mapped_empty((2, n // 2), np.float64)
    assert shaped.reshape(-1).base is shaped
