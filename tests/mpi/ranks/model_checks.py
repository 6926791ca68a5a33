"""Checks every model must pass on any rank count (used by test_burgers, test_wave, test_grayscott),
and the small models and store-all references the checkpointing modules compare their plans against.

The rank-count reference is the same model built on COMM_SELF on rank 0 (a serial run), broadcast to
all ranks; distributed blocks are gathered into global arrays by their FieldLayouts and compared.
"""

from __future__ import annotations

import numpy as np

from hpcadj.adjoint.verify import compute_gradient, dot_product_test, taylor_test

MIN_RATE = 1.95
#: each model's grid in the checkpointing modules (test_checkpointing, test_online_driver, test_faults)
SMALL_GRIDS = {"heat": "10x9", "burgers": "12x12", "wave": "14x12", "grayscott": "12x12"}


def small_model(name: str, comm, steps: int, grid: str | None = None):
    """Model ``name`` built from the command line's own options, at its small grid (or ``grid``)."""
    from hpcadj.cli import Parser
    from hpcadj.cli.common import add_model_arguments, build_model

    parser = Parser()
    add_model_arguments(parser)
    args = parser.parse_args(["--model", name, "--grid", grid or SMALL_GRIDS[name], "--steps", str(steps)])
    return build_model(args, comm)


def owned(result) -> dict:
    """This rank's block of every gradient field of ``result``, copied out of its Vecs."""
    return {name: vec.getArray().copy() for name, vec in result.gradient.items()}


def store_all_reference(model, controls=None) -> tuple:
    """(model, controls, J, owned gradient) of a store-all run: what every checkpointed plan must give
    bitwise. ``controls`` defaults to the model's defaults."""
    controls = model.default_controls() if controls is None else controls
    result = compute_gradient(model, controls)
    return model, controls, result.J, owned(result)


def gather(comm, layouts, arrays) -> dict:
    """Global natural-ordered arrays from every rank's blocks (on every rank)."""
    out = {}
    for name in sorted(layouts):
        layout = layouts[name]
        pieces = comm.allgather((layout.slices, np.asarray(arrays[name])))
        full = np.full(layout.global_shape, np.nan)
        for slices, block in pieces:
            full[slices] = block
        assert not np.isnan(full).any(), f"{name}: the blocks do not cover the global array"
        out[name] = full
    return out


def serial_reference(comm, build):
    """J, the gradient and the snapshot of u_n from a one-rank run (rank 0), broadcast to all ranks."""
    from hpcadj.imports import mpi

    ref = None
    if comm.rank == 0:
        model = build(mpi().COMM_SELF)
        controls = model.default_controls()
        result = compute_gradient(model, controls)
        model.set_controls(controls)
        u = model.initial_state()
        def kept(u):
            return {name: block.copy() for name, block in model.snapshot(u).items()}

        states = [kept(u)]
        for i in range(model.n_steps):
            u = model.step(i, u)
            states.append(kept(u))
        ref = {"J": result.J, "gradient": model.control_arrays(result.gradient), "states": states}
    return comm.bcast(ref, root=0)


def check_taylor(comm, build, control, eps0=1e-2):
    model = build(comm)
    controls = model.default_controls()
    result = taylor_test(model, controls, control, eps0=eps0, halvings=3)
    assert all(r > 0 for r in result.remainders), result
    assert result.min_rate >= MIN_RATE, f"{control}: rates {result.rates}, remainders {result.remainders}"
    return result


def check_dot_product(comm, build, tol=1e-10):
    model = build(comm)
    result = dot_product_test(model, model.default_controls())
    assert abs(result.tangent) > 0
    assert result.relative_mismatch <= tol, result
    return result


def check_rank_invariance(comm, build, rtol):
    """J, every gradient field and every state equal the serial run's to ``rtol`` (relative to max)."""
    ref = serial_reference(comm, build)
    model = build(comm)
    controls = model.default_controls()
    result = compute_gradient(model, controls)
    assert abs(result.J - ref["J"]) <= rtol * abs(ref["J"]), (result.J, ref["J"])
    grads = gather(comm, model.control_layout(), model.control_arrays(result.gradient))
    assert sorted(grads) == sorted(ref["gradient"])
    for name, field in grads.items():
        expected = ref["gradient"][name]
        scale = np.max(np.abs(expected))
        assert scale > 0, f"gradient {name} is zero: the check would be empty"
        assert np.max(np.abs(field - expected)) <= rtol * scale, name
    for name, vec in result.gradient.items():  # collective on every rank (no stale cached norms)
        assert abs(vec.norm() - np.linalg.norm(ref["gradient"][name])) <= rtol * np.linalg.norm(ref["gradient"][name])
    model.set_controls(controls)
    u = model.initial_state()
    for i in range(model.n_steps + 1):
        if i > 0:
            u = model.step(i - 1, u)
        state = gather(comm, model.snapshot_layout(), model.snapshot(u))
        for name, field in state.items():
            expected = ref["states"][i][name]
            assert np.max(np.abs(field - expected)) <= rtol * max(np.max(np.abs(expected)), 1e-300), (i, name)


def check_restart_across_ranks(comm, build, rtol):
    """A serial snapshot of u_k, cut into this rank count's blocks by the layout, continues the run."""
    ref = serial_reference(comm, build)
    model = build(comm)
    model.set_controls(model.default_controls())
    k = model.n_steps // 2
    layouts = model.snapshot_layout()
    assert set(layouts) == set(ref["states"][k])
    blocks = {name: ref["states"][k][name][layout.slices] for name, layout in layouts.items()}
    for name, layout in layouts.items():
        assert blocks[name].shape == layout.shape
    u = model.restore(blocks)
    assert all(np.array_equal(model.snapshot(u)[name], blocks[name]) for name in blocks)
    for i in range(k, model.n_steps):
        u = model.step(i, u)
    final = gather(comm, layouts, model.snapshot(u))
    for name, field in final.items():
        expected = ref["states"][-1][name]
        assert np.max(np.abs(field - expected)) <= rtol * np.max(np.abs(expected)), name
    assert model.snapshot_bytes() == sum(int(np.prod(layout.global_shape)) * 8 for layout in layouts.values())


def write_observations(comm, truth, observed, path) -> None:
    """u of a run of ``truth`` (controls set) at the ``observed`` steps, as an --observations file."""
    from hpcadj.imports import h5py

    u, states = truth.initial_state(), {}
    for i in range(max(observed)):
        u = truth.step(i, u)
        if i + 1 in observed:
            states[i + 1] = truth.grid.owned_view(u).copy()
    with h5py().File(path, "w", driver="mpio", comm=comm) as f:
        f.create_dataset("steps", data=np.array(observed))
        d = f.create_dataset("u", shape=(len(observed),) + truth.grid.global_shape, dtype="f8")
        for k, step in enumerate(observed):
            with d.collective:
                d[(k, *truth.grid.layout().slices)] = states[step]
