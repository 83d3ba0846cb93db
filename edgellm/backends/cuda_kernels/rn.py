"""Float operations rounded once each, as numpy rounds them: the CUDA kernels' bit-exact arithmetic.

On a GPU, a float32 multiply followed by an add or subtract without a rounding modifier may be fused into
one FMA by ptxas (PTX ISA: "mul/add without a rounding modifier may be optimized aggressively"), which
changes the last bit. Ops that must equal the reference bit for bit (dequantization, RMSNorm, RoPE, the
activation quantizers) use these: libdevice's __fmul_rn / __fadd_rn / __fsub_rn / __fdiv_rn, never fused.
Under numba-cuda's simulator (NUMBA_ENABLE_CUDASIM=1) the kernels run as Python on numpy scalars, which
round each operation already; there they are plain operators.
"""

from __future__ import annotations

from numba import config, cuda

SIMULATED = bool(config.ENABLE_CUDASIM)

if SIMULATED:

    def mul(a, b):
        return a * b

    def add(a, b):
        return a + b

    def sub(a, b):
        return a - b

    def div(a, b):
        return a / b

else:
    from numba.cuda import libdevice

    @cuda.jit(device=True, inline=True)
    def mul(a, b):
        return libdevice.fmul_rn(a, b)

    @cuda.jit(device=True, inline=True)
    def add(a, b):
        return libdevice.fadd_rn(a, b)

    @cuda.jit(device=True, inline=True)
    def sub(a, b):
        return libdevice.fsub_rn(a, b)

    @cuda.jit(device=True, inline=True)
    def div(a, b):
        return libdevice.fdiv_rn(a, b)


# float32 <-> its bits as uint32 (libdevice __float_as_int / __int_as_float on the GPU)
if SIMULATED:
    import numpy as np

    def f32_bits(x):
        return np.float32(x).view(np.uint32)

    def bits_f32(u):
        return np.uint32(u).view(np.float32)

    def sqrt(x):
        return np.float32(np.sqrt(np.float32(x)))

else:
    import numpy as np

    @cuda.jit(device=True, inline=True)
    def f32_bits(x):
        return np.uint32(libdevice.float_as_int(x))

    @cuda.jit(device=True, inline=True)
    def bits_f32(u):
        return libdevice.int_as_float(np.int32(u))

    @cuda.jit(device=True, inline=True)
    def sqrt(x):
        return libdevice.fsqrt_rn(x)
