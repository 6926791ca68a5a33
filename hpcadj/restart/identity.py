"""What identifies a run, to refuse resuming it with another configuration.

The identity is what ``describe()`` lists and a fingerprint of the controls; the trajectory
fingerprint (:func:`trajectory_fingerprint`) catches settings ``describe()`` leaves out.
"""

from __future__ import annotations

import zlib

import numpy as np

#: identity keys compared first, most basic first; the others follow in name order
IDENTITY_ORDER = ("model", "grid", "shape", "steps", "dt")
#: relative agreement of the trajectory fingerprint's sums on another rank count (rounding only)
TRAJECTORY_RTOL = 1e-8

def controls_fingerprint(model, controls, comm) -> list[float]:
    """Two numbers per control that do not depend on the rank layout (weighted by natural index)."""
    out = []
    layouts = model.control_layout()
    for name in sorted(controls):
        layout = layouts[name]
        values = controls[name].getArray(readonly=True).reshape(layout.shape)
        grids = np.meshgrid(*[np.arange(s, s + m) for s, m in zip(layout.start, layout.shape)], indexing="ij")
        natural = np.ravel_multi_index(grids, layout.global_shape) if values.size else np.zeros(values.shape)
        weights = np.sin(0.7 + 1.3 * natural)
        out.extend([comm.allreduce(float(values.sum())), comm.allreduce(float((values * weights).sum()))])
    return out


def _same_fingerprint(a, b) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-12 * max(1.0, abs(x), abs(y)) for x, y in zip(a, b))


def _natural_index(layout) -> np.ndarray:
    """The natural (global, C-order) index of every point of this rank's block, as float64 (one
    block-sized array: the axes' offsets are broadcast, not expanded)."""
    out = np.zeros(layout.shape, dtype=np.float64)
    stride = 1
    for axis in reversed(range(len(layout.shape))):
        shape = [1] * len(layout.shape)
        shape[axis] = layout.shape[axis]
        start = layout.start[axis]
        out += (np.arange(start, start + layout.shape[axis], dtype=np.float64) * stride).reshape(shape)
        stride *= layout.global_shape[axis]
    return out


def _field_print(arrays: dict, layouts: dict, comm) -> dict:
    """A fingerprint of distributed fields: per field, the CRC-32 of every rank's block in rank order
    (bitwise, for the same rank count) and three sums that do not depend on the rank layout
    (sum |x| and two weighted sums, for another rank count, compared to rounding)."""
    out = {}
    for name in sorted(layouts):
        values = np.asarray(arrays[name]).reshape(layouts[name].shape)
        x = values.astype(np.float64, copy=False)
        natural = _natural_index(layouts[name])
        weights = np.sin(0.7 + 1.3 * natural)
        local = [np.abs(x).sum(), np.vdot(x, weights)]
        np.cos(0.2 + 0.9 * natural, out=weights)
        local = np.array(local + [np.vdot(x, weights)])
        crcs = comm.allgather(zlib.crc32(np.ascontiguousarray(values).tobytes()))
        out[name] = {"crc32": zlib.crc32(np.asarray(crcs, dtype=np.uint32).tobytes()),
                     "sums": [float(v) for v in comm.allreduce(local)]}
    return out


def _probe_state(model):
    """A state with fixed values given by the natural index (the same field on any rank count)."""
    blocks = {}
    for name, layout in model.snapshot_layout().items():
        blocks[name] = np.sin(0.3 + 0.77 * _natural_index(layout)).astype(layout.dtype, copy=False)
    return model.restore(blocks)


def trajectory_fingerprint(model, controls, comm) -> dict:
    """What the run's first step and one adjoint step give, to recognise the run on resume.

    ``describe()`` lists what its author thought of; a setting it leaves out (a velocity, a rate
    constant) still changes the trajectory. So at creation and on every resume the model takes
    u_1 = step(0, u_0) from the controls, one adjoint step lambda_0 = adjoint_step(0, u_0, u_1, w)
    from a fixed field w (with the parameter gradient it adds), and the objective at u_0 and u_1
    (as state 1 and as state n): one forward and one adjoint step each time. A model with adaptive
    steps gets its step record back as it was (the first sweep decides it). Collective.
    """
    record = getattr(model, "step_record", lambda: None)()
    model.set_controls(controls)
    u0 = model.initial_state()
    u1 = model.step(0, u0)
    n = model.n_steps
    objective = [float(model.objective(0, u0)), float(model.objective(1, u1))]
    if n is not None and n > 1:
        objective.append(float(model.objective(n, u1)))
    grad = {name: vec.duplicate() for name, vec in controls.items()}
    for vec in grad.values():
        vec.set(0.0)
    probe = _probe_state(model)
    lam0 = model.adjoint_step(0, u0, u1 if getattr(model, "adjoint_reads_next", True) else None, probe, grad)
    layouts = model.snapshot_layout()
    out = {"u1": _field_print(model.snapshot(u1), layouts, comm),
           "lambda0": _field_print(model.snapshot(lam0), layouts, comm),
           "grad": _field_print(model.control_arrays(grad), model.control_layout(), comm),
           "objective": objective}
    if record is not None:
        model.load_step_record(record)
    return out  # the Vecs go with their references (a model may hand out one it keeps, e.g. u_0)


