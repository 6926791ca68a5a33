"""Inversion under mpirun: cached evaluations bitwise equal to fresh sessions at every control, in
every order, under a multi-level compressed plan; kappa recovered from observations with a monotone
misfit; a stopped inversion resumed bitwise as a fresh one from its last accepted iterate."""

import json
import os

import numpy as np
import pytest

from hpcadj.adjoint.session import Checkpointing, GradientSession
from hpcadj.checkpoint.schedules import CostProfile
from hpcadj.inversion import ControlSpace, EvaluationCache, Inversion, InversionError
from hpcadj.models.heat import HeatModel
from hpcadj.models.observations import Observations
from model_checks import write_observations

GRID, N, DT, OBSERVED = (12, 10), 10, 2e-3, [2, 4, 6, 8, 10]

pytestmark = pytest.mark.timeout(240)


def true_kappa(model):
    c = model.default_controls()
    y, x = model.grid.node_coordinates()
    model.grid.owned(c["kappa"])[...] = 1.0 + 0.8 * np.sin(np.pi * x) * np.sin(np.pi * y)
    return c


def write_true_observations(comm, path):
    """u at the observed steps of a run with the true kappa, as an --observations file."""
    truth = HeatModel(comm, grid=GRID, n_steps=N, dt=DT)
    truth.set_controls(true_kappa(truth))
    write_observations(comm, truth, OBSERVED, path)


@pytest.fixture
def model(comm, shared_tmp):
    path = os.path.join(shared_tmp, "observations.h5")
    write_true_observations(comm, path)
    return HeatModel(comm, grid=GRID, n_steps=N, dt=DT, observations=Observations.from_file(path))


def multilevel(tmp, name):
    return Checkpointing(ram=2, disk=3, local_dir=os.path.join(tmp, f"local-{name}"), schedule="multilevel",
                         compress="lossless", costs=CostProfile.default(2))


def arrays(vec):
    return vec.getArray(readonly=True).copy()


def test_cached_evaluations_are_fresh_sessions_bitwise_in_every_order(comm, model, shared_tmp):
    m1 = model.default_controls()
    m2 = model.default_controls()
    m2["kappa"].scale(1.25)
    m2["u0"].scale(0.9)
    refs = {}
    for tag, m in (("m1", m1), ("m2", m2)):
        r = GradientSession(model, controls=m).solve().result
        refs[tag] = (r.J, {k: arrays(v) for k, v in r.gradient.items()})
    space = ControlSpace(m1, ["kappa", "u0"])
    points = {"m1": space.pack(m1), "m2": space.pack(m2)}
    for policy in ("gradient", "forward"):
        cache = EvaluationCache(model, space, multilevel(shared_tmp, policy), policy=policy)
        sequence = [("f", "m1"), ("g", "m1"), ("g", "m2"), ("f", "m1"), ("f", "m2"), ("g", "m2"),
                    ("g", "m1"), ("g", "m1"), ("f", "m1"), ("g", "m2")]
        for what, tag in sequence:
            before = cache.forward_steps
            repeat = cache.entry is not None and cache.entry.key == cache.key(points[tag])
            had_gradient = repeat and cache.entry.gradient is not None
            e = cache.objective(points[tag]) if what == "f" else cache.gradient(points[tag])
            J, grad = refs[tag]
            assert e.J == J, (policy, what, tag)
            if what == "g" or policy == "gradient":
                a = e.gradient.getArray(readonly=True)
                for name, lo, hi in zip(space.names, space.offsets[:-1], space.offsets[1:]):
                    assert np.array_equal(a[lo:hi], grad[name]), (policy, what, tag, name)
            if repeat and (what == "f" or had_gradient):
                assert cache.forward_steps == before, (policy, what, tag)   # answered from the cache
            else:
                assert cache.forward_steps > before, (policy, what, tag)    # another control: recomputed
        if policy == "gradient":
            assert cache.hits == 4 and cache.sessions == 6, cache.counts()
        else:
            assert cache.forward_sweeps == 3 and cache.sessions == 5, cache.counts()


def test_kappa_recovered_with_bounds_and_a_monotone_misfit(comm, model, shared_tmp):
    log = os.path.join(shared_tmp, "inversion.jsonl")
    inv = Inversion(model, ["kappa"], Checkpointing(ram=3, schedule="revolve"), tao_type="blmvm",
                    bounds={"kappa": (0.5, 3.0)}, max_it=10, gatol=0.0, grtol=0.0, gttol=0.0, log=log)
    result = inv.solve()
    assert result.status == "max_it" and result.iterations == 10, result.status
    misfits = [h["misfit"] for h in result.history]
    assert len(misfits) == 11 and all(b < a for a, b in zip(misfits, misfits[1:])), misfits
    assert misfits[-1] < 1e-3 * misfits[0], misfits
    truth = true_kappa(model)["kappa"]
    start, err = truth.copy(), truth.copy()
    start.shift(-1.0)
    err.axpy(-1.0, result.controls["kappa"])
    assert err.norm() < 0.25 * start.norm(), (err.norm(), start.norm())   # error falls 4-fold or more
    lo, hi = result.controls["kappa"].min()[1], result.controls["kappa"].max()[1]
    assert 0.5 <= lo and hi <= 3.0
    if comm.rank == 0:
        with open(log) as fh:
            lines = [json.loads(line) for line in fh]
        assert [r["iteration"] for r in lines] == list(range(11))
        assert all(r["forward_steps"] > 0 and r["adjoint_steps"] > 0 and r["seconds"] > 0 for r in lines)
        assert [r["misfit"] for r in lines] == misfits and lines[0]["regularization"] == 0.0


