"""TAO's Newton types (nls, bntr) over Hessian-vector products: the shell matrix y = (H + w I) x."""

from __future__ import annotations

from ..adjoint.products import HessianProducts
from ..imports import petsc


class HessianShell:
    """y = (H + w I) x over packed controls, as the context of a petsc4py shell Mat, for TAO's
    Newton methods (nls, bntr).

    ``space`` packs the inverted controls into one Vec (:class:`hpcadj.inversion.space.ControlSpace`:
    ``pack``, ``unpack``, ``names``, ``vec``); ``w`` is a zeroth-order Tikhonov weight. TAO's Hessian
    callback (:meth:`point`) fixes m and runs one forward sweep (:class:`HessianProducts`, which
    ``products_options`` such as ``ram``, ``memory`` and ``local_dir`` configure); every product after
    it (:meth:`mult`, one per Krylov iteration) runs only the tangent and reverse sweeps.
    :meth:`release` frees the kept states between Krylov solves (a product after it runs the
    forward sweep at the same m again); ``prepare`` is called before each forward sweep (the
    inversion frees its own kept levels there, so that a budget holds one of the two at a time).
    ``plan``: the :class:`~hpcadj.adjoint.products.ProductPlan` decided before TAO starts, which
    every forward sweep then keeps (else each plans from ``products_options``).
    """

    def __init__(self, model, space, *, gauss_newton: bool = False, regularization: float = 0.0,
                 prepare=None, plan=None, **products_options):
        self.model, self.space, self.plan = model, space, plan
        self.gauss_newton, self.weight = gauss_newton, float(regularization)
        self.products_options = products_options
        self.prepare = prepare
        self.products = self.mat = self.x = None
        self.count = 0
        self.sweeps = 0
        self.steps = {"forward": 0, "tangent": 0, "adjoint": 0}
        self.peak_predicted = None

    def matrix(self):
        """The shell Mat (collective); :meth:`close` destroys it."""
        vec = self.space.vec
        sizes = (vec.getLocalSize(), vec.getSize())
        self.mat = petsc().Mat().createPython((sizes, sizes), context=self, comm=vec.getComm())
        self.mat.setUp()
        return self.mat

    def point(self, tao, x, H, P) -> None:
        """TAO's Hessian callback: the products that follow are at the controls packed in ``x``."""
        self.release()
        if self.x is not None:
            self.x.destroy()
        self.x = x.copy()
        self._products()

    def _products(self):
        if self.products is None:
            if self.prepare is not None:
                self.prepare()
            controls = self.space.unpack(self.x)
            self.products = HessianProducts(self.model, controls, gauss_newton=self.gauss_newton,
                                            plan=self.plan, **self.products_options)
            for vec in controls.values():
                vec.destroy()
            self.sweeps += 1
            if self.products.memory is not None:
                peak = self.products.memory.peak_bytes
                self.peak_predicted = max(self.peak_predicted or 0, peak)
        return self.products

    def mult(self, mat, x, y) -> None:
        v = self.space.unpack(x)
        for name, vec in v.items():
            if name not in self.space.names:
                vec.set(0.0)
        self.space.pack(self._products().hessian_action(v).hessian, y)
        if self.weight:
            y.axpy(self.weight, x)
        self.count += 1

    def counts(self) -> dict:
        """Products so far, the forward sweeps they ran and the model steps they took."""
        steps = dict(self.steps)
        if self.products is not None:
            for key in steps:
                steps[key] += self.products.counts[key]
        out = {"hessian_products": self.count, "hessian_forward_sweeps": self.sweeps,
               **{f"hessian_{k}_steps": v for k, v in steps.items()}}
        if self.peak_predicted is not None:
            out["hessian_predicted_peak_bytes"] = self.peak_predicted
        return out

    def release(self) -> None:
        """Free the kept states (and their node-local files); the point stays."""
        if self.products is not None:
            for key in self.steps:
                self.steps[key] += self.products.counts[key]
            self.products.close()
            self.products = None

    def close(self) -> None:
        """Release the kept forward states (and their node-local files) and the shell Mat."""
        self.release()
        if self.x is not None:
            self.x.destroy()
            self.x = None
        if self.mat is not None:
            self.mat.destroy()
            self.mat = None
