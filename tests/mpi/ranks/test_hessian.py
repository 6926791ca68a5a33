"""Hessian-vector products of every built-in model: second-order Taylor, symmetry, gradient differences."""

import numpy as np
import pytest

from hpcadj.adjoint import hessian as H

from hpcadj.adjoint import verify as V


def build(comm, name, steps=None):
    """A tiny model (``steps`` overrides its default step count)."""
    if name == "heat":
        from hpcadj.models.heat import HeatModel
        return HeatModel(comm, (7, 6), n_steps=steps or 5, dt=2e-3)
    if name == "burgers":
        from hpcadj.models.burgers import BurgersModel
        return BurgersModel(comm, (12, 9), n_steps=steps or 6)
    if name == "wave":
        from hpcadj.models.wave import WaveModel
        return WaveModel(comm, (12, 10), n_steps=steps or 30)
    if name == "grayscott":
        from hpcadj.models.grayscott import GrayScottModel
        return GrayScottModel(comm, (10, 9), n_steps=steps or 4)
    raise KeyError(name)


MODELS = ["heat", "burgers", "wave", "grayscott"]
#: the second-order Taylor test's first step (grayscott's remainder leaves its asymptotic range
#: beyond a few per cent of F and k)
EPS0 = {"grayscott": 0.05}


def perturbed_controls(model):
    """Controls 5 % (relative) away from the defaults: no earlier evaluation used them."""
    controls = model.default_controls()
    shift = V.scaled_direction(model, controls, 7, scale={k: 0.05 for k in controls})
    for k in controls:
        controls[k].axpy(1.0, shift[k])
    return controls


@pytest.fixture(scope="module")
def checks(comm):
    """One set of runs per model, shared by the assertions below."""
    out = {}
    for name in MODELS:
        model = build(comm, name)
        controls = perturbed_controls(model)
        v = V.scaled_direction(model, controls, 11, scale={k: 0.1 for k in controls})
        w = V.scaled_direction(model, controls, 13, scale={k: 0.1 for k in controls})
        hv = H.hessian_action(model, controls, v)
        taylor = V.second_order_taylor_test(model, controls, v, hess=hv, eps0=EPS0.get(name, 0.5))
        hw = H.hessian_action(model, controls, w)
        fd = [V.relative_difference(hv.hessian, V.gradient_difference(model, controls, v, eps))
              for eps in (1e-3, 5e-4)]
        gn_v = H.hessian_action(model, controls, v, gauss_newton=True)
        gn_w = H.hessian_action(model, controls, w, gauss_newton=True)
        out[name] = dict(model=model, v=v, w=w, hv=hv, hw=hw, taylor=taylor, fd=fd, gn_v=gn_v, gn_w=gn_w)
    return out


@pytest.mark.parametrize("name", MODELS)
def test_second_order_taylor(checks, name):
    t = checks[name]["taylor"]
    assert t.min_rate >= 2.9, (t.rates, t.remainders)


@pytest.mark.parametrize("name", MODELS)
def test_symmetric(checks, name):
    c = checks[name]
    a, b = V.controls_dot(c["hv"].hessian, c["w"]), V.controls_dot(c["v"], c["hw"].hessian)
    assert abs(a - b) <= 1e-10 * max(abs(a), abs(b)), (a, b)


@pytest.mark.parametrize("name", MODELS)
def test_against_gradient_differences(checks, name):
    """Central differences of two gradients: O(eps^2) error (a quarter when eps halves), small."""
    e1, e2 = checks[name]["fd"]
    assert e1 < 1e-6 and 3.5 < e1 / e2 < 4.5, (e1, e2)


@pytest.mark.parametrize("name", MODELS)
def test_gauss_newton(checks, name):
    """Gauss-Newton: symmetric, same J and gradient as Newton's run, and a different product."""
    c = checks[name]
    a, b = V.controls_dot(c["gn_v"].hessian, c["w"]), V.controls_dot(c["v"], c["gn_w"].hessian)
    assert abs(a - b) <= 1e-10 * max(abs(a), abs(b)), (a, b)
    assert c["gn_v"].J == c["hv"].J
    assert V.relative_difference(c["gn_v"].gradient, c["hv"].gradient) == 0.0
    assert V.relative_difference(c["gn_v"].hessian, c["hv"].hessian) > 1e-8


#: H v across rank counts agrees as the models' gradients do (tests/mpi/test_<model>.py)
RANK_RTOL = {"heat": 1e-10, "burgers": 1e-13, "wave": 1e-13, "grayscott": 1e-10}


def fixed_direction(model, controls, seed):
    """A direction drawn on the global grid, scaled by constants (no reductions): the same on any
    rank count, bit for bit."""
    from hpcadj.adjoint.verify import random_direction

    direction = random_direction(model, controls, seed, relative=False)
    for name, vec in direction.items():
        vec.scale({"kappa": 0.1, "nu": 1e-3, "c": 0.1, "F": 4e-3, "k": 6e-3}.get(name, 0.05))
    return direction


def hessian_fields(comm, name):
    """Global arrays of dJ/dm and H v (at default controls + a fixed shift, along a fixed direction)."""
    from model_checks import gather

    model = build(comm, name)
    controls = model.default_controls()
    shift = fixed_direction(model, controls, 7)
    for k in controls:
        controls[k].axpy(0.5, shift[k])
    hv = H.hessian_action(model, controls, fixed_direction(model, controls, 11))
    layouts = model.control_layout()
    return {"J": hv.J, "g": gather(comm, layouts, model.control_arrays(hv.gradient)),
            "hv": gather(comm, layouts, model.control_arrays(hv.hessian))}


@pytest.mark.parametrize("name", MODELS)
def test_rank_count_invariance(comm, name):
    from hpcadj.imports import mpi

    ref = comm.bcast(hessian_fields(mpi().COMM_SELF, name) if comm.rank == 0 else None, root=0)
    got = hessian_fields(comm, name)
    rtol = RANK_RTOL[name]
    assert abs(got["J"] - ref["J"]) <= rtol * abs(ref["J"])
    for part in ("g", "hv"):
        for field, expected in ref[part].items():
            scale = np.max(np.abs(expected))
            assert scale > 0, (part, field)
            assert np.max(np.abs(got[part][field] - expected)) <= rtol * scale, (part, field)
