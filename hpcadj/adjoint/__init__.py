"""The adjoint driver (executes plans) and gradient verification."""

from .driver import Driver, GradientResult
from .verify import compute_gradient, dot_product_test, evaluate_objective, taylor_test

__all__ = ["Driver", "GradientResult", "compute_gradient", "dot_product_test", "evaluate_objective",
           "taylor_test"]
