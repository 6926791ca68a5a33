"""What a user's TS holds, declared per TS and held to: the contract's RSS probe against
``working_set_states()``, and ``hpcadj run --memory`` on a TS model keeping every rank's peak RSS
within the budget (RK4, Gray–Scott at a size where the TS's working set is most of the budget)."""

import re

import pytest

from hpcadj.adjoint.contract import FAILED, _working_set
from hpcadj.imports import mpi, petsc
from hpcadj.ts.examples import GrayScott

from ..helpers import hpcadj, hpcadj_json

MiB = 2 ** 20
#: RK4 at dt 0.05 (0.5 is unstable for explicit RK on this grid); 0.5 MiB a restart state per rank on
#: 2 ranks, and store-all keeps each step's four stages (2 MiB): its 80 MiB exceed the budget of a dozen
#: restart slots by far more than the plan's margins (its peak about 200 MiB against 142)
RK4 = ["run", "--model", "hpcadj.ts.examples:grayscott_stepper", "--grid", "256", "--steps", "40",
       "-ts_type", "rk", "-ts_rk_type", "4", "-ts_dt", "0.05"]


@pytest.fixture(scope="module")
def comm():
    petsc()
    return mpi().COMM_WORLD


def test_counted_parts_follow_the_method(comm):
    """RK counts 3 s + 3 Vecs for its s stages and no solver; CN its SNES/KSP and the ILU factor."""
    rk = GrayScott(comm, m=16, ts_type="rk").stepper(2)._working_set()
    cn = GrayScott(comm, m=16, ts_type="cn").stepper(2)._working_set()
    assert rk["parts"]["stages"] == 3 * 4 + 3 and "snes_ksp" not in rk["parts"]
    assert cn["parts"]["snes_ksp"] == 5 + 30 + 4 and cn["parts"]["factor"] == cn["parts"]["jacobian"] > 10
    assert cn["states"] > rk["states"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ts_type,dt", [("rk", 0.05), ("cn", 0.5)])
def test_declared_working_set_covers_the_measured_one(comm, ts_type, dt):
    """4 MiB a state: RSS resolves it. The TS built after the baseline, a few steps and adjoint steps."""
    def factory():
        return GrayScott(comm, m=512, ts_type=ts_type, dt=dt).stepper(3)

    model = factory()
    result = _working_set(model, None, factory, 3, 0.25)
    measured, declared = result.details["measured_states"], result.details["declared_states"]
    assert result.status != FAILED, result.reason
    assert measured <= declared, (measured, declared)
    assert measured > 30                                 # the probe saw the TS's solvers and Jacobian


@pytest.mark.timeout(400)
def test_rk4_peak_rss_within_memory(restart_costs):
    proc = hpcadj([*RK4, *restart_costs, "--memory", "60MiB"], 2, timeout=120)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hpcadj: error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    least = float(re.search(r"the least budget that would do is ([\d.]+) MiB", errors[0]).group(1))
    budget = least + 6                                   # about a dozen 0.5 MiB slots beside the TS
    info = hpcadj_json([*RK4, *restart_costs, "--memory", f"{budget}MiB"], 2, timeout=240)
    assert info["ts_type"] == "rk" and info["memory"]["budget"] == int(budget * MiB)
    assert info["forward_steps"] > 40 and info["schedule"] != "store-all"      # recomputes to fit
    assert info["peak_rss_bytes"] <= info["memory"]["budget"], (info["peak_rss_bytes"] / MiB, budget)
    store_all = hpcadj_json([*RK4, *restart_costs], 2, timeout=240)            # every state in RAM
    assert store_all["peak_rss_bytes"] > info["memory"]["budget"], store_all["peak_rss_bytes"] / MiB
