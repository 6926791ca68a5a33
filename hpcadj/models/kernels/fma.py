"""Fused multiply-add for numba kernels: fma(a, b, c) = a * b + c rounded once (IEEE 754 fusedMultiplyAdd).

Numba without fastmath never contracts a * b + c into an FMA, and contraction left to the compiler
would make a point's result depend on whether it fell in a vectorised loop body or a scalar remainder
(a decomposition-dependent choice). An explicit FMA is one exactly rounded operation wherever it runs:
the vector and scalar instructions, and libm's fma() on a CPU without them, give the same double.
"""

from __future__ import annotations

from numba import types
from numba.extending import intrinsic


@intrinsic
def fma(typingctx, a, b, c):
    """a * b + c with one rounding (LLVM's llvm.fma.f64)."""
    if not all(isinstance(x, types.Float) for x in (a, b, c)):
        return None
    sig = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, signature, args):
        x, y, z = (context.cast(builder, v, t, types.float64) for v, t in zip(args, signature.args))
        return builder.fma(x, y, z)

    return sig, codegen
