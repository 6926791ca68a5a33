"""Checkpoints reused across evaluations, under mpirun: an objective-only evaluation keeps its first
sweep's levels (RAM + node-local + HDF5, asynchronous, compressed) and a gradient at the same controls
runs only the reverse sweep from them; at m1, m2, m1 again, in every order of f and g, with a
stopped and resumed session at another control in between, every J and gradient is bitwise a fresh
session's at that control, and nothing is reused across controls. TAO's iterates are the same under
every cache policy, the kept levels saving forward steps."""

import glob
import json
import os

import numpy as np
import pytest

from hpcadj.adjoint.session import Checkpointing, GradientSession, Restart
from hpcadj.checkpoint.schedules import CostProfile
from hpcadj.inversion import ControlSpace, EvaluationCache, Inversion
from hpcadj.models.heat import HeatModel
from hpcadj.models.observations import Observations
from model_checks import write_observations

GRID, N, DT, OBSERVED = (12, 10), 10, 2e-3, [3, 6, 10]

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def model(comm, shared_tmp):
    """Heat with observations of a run at another kappa (so J and g depend on kappa and u0)."""
    truth = HeatModel(comm, grid=GRID, n_steps=N, dt=DT)
    c = truth.default_controls()
    c["kappa"].scale(1.5)
    truth.set_controls(c)
    path = os.path.join(shared_tmp, "observations.h5")
    write_observations(comm, truth, OBSERVED, path)
    return HeatModel(comm, grid=GRID, n_steps=N, dt=DT, observations=Observations.from_file(path))


def three_levels(tmp, name):
    """RAM + node-local + HDF5, asynchronous writes, lossless compression on every level."""
    return Checkpointing(ram=1, disk=1, pfs=2, local_dir=os.path.join(tmp, f"local-{name}"),
                         pfs_file=os.path.join(tmp, f"ckpt-{name}.h5"), schedule="multilevel",
                         compress="lossless", async_io=True, costs=CostProfile.default(3))


def fresh(model, controls):
    """J and the gradient (name -> array) of a fresh store-all session at ``controls``."""
    r = GradientSession(model, controls=controls).solve().result
    return r.J, {k: v.getArray(readonly=True).copy() for k, v in r.gradient.items()}


def test_kept_levels_give_fresh_sessions_bitwise_at_m1_m2_m1_in_every_order(comm, model, shared_tmp):
    m1 = model.default_controls()
    m2 = model.default_controls()
    m2["kappa"].scale(1.25)
    m2["u0"].scale(0.9)
    m3 = model.default_controls()           # differs from m1 in one bit of one rank's kappa only
    if comm.rank == comm.size - 1:
        a = m3["kappa"].getArray()
        a[-1] = np.nextafter(a[-1], np.inf)
    refs = {"m1": fresh(model, m1), "m2": fresh(model, m2), "m3": fresh(model, m3)}
    space = ControlSpace(m1, ["kappa", "u0"])
    points = {tag: space.pack(m) for tag, m in (("m1", m1), ("m2", m2), ("m3", m3))}
    ck = three_levels(shared_tmp, "cache")
    cache = EvaluationCache(model, space, ck)
    assert cache.policy == "keep"

    def check(what, tag):
        before = cache.forward_steps
        e = cache.objective(points[tag]) if what == "f" else cache.gradient(points[tag])
        J, grad = refs[tag]
        assert e.J == J, (what, tag)
        if what == "g":
            a = e.gradient.getArray(readonly=True)
            for name, lo, hi in zip(space.names, space.offsets[:-1], space.offsets[1:]):
                assert np.array_equal(a[lo:hi], grad[name]), (what, tag, name)
        return cache.forward_steps - before

    # every transition: f->g, g->f, f->f, g->g at one control; f/g -> f/g at another
    sequence = [("f", "m1"), ("g", "m1"), ("f", "m2"), ("f", "m1"), ("g", "m1"), ("g", "m2"), ("f", "m2"),
                ("g", "m2"), ("g", "m1"), ("f", "m2"), ("f", "m2"), ("g", "m2"), ("f", "m1"), ("g", "m3"),
                ("f", "m1"), ("f", "m3"), ("g", "m3"), ("g", "m3"), ("f", "m1"), ("g", "m1")]
    state = None      # (tag, "kept" | "gradient") of the entry
    for what, tag in sequence:
        kept = cache.entry.session if cache.entry is not None and cache.entry.session is not None else None
        steps = check(what, tag)
        if state is not None and state[0] == tag and (what == "f" or state[1] == "gradient"):
            assert steps == 0, (what, tag, state)                    # answered from the entry
        elif what == "f":
            assert steps == N, (what, tag, state)                    # one first sweep, levels kept
            s = cache.entry.session
            assert [lv.occupied > 0 for lv in s.levels] == [True, True, True], [lv.occupied for lv in s.levels]
            state = (tag, "kept")
        elif state is not None and state == (tag, "kept"):
            assert 0 < steps < N, (what, tag, steps)                 # reverse sweep from the kept levels
            assert kept is not None and kept._paused is None         # that session, finished
            state = (tag, "gradient")
        else:
            assert steps > N, (what, tag, steps)                     # a whole session at another control
            state = (tag, "gradient")
    assert cache.kept_sweeps == 8 and cache.reverse_from_kept == 5 and cache.hits == 4, cache.counts()
    # a control that changed gives levels of the old one up: one node-local directory at a time
    cache.objective(points["m2"])
    local = ck.local_dir
    assert len(glob.glob(os.path.join(local, "hpcadj-*"))) == 1 and os.path.exists(ck.pfs_file)
    comm.Barrier()
    cache.drop()
    comm.Barrier()
    assert glob.glob(os.path.join(local, "hpcadj-*")) == [] and not os.path.exists(ck.pfs_file)


