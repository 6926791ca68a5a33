"""Acoustic wave u_tt + sigma u_t = c(x)^2 lap u + f on the unit square/cube (2-D or 3-D), u = 0 outside.

Interior nodes x_i = (i+1)h, h = 1/(N+1); natural axis 0 is depth. 5/7-point Laplacian L; leapfrog in
time with the sponge damping sigma u_t centred:

    u^{i+1} = a [2 u^i - b u^{i-1} + dt^2 (c^2 L u^i + f^i)],  a = 1/(1 + sigma dt/2), b = 1 - sigma dt/2.

sigma(x) = sigma_max sum_axes (d/W)^2 in a sponge of width W = 0.1 at every face (d the depth into
it), zero inside. The source is a Ricker wavelet of peak frequency f0 (delay 1/f0) at one node, as a
discrete delta r(t_i)/h^d, at depth 0.2 and ``source_x`` along the last axis (default 0.5; a shot of
hpcadj.inversion.shots puts it elsewhere). The state of step i is the pair (u^{i-1}, u^i): a global
Vec of the dof-2 DMDA's size whose owned part holds the two fields one after the other (the *split*
layout: unit-stride rows for the kernels), while the control u0 keeps the DMDA's interleaved layout; a
snapshot holds both fields. The step is linear in the state and in c^2, pointwise or a symmetric
stencil, so the adjoint is exact to round-off and the states are bitwise the same on any rank count:

    lam_prev = -a b mu,  lam_cur = lam_prev' + 2 a mu + dt^2 L(c^2 a mu),  dJ/dc += 2 c dt^2 a mu L u^i,

with (lam_prev', mu) the adjoint of (u^i, u^{i+1}). dt = 0.5 h / (c_max sqrt(d)), fixed at
construction from the background and true models.

Objective (full-waveform inversion): J = 1/2 sum_{i=0..n} sum_r (u^i(x_r) - d_r^i)^2 over receivers on
a line at depth 0.2 (the source's depth, x from 0.15 to 0.85). The observed traces d come from an
HDF5 file (dataset ``traces`` of shape (n+1, receivers)) or, by default, from a run with the "true"
model c_true = c_bg (1 + A exp(-|x - x_c|^2 / (2 * 0.1^2))), a Gaussian anomaly of relative amplitude A
(default 0.1) at the centre. Controls: ``c`` (the velocity model, default the background
c_bg = 1 + 0.5 depth) and ``u0`` (the initial pair (u^{-1}, u^0), default zero).

Adaptive steps (``adaptive=True``, ``t_final``): dt_i = cfl times the CFL limit of the current velocity
model (its maximum over all ranks), the last step shortened to land on t_final, on the non-uniform
leapfrog (kernels/wave.py: r = dt_i / dt_{i-1}, dt^2 -> (dt_i + dt_{i-1}) dt_i / 2, sigma dt_i / 2 per
step). The leapfrog's stability limit depends on c, not on the state, so the sequence is constant but
for its last step. Observed traces are indexed by step, so an adaptive run observes d = 0 (J is the
receivers' energy).
"""

from __future__ import annotations

import math
import os

import numpy as np

from ..imports import mpi
from . import kernels
from .adaptive import AdaptiveSteps, StepSequence
from .base import Stepper
from .common import laplacian
kern = kernels.lazy("wave")


_NO_FACE = kernels.readonly(np.zeros((1, 1)))


class _DataPool(kernels.VecPool):
    """Field-size buffers for steps' adjoint data (u^i), recycled like the states' (no fresh pages
    per capture). The driver's trims before each data store leave them (the next captures reuse
    them); its trims before a restart state is stored drop the idle ones, as a full trim does."""

    holds_data = True


def _tiled():
    """The tiled advance's module (kernels/wave_tiled.py), imported when first used."""
    from .kernels import wave_tiled

    return wave_tiled


def ricker(t, f0: float):
    """Ricker wavelet (1 - 2 (pi f0 s)^2) exp(-(pi f0 s)^2), s = t - 1/f0."""
    s = math.pi * f0 * (t - 1.0 / f0)
    if abs(s) > 30.0:  # exp(-900) underflows: the wavelet is exactly 0 here (and s*s may overflow)
        return 0.0
    arg = s * s
    return (1.0 - 2.0 * arg) * math.exp(-arg)


