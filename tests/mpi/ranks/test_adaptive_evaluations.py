"""The step sequence of an adaptive model belongs to the evaluation at one control, under mpirun:
at m1, m2, m1 again, objective and gradient in every order, through the evaluation cache (each
policy) and plain sessions on one model, every J, gradient and step sequence is bitwise a fresh
model's session at that control (adaptive heat, adaptive wave, a Gray-Scott TS with TSAdapt); the
Hessian products, which keep no evaluation's sequence, refuse an adaptive model."""

import numpy as np
import pytest

from hpcadj.adjoint.session import Checkpointing, GradientSession
from hpcadj.imports import petsc
from hpcadj.inversion import ControlSpace, EvaluationCache
from hpcadj.models.heat import HeatModel
from hpcadj.models.wave import WaveModel

pytestmark = pytest.mark.timeout(300)

#: the inverted control and how m2 differs from m1 (the default controls)
SETUPS = {"heat": ("kappa", 1.3), "wave": ("c", 1.15), "ts": ("u0", 0.8)}


def build(name, comm, tag=""):
    if name == "heat":
        return HeatModel(comm, (10, 9), dt=1e-3, adaptive=True, t_final=0.02, tolerance=1e-3)
    if name == "wave":
        return WaveModel(comm, (14, 12), adaptive=True, t_final=0.3)
    from hpcadj.ts import TSStepper
    from hpcadj.ts.examples import GrayScott

    prefix = f"adeval{tag}_"
    opts = petsc().Options()
    settings = {"ts_adapt_type": "basic", "ts_rk_type": "3bs", "ts_rtol": 1e-6, "ts_atol": 1e-6}
    for key, value in settings.items():
        opts[prefix + key] = value
    try:
        gs = GrayScott(comm, m=12, dt=0.5, ts_type="rk", prefix=prefix)
    finally:
        for key in settings:
            opts.delValue(prefix + key)
    return TSStepper(gs.ts, gs.u0, final=(lambda u: 0.5 * u.dot(u), lambda u: u.copy()), t_final=20.0, max_steps=200)


def controls_at(model, name, tag):
    control, factor = SETUPS[name]
    c = model.default_controls()
    if tag == "m2":
        c[control].scale(factor)
    return c


def fresh(name, comm, tag):
    """(J, gradient arrays, dts) of a session on a model built afresh, at control ``tag``."""
    model = build(name, comm, f"fresh{tag}")
    r = GradientSession(model, controls=controls_at(model, name, tag)).solve().result
    return r.J, {k: v.getArray(readonly=True).copy() for k, v in r.gradient.items()}, list(model.steps.dts)


@pytest.fixture(scope="module", params=sorted(SETUPS))
def case(request, comm):
    name = request.param
    refs = {tag: fresh(name, comm, tag) for tag in ("m1", "m2")}
    assert refs["m1"][2] != refs["m2"][2]  # the two controls decide different step sequences
    return name, refs


#: m1, m2, m1 with g after g, f after g, g after f at the same and at another control
SEQUENCE = [("g", "m1"), ("g", "m2"), ("f", "m1"), ("g", "m1"), ("f", "m2"), ("g", "m1"), ("g", "m2")]


@pytest.mark.parametrize("policy", ["keep", "gradient", "forward"])
def test_cache_at_m1_m2_m1_is_a_fresh_session_bitwise(comm, case, policy):
    name, refs = case
    model = build(name, comm, f"cache{policy}")
    control = SETUPS[name][0]
    space = ControlSpace(model.default_controls(), [control])
    points = {tag: space.pack(controls_at(model, name, tag)) for tag in refs}
    cache = EvaluationCache(model, space, Checkpointing(ram=3), policy=policy)
    for what, tag in SEQUENCE:
        e = cache.objective(points[tag]) if what == "f" else cache.gradient(points[tag])
        J, grad, dts = refs[tag]
        assert e.J == J, (what, tag)
        if what == "g":
            assert np.array_equal(e.gradient.getArray(readonly=True), grad[control]), (what, tag)
            assert model.steps.dts == dts, (what, tag)
    cache.drop()


def test_sessions_on_one_model_are_fresh_sessions_bitwise(comm, case):
    name, refs = case
    model = build(name, comm, "sessions")
    for tag in ("m1", "m2", "m1", "m2"):
        r = GradientSession(model, Checkpointing(ram=3), controls=controls_at(model, name, tag)).solve().result
        J, grad, dts = refs[tag]
        assert r.J == J and model.steps.dts == dts and model.n_steps == len(dts), tag
        for k, v in r.gradient.items():
            assert np.array_equal(v.getArray(readonly=True), grad[k]), (tag, k)


def test_hessian_products_refuse_an_adaptive_model_after_an_evaluation(comm):
    """The products keep no evaluation's step sequence: n known from a past evaluation is no licence."""
    from hpcadj.adjoint.hessian import check_model

    model = build("heat", comm, "hessian")
    GradientSession(model, controls=model.default_controls()).solve()
    assert model.n_steps is not None
    with pytest.raises(ValueError, match="adaptive steps are not supported"):
        check_model(model, gauss_newton=True)
