"""Compile and cache every model's numba kernels once, at set-up (scripts/setup.sh, in two processes).

The first call of a kernel compiles it and writes numba's on-disk cache; in a fresh clone the ranks
of the first run or MPI test would otherwise compile and write the same cache entries at once. One
gradient and one tangent of each model on a tiny grid (2-D and 3-D, grayscott with both Jacobians)
and an advance of three steps (wave's and burgers' tiled kernels) reach every model kernel; two small multi-level
DPs forced onto the compiled path reach the planner's.
"""

import sys

from hpcadj.adjoint import compute_gradient, dot_product_test
from hpcadj.cli import Parser
from hpcadj.cli.common import add_model_arguments, build_model
from hpcadj.models.grayscott import GrayScottModel
from hpcadj.imports import mpi

CASES = [("wave", "8x8x6"), ("wave", "8x6"), ("burgers", "8x8"), ("heat", "8x8x6"), ("heat", "8x6"),
         ("grayscott", "8x8")]


def main(part: int = 0, parts: int = 1) -> None:
    """Warm the ``part``-th of ``parts`` shares of the models (every ``parts``-th case)."""
    comm = mpi().COMM_WORLD
    models = []
    for name, grid in CASES[part::parts]:
        parser = Parser()
        add_model_arguments(parser)
        models.append(build_model(parser.parse_args(["--model", name, "--grid", grid, "--steps", "3"]), comm))
    if part == parts - 1:
        models.append(GrayScottModel(comm, (8, 8), n_steps=3, jacobian="assembled"))
    for model in models:
        controls = model.default_controls()
        dot_product_test(model, controls, gradient=compute_gradient(model, controls))
        model.set_controls(controls)
        model.advance(0, model.initial_state(), 3)  # a model's own advance: wave's, burgers' time tiles


def warm_multilevel() -> None:
    """The multi-level DP's compiled loops (schedules/multilevel_kernels.py): one small DP with the
    exact split scan and one with candidate splits, forced onto the compiled path."""
    from hpcadj.checkpoint.schedules import default_costs, multilevel

    multilevel.COMPILED = True
    try:
        for exact in (True, False):
            multilevel.MultilevelPlanner(40, (2, 3, 4), default_costs(3), exact=exact)
    finally:
        multilevel.COMPILED = None


if __name__ == "__main__":
    # ``warm_kernels.py K N``: the K-th of N shares, so N processes can warm the cache side by side
    # (numba replaces a cache file atomically: two processes compiling one kernel is only waste)
    part, parts = (int(a) for a in sys.argv[1:3]) if len(sys.argv) == 3 else (0, 1)
    main(part, parts)
    if part == 0:
        warm_multilevel()
