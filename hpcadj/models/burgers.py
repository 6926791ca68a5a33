"""2-D viscous Burgers w_t + (w . grad) w = nu lap w for the velocity w = (u, v), periodic unit square.

Nodes x_j = j h, h = 1/N per axis, on a DMDA with dof 2. A state is a global Vec of that DMDA's
size whose owned part holds u's block then v's (the *split* layout: unit-stride rows for the
kernels); the control u0 keeps the DMDA's interleaved (u, v) layout. Advection in the
skew-symmetric form b(w, w)_c = 1/2 [w . grad w_c + div(w w_c)] with second-order *central*
differences, diffusion with the 5-point Laplacian. Why central: N(w) = -b(w, w) + nu lap w is a
polynomial in w, so the discrete map is smooth and its adjoint exact (an upwind switch on sign(u) is
not differentiable and spoils Taylor tests where the velocity changes sign). Why skew-symmetric: the
central advective form alone blows up on coarse grids (cell Reynolds number above 2); the
skew-symmetric one conserves the discrete kinetic energy, so only the viscosity changes it.
Time stepping: SSP-RK3 (Shu-Osher)

    w1 = w + dt N(w);  w2 = 3/4 w + 1/4 (w1 + dt N(w1));  w_{i+1} = 1/3 w + 2/3 (w2 + dt N(w2)),

with the default dt = cfl * min(sqrt(3) / max(|u|/h + |v|/h), 2.5 / (8 nu / h^2)) from the default
initial velocity, fixed at construction so that dt never depends on the controls. The step runs the
three stages as three passes over the block (``kernels.burgers.stage``); the tangent step and the
adjoint step are one pass each (``kernels.burgers.tangent_step`` / ``adjoint_step``: the stages as a
wavefront over the rows, from a 3- and 5-point deep halo, the stage states never stored), the adjoint
recomputing w1, w2 from u_i and running the three stages backwards. Everything is pointwise or a
stencil, so states, tangents and dJ/du0 are bitwise the same on any rank count. dJ/dnu = sum over
the stages of their weight times dt <w_k, lap mu_k> (the periodic Laplacian is symmetric, so this is
<lap w_k, mu_k>): each rank sums its block column by column (a vectorisable order) and an allreduce
adds the ranks' sums, so it is deterministic for a given decomposition and agrees across rank counts
to round-off (not bitwise). Costs at 1024^2: experiments/kernels.

Controls: ``u0`` (initial velocity, both components, shape (ny, nx, 2)) and ``nu`` (scalar viscosity).
Objective: the final kinetic energy J = 1/2 h^2 sum |w_n|^2.
"""

from __future__ import annotations

import math

import numpy as np

from ..imports import mpi
from . import kernels
from .adaptive import AdaptiveSteps, StepSequence
from .base import Stepper
from .common import ComponentSnapshots, scalar_add, scalar_array, scalar_layout, scalar_value, scalar_vec
kern = kernels.lazy("burgers")
tiled = kernels.lazy("burgers_tiled")


