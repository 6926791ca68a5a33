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
from hpcadj.checkpoint.schedules import CostProfile
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
    session, rest = divmod(ev.forward_steps, n_shots)
    assert rest == 0 and session > N, ev.counts()
    profile = ev.checkpointing.costs
    assert profile is not None and profile.source == "calibrated"
    assert len({repr(p) for p in comm.allgather(profile)}) == 1, "the shots' groups planned with different costs"
    x2 = scaled(space, problem.default_controls(), 0.98)
    groups = min(comm.size, n_shots)
    last = [max(k for k in range(n_shots) if k % comm.size == g) for g in range(groups)]
    before = ev.forward_steps
    ev.objective(x2)  # "keep": each group's last shot's first sweep kept (its own HDF5 file), the others swept
    assert ev.forward_steps - before == N * n_shots and ev.kept_sweeps == groups, ev.counts()
    assert ev.forward_sweeps == n_shots - groups, ev.counts()
    comm.Barrier()
    if comm.rank == 0:
        files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(shared_tmp, "ck-shot*.h5")))
        assert files == [f"ck-shot{k:03d}.h5" for k in sorted(last)], files
    e = ev.gradient(x2)  # the kept shots' reverse sweeps, the others' whole sessions
    assert ev.hits == 0 and ev.reverse_from_kept == groups and ev.sessions == 2 * n_shots, ev.counts()
    # S forward steps a session (one plan for all shots): S - N more for a kept shot, S for the others
    assert ev.forward_steps - before == N * n_shots + n_shots * session - groups * N, ev.counts()
    comm.Barrier()
    assert not glob.glob(os.path.join(shared_tmp, "ck-shot*.h5")) and not glob.glob(os.path.join(local, "shot-*"))

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


def test_kept_levels_per_group_cost_their_count_and_tao_moves_as_with_the_gradient_policy(comm, shared_tmp):
    """Armijo asks f at its trials and g at the accepted one: under "keep" every group keeps its
    last shot's first sweep for that gradient (the others: forward sweeps). lmvm's iterates (new
    controls each) are bitwise those of the "gradient" policy, and the forward steps are exactly the
    sessions' plus the sweeps no gradient followed; nothing is left on disk."""
    runs = {}
    for policy in ("keep", "gradient"):
        local = os.path.join(shared_tmp, f"local-{policy}")
        ck = Checkpointing(ram=2, disk=2, local_dir=local, schedule="multilevel", costs=CostProfile.default(2))
        inversion = ShotInversion(comm, factory(3), 3, ["c"], ck, tao_type="lmvm", max_it=3, gatol=0.0,
                                  grtol=0.0, gttol=0.0, policy=policy,
                                  tao_options=["-tao_ls_type", "armijo", "-tao_ls_stepinit", "4"])
        runs[policy] = inversion.solve()
        inversion.close()
        comm.Barrier()
        assert not glob.glob(os.path.join(local, "shot-*")), policy
    keep, grad = runs["keep"], runs["gradient"]
    assert keep.iterations == 3 and [h["J"] for h in keep.history] == [h["J"] for h in grad.history]
    assert keep.controls["c"].getArray(readonly=True).tobytes() == grad.controls["c"].getArray(readonly=True).tobytes()
    c, g = keep.counts, grad.counts
    session = g["forward_steps"] // g["sessions"]  # one plan for every shot's session: S steps each
    assert g["forward_steps"] == g["sessions"] * session and g["kept_sweeps"] == 0, g
    groups = min(comm.size, 3)
    assert c["reverse_from_kept"] >= 3 * groups and c["kept_sweeps"] > c["reverse_from_kept"], c  # trials rejected
    assert c["forward_sweeps"] == c["kept_sweeps"] // groups * (3 - groups), c
    unfollowed = c["kept_sweeps"] - c["reverse_from_kept"] + c["forward_sweeps"]
    assert c["forward_steps"] == c["sessions"] * session + unfollowed * N, c
    assert c["forward_steps"] < g["forward_steps"] and c["forward_steps"] < c["naive_forward_steps"], (c, g)
    assert c["adjoint_steps"] < g["adjoint_steps"], (c, g)


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
    assert sorted(os.listdir(run_dir)) == ["inversion.json", "iterate-00000.h5", "owned.json"]
    first.close()
    again = ShotInversion(comm, factory(3), 3, ["c"], Checkpointing(ram=3, schedule="revolve"), tao_type="lmvm",
                          max_it=3, run_dir=run_dir, resume=True)
    result = again.solve()
    assert result.resumed_from == 0 and result.status in ("max_it", "converged") and result.iterations >= 1
    mine = result.controls["c"].getArray(readonly=True).tobytes()
    assert len(set(again.layout.cross_comm.allgather(mine))) == 1
    again.close()
