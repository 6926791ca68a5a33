"""Hessian products under a whole-process budget (``memory=``, ``--memory``): the process's peak
resident set, measured from a settled baseline (VmHWM reset), stays within the budget where the
store-all products would not fit, and H v is bitwise store-all's. Wave 384x384 (2.25 MiB a state),
40 steps, one rank, in process."""


import numpy as np
import pytest

from hpcadj.adjoint import hessian as H

from hpcadj.adjoint import verify as V
from hpcadj.adjoint import products as P
from hpcadj.imports import mpi
from hpcadj.models.wave import WaveModel

pytestmark = pytest.mark.timeout(120)
MiB = 2 ** 20
GRID, N = (384, 384), 40


def peak_since_reset(run):
    """``run()``'s result and this process's peak resident set while it ran (VmHWM reset first)."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    out = run()
    with open("/proc/self/status") as fh:
        hwm = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))
    return out, hwm


def products(model, controls, directions, **options):
    """Each direction's H v (owned arrays) from one HessianProducts, and the products object."""
    p = P.HessianProducts(model, controls, gauss_newton=False, **options)
    try:
        return [H.owned_arrays(model, p.hessian_action(v).hessian) for v in directions], p
    finally:
        p.close()


@pytest.fixture(scope="module")
def problem():
    model = WaveModel(mpi().COMM_SELF, GRID, n_steps=N)
    controls = model.default_controls()
    shift = V.scaled_direction(model, controls, 7, scale={k: 0.05 for k in controls})
    for k in controls:  # controls no earlier evaluation in this process used
        controls[k].axpy(1.0, shift[k])
    directions = [V.scaled_direction(model, controls, s, scale={k: 0.1 for k in controls}) for s in (11, 13)]
    small = WaveModel(mpi().COMM_SELF, (16, 16), n_steps=3)  # compiles the kernels before any baseline
    H.hessian_action(small, small.default_controls(), V.scaled_direction(small, small.default_controls(), 1))
    return model, controls, directions


@pytest.mark.parametrize("room, mode", [(90, "recompute"), (175, "ram")])
def test_products_peak_within_the_budget_and_bitwise(problem, room, mode):
    model, controls, directions = problem
    budget = P.settled_rss(model.comm) + room * MiB
    (held, p), peak = peak_since_reset(lambda: products(model, controls, directions, memory=budget))
    assert p.mode == mode and peak <= budget, (p.mode, p.plan_slots, (peak - budget) / MiB)
    assert p.memory.peak_bytes <= budget
    assert p.counts["forward"] >= N and p.counts["products"] == 2
    if mode == "recompute":
        assert p.counts["forward"] > 2 * N  # the pairs did not fit: forward steps recomputed
    P.settled_rss(model.comm)
    (full, q), full_peak = peak_since_reset(lambda: products(model, controls, directions))
    assert q.mode == "store-all" and full_peak > budget  # store-all would not have fitted
    for got, want in zip(held, full):
        assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)


def test_a_budget_no_product_fits_names_the_least(problem):
    from hpcadj.checkpoint.options import ConfigError

    model, controls, _ = problem
    with pytest.raises(ConfigError, match=r"cannot hold a Hessian product: .*least budget that would do is"):
        P.HessianProducts(model, controls, memory=P.settled_rss(model.comm) + 20 * MiB)