class BurgersModel(ComponentSnapshots, AdaptiveSteps, Stepper):
    """Viscous Burgers with SSP-RK3 and central advection; controls ``u0`` (velocity) and ``nu``."""

    name = "burgers"
    adjoint_reads_next = False  # the stages are recomputed from u_i
    SNAPSHOT_FIELDS = ("u", "v")
    default_steps = 100
    default_nu = 0.01
    default_cfl = 0.5

    def __init__(self, comm, grid=(64, 64), n_steps: int = 100, nu: float = 0.01, dt: float | None = None,
                 cfl: float = 0.5, adaptive: bool = False, t_final: float | None = None):
        if len(grid) != 2:
            raise ValueError(f"burgers is 2-D, got a {len(grid)}-D grid")
        if min(grid) < 3:
            raise ValueError("burgers needs at least 3 points per axis")
        if adaptive and (dt is not None or t_final is None):
            raise ValueError("--adaptive takes --t-final T and decides dt itself (no --dt)")
        if not adaptive and n_steps < 1:
            raise ValueError(f"steps must be >= 1, got {n_steps}")
        if not nu > 0 or not math.isfinite(nu):
            raise ValueError(f"viscosity must be positive, got {nu}")
        if not 0 < cfl <= 1:
            raise ValueError(f"cfl must lie in (0, 1], got {cfl}")
        self.comm = comm
        self.steps = StepSequence(t_final) if adaptive else None
        self.n_steps = None if adaptive else int(n_steps)
        self.cfl = float(cfl)
        self.field = kernels.LeanGrid(comm, tuple(grid), periodic=True)  # one component's layout; its DMDA
        # is released once the halos are built
        self.grid = kernels.PairLayout(self.field)  # the (u, v) pair's: no DMDA of its own
        self.h = self.grid.spacing()
        self.cell_volume = float(np.prod(self.h))
        self.default_nu_value = float(nu)
        hy, hx = self.h
        self._ih = (1.0 / hy ** 2, 1.0 / hx ** 2, 1.0 / (2.0 * hy), 1.0 / (2.0 * hx))
        # scratch of one step (the stage states w1, w2) and halo buffers: overwritten by every call,
        # never carried from one to the next, so steps stay pure
        self._stage_vecs = [kernels.new_vec(self.grid) for _ in range(2)]
        self._split_pair = kernels.SplitPair(self.field, self.grid)
        # one halo (one scatter) per component, straight from the state Vec
        self._halos = (self._split_pair.halo(0, slots=3), self._split_pair.halo(1, slots=3))
        self._deep_halos = self._adjoint_deep = None  # the fused steps' deep halos, made at first use
        self.field.release()
        self._pool = self._split_pair.pool
        self._u0 = None  # u0 as the split initial state (set_controls)
        self.nu = float(nu)
        self.dt = float(dt) if dt is not None else self.stable_dt(cfl)  # adaptive: dt_0's bound only
        if not self.dt > 0 or not math.isfinite(self.dt):
            raise ValueError(f"dt must be positive, got {self.dt}")
        if dt is not None and self.dt > (limit := self.stable_dt(1.0)):
            # explicit RK3: beyond the stability limit the states blow up and the gradient is garbage
            raise ValueError(f"dt {self.dt:g} exceeds the explicit RK3 stability limit {limit:.6g} "
                             f"for this grid and viscosity")
        kernels.release_free_memory()  # the construction's transients

    def stable_dt(self, cfl: float, u=None, nu: float | None = None) -> float:
        """cfl times the RK3 limits for central advection (sqrt 3) and diffusion (2.5) of state ``u``
        and viscosity ``nu`` (default: the default controls); collective, the same on every rank."""
        controls = None
        if u is None:
            controls = self.default_controls()
            w = self.grid.owned(controls["u0"])  # the control's interleaved layout
            fu, fv = w[..., 0], w[..., 1]
        else:
            fu, fv = self._block(u)
        hy, hx = self.h
        rate = 0.0
        for j in range(0, fu.shape[0], 64):  # in blocks of rows: no full-size temporaries (max is exact)
            rate = max(rate, float(np.max(np.abs(fu[j:j + 64]) / hx + np.abs(fv[j:j + 64]) / hy)))
        if controls is not None:
            for vec in controls.values():
                vec.destroy()
        rate = self.comm.allreduce(rate, op=mpi().MAX)
        nu = self.default_nu_value if nu is None else nu
        diffusion = 4.0 * nu * (1.0 / hx ** 2 + 1.0 / hy ** 2)
        return cfl * min(math.sqrt(3.0) / rate if rate > 0 else math.inf, 2.5 / diffusion)

    def _step_dt(self, i: int, u) -> float:
        """dt_i: fixed, recorded, or (first sweep, adaptive) the CFL step of u_i, landing on t_final."""
        if self.steps is None:
            return self.dt
        if not self.steps.known(i):
            dt, last = self.steps.clip(i, self.stable_dt(self.cfl, u, self.nu))
            self._accepted(i, dt, last)
        return self.steps.dt(i)

    # -- controls ----------------------------------------------------------------------------
    def default_controls(self):
        ys, x = self.grid.node_coordinates()
        u0 = self.grid.create_vec()
        two_pi = 2.0 * np.pi
        for j in range(0, ys.shape[0], 64):  # in blocks of rows: no full-size temporaries
            w, y = self.grid.owned(u0)[j:j + 64], ys[j:j + 64]
            w[..., 0] = np.sin(two_pi * x) * np.cos(two_pi * y) + 0.3 * np.cos(two_pi * (x + 2.0 * y))
            w[..., 1] = -np.cos(two_pi * x) * np.sin(two_pi * y) + 0.2 * np.sin(two_pi * (2.0 * x - y)) + 0.1
        return {"u0": u0, "nu": scalar_vec(self.comm, self.default_nu_value)}

    def set_controls(self, controls):
        """Keep nu (a float) and u0 as the split initial state: no copies of the control Vecs."""
        self.nu = scalar_value(self.comm, controls["nu"])
        self._u0 = self._split_pair.split(controls["u0"])
        kernels.release_free_memory()  # the caller's transients of making the controls, if any

    def working_set_states(self) -> float:
        """3: the model's own share beside the driver's states, the controls, the gradient and the RAM
        slots: the step's two stage scratch Vecs and the halo buffers (the one-pass tangent and adjoint
        steps add only their row rings and deep-halo strips, under 1 MiB at 1024^2); its kept u0 is
        u_0 itself. Measured by experiments/memory_budget/probe.py (3 RAM slots, 10 steps; peak RSS
        above baseline per state per rank): 1024^2 10.2 / 10.3 states in all on 1 / 2 ranks, before
        the tiled advance, whose halo strips and rings (about 0.3 states at 1024^2, T = 8) are not
        counted here."""
        return 3.0

    def initial_state(self):
        """u_0: the split u0 made by set_controls, shared (states are never changed in place)."""
        return self._split_pair.share(self._u0)

    # -- blocks and halos (the kernels are in kernels/burgers.py) ----------------------------
    def _block(self, vec, readonly=True):
        """A state's owned (u, v) as one (2, ny, nx) view (split layout)."""
        return self._split_pair.fields(vec, readonly)

    def _faces(self, vec, slot):
        """The halo faces of a state's u and v (buffer ``slot`` of each component's halo)."""
        return self._halos[0].faces(vec, slot), self._halos[1].faces(vec, slot)

    def _interleaved(self, vec):
        """A state's owned block in the control layout (ny, nx, 2), a copy."""
        return np.stack(tuple(self._block(vec)), axis=-1)

    # -- forward -----------------------------------------------------------------------------
    def step(self, i, u):
        """Three stage passes: w1, w2 into the scratch Vecs, u_{i+1} into a new state."""
        dt, nu, ih = self._step_dt(i, u), self.nu, self._ih
        w1v, w2v = self._stage_vecs
        out = self._pool.new_vec()
        W0 = self._block(u)
        kern.stage(*W0, *self._faces(u, 0), *W0, 0.0, 1.0, True, nu, dt, ih, *self._block(w1v, readonly=False))
        kern.stage(*self._block(w1v), *self._faces(w1v, 1), *W0, 0.75, 0.25, False, nu, dt, ih,
                   *self._block(w2v, readonly=False))
        kern.stage(*self._block(w2v), *self._faces(w2v, 2), *W0, 1.0 / 3.0, 2.0 / 3.0, False, nu, dt, ih,
                   *self._block(out, readonly=False))
        return out

    # -- advances (time tiling, kernels/burgers_tiled.py) -------------------------------------
    time_tile: int | None = None  # requested depth T; None: automatic (:func:`burgers_tiled.auto_depth`)
    advance_objective = True  # J is the last state's, which the advance returns
    MAX_DEPTH = 64
    _tile_halos = None  # T -> the depth-3T halos of u and v

    def set_time_tile(self, depth) -> None:
        """Use time tiles of depth T (1: single steps; None: automatic); ValueError naming the limit.
        Any partition allows any T: a deep halo reaches past the next rank (``kernels.DeepHalo``)."""
        if depth is not None:
            if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
                raise ValueError(f"--time-tile must be a whole number >= 1, got {depth!r}")
            if depth > self.MAX_DEPTH:
                raise ValueError(f"--time-tile {depth} exceeds burgers' limit {self.MAX_DEPTH} "
                                 f"(the tile keeps 3T + 1 levels of rows)")
        self.time_tile = depth

    def tile_depth(self) -> int:
        """The time tile depth in use (automatic: from the rank's row length and the L2 cache)."""
        if self.time_tile is None:
            self.time_tile = tiled.auto_depth(self.comm.allreduce(int(self.field.shape[1]), op=mpi().MAX))
        return self.time_tile

    def _tile_halo(self, depth):
        """The depth-3T halos of both components (one scatter each), made once per T (a shorter tile
        reads the part it needs)."""
        if self._tile_halos is None:
            self._tile_halos = {}
        if depth not in self._tile_halos:
            self._tile_halos[depth] = tuple(self._split_pair.deep_halo(c, 3 * depth, template=self._stage_vecs[0])
                                            for c in (0, 1))
        return self._tile_halos[depth]

    def advance(self, i, u, k, objective=False):
        """u_{i+k} from u_i in tiles of T steps (bitwise k calls of :meth:`step`); a tile ends at the
        last step, whose state J reads; a shorter tile, even of one step (its stages fused in one
        pass), reads part of the same halo. T = 1, and a step whose dt is not decided yet (the first
        sweep of an adaptive run), are :meth:`step`'s three stage passes."""
        depth, terms, first = self.tile_depth(), [], u
        while k > 0:
            t = min(depth, k)
            if self.n_steps is not None and i < self.n_steps:
                t = min(t, self.n_steps - i)
            if self.steps is not None:
                while t > 0 and not self.steps.known(i + t - 1):
                    t -= 1
            if depth == 1 or t == 0:
                t = 1
                out = self.step(i, u)
            else:
                dts = np.array([self._step_dt(j, None) for j in range(i, i + t)])
                hu, hv = self._tile_halo(depth)
                out = self._pool.new_vec()
                tiled.advance(*self._block(u), hu.strips(u), hv.strips(u), self.nu, dts, self._ih,
                              *self._block(out, readonly=False))
            if u is not first:
                u.destroy()  # an intermediate tile's state: its buffer goes back to the pool
            if objective:
                terms += [0.0] * (t - 1) + [self.objective(i + t, out)]
            u, i, k = out, i + t, k - t
        return (u, terms) if objective else u

    def objective(self, i, u):
        if i != self.n_steps:
            return 0.0
        return self.comm.allreduce(0.5 * self.cell_volume * self._sum_squares(u))

    def _sum_squares(self, u) -> float:
        """sum |w|^2 over the owned block, bitwise ``np.sum(w * w)`` of the interleaved (ny, nx, 2)
        block as ever (J unchanged), without that block's two full-size temporaries: numpy sums a
        large array in chunks of its buffer size, pairwise within each, in order; so does this."""
        fu, fv = (f.ravel() for f in self._block(u))
        points = np.getbufsize() // 2
        if 2 * points != np.getbufsize():  # an odd buffer size splits a pair: the whole block at once
            w = self._interleaved(u)
            return float(np.sum(w * w))
        total = 0.0
        for k in range(0, fu.size, points):
            w = np.stack((fu[k:k + points], fv[k:k + points]), axis=-1)
            total += float(np.sum(w * w))
        return total

    def objective_gradient(self, i, u):
        if i != self.n_steps:
            return None
        vec = self._pool.new_vec()
        np.multiply(self.cell_volume, u.getArray(readonly=True), out=vec.getArray())
        return vec

    # -- adjoint -----------------------------------------------------------------------------
    def adjoint_step(self, i, u, u_next, lam_next, grad):
        """All three backward stages and the two forward stages they need in one pass
        (``kern.adjoint_step``, temporal blocking): w1, w2 and the backward stage vectors are made
        row by row inside it and never stored."""
        dt = self._step_dt(i, u)
        hu, hv, hm, hn = self._adjoint_halos()
        out = self._pool.new_vec()
        g3, g2, g1 = kern.adjoint_step(*self._block(u), hu.strips(u), hv.strips(u), *self._block(lam_next),
                                       hm.strips(lam_next, 1), hn.strips(lam_next, 1), self.nu, dt, self._ih,
                                       *self._block(out, readonly=False))
        scalar_add(self.comm, grad["nu"], dt * ((2.0 / 3.0) * g3 + 0.25 * g2 + g1))
        return out

    def _adjoint_halos(self):
        """u_i's depth-5 halos (u, v) and lambda_{i+1}'s depth-3 halos (slot 1 of the tangent's)."""
        if self._adjoint_deep is None:
            depth = kern.ADJOINT_DEPTHS[0]
            self._adjoint_deep = tuple(self._split_pair.deep_halo(c, depth, template=self._stage_vecs[0])
                                       for c in (0, 1))
        return self._adjoint_deep + self._depth3_halos()

    def _depth3_halos(self):
        """The depth-3 halos of both components, two slots each (the tangent step's u_i and du_i)."""
        if self._deep_halos is None:
            self._deep_halos = tuple(self._split_pair.deep_halo(c, kern.TANGENT_DEPTH, slots=2,
                                                                template=self._stage_vecs[0]) for c in (0, 1))
        return self._deep_halos

    def initial_adjoint(self, lam0, grad):
        self._split_pair.add_into(grad["u0"], lam0)

    # -- tangent linear ----------------------------------------------------------------------
    def initial_tangent(self, dcontrols):
        return self._split_pair.split(dcontrols["u0"])

    def tangent_step(self, i, u, u_next, du, dcontrols):
        """All three tangent stages in one pass (``kern.tangent_step``, temporal blocking): the stage
        states w1, w2 are recomputed from u_i inside it, bitwise ``kern.stage``'s, and never stored."""
        dt = self._step_dt(i, u)
        dnu = scalar_value(self.comm, dcontrols["nu"])
        hu, hv = self._depth3_halos()
        out = self._pool.new_vec()
        kern.tangent_step(*self._block(u), hu.strips(u, 0), hv.strips(u, 0), *self._block(du), hu.strips(du, 1),
                          hv.strips(du, 1), self.nu, dnu, dt, self._ih, *self._block(out, readonly=False))
        return out

    # -- second order (Hessian actions, hpcadj.adjoint.hessian) ------------------------------
    def add_objective_hessian(self, i, u, du, dlam):
        """dlam += d^2 J/du^2 du = h^2 du at the final step."""
        if i == self.n_steps:
            dlam.getArray()[...] += self.cell_volume * du.getArray(readonly=True)

    def hessian_adjoint_step(self, i, u, u_next, du, du_next, lam_next, dlam_next, dcontrols, grad, hgrad):
        """(lambda_i, dlambda_i), dJ/dnu and (H v)_nu contributions of step i.

        dlambda_i = (step's adjoint applied to dlambda_{i+1}, the compiled adjoint step) + S, S the
        derivative of the adjoint step along (du_i, dnu) at fixed lambda_{i+1}: the stages' adjoints
        a2, a1 and tangents dw1, dw2 are recomputed and differentiated stage by stage in numpy
        (:class:`_SecondOrder`; correct first, not fast: about ten stencil passes with halo exchanges).
        """
        if self.steps is not None:
            raise ValueError("burgers: Hessian actions need fixed steps")
        lam = self.adjoint_step(i, u, None, lam_next, grad)
        dlam = self.adjoint_step(i, u, None, dlam_next, hgrad)
        if self._second is None:
            self._second = _SecondOrder(self)
        dnu = scalar_value(self.comm, dcontrols["nu"])
        extra, dg_nu = self._second.terms(self._block(u), self._block(du), self._block(lam_next), self.nu, dnu,
                                          self.dt)
        self._block(dlam, readonly=False)[...] += extra
        scalar_add(self.comm, hgrad["nu"], dg_nu)
        return lam, dlam

    _second = None

    # -- snapshots ---------------------------------------------------------------------------
    def snapshot(self, u):
        fields = self._block(u)
        return {name: fields[k] for k, name in enumerate(self.SNAPSHOT_FIELDS)}

    def restore(self, snapshot):
        """A state from a snapshot, in a pooled buffer or shared (see :meth:`SplitPair.restore`)."""
        return self._split_pair.restore(*(snapshot[name] for name in self.SNAPSHOT_FIELDS))

    def control_layout(self):
        return {"u0": self.grid.layout(), "nu": scalar_layout(self.comm)}

    def control_arrays(self, controls):
        return {"u0": self.grid.owned(controls["u0"]).copy(), "nu": scalar_array(self.comm, controls["nu"])}

    def describe(self):
        return self._describe_steps({"model": self.name, "grid": "x".join(map(str, self.grid.sizes_xyz)),
                                     "steps": self.n_steps, "dt": self.dt, "nu": self.default_nu_value,
                                     "advection": "central", "scheme": "SSP-RK3"})


