"""What burgers' in-order dJ/dnu sum costs its adjoint stage (issue 15): the kernel as shipped
against a copy whose scalar sum loop is dropped (wrong dnu, same outputs otherwise), side by side.

    python experiments/kernels/burgers_dnu_sum.py [--grid 1024x1024] [--reps 15]

One process, one rank (the sum is per rank). Prints ms per adjoint stage (modes 3, 2, 1), median of
--reps, and the ratio. The sum must run point by point, u's term then v's, for dJ/dnu to stay bitwise
what it was; that dependent chain of additions cannot be vectorised without reordering it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent.parent
KERNEL = ROOT / "hpcadj" / "models" / "kernels" / "burgers.py"
SUM = "        for i in range(mx):\n            dnu += gu[i]\n            dnu += gv[i]\n"


def _compiled(source: str, name: str) -> dict:
    ns = {"__name__": name}
    exec(compile(source.replace("cache=True", "cache=False"), name, "exec"), ns)
    return ns


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", default="1024x1024")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    from hpcadj.models.burgers import BurgersModel
    from hpcadj.models.dmda import parse_grid
    from hpcadj.stack import mpi

    try:
        sizes = parse_grid(args.grid)
        if len(sizes) != 2 or min(sizes) < 3 or args.reps < 1:
            raise ValueError(f"need a 2-D grid of at least 3x3 and --reps >= 1, got {args.grid}, {args.reps}")
    except ValueError as exc:
        print(f"burgers_dnu_sum: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    source = KERNEL.read_text()
    if SUM not in source:
        print("burgers_dnu_sum: the kernel's sum loop is not where this script expects it", file=sys.stderr)
        raise SystemExit(2)
    kernels = {"in-order sum": _compiled(source, "with_sum"),
               "no sum": _compiled(source.replace(SUM, "        dnu += gu[0]\n"), "no_sum")}
    m = BurgersModel(mpi().COMM_SELF, sizes, n_steps=2)
    m.set_controls(m.default_controls())
    u = m.initial_state()
    mu = m.step(0, u)
    W, F = m._block(u), m._faces(u, 0)
    M, FM = m._block(mu), m._faces(mu, 3)
    O1, O2 = m._block(m._scratch(2), readonly=False), m._block(m._scratch(3), readonly=False)

    def timed(fn):
        fn()
        out = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return 1e3 * float(np.median(out))

    ms = {}
    for _round in range(2):  # alternate, so both see the same machine load
        for label, ns in kernels.items():
            for mode in (3, 2, 1):
                t = timed(lambda: ns["adjoint_stage"](*W, *F, *M, *FM, mode, m.nu, m.dt, m._ih, *O1, *O2))
                ms.setdefault((label, mode), []).append(t)
    print(f"burgers {args.grid}, 1 rank: ms per adjoint stage (best of 2 rounds of median-of-{args.reps})")
    for mode in (3, 2, 1):
        a, b = min(ms[("in-order sum", mode)]), min(ms[("no sum", mode)])
        print(f"  mode {mode}: in-order sum {a:6.2f}  no sum {b:6.2f}  ratio {a / b:.2f}")


if __name__ == "__main__":
    main()
