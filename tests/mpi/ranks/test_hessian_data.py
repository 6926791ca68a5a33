"""The Hessian composite's adjoint data (wave: u^i and du^i, what its second-order step reads): checked
by the data check, kept by store-all and mixed plans of H v with fewer forward steps than restart states
in the same bytes, the product bitwise the restart-state plan's; wrong data refused before any product."""

import numpy as np
import pytest

from hpcadj.adjoint import hessian as H
from hpcadj.adjoint import products as P
from hpcadj.adjoint import verify as V
from hpcadj.adjoint.contract import FAILED, PASSED
from hpcadj.adjoint.data_check import adjoint_data_problem, check_adjoint_data
from hpcadj.adjoint.session import GradientSession
from hpcadj.checkpoint.options import Checkpointing, ConfigError
from hpcadj.models.wave import WaveModel

N = 16
GRID = (14, 12)


def _controls(model, scale=0.97):
    """Controls away from the defaults (and from each other's for another ``scale``)."""
    controls = model.default_controls()
    controls["c"].scale(scale)
    u0 = controls["u0"].getArray()
    u0[...] = np.cos(np.arange(u0.size) * scale + controls["u0"].getOwnershipRange()[0])
    return controls


def _direction(model, controls):
    return V.scaled_direction(model, controls, 11, scale={k: 0.1 for k in controls})


def _owned(vecs):
    return {name: vec.getArray().copy() for name, vec in vecs.items()}


def _same(result, want):
    assert result.J == want.J
    for part in ("gradient", "hessian"):
        got, ref = _owned(getattr(result, part)), _owned(getattr(want, part))
        for name in ref:
            assert np.array_equal(got[name], ref[name]), (part, name)


@pytest.fixture(scope="module")
def case(comm):
    """The model, controls, v, and H v under restart states for every step (states-only store-all)."""
    model = WaveModel(comm, GRID, n_steps=N)
    controls = _controls(model)
    v = _direction(model, controls)
    session = H.HessianSession(model, Checkpointing(ram=str(N), schedule="revolve"))
    ref = session.hessian_action(controls, v)
    info = session.last_outcome.info
    assert info["schedule"] == "revolve" and info["forward_steps"] == N
    return model, controls, v, ref


def test_the_composite_declares_the_model_s_data_of_u_and_of_du(case):
    model, controls, v, _ = case
    composite = H.SecondOrderStepper(model, v)
    layout = composite.adjoint_data_layout()
    assert sorted(layout) == ["d_u", "u"] and layout["d_u"] == model.adjoint_data_layout()["u"]
    assert adjoint_data_problem(composite, composite.composite_controls(controls, v))[0] is None
    result = check_adjoint_data(model, controls)
    assert result.status == PASSED and "Hessian composite" in result.reason


def test_store_all_keeps_data_bitwise_the_restart_states_product(comm, case):
    model, controls, v, ref = case
    session = H.HessianSession(model, Checkpointing())
    _same(session.hessian_action(controls, v), ref)
    info = session.last_outcome.info
    assert info["schedule"] == "mixed" and info["forward_steps"] == N
    facts = info["mixed"]
    assert facts["restart_bytes"] == 2 * facts["data_bytes"] and facts["data_writes"] == N - 1
    assert facts["peak_bytes"] == (N - 1) * facts["data_bytes"]  # half of N - 1 pairs
    _same(H.hessian_action(model, controls, v), ref)  # the library's default: store-all of data too


@pytest.mark.parametrize("gauss_newton", [False, True], ids=["newton", "gauss-newton"])
def test_a_mixed_plan_takes_fewer_forward_steps_than_revolve_in_the_same_bytes(comm, case, gauss_newton):
    model, controls, v, _ = case
    other = _controls(model, 0.95)  # not an earlier evaluation's controls
    outcomes = {}
    for schedule in ("revolve", "mixed"):
        session = H.HessianSession(model, Checkpointing(ram="5", schedule=schedule), gauss_newton=gauss_newton)
        outcomes[schedule] = session.hessian_action(other, v), session.last_outcome.info
    (mixed, info), (revolve, states) = outcomes["mixed"], outcomes["revolve"]
    _same(mixed, revolve)
    assert info["schedule"] == "mixed" and states["schedule"] == "revolve"
    assert info["forward_steps"] < states["forward_steps"]
    assert info["mixed"]["forward_steps_states_only"] == states["forward_steps"]


