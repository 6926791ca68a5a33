"""A compressed RAM pool under --memory whose states compress worse than probed (issue 27 item 9).

Wave states start nearly empty (the source has just begun) and fill with detail: the probe of its
first steps plans slots far too small, the pool overflows mid-run and the run re-plans. The
re-planned run must stay within a sane number of forward steps (or warn when it cannot), keep the
process's measured peak RSS within the predicted peak and the budget, and give the store-all
gradient bit for bit.
"""

import re

import numpy as np
import pytest

from hpcadj.adjoint import compute_gradient
from hpcadj.adjoint.session import Checkpointing, GradientSession
from hpcadj.checkpoint.provision import SLOW_RECOMPUTE_FACTOR
from hpcadj.cli import Parser
from hpcadj.cli.common import add_model_arguments, build_model

N_STEPS = 150
#: lossless wave 32^3 snapshots grow from ~3 KB (u_0) to ~400 KB (u_60) in all, 512 KB raw
GRID = "32x32x32"
MiB = 2 ** 20

pytestmark = pytest.mark.timeout(300)


def status_bytes(key):
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M).group(1)) * 1024


def wave(comm, steps):
    """The wave model on GRID for ``steps`` steps."""
    parser = Parser()
    add_model_arguments(parser)
    return build_model(parser.parse_args(["--model", "wave", "--grid", GRID, "--steps", str(steps)]), comm)


@pytest.fixture(scope="module")
def case(comm):
    """The model, controls away from the defaults, and their store-all gradient."""
    model = wave(comm, N_STEPS)
    controls = model.default_controls()
    controls["c"].scale(0.97)
    result = compute_gradient(model, controls)
    return model, controls, result.J, {k: v.getArray().copy() for k, v in result.gradient.items()}


def solve(comm, case, pool_bytes):
    """One gradient with --memory (the process's RSS now + 64 MiB) and the RAM pool capped at
    ``pool_bytes`` per rank: (outcome, warnings, peak RSS of this rank during solve, session)."""
    model, controls, _, _ = case
    budget = comm.allreduce(status_bytes("VmRSS"), op=max_op()) + 64 * MiB
    warnings = []
    ck = Checkpointing(memory=budget, ram=f"{pool_bytes}B", compress="lossless")
    session = GradientSession(model, ck, controls=controls,
                              on_message=lambda kind, text: warnings.append(text) if kind == "warning" else None)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM from here on
    outcome = session.solve()
    return outcome, warnings, status_bytes("VmHWM"), session, budget


def max_op():
    from hpcadj.imports import mpi

    return mpi().MAX


def check_gradient(outcome, case):
    _, _, J, grad = case
    assert outcome.status == "complete", outcome.message
    assert outcome.result.J == J
    for name, ref in grad.items():
        assert np.array_equal(outcome.result.gradient[name].getArray(), ref), name


def test_an_overflowing_pool_replans_sanely_within_the_budget_and_bitwise(comm, case):
    # about 8 late snapshots per rank: the pool overflows mid first sweep, after its early, small ones
    outcome, warnings, peak, session, budget = solve(comm, case, 3 * MiB // comm.size)
    check_gradient(outcome, case)
    comp = outcome.info["compression"]["ram"]
    assert comp["overflows"] >= 1 and outcome.info["faults"]
    # main froze the pool at the snapshots it held, and kept re-planning with no free slot
    assert outcome.result.forward_steps <= 4 * N_STEPS, outcome.result.forward_steps
    assert not any("re-planned" in w for w in warnings), warnings
    assert comp["peak_pool_bytes"] <= comp["pool_bytes"]
    assert peak <= session.memory.peak_bytes <= budget, (peak, session.memory.as_dict())


#: the warning's run: short, so its quadratic recomputation stays a few seconds at 3 ranks
WARN_STEPS = 36


def test_a_replan_that_must_recompute_a_lot_warns(comm):
    # a store-all plan over a pool with room for a third of a raw snapshot (one late compressed one):
    # no re-plan can avoid heavy recomputation, and the session's rule says so
    from hpcadj.adjoint import Driver
    from hpcadj.checkpoint.provision import recompute_warning
    from hpcadj.checkpoint.schedules import make_schedule
    from hpcadj.checkpoint.storage.codec import parse_codec
    from hpcadj.checkpoint.storage.compressed import PooledLevel

    model = wave(comm, WARN_STEPS)
    controls = model.default_controls()
    controls["c"].scale(0.97)
    reference = compute_gradient(model, controls)
    layout = model.snapshot_layout()
    raw = comm.allreduce(sum(f.local_nbytes for f in layout.values()), op=max_op())
    level = PooledLevel(parse_codec("lossless"), layout, WARN_STEPS, raw // 3, comm)
    totals = []
    try:
        result = Driver(model, [level], on_replan=totals.append).run(
            make_schedule("store-all", WARN_STEPS, [WARN_STEPS]), controls)
    finally:
        level.close()
    assert result.J == reference.J and level.overflows >= 1 and len(totals) == level.overflows
    for name, ref in reference.gradient.items():
        assert np.array_equal(result.gradient[name].getArray(), ref.getArray()), name
    assert totals[-1] == result.forward_steps > SLOW_RECOMPUTE_FACTOR * WARN_STEPS
    assert "re-planned run evaluates" in recompute_warning(totals[-1], WARN_STEPS, "the re-planned run")
