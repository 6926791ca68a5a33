"""Shots under mpirun (1, 2, 3 ranks, one rank per shot): the shot-parallel J and gradient are bitwise
the shots run one after another on one rank and added in shot order, at controls other than an
earlier evaluation's, under a calibrated RAM + node-local + HDF5 plan with one file per shot; TAO
moves alike in every shot group; a layout the ranks cannot run is one line on stderr, exit 2."""

import glob
import os
from dataclasses import replace

import numpy as np
import pytest

from hpcadj.adjoint.session import Checkpointing, GradientSession
from hpcadj.cli import main
from hpcadj.imports import mpi
from hpcadj.inversion import ControlSpace
from hpcadj.inversion.shots import (ShotEvaluations, ShotInversion, ShotLayout, ShotLayoutError, ShotProblem,
                                    check_layout, shot_positions)
from hpcadj.models.wave import WaveModel

GRID, N = (12, 14), 16

pytestmark = pytest.mark.timeout(240)


def factory(n_shots):
    positions = shot_positions(n_shots)
    return lambda comm, shot: WaveModel(comm, GRID, n_steps=N, source_x=positions[shot])


def scaled(space, controls, factor):
    x = space.pack(controls)
    x.scale(factor)
    return x


def one_after_another(n_shots, factor):
    """(J, gradient of c) of the shots run in turn on this rank alone, store-all, added in shot order."""
    J, g = None, None
    for shot in range(n_shots):
        model = factory(n_shots)(mpi().COMM_SELF, shot)
        controls = model.default_controls()
        controls["c"].scale(factor)
        result = GradientSession(model, Checkpointing(), controls=controls).solve().result
        gk = result.gradient["c"].getArray(readonly=True).copy()
        J = result.J if J is None else J + result.J
        g = gk if g is None else g + gk
    return J, g


@pytest.mark.parametrize("n_shots", [2, 3])
def test_shot_parallel_gradient_is_the_shots_in_turn_summed_bitwise(comm, shared_tmp, n_shots):
    layout = ShotLayout(comm, n_shots, 1)
    problem = ShotProblem(layout, factory(n_shots))
    space = ControlSpace(problem.default_controls(), ["c"])
    local = os.path.join(shared_tmp, "local")
    ck = Checkpointing(ram=2, disk=3, pfs=4, local_dir=local, pfs_file=os.path.join(shared_tmp, "ck.h5"),
                       schedule="multilevel")
    ev = ShotEvaluations(problem, space, ck)
    ev.gradient(scaled(space, problem.default_controls(), 1.01))  # m1: calibrates, then moves on
    profile = ev.checkpointing.costs
    assert profile is not None and profile.source == "calibrated"
    assert len({repr(p) for p in comm.allgather(profile)}) == 1, "the shots' groups planned with different costs"
    x2 = scaled(space, problem.default_controls(), 0.98)
    ev.objective(x2)
    e = ev.gradient(x2)
    assert ev.hits == 1 and ev.sessions == 2 * n_shots  # the gradient at m2 came with its objective

    J, g = one_after_another(n_shots, 0.98)
    assert e.J == J, (e.J, J)
    assert e.gradient.getArray(readonly=True).tobytes() == g.tobytes()
    assert np.abs(g).max() > 0
    sources = [d["source_x"] for d in problem.describe()["per_shot"]]
    assert sources == shot_positions(n_shots) and len(set(sources)) == n_shots

    kept = ShotEvaluations(problem, space, replace(ev.checkpointing, keep=True))  # the files stay, to be seen
    assert kept.gradient(x2).J == J
    comm.Barrier()
    if comm.rank == 0:
        files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(shared_tmp, "ck-shot*.h5")))
        assert files == [f"ck-shot{k:03d}.h5" for k in range(n_shots)], files
    mine = {int(os.path.basename(os.path.dirname(os.path.dirname(p)))[5:])
            for p in glob.glob(os.path.join(local, "shot-*", "hpcadj-*", "rank0"))}
    every = set().union(*comm.allgather(mine))
    assert every == set(range(n_shots)), every  # node-local files per shot
    layout.free()


def test_shot_groups_move_alike_under_tao(comm):
    """An L-BFGS run over 3 shots: every group ends at the same controls, bit for bit, and J falls."""
    inversion = ShotInversion(comm, factory(3), 3, ["c"], Checkpointing(ram=3, schedule="revolve"),
                              ranks_per_shot=1, tao_type="lmvm", max_it=2)
    result = inversion.solve()
    assert result.status in ("max_it", "converged") and result.iterations >= 1
    assert result.history[-1]["J"] < result.history[0]["J"]
    mine = result.controls["c"].getArray(readonly=True).tobytes()
    assert len(set(inversion.layout.cross_comm.allgather(mine))) == 1
    assert result.counts["shots"] == 3 and result.counts["shot_groups"] == comm.size
    inversion.close()


def invert_cli(shots, ranks_per_shot, capfd):
    rc = main(["invert", "--model", "wave", "--grid", "12x14", "--steps", "4", "--invert", "c", "--shots",
               str(shots), "--ranks-per-shot", str(ranks_per_shot)])
    return rc, capfd.readouterr().err


def test_more_ranks_per_shot_than_ranks_is_one_line_exit_2(comm, capfd):
    rc, err = invert_cli(2, comm.size + 1, capfd)
    assert rc == 2
    if comm.rank == 0:
        assert err.count("\n") == 1 and "more ranks per shot than the job's" in err and "Traceback" not in err, err
    else:
        assert err == ""


def test_ranks_not_divisible_is_one_line_exit_2(comm, capfd):
    with pytest.raises(ShotLayoutError, match="does not divide the job's 3 ranks"):
        check_layout(3, 2, 2)
    if comm.size == 3:
        rc, err = invert_cli(2, 2, capfd)
        assert rc == 2
        if comm.rank == 0:
            assert err.count("\n") == 1 and "does not divide the job's 3 ranks" in err, err


def test_a_stop_asked_on_one_rank_stops_every_group_and_resume_continues(comm, shared_tmp):
    """Rank 0 alone asks to stop after the first accepted iterate: every group stops after the same
    evaluation (exit 75's path), group 0 alone wrote the run directory, and a resume in every group
    continues from that iterate to the cap, the groups still alike."""
    run_dir = os.path.join(shared_tmp, "run")
    seen = []

    def stop():
        return comm.rank == 0 and len(seen) > 0

    first = ShotInversion(comm, factory(3), 3, ["c"], Checkpointing(ram=3, schedule="revolve"), tao_type="lmvm",
                          max_it=3, run_dir=run_dir, should_stop=stop, on_iteration=seen.append)
    stopped = first.solve()
    assert stopped.status == "stopped" and stopped.iterations == 0
    assert sorted(os.listdir(run_dir)) == ["inversion.json", "iterate-00000.h5"]
    first.close()
    again = ShotInversion(comm, factory(3), 3, ["c"], Checkpointing(ram=3, schedule="revolve"), tao_type="lmvm",
                          max_it=3, run_dir=run_dir, resume=True)
    result = again.solve()
    assert result.resumed_from == 0 and result.status in ("max_it", "converged") and result.iterations >= 1
    mine = result.controls["c"].getArray(readonly=True).tobytes()
    assert len(set(again.layout.cross_comm.allgather(mine))) == 1
    again.close()