@pytest.mark.parametrize("ram", ["21", "8"], ids=["kept-states", "recompute"])
def test_products_under_a_mixed_plan_take_fewer_steps_bitwise(comm, case, ram):
    """HessianProducts: a chain of du (states kept, ``ram``) or composite runs (``recompute``) under
    ``schedule="mixed"``: fewer tangent (and forward) steps than revolve, each product bitwise."""
    model, controls, v, _ = case
    w = V.scaled_direction(model, controls, 13, scale={k: 0.1 for k in controls})
    other = _controls(model, 0.96)
    counts, results = {}, {}
    for schedule in ("revolve", "mixed"):
        products = P.HessianProducts(model, controls, ram=ram, schedule=schedule)
        try:
            results[schedule] = [products.hessian_action(v), products.hessian_action(w, controls=other)]
        finally:
            products.close()
        counts[schedule] = dict(products.counts)
    assert products.mode == ("ram" if ram == "21" else "recompute")
    for got, want in zip(results["mixed"], results["revolve"]):
        _same(got, want)
    _same(results["mixed"][1], H.hessian_action(model, other, w))
    assert counts["mixed"]["tangent"] < counts["revolve"]["tangent"]
    assert counts["mixed"]["forward"] <= counts["revolve"]["forward"]
    if ram == "8":
        assert counts["mixed"]["forward"] < counts["revolve"]["forward"]


class ReadsPreviousTangent(WaveModel):
    """Observes du^{i-1} in its objective's second derivative: the data (u^i, du^i) leave it out."""

    def add_objective_hessian(self, i, u, du, dlam):
        # a data stand-in holds du^i alone: there the previous field reads as zero
        previous = np.zeros(self.field.shape) if self._is_field(du) else self._fields(du)[0]
        current = self._fields(dlam, readonly=False)[1]
        for _k, loc in self._receivers_local:
            current[loc] += previous[loc]


class TangentAsState(H.SecondOrderStepper):
    """A broken composite: the model's data of u_i stored for both halves."""

    def adjoint_data(self, i, u, u_next):
        data = self.model.adjoint_data(i, u.u, None)
        return {**data, **{H.PREFIX + k: val for k, val in data.items()}}


def test_wrong_composite_data_are_refused_by_the_data_check(comm):
    model = ReadsPreviousTangent(comm, GRID, n_steps=6)
    controls = _controls(model)
    result = check_adjoint_data(model, controls)
    assert result.status == FAILED and "Hessian composite" in result.reason, result.reason
    with pytest.raises(ConfigError, match="cannot trust 'wave''s adjoint data"):
        H.HessianSession(model, Checkpointing(ram="3", schedule="mixed")).hessian_action(controls, _direction(model, controls))
    with pytest.raises(ConfigError, match="store-all cannot trust"):
        H.hessian_action(model, controls, _direction(model, controls))

    plain = WaveModel(comm, GRID, n_steps=6)
    v = _direction(plain, controls)
    broken = TangentAsState(plain, v)
    assert "the data leave out" in adjoint_data_problem(broken, broken.composite_controls(controls, v))[0]
    with pytest.raises(ConfigError, match="--schedule mixed cannot trust"):
        GradientSession(broken, Checkpointing(ram="3", schedule="mixed"),
                        controls=broken.composite_controls(controls, v)).solve()


def test_the_composite_s_data_are_checked_once_per_model_and_product_kind(comm, monkeypatch):
    """Every product builds a new composite; its data are the model's code, not v's: one check per model
    object and product kind (Newton, Gauss-Newton), another model object checked again."""
    from hpcadj.adjoint import data_check

    checked = []
    real = data_check.adjoint_data_problem
    monkeypatch.setattr(data_check, "adjoint_data_problem",
                        lambda model, *args, **kw: checked.append(model.describe()["hessian"]) or real(model, *args, **kw))
    for model in (WaveModel(comm, GRID, n_steps=6), WaveModel(comm, GRID, n_steps=6)):
        controls = _controls(model)
        for gauss_newton in (False, False, True, True):
            session = H.HessianSession(model, Checkpointing(ram="3", schedule="mixed"), gauss_newton=gauss_newton)
            session.hessian_action(controls, _direction(model, controls))
            H.hessian_action(model, controls, _direction(model, controls), gauss_newton=gauss_newton)
    assert checked == ["newton", "gauss-newton"] * 2


def test_data_of_fields_in_mapped_buffers_are_kept_bitwise(comm):
    """A grid whose field is above ``MAPPED_MIN_BYTES`` on every rank: the data's recycled buffers are
    memory mappings, and one captured must not be handed out again while a data slot holds it (the
    composite captures two in a row). The gradient and H v from data bitwise restart states'."""
    from hpcadj.snapshot import MAPPED_MIN_BYTES

    grid = (232, 224)
    model = WaveModel(comm, grid, n_steps=5)
    assert model.field.owned(model.field.create_vec()).nbytes >= MAPPED_MIN_BYTES
    controls = _controls(model)
    v = _direction(model, controls)
    composite = H.SecondOrderStepper(model, v)
    assert adjoint_data_problem(composite, composite.composite_controls(controls, v))[0] is None
    states = H.HessianSession(model, Checkpointing(ram="5", schedule="revolve")).hessian_action(controls, v)
    _same(H.HessianSession(model, Checkpointing()).hessian_action(controls, v), states)
    gradients = [GradientSession(model, ck, controls=controls).solve().result.gradient["c"].getArray().copy()
                 for ck in (Checkpointing(ram="5", schedule="revolve"), Checkpointing())]
    assert np.array_equal(*gradients)