#: what each part of the trajectory fingerprint is, for the refusal
_TRAJECTORY_PARTS = (("u1", "its first step u_1 = step(0, u_0) differs"),
                     ("lambda0", "its adjoint step differs"),
                     ("grad", "its parameter gradient from one adjoint step differs"),
                     ("objective", "its objective differs"))
#: a difference across rank counts up to this (relative) is what a solve stopped at a loose tolerance
#: leaves (GMRES at its default rtol 1e-5 gave 1e-6 in u_1), not another setting
LOOSE_SOLVE_RTOL = 1e-3


def _relative(a: list, b: list, scale: float) -> float:
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0) / max(scale, 1e-300)


def trajectory_difference(saved: dict, now: dict, same_ranks: bool) -> tuple[str, str, float | None] | None:
    """The first part of the trajectory fingerprint that differs, as (part, field, relative
    difference), or None: bitwise on the same rank count, to rounding (TRAJECTORY_RTOL of sum |x|)
    on another. The relative difference is the largest of the layout-independent sums' (None when
    the fields themselves differ); on the same rank count it can be 0 for bits no sum resolves."""
    for part, _ in _TRAJECTORY_PARTS:
        a, b = saved.get(part), now.get(part)
        if part == "objective":
            if len(a) != len(b):
                return part, "J", None
            for x, y in zip(a, b):
                rel = _relative([x], [y], max(abs(x), abs(y)))
                if (x != y) if same_ranks else rel > TRAJECTORY_RTOL:
                    return part, "J", rel
            continue
        if set(a) != set(b):
            return part, ", ".join(sorted(set(a) ^ set(b))), None
        for field in sorted(a):
            rel = _relative(a[field]["sums"], b[field]["sums"], max(a[field]["sums"][0], b[field]["sums"][0]))
            if (a[field]["crc32"] != b[field]["crc32"]) if same_ranks else rel > TRAJECTORY_RTOL:
                return part, field, rel
    return None


def trajectory_refusal(path, saved: dict, now: dict, saved_ranks: int, ranks: int) -> str | None:
    """The one-line refusal of a resume whose trajectory fingerprint is not the recorded one (None
    when it is): what differs, by how much, and what to do. Across rank counts a small difference
    is a loose solver tolerance, not another configuration."""
    found = trajectory_difference(saved, now, saved_ranks == ranks)
    if found is None:
        return None
    part, field, rel = found
    what = dict(_TRAJECTORY_PARTS)[part]
    by = f"in {field}" if rel is None else f"in {field} by {rel:.1e} relative"
    if saved_ranks != ranks and rel is not None and rel <= LOOSE_SOLVE_RTOL:
        def ranks_of(n):
            return f"{n} rank{'s' if n != 1 else ''}"
        return (f"run directory {path} was run on {ranks_of(saved_ranks)} and cannot resume on {ranks}: "
                f"{what} {by}, more than the {TRAJECTORY_RTOL:.0e} of rounding allowed across rank counts; "
                f"a solve stopped at a loose tolerance (GMRES at its default -ksp_rtol 1e-5, say) gives "
                f"states that depend on the rank count: resume on {ranks_of(saved_ranks)}, or start afresh "
                f"with tight tolerances (-ksp_rtol 1e-12 -snes_rtol 1e-12) to resume on any rank count")
    return (f"run directory {path} belongs to another configuration: {what} {by} (a setting the "
            f"model's describe() does not list, e.g. a coefficient, a velocity or a solver tolerance, "
            f"is not the run's): resume with the run's settings, or use another run directory")


def identity_mismatch(saved: dict, current: dict) -> str | None:
    """The most basic difference first: model, grid/shape, steps, dt, then the rest by name."""
    keys = (set(saved) | set(current)) - {"controls"}
    ordered = [k for k in IDENTITY_ORDER if k in keys] + sorted(keys - set(IDENTITY_ORDER))
    for key in ordered:
        if saved.get(key) != current.get(key):
            return (f"run directory belongs to another configuration: {key} was "
                    f"{saved.get(key)!r}, now {current.get(key)!r}")
    if not _same_fingerprint(saved.get("controls", []), current.get("controls", [])):
        return "run directory belongs to another configuration: the controls differ"
    return None