class WaveModel(AdaptiveSteps, Stepper):
    """Acoustic leapfrog with sponge, Ricker source and receivers; controls ``c`` and ``u0``."""

    name = "wave"
    adjoint_reads_next = False  # the leapfrog adjoint reads u_i only
    default_anomaly = 0.1
    sponge_width = 0.1
    source_depth = 0.2
    receiver_span = (0.15, 0.85)

    def __init__(self, comm, grid=(64, 64), n_steps: int | None = None, dt: float | None = None,
                 frequency: float | None = None, anomaly: float = 0.1, observed: str | None = None,
                 cfl: float = 0.5, adaptive: bool = False, t_final: float | None = None,
                 source_x: float | None = None):
        if adaptive and (t_final is None or dt is not None or observed is not None):
            raise ValueError("--adaptive takes --t-final T and decides dt itself (no --dt, no --observed)")
        self.steps = StepSequence(t_final) if adaptive else None
        if len(grid) not in (2, 3):
            raise ValueError(f"wave is 2-D or 3-D, got a {len(grid)}-D grid")
        if min(grid) < 5:
            raise ValueError("wave needs at least 5 points per axis")
        if not -0.5 < anomaly < 1.0:
            raise ValueError(f"anomaly must lie in (-0.5, 1), got {anomaly}")
        if source_x is not None and not 0.0 < source_x < 1.0:
            raise ValueError(f"source_x must lie in (0, 1), got {source_x}")
        self.source_x = None if source_x is None else float(source_x)
        self.comm = comm
        self.field = kernels.LeanGrid(comm, tuple(grid))  # its DMDA released once the halos are built
        self.grid = kernels.PairLayout(self.field)  # the pair's layout: no DMDA of its own
        self.dim = self.field.dim
        self.h = self.field.spacing()
        self.anomaly = float(anomaly)
        c_bg = self.background()
        c_true = self.true_model()
        c_max = comm.allreduce(float(max(np.max(c_bg, initial=0.0),
                                         np.max(self.field.owned(c_true), initial=0.0))), op=mpi().MAX)
        del c_bg
        if not 0 < cfl <= 1:
            raise ValueError(f"cfl must lie in (0, 1], got {cfl}")
        limit = 1.0 / (c_max * math.sqrt(sum(1.0 / h ** 2 for h in self.h)))
        self.dt = float(dt) if dt is not None else cfl * limit
        if not self.dt > 0 or not math.isfinite(self.dt):
            raise ValueError(f"dt must be positive, got {self.dt}")
        if self.dt > limit:
            # explicit leapfrog: beyond the CFL limit the states blow up and the gradient is garbage
            raise ValueError(f"dt {self.dt:g} exceeds the leapfrog CFL limit {limit:.6g} for this grid")
        self.cfl = float(cfl)
        self._limit_factor = 1.0 / math.sqrt(sum(1.0 / h ** 2 for h in self.h))
        if n_steps is None:
            n_steps = int(math.ceil(1.0 / self.dt))
        if n_steps < 1:
            raise ValueError(f"steps must be >= 1, got {n_steps}")
        self.n_steps = None if adaptive else int(n_steps)
        self.frequency = float(frequency) if frequency is not None else 1.0 / (12.0 * max(self.h))
        if not 0 < self.frequency < math.inf:
            raise ValueError(f"frequency must be a positive finite number, got {frequency}")
        # the kernels' view of the geometry: 3-D blocks (nz = 1 in 2-D); the sponge sigma is the one
        # coefficient array beside c (s = sigma dt / 2, a, b, c^2 a are made per point, kernels/wave.py)
        self._has_z = self.dim == 3
        self._shape3 = (1,) * (3 - self.dim) + self.field.shape
        self._ih2 = tuple([1.0] * (3 - self.dim) + [1.0 / h ** 2 for h in self.h])
        self._split_pair = kernels.SplitPair(self.field, self.grid)
        self._halo = self._split_pair.halo(1, slots=2)  # the kernels read only u^i's neighbours
        self._pool = self._split_pair.pool
        self._field_halo = kernels.Halo(self.field)
        self._data_pool = _DataPool(self.field)
        sigma_vec = self.field.vec_from(self._sponge())
        self._sigma = kernels.kept_copy(self.field.owned(sigma_vec).reshape(self._shape3))
        self._sigma_faces = self._faces3(tuple(f.copy() for f in self._field_halo.faces(sigma_vec)))
        sigma_vec.destroy()
        self.field.release()
        self.source = tuple(self._axis_index(axis, frac) for axis, frac in enumerate(self._source_position()))
        self._source_local = self._locate(self.source)
        self._source3 = ((-1, -1, -1) if self._source_local is None
                         else tuple([0] * (3 - self.dim) + list(self._source_local)))
        self.receivers = self._receiver_nodes()
        located = [(k, self._locate(node)) for k, node in enumerate(self.receivers)]
        self._receivers_local = [(k, loc) for k, loc in located if loc is not None]
        self._data = None  # (c, its halo faces, {dt: faces of c^2 a}, the split u0, CFL step)
        self.observed_path = observed
        if adaptive:
            self.observed = None  # d = 0
        elif observed is not None:
            self.observed = self._read_observed(observed)
        else:
            zero = self._zero_pair()
            self.observed = self.traces({"c": c_true, "u0": zero})
            zero.destroy()
        c_true.destroy()
        kernels.release_free_memory()  # the construction's transients (see there)

    @property
    def c_true(self):
        """The true velocity model (a new Vec: the model keeps none)."""
        return self.true_model()

    # -- geometry ----------------------------------------------------------------------------
    def _coords(self):
        return self.field.node_coordinates()

    def background(self) -> np.ndarray:
        """c_bg = 1 + 0.5 depth on the owned block."""
        depth = self._coords()[0]
        return np.broadcast_to(1.0 + 0.5 * depth, self.field.shape).copy()

    def true_model(self):
        """c_true = c_bg (1 + A g), g a Gaussian of width 0.1 at the centre (a Vec)."""
        r2 = sum((x - 0.5) ** 2 for x in self._coords())
        return self.field.vec_from(self.background() * (1.0 + self.anomaly * np.exp(-r2 / (2 * 0.1 ** 2))))

    def _sponge(self) -> np.ndarray:
        """sigma = sigma_max sum (d/W)^2, sigma_max = 1.5 ln(1000) / W (c ~ 1)."""
        width = self.sponge_width
        sigma_max = 1.5 * math.log(1000.0) / width
        sigma = np.zeros(self.field.shape)
        for x in self._coords():
            d = np.maximum(np.maximum(width - x, x - (1.0 - width)), 0.0) / width
            sigma = sigma + sigma_max * d ** 2
        return sigma

    def _axis_index(self, axis: int, frac: float) -> int:
        n = self.field.global_shape[axis]
        return min(max(int(round(frac * (n + 1))) - 1, 0), n - 1)

    def _source_position(self):
        """Depth 0.2, the middle of the other axes but the last, where ``source_x`` puts it (a shot
        along the receivers' line; default the middle)."""
        along = 0.5 if self.source_x is None else self.source_x
        return [self.source_depth] + [0.5] * (self.dim - 2) + [along]

    def _receiver_nodes(self) -> list[tuple[int, ...]]:
        lo, hi = (self._axis_index(self.dim - 1, f) for f in self.receiver_span)
        depth = self._axis_index(0, self.source_depth)
        middle = [self._axis_index(axis, 0.5) for axis in range(1, self.dim - 1)]
        return [(depth, *middle, j) for j in range(lo, hi + 1)]

    def _locate(self, node):
        """Owned-block index of a global node (natural order), or None where another rank owns it."""
        local = tuple(g - s for g, s in zip(node, self.field.start))
        if all(0 <= k < m for k, m in zip(local, self.field.shape)):
            return local
        return None

    def _zero_pair(self):
        vec = self.grid.create_vec()
        vec.set(0.0)
        return vec

    def _read_observed(self, path: str) -> np.ndarray:
        from ..imports import h5py

        if not os.path.isfile(path):
            raise ValueError(f"observed traces file not found: {path}")
        try:
            with h5py().File(path, "r") as f:
                traces = np.array(f["traces"][...], dtype=np.float64)
        except (OSError, KeyError) as exc:
            raise ValueError(f"cannot read dataset 'traces' from {path}: {exc}") from None
        expected = (self.n_steps + 1, len(self.receivers))
        if traces.shape != expected:
            raise ValueError(f"{path}: traces have shape {traces.shape}, this run records {expected} "
                             f"(steps + 1, receivers)")
        return traces

    def traces(self, controls) -> np.ndarray:
        """Receiver traces (n+1, receivers) of a forward run with ``controls``, on every rank."""
        saved = self._data
        self.set_controls(controls)
        u = self.initial_state()
        out = np.zeros((self.n_steps + 1, len(self.receivers)))
        for i in range(self.n_steps + 1):
            if i > 0:
                u = self.step(i - 1, u)
            current = self._fields(u)[1]
            for k, loc in self._receivers_local:
                out[i, k] = current[loc]
        self._data = saved
        return self.comm.allreduce(out)

    # -- controls ----------------------------------------------------------------------------
    def default_controls(self):
        return {"c": self.field.vec_from(self.background()), "u0": self._zero_pair()}

    def set_controls(self, controls):
        """Keep c (one field, and its halo faces) and u0 as the split initial state; nothing else."""
        c = kernels.kept_copy(self.field.owned(controls["c"]).reshape(self._shape3))
        c_faces = self._faces3(tuple(f.copy() for f in self._field_halo.faces(controls["c"])))
        cfl_step = None
        if self.steps is not None:  # the CFL step of this velocity model (collective)
            c_max = self.comm.allreduce(float(np.max(c, initial=0.0)), op=mpi().MAX)
            cfl_step = self.cfl * self._limit_factor / c_max
        self._data = (c, c_faces, {}, self._split_pair.split(controls["u0"]), cfl_step)
        kernels.release_free_memory()  # the caller's transients of making the controls, if any

    @property
    def _c(self):
        return self._data[0]

    def _step_params(self, i: int):
        """(dt_i, r = dt_i / dt_{i-1}, (dt_i + dt_{i-1}) dt_i / 2); the first sweep of an adaptive run
        decides dt_i here. Fixed steps: (dt, 1, dt^2)."""
        if self.steps is None:
            return self.dt, 1.0, self.dt ** 2
        if not self.steps.known(i):
            dt, last = self.steps.clip(i, self._data[4])
            self._accepted(i, dt, last)
        dt = self.steps.dt(i)
        prev = self.steps.dt(i - 1) if i > 0 else dt
        return dt, dt / prev, 0.5 * (dt + prev) * dt

    def _q_faces(self, dt: float):
        """The halo faces of c^2 a for step size dt, a = 1 / (1 + sigma dt / 2) (the adjoint's q);
        small arrays, cached per dt (an adaptive run has two: the CFL step and the last)."""
        cache = self._data[2]
        faces = cache.get(dt)
        if faces is None:
            hdt = 0.5 * dt
            faces = tuple(kernels.readonly((cf * cf) * (1.0 / (1.0 + hdt * sf)))
                          for cf, sf in zip(self._data[1], self._sigma_faces))
            if len(cache) >= 4:
                cache.pop(next(iter(cache)))
            cache[dt] = faces
        return faces

    def working_set_states(self) -> float:
        """2: the model's own share beside the driver's states, the controls, the gradient and the RAM
        slots: sigma and c (1 state: a field is half a pair), halo buffers and faces, the receivers'
        traces. Its kept u0 is u_0 itself. Measured by experiments/memory_budget/probe.py (2 ranks,
        3 RAM slots, 10 steps; peak RSS above baseline per state per rank): 128^3 11.3 states in all,
        1.3 of them the model's; 64^3 11.7 (1.7); 2-D 1024^2 11.6 (1.6). Was 24.1 at 128^3.
        Time tiles add what the tiler holds (``wave_tiled.extra_states``: sigma, c and a on the
        extended block, about 1.5 states)."""
        depth = self.time_tile if self.time_tile is not None else _tiled().auto_depth(self.field)
        return 2.0 + (_tiled().extra_states(self.field, depth, self.tile_width) if depth > 1 else 0.0)

    def initial_state(self):
        """u_0: the split u0 made by set_controls, shared (states are never changed in place)."""
        return self._split_pair.share(self._data[3])

    # -- forward -----------------------------------------------------------------------------
    def _source_value(self, i: int) -> float:
        return ricker(self.time(i), self.frequency) / float(np.prod(self.h))

    def _fields(self, vec, readonly=True):
        """A state's owned (u^{i-1}, u^i) as one (2, *field shape) view (split layout)."""
        return self._split_pair.fields(vec, readonly)

    def _block(self, vec, readonly=True):
        """A state's two fields as the kernels see them: (2, nz, ny, nx), nz = 1 in 2-D."""
        return vec.getArray(readonly=readonly).reshape((2,) + self._shape3)

    def _faces3(self, faces):
        """Halo faces in the kernels' 3-D form (zero z faces in 2-D)."""
        if self._has_z:
            return tuple(faces)
        # the kernels read no z face in 2-D: a 1x1 stand-in (a full-size one per call cost 4 MiB)
        return (_NO_FACE, _NO_FACE) + tuple(f.reshape((1,) + f.shape) for f in faces)

    def _state_faces(self, vec, slot=0):
        return self._faces3(self._halo.faces(vec, slot))

    _sigma_runs = None  # sigma's zero run per row (kernels/wave.py ``zero_runs``), made at the first step

    def step(self, i, u):
        dt, r, dt2 = self._step_params(i)
        out = self._pool.new_vec()
        prev, cur = self._block(u)
        out_prev, out_cur = self._block(out, readonly=False)
        if self._sigma_runs is None:
            self._sigma_runs = kern.zero_runs(self._sigma)
        kern.step(prev, cur, self._state_faces(u), self._sigma, 0.5 * dt, self._c, self._ih2, self._has_z,
                  dt2, r, self._source3, self._source_value(i), self._sigma_runs, out_prev, out_cur)
        return out

    def _residuals(self, i, u):
        current = self._current(u).reshape(self.field.shape)
        if self.observed is None:
            return [(k, loc, current[loc]) for k, loc in self._receivers_local]
        return [(k, loc, current[loc] - self.observed[i, k]) for k, loc in self._receivers_local]

    def objective(self, i, u):
        current = self._fields(u)[1]
        return self._objective_term(i, [current[loc] for _k, loc in self._receivers_local])

    def _objective_term(self, i, values):
        """J_i from this rank's receivers' values of u^i (in ``_receivers_local`` order)."""
        if self.observed is not None:
            values = [v - self.observed[i, k] for (k, _loc), v in zip(self._receivers_local, values)]
        local = 0.5 * sum(r * r for r in values)
        return self.comm.allreduce(float(local))

    # -- advances (time tiling, kernels/wave_tiled.py) ----------------------------------------
    time_tile: int | None = None  # requested depth T; None: automatic (:func:`wave_tiled.auto_depth`)
    tile_width: int | None = None  # rows per slab along y; None: from the L2 (:func:`wave_tiled.auto_width`)
    advance_objective = True      # the receivers are sampled inside the tile
    #: the default profile's prices in forward steps (experiments/mixed, "Auto prices advances and data
    #: copies"): a tiled step at 128^3 on 2 ranks, and the two copies of u^i a step from its data makes
    relative_advance_step = 0.5
    relative_data_step = 0.2
    _tiler = None

    def time_tile_limit(self) -> int:
        """The largest T the partition allows (collective): the thinnest owned extent along a split
        axis (a halo then comes from the next rank only), at most ``wave_tiled.MAX_DEPTH``."""
        return _tiled().depth_limit(self.field, self.comm)

    def set_time_tile(self, depth) -> None:
        """Use time tiles of depth T (1: single steps; None: automatic); ValueError naming the limit."""
        if depth is not None:
            if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
                raise ValueError(f"--time-tile must be a whole number >= 1, got {depth!r}")
            limit = self.time_tile_limit()
            if depth > limit:
                raise ValueError(f"--time-tile {depth} exceeds this partition's limit {limit} "
                                 f"({_tiled().limit_reason(self.field, self.comm)})")
        self.time_tile = depth
        self._tiler = None

    def tile_depth(self) -> int:
        """The time tile depth in use (collective the first time: the automatic choice agrees)."""
        if self.time_tile is None:
            self.time_tile = min(_tiled().auto_depth(self.field), self.time_tile_limit())
        return self.time_tile

    def advance(self, i, u, k, objective=False):
        """u_{i+k} from u_i in tiles of depth T (bitwise k single steps); with ``objective`` also
        [J_{i+1} .. J_{i+k}] from the receivers sampled inside the tiles."""
        depth = self.tile_depth()
        if depth > 1 and (self._tiler is None or self._tiler.depth != depth
                          or self.tile_width not in (None, self._tiler.width)):
            self._tiler = _tiled().Tiler(self, depth, self.tile_width)
        tiler, terms, first = self._tiler, [], u
        while k > 0:
            t = min(depth, k)
            if t == 1:  # a lone step (T = 1, or the last of a run): the single-step kernel
                out = self.step(i, u)
                if u is not first:
                    u.destroy()
                if objective:
                    terms.append(self.objective(i + 1, out))
                u, i, k = out, i + 1, k - 1
                continue
            params = []
            for j in range(i, i + t):
                dt, r, dt2 = self._step_params(j)
                params.append((0.5 * dt, r, dt2, self._source_value(j)))
            traces = np.zeros((t, tiler.n_traces))
            out = self._pool.new_vec()
            tiler.run(u, out, params, traces)
            if u is not first:
                u.destroy()  # an intermediate tile's state: its buffer goes back to the pool
            if objective:
                terms += [self._objective_term(i + s + 1, [traces[s, kk] for kk, _loc in self._receivers_local])
                          for s in range(t)]
            u, i, k = out, i + t, k - t
        return (u, terms) if objective else u

    def objective_gradient(self, i, u):
        g = self._pool.new_vec()  # a pooled buffer (often an idle one), zeroed
        g.getArray()[...] = 0.0
        current = self._fields(g, readonly=False)[1]
        for _k, loc, r in self._residuals(i, u):
            current[loc] += r
        return g

    def add_objective_gradient(self, i, u, lam):
        """The receivers' residuals added into lambda_i's current field: a few points, not a Vec."""
        current = self._fields(lam, readonly=False)[1]  # every rank: bumps lam's state everywhere
        for _k, loc, r in self._residuals(i, u):
            current[loc] += r

    # -- adjoint -----------------------------------------------------------------------------
    def adjoint_step(self, i, u, u_next, lam_next, grad):
        dt, r, dt2 = self._step_params(i)
        out = self._pool.new_vec()
        g = self.field.owned(grad["c"]).reshape(self._shape3)
        lam_prev, lam_cur = self._block(lam_next)
        out_prev, out_cur = self._block(out, readonly=False)
        kern.adjoint_step(lam_prev, lam_cur, self._state_faces(lam_next, 1), self._current(u),
                          self._current_faces(u), self._sigma, 0.5 * dt, self._c, self._q_faces(dt),
                          self._ih2, self._has_z, dt2, r, g, out_prev, out_cur)
        return out

    def _is_field(self, vec) -> bool:
        """True for a one-field state: the stand-in :meth:`adjoint_data_state` makes (u^i alone)."""
        return vec.getLocalSize() == self._sigma.size

    def _current(self, vec):
        """u^i of a state or of a data stand-in (du^i of a tangent's), as the kernels see it (nz, ny, nx)."""
        if self._is_field(vec):
            return vec.getArray(readonly=True).reshape(self._shape3)
        return self._block(vec)[1]

    def _current_faces(self, vec):
        """The halo faces of u^i of a state or of a data stand-in."""
        if self._is_field(vec):
            return self._faces3(self._field_halo.faces(vec))
        return self._state_faces(vec, 0)

    def initial_adjoint(self, lam0, grad):
        self._split_pair.add_into(grad["u0"], lam0)

    # -- tangent linear ----------------------------------------------------------------------
    def initial_tangent(self, dcontrols):
        return self._split_pair.split(dcontrols["u0"])

    def tangent_step(self, i, u, u_next, du, dcontrols):
        dt, r, dt2 = self._step_params(i)
        out = self._pool.new_vec()
        dc = dcontrols["c"].getArray(readonly=True).reshape(self._shape3)
        du_prev, du_cur = self._block(du)
        out_prev, out_cur = self._block(out, readonly=False)
        kern.tangent_step(du_prev, du_cur, self._state_faces(du, 1), self._block(u)[1], self._state_faces(u, 0),
                          self._sigma, 0.5 * dt, self._c, dc, self._ih2, self._has_z, dt2, r,
                          out_prev, out_cur)
        return out

    # -- second order (Hessian actions, hpcadj.adjoint.hessian) ------------------------------
    def add_objective_hessian(self, i, u, du, dlam):
        """dlam += d^2 J_i/du^2 du: du's current field at the receivers."""
        current, dcur = self._fields(dlam, readonly=False)[1], self._current(du).reshape(self.field.shape)
        for _k, loc in self._receivers_local:
            current[loc] += dcur[loc]

    def hessian_adjoint_step(self, i, u, u_next, du, du_next, lam_next, dlam_next, dcontrols, grad, hgrad):
        """(lambda_i, dlambda_i), dJ/dc and (H v)_c contributions of step i.

        The step is linear in the state and in c^2, so along (du, dc) only the c-dependent adjoint
        terms vary: dlambda_i's current field gains dt^2 L(2 c dc a mu) and (H v)_c gains
        2 dt^2 a mu (dc L u^i + c L du^i), mu = lambda_{i+1}'s current field (numpy, correct first).
        """
        if self.steps is not None:
            raise ValueError("wave: Hessian actions need fixed steps")
        lam = self.adjoint_step(i, u, None, lam_next, grad)
        dlam = self.adjoint_step(i, u, None, dlam_next, hgrad)
        if self._second is None:
            from .dmda import Grid

            grid = Grid(self.comm, self.field.sizes_xyz)
            if grid.start != self.field.start or grid.shape != self.field.shape:
                raise RuntimeError("wave: the second-order halo grid does not match the model's partition")
            self._second = (grid, grid.create_vec())
        grid, scratch = self._second

        def lap(block):
            grid.owned(scratch)[...] = block
            return laplacian(grid, grid.padded(scratch), self.h)

        dt2 = self.dt ** 2
        shape = self.field.shape
        c, sigma = self._c.reshape(shape), self._sigma.reshape(shape)
        a = 1.0 / (1.0 + (0.5 * self.dt) * sigma)
        dc = self.field.owned_view(dcontrols["c"])
        mu = np.array(self._fields(lam_next)[1])
        self._fields(dlam, readonly=False)[1] += dt2 * lap(2.0 * c * dc * a * mu)
        g = self.field.owned(hgrad["c"])
        g += (2.0 * dt2) * a * mu * (dc * lap(self._current(u).reshape(shape))
                                     + c * lap(self._current(du).reshape(shape)))
        return lam, dlam

    _second = None

    # -- snapshots ---------------------------------------------------------------------------
    def snapshot_layout(self):
        layout = self.field.layout()
        return {"u_prev": layout, "u": layout}

    def snapshot(self, u):
        fields = self._fields(u)
        return {"u_prev": fields[0], "u": fields[1]}

    def restore(self, snapshot):
        """A state from a snapshot, in a pooled buffer or shared (see :meth:`SplitPair.restore`)."""
        return self._split_pair.restore(snapshot["u_prev"], snapshot["u"])

    # -- adjoint data: the leapfrog adjoint step reads u^i alone, one field of the pair ------------
    def adjoint_data_layout(self):
        return {"u": self.field.layout()}

    def adjoint_data(self, i, u, u_next):
        """u^i copied into a recycled field buffer (a data level holds it by reference). The array
        is the buffer's Vec's: its views hold the Vec and so the buffer, which the pool then sees in
        use; numpy's own views of a pooled buffer refer to the mapping beneath it, not to it."""
        out = self._data_pool.new_vec().getArray().reshape(self.field.shape)
        np.copyto(out, self._fields(u)[1])
        return {"u": out}

    def adjoint_data_state(self, i, data):
        """The stand-in state of step i for the adjoint step and the receivers' term: u^i alone, a
        one-field Vec over the data's own buffer when they are one of :meth:`adjoint_data`'s (no
        copy), else over a copy; the adjoint step never reads u^{i-1}."""
        field = data["u"]
        vec = self._data_pool.vec_sharing([field.reshape(-1)]) if field.flags.c_contiguous else None
        if vec is None:
            vec = self._data_pool.new_vec()
            vec.getArray().reshape(self.field.shape)[...] = field
        return vec

    def control_layout(self):
        return {"c": self.field.layout(), "u0": self.grid.layout()}

    def control_arrays(self, controls):
        return {"c": self.field.owned(controls["c"]).copy(), "u0": self.grid.owned(controls["u0"]).copy()}

    def describe(self):
        observed = "none (d = 0)" if self.steps is not None else (
            self.observed_path or f"true model, anomaly {self.anomaly}")
        return self._describe_steps({"model": self.name, "grid": "x".join(map(str, self.field.sizes_xyz)),
                                     "steps": self.n_steps, "dt": self.dt, "frequency": self.frequency,
                                     "receivers": len(self.receivers), "observed": observed,
                                     **({} if self.source_x is None else {"source_x": self.source_x})})
