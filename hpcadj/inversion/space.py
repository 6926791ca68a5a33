"""The controls an inversion changes, packed into the one PETSc Vec TAO optimises, and its
Tikhonov term.

Each inverted control keeps its own parallel layout: the packed Vec's local part on a rank is the
concatenation of that rank's local parts of the inverted controls (in the order given), so packing
and unpacking move no data between ranks. Controls not inverted stay fixed at their given values.
"""

from __future__ import annotations

import numpy as np
from ..collective import any_rank
from ..imports import petsc


class ControlSpace:
    """``invert`` (names) out of ``controls`` (name -> Vec, the starting point and the fixed rest)."""

    def __init__(self, controls: dict, invert):
        self.controls = controls
        self.names = list(invert)
        unknown = [n for n in self.names if n not in controls]
        if not self.names or unknown:
            raise ValueError(f"cannot invert {', '.join(unknown) or 'nothing'}: the model's controls are "
                             f"{', '.join(sorted(controls))}")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"a control is named twice in {', '.join(self.names)}")
        self.sizes = [controls[n].getLocalSize() for n in self.names]
        self.offsets = np.cumsum([0] + self.sizes)
        comm = controls[self.names[0]].getComm()
        self.vec = petsc().Vec().createMPI((int(self.offsets[-1]), petsc().DECIDE), comm=comm)

    def new(self):
        """A new packed Vec (zeros)."""
        v = self.vec.duplicate()
        v.set(0.0)
        return v

    def pack(self, fields: dict, out=None):
        """The inverted controls of ``fields`` as one packed Vec (``out`` if given)."""
        out = out if out is not None else self.vec.duplicate()
        a = out.getArray()
        for name, lo, hi in zip(self.names, self.offsets[:-1], self.offsets[1:]):
            a[lo:hi] = fields[name].getArray(readonly=True)
        return out

    def unpack(self, x) -> dict:
        """Every control: copies of the fixed ones, the inverted ones read from packed ``x``."""
        a = x.getArray(readonly=True)
        out = {}
        for name, vec in self.controls.items():
            out[name] = vec.copy()
        for name, lo, hi in zip(self.names, self.offsets[:-1], self.offsets[1:]):
            out[name].getArray()[:] = a[lo:hi]
        return out

    def fill(self, values: dict, default: float):
        """A packed Vec holding ``values[name]`` (a float) on each inverted control, else ``default``."""
        out = self.vec.duplicate()
        a = out.getArray()
        for name, lo, hi in zip(self.names, self.offsets[:-1], self.offsets[1:]):
            a[lo:hi] = values.get(name, default)
        return out


class Tikhonov:
    """R(m) = w/2 · Σ (m − m_ref)² over every entry of the inverted controls (zeroth order), and
    dR/dm = w (m − m_ref); ``w`` = 0 adds nothing (not even a rounding)."""

    def __init__(self, weight: float, reference):
        if not (np.isfinite(weight) and weight >= 0):
            raise ValueError(f"the regularisation weight must be >= 0, got {weight}")
        self.weight = float(weight)
        self.reference = reference

    def value(self, x) -> float:
        if self.weight == 0.0:
            return 0.0
        d = x.copy()
        d.axpy(-1.0, self.reference)
        r = 0.5 * self.weight * d.dot(d)
        d.destroy()
        return r

    def add_gradient(self, x, g) -> None:
        """g += w (x − m_ref)."""
        if self.weight == 0.0:
            return
        g.axpy(self.weight, x)
        g.axpy(-self.weight, self.reference)


class Scaling:
    """A diagonal preconditioner as a change of variables m = s ⊙ y (s > 0 per entry): TAO optimises
    y, so its gradient is s ⊙ dJ/dm and a gradient step in y moves m by s² ⊙ dJ/dm. A depth or
    illumination weight evens out updates a raw gradient piles up near the sources and receivers.

    ``weights`` maps inverted controls to their s (a Vec or an array of the control's local part);
    controls not named keep s = 1. Bounds and the optimiser's steps live in y; J, its gradient, the
    Tikhonov term, the log and the stored iterates stay in m.
    """

    def __init__(self, space: ControlSpace, weights: dict):
        unknown = [n for n in weights if n not in space.names]
        if unknown:
            raise ValueError(f"cannot scale {', '.join(unknown)}: the inverted controls are {', '.join(space.names)}")
        self.s = space.fill({}, 1.0)
        a = self.s.getArray()
        for name, lo, hi in zip(space.names, space.offsets[:-1], space.offsets[1:]):
            if name in weights:
                w = weights[name]
                a[lo:hi] = w.getArray(readonly=True) if hasattr(w, "getArray") else np.ravel(w)
        if any_rank(space.vec.getComm().tompi4py(), not bool(np.all(np.isfinite(a)) and np.all(a > 0))):
            raise ValueError("a scaling weight is not a positive finite number")

    def to_m(self, y, out):
        """out = s ⊙ y."""
        out.pointwiseMult(self.s, y)
        return out

    def to_y(self, m):
        """m / s, in place."""
        m.pointwiseDivide(m, self.s)
        return m

    def gradient(self, g):
        """dJ/dy = s ⊙ dJ/dm, in place."""
        g.pointwiseMult(g, self.s)