def test_stopped_inversion_resumes_as_a_fresh_one_from_its_last_iterate(comm, model, shared_tmp):
    run_dir = os.path.join(shared_tmp, "run")
    accepted = []   # a SIGUSR1 arriving once iterate 3 is accepted: the stop comes one evaluation later

    options = dict(tao_type="lmvm", max_it=7, gatol=0.0, grtol=0.0, gttol=0.0, regularization=1e-5)
    first = Inversion(model, ["kappa"], Checkpointing(ram=3, schedule="revolve"), run_dir=run_dir,
                      should_stop=lambda: len(accepted) > 3, on_iteration=accepted.append, **options).solve()
    assert first.status == "stopped" and first.iterations == 3, (first.status, first.iterations)
    k = 3
    with pytest.raises(InversionError, match="already holds an inversion"):
        Inversion(model, ["kappa"], run_dir=run_dir, **options).solve()
    with pytest.raises(InversionError, match="another inversion"):
        Inversion(model, ["kappa"], run_dir=run_dir, resume=True, **{**options, "regularization": 0.0}).solve()
    resumed = Inversion(model, ["kappa"], Checkpointing(ram=2, disk=2, local_dir=os.path.join(shared_tmp, "l"),
                                                        schedule="multilevel", costs=CostProfile.default(2)),
                        run_dir=run_dir, resume=True, **options).solve()
    assert resumed.resumed_from == k and resumed.status == "max_it" and resumed.iterations == 7
    assert [h["J"] for h in resumed.history[:k + 1]] == [h["J"] for h in first.history]
    # documented: a fresh inversion started at iterate k, with the same reference and the iterations left
    start = first.controls
    fresh = Inversion(model, ["kappa"], controls=start, reference=model.default_controls(),
                      **{**options, "max_it": 7 - k}).solve()
    assert [h["J"] for h in fresh.history] == [h["J"] for h in resumed.history[k:]]
    assert np.array_equal(arrays(fresh.controls["kappa"]), arrays(resumed.controls["kappa"]))


def test_a_scaling_steps_in_m_over_s_with_bounds_and_the_log_in_m(comm, model, shared_tmp):
    """Scaling s: s = 1 is bitwise no scaling; a first blmvm step from m0 moves m along -s^2 g (TAO's
    y = m / s) under either line search, inside the bounds given in m; bad weights are refused."""
    options = dict(tao_type="blmvm", bounds={"kappa": (0.5, 3.0)}, gatol=0.0, grtol=0.0, gttol=0.0)
    start = model.default_controls()
    start["kappa"].scale(1.1)   # not the controls another test evaluated
    plain = Inversion(model, ["kappa"], controls=start, max_it=2, **options).solve()
    ones = model.default_controls()["kappa"]
    unit = Inversion(model, ["kappa"], controls=start, max_it=2, scaling={"kappa": ones}, **options).solve()
    assert [h["J"] for h in unit.history] == [h["J"] for h in plain.history]
    assert np.array_equal(arrays(unit.controls["kappa"]), arrays(plain.controls["kappa"]))
    y, x = model.grid.node_coordinates()
    s = np.broadcast_to(0.5 + 2.0 * x * y, model.grid.owned(ones).shape).ravel()   # 4.5-fold range of s^2
    g = GradientSession(model, controls=start).solve().result.gradient["kappa"].getArray(readonly=True)
    for search in ("more-thuente", "armijo"):   # f and g together; f at trials, g apart
        one = Inversion(model, ["kappa"], controls=start, max_it=1, scaling={"kappa": s},
                        tao_options=["-tao_ls_type", search], **options).solve()
        step = arrays(one.controls["kappa"]) - arrays(start["kappa"])
        assert one.iterations == 1 and one.misfit < one.history[0]["misfit"], search
        ratio = step / (-s * s * g)
        assert np.allclose(ratio, ratio.flat[0], rtol=1e-9) and ratio.flat[0] > 0, (search, ratio.min(), ratio.max())
        assert one.controls["kappa"].min()[1] >= 0.5 and one.controls["kappa"].max()[1] <= 3.0
    for bad, match in (({"u0": ones}, "cannot scale u0"), ({"kappa": 0.0 * s}, "not a positive finite")):
        with pytest.raises(InversionError, match=match):
            Inversion(model, ["kappa"], controls=start, max_it=1, scaling=bad, **options).solve()