def test_a_session_stopped_and_resumed_in_between_leaves_the_kept_levels_exact(comm, model, shared_tmp):
    m1 = model.default_controls()
    m2 = model.default_controls()
    m2["kappa"].scale(0.8)
    refs = {"m1": fresh(model, m1), "m2": fresh(model, m2)}
    space = ControlSpace(m1, ["kappa"])
    x1, x2 = space.pack(m1), space.pack(m2)
    cache = EvaluationCache(model, space, three_levels(shared_tmp, "kept"))
    assert cache.objective(x1).J == refs["m1"][0]
    # the same model serves a restartable session at m2, stopped mid-reverse and resumed, in between
    run_dir = os.path.join(shared_tmp, "run")
    calls = []
    ck = Checkpointing(ram=2, disk=2, local_dir=cache.checkpointing.local_dir, schedule="multilevel",
                       compress="lossless", costs=CostProfile.default(2))
    stopped = GradientSession(model, ck, controls=m2, restart=Restart(run_dir, durable_every=1),
                              should_stop=lambda: calls.append(1) or len(calls) > N + 3).solve()
    assert stopped.status == "stopped", stopped.message
    assert cache.entry.session is not None                  # a stopped run elsewhere leaves the entry
    resumed = GradientSession(model, ck, controls=m2, restart=Restart(run_dir, resume=True)).solve()
    assert resumed.status == "complete" and resumed.result.J == refs["m2"][0]
    assert np.array_equal(resumed.result.gradient["kappa"].getArray(readonly=True), refs["m2"][1]["kappa"])
    before = cache.forward_steps
    e = cache.gradient(x1)
    assert cache.reverse_from_kept == 1 and 0 < cache.forward_steps - before < N
    assert e.J == refs["m1"][0] and np.array_equal(e.gradient.getArray(readonly=True), refs["m1"][1]["kappa"])
    e = cache.gradient(x2)
    assert e.J == refs["m2"][0] and np.array_equal(e.gradient.getArray(readonly=True), refs["m2"][1]["kappa"])
    cache.drop()


def test_tao_iterates_are_the_same_under_every_policy_and_keep_saves_forward_steps(comm, model, shared_tmp):
    """Armijo asks f at trials and g at the accepted point; More-Thuente f and g together."""
    for search in ("armijo", "more-thuente"):
        runs = {}
        for policy in ("keep", "gradient", "forward"):
            log = os.path.join(shared_tmp, f"{search}-{policy}.jsonl")
            ck = Checkpointing(ram=2, disk=2, local_dir=os.path.join(shared_tmp, f"local-{search}-{policy}"),
                               schedule="multilevel", costs=CostProfile.default(2))
            runs[policy] = Inversion(model, ["kappa"], ck,
                                     tao_type="lmvm", max_it=4, gatol=0.0, grtol=0.0, gttol=0.0, log=log,
                                     policy=policy, tao_options=["-tao_ls_type", search]).solve()
        keep = runs["keep"]
        for policy, r in runs.items():
            assert [h["J"] for h in r.history] == [h["J"] for h in keep.history], (search, policy)
            assert np.array_equal(r.controls["kappa"].getArray(readonly=True),
                                  keep.controls["kappa"].getArray(readonly=True)), (search, policy)
        counts = {p: r.counts for p, r in runs.items()}
        assert keep.iterations == 4 and keep.counts["sessions"] > 0
        if search == "armijo":       # f at a trial then g there: the reverse sweep from the kept levels
            assert keep.counts["reverse_from_kept"] >= 4, counts
            for what in ("forward_steps", "adjoint_steps"):   # equal to the gradient policy's if no trial fails
                assert keep.counts[what] <= runs["gradient"].counts[what], counts
            assert keep.counts["forward_steps"] < runs["forward"].counts["forward_steps"], counts
        else:                        # f and g together: nothing to keep, the same cost under every policy
            assert keep.counts["kept_sweeps"] == 0 and len({c["forward_steps"] for c in counts.values()}) == 1
        assert keep.counts["forward_steps"] < keep.counts["naive_forward_steps"] or search != "armijo"
        if comm.rank == 0:
            with open(os.path.join(shared_tmp, f"{search}-keep.jsonl")) as fh:
                lines = [json.loads(line) for line in fh]
            assert sum(r["forward_steps"] for r in lines) == keep.counts["forward_steps"]
            assert sum(r["naive_forward_steps"] for r in lines) == keep.counts["naive_forward_steps"]
        assert not glob.glob(os.path.join(shared_tmp, f"local-{search}-keep", "hpcadj-*"))   # dropped at the end