class _SecondOrder:
    """Burgers' stage operators in numpy on one-point-padded blocks, for the second-order adjoint.

    N(w) = -b(w, w) + nu lap w with b(p, q)_c = 1/2 [p . grad q_c + div(p q_c)] (central differences,
    periodic). Its transposed linearisation is N'(w)^T a = -c(a, w) + b(w, a) + nu lap a, with
    c(a, q)_d = 1/2 sum_c [a_c D_d q_c - q_c D_d a_c] (D_d^T = -D_d); it is linear in (w, nu), so its
    derivative along (dw, dnu) is N'(dw; dnu)^T a. Halos come from a DMDA of the model's partition.
    """

    def __init__(self, model):
        from .dmda import Grid

        self.grid = Grid(model.comm, model.field.sizes_xyz, periodic=True)
        if self.grid.start != model.field.start or self.grid.shape != model.field.shape:
            raise RuntimeError("burgers: the second-order halo grid does not match the model's partition")
        self.hy, self.hx = model.h
        self._vec = self.grid.create_vec()

    def pad(self, W):
        """(2, ny, nx) owned blocks -> (2, ny + 2, nx + 2) with the periodic one-point halo."""
        out = []
        for comp in W:
            self.grid.owned(self._vec)[...] = comp
            out.append(self.grid.padded(self._vec))
        return np.stack(out)

    def dx(self, P):
        return (P[..., 1:-1, 2:] - P[..., 1:-1, :-2]) / (2.0 * self.hx)

    def dy(self, P):
        return (P[..., 2:, 1:-1] - P[..., :-2, 1:-1]) / (2.0 * self.hy)

    def lap(self, P):
        c = P[..., 1:-1, 1:-1]
        return ((P[..., 1:-1, 2:] + P[..., 1:-1, :-2] - 2.0 * c) / self.hx ** 2
                + (P[..., 2:, 1:-1] + P[..., :-2, 1:-1] - 2.0 * c) / self.hy ** 2)

    def b(self, Pp, Pq):
        p = Pp[:, 1:-1, 1:-1]
        return 0.5 * (p[0] * self.dx(Pq) + p[1] * self.dy(Pq) + self.dx(Pp[0] * Pq) + self.dy(Pp[1] * Pq))

    def c(self, Pa, Pq):
        a, q = Pa[:, 1:-1, 1:-1], Pq[:, 1:-1, 1:-1]
        return 0.5 * np.stack((np.sum(a * self.dx(Pq) - q * self.dx(Pa), axis=0),
                               np.sum(a * self.dy(Pq) - q * self.dy(Pa), axis=0)))

    def n(self, Pw, nu):
        return -self.b(Pw, Pw) + nu * self.lap(Pw)

    def n_lin(self, Pw, nu, Pd, dnu):
        """N'(w) d + dnu lap w."""
        return -(self.b(Pd, Pw) + self.b(Pw, Pd)) + nu * self.lap(Pd) + dnu * self.lap(Pw)

    def n_adj(self, Pw, nu, Pa):
        """N'(w)^T a (w, nu enter linearly)."""
        return -self.c(Pa, Pw) + self.b(Pw, Pa) + nu * self.lap(Pa)

    def terms(self, W, dW, L, nu, dnu, dt):
        """(S, this rank's (H v)_nu term): the derivative of one SSP-RK3 adjoint step along (dW, dnu)
        at fixed lambda_{i+1} = L."""
        W, dW, L = (np.asarray(x, dtype=float) for x in (W, dW, L))
        Pw, Pdw, PL = self.pad(W), self.pad(dW), self.pad(L)
        w1 = W + dt * self.n(Pw, nu)
        Pw1 = self.pad(w1)
        Pw2 = self.pad(0.75 * W + 0.25 * (w1 + dt * self.n(Pw1, nu)))
        dw1 = dW + dt * self.n_lin(Pw, nu, Pdw, dnu)
        Pdw1 = self.pad(dw1)
        Pdw2 = self.pad(0.75 * dW + 0.25 * (dw1 + dt * self.n_lin(Pw1, nu, Pdw1, dnu)))
        a2 = (2.0 / 3.0) * (L + dt * self.n_adj(Pw2, nu, PL))
        Pa2 = self.pad(a2)
        a1 = 0.25 * (a2 + dt * self.n_adj(Pw1, nu, Pa2))
        Pa1 = self.pad(a1)
        da2 = (2.0 / 3.0) * dt * self.n_adj(Pdw2, dnu, PL)
        Pda2 = self.pad(da2)
        da1 = 0.25 * (da2 + dt * self.n_adj(Pw1, nu, Pda2) + dt * self.n_adj(Pdw1, dnu, Pa2))
        Pda1 = self.pad(da1)
        S = 0.75 * da2 + da1 + dt * self.n_adj(Pw, nu, Pda1) + dt * self.n_adj(Pdw, dnu, Pa1)
        dg = ((2.0 / 3.0) * dt * np.sum(self.lap(Pdw2) * L)
              + 0.25 * dt * (np.sum(self.lap(Pdw1) * a2) + np.sum(self.lap(Pw1) * da2))
              + dt * (np.sum(self.lap(Pdw) * a1) + np.sum(self.lap(Pw) * da1)))
        return S, float(dg)
