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
