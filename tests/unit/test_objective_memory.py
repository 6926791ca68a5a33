"""A plain forward sweep (evaluate_objective, tangent_linear) frees the states it drops: petsc4py
parks each dropped Vec on the communicator's garbage list, and without a cleanup every sweep left
its n states allocated (the resident set grew by n states per evaluation of an inversion)."""

import pytest

from hpcadj.adjoint.verify import evaluate_objective, random_direction, tangent_linear
from hpcadj.checkpoint.manager import snapshot_slot_bytes
from hpcadj.checkpoint.memory import process_rss_bytes
from hpcadj.imports import mpi
from hpcadj.models.wave import WaveModel

pytestmark = pytest.mark.timeout(60)
GRID, N, SWEEPS = (64, 64), 150, 3


def growth(sweep) -> tuple[int, int]:
    """(resident-set growth over ``SWEEPS`` sweeps after a warm-up, bytes of the sweeps' states)."""
    model = WaveModel(mpi().COMM_WORLD, GRID, n_steps=N)
    controls = model.default_controls()
    sweep(model, controls)
    before = process_rss_bytes()
    for k in range(SWEEPS):
        controls["c"].scale(1.0 + 0.01 * (k + 1))  # other controls each time
        sweep(model, controls)
    state = snapshot_slot_bytes(model.snapshot_layout(), model.comm)["ram"]
    return process_rss_bytes() - before, SWEEPS * N * state


@pytest.mark.parametrize("name", ["evaluate_objective", "tangent_linear"])
def test_sweeps_do_not_keep_their_states(name):
    if name == "evaluate_objective":
        sweep = evaluate_objective
    else:
        def sweep(model, controls):
            tangent_linear(model, controls, random_direction(model, controls, 7))
    grown, states = growth(sweep)
    assert grown < states / 10, (grown, states)
