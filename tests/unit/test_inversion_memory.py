"""--memory across an inversion's sessions: the wave model's buffer pool keeps a finished session's
RAM slots for reuse, and a later session measured them as its baseline and refused the budget the
first one had filled (every FWI under --memory stopped at its second session). One shot and two
shots on one rank, a budget the first session fills, gradients at two different controls."""

import ctypes
import gc

import pytest

from hpcadj.adjoint.session import Checkpointing
from hpcadj.checkpoint.memory import process_rss_bytes
from hpcadj.imports import mpi, petsc
from hpcadj.inversion import ControlSpace, EvaluationCache
from hpcadj.inversion.shots import ShotEvaluations, ShotLayout, ShotProblem, shot_positions
from hpcadj import buffers
from hpcadj.models.wave import WaveModel

#: 144 KiB a snapshot, 169 MiB for every step: far more than the budget's room, however much the
#: process's resident set (the baseline) falls between the budget's measure and a session's
GRID, N = (96, 96), 1200

pytestmark = pytest.mark.timeout(120)


def budget() -> int:
    """About 20 MiB of RAM slots above this process's resident set and the planner's slack, the set
    measured after what earlier tests of this process left is freed (else it falls later)."""
    gc.collect()
    petsc().garbage_cleanup(mpi().COMM_SELF)
    buffers.release_idle_buffers()
    ctypes.CDLL(None).malloc_trim(0)
    return process_rss_bytes() + 40 * 2**20


def two_gradients(cache, space, controls) -> list:
    out = []
    for factor in (1.0, 1.05):  # the second at controls no earlier evaluation used
        x = space.pack(controls)
        x.scale(factor)
        e = cache.gradient(x)
        out.append((e.J, e.forward_steps))
        x.destroy()
    return out


def test_second_session_fits_the_budget_the_first_filled():
    model = WaveModel(mpi().COMM_SELF, GRID, n_steps=N)
    controls = model.default_controls()
    space = ControlSpace(controls, ["c"])
    cache = EvaluationCache(model, space, Checkpointing(memory=budget()), policy="gradient")
    (J1, f1), (J2, f2) = two_gradients(cache, space, controls)
    assert f1 > N  # checkpointed, not store-all: the RAM slots filled the budget
    assert f2 >= N and J1 != J2  # and the second session was not refused
    assert cache.sessions == 2


def test_two_shots_on_one_rank_fit_one_budget():
    positions = shot_positions(2)
    layout = ShotLayout(mpi().COMM_SELF, 2, 1)
    problem = ShotProblem(layout, lambda comm, shot: WaveModel(comm, GRID, n_steps=N, source_x=positions[shot]))
    controls = problem.default_controls()
    space = ControlSpace(controls, ["c"])
    cache = ShotEvaluations(problem, space, Checkpointing(memory=budget()))
    (J1, f1), (J2, f2) = two_gradients(cache, space, controls)
    assert f1 > 2 * N and f2 >= 2 * N
    assert cache.sessions == 4
    layout.free()
