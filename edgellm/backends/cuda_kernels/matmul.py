"""numba.cuda matmul and get_rows for every weight type, specialized per type at first use.

A weight stays as the file's blocks (uint8 rows, uploaded once). matmul multiplies it with activations
already rounded as ggml's dot products round them (ops.round_activations: Q8_0 / Q8_1 / Q8_K blocks, f16
or bf16), so each output is the reference's exact product up to float32 summation order: one block of
threads per weight row and group of NT tokens, each thread dequantizing whole blocks (blocks.make_dequant,
bit-exact with edgellm.quants) into local memory and meeting them with the group's activations.
Q4_1 / Q5_1 add min * corr per block (ggml's q8_1 dot uses f16(d * sum q), not the dequantized sum).
"""

from __future__ import annotations

import functools

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda, float32

from edgellm.backends.cuda_kernels.blocks import QK, TYPE_SIZE, make_dequant
from edgellm.backends.cuda_kernels.ops import TB, f16_to_f32

NT = 8  # tokens per block of threads: each weight block dequantized once meets NT activation rows
_WITH_MIN = (int(T.Q4_1), int(T.Q5_1))


@functools.cache
def matmul_kernel(qtype: int):
    """kernel[(rows, ceil(N / NT)), TB](w, xa, corr, y) (any grid: it strides): y (N, M) = xa (N, K)
    times w (M, K as blocks)ᵀ."""
    deq = make_dequant(qtype)
    qk, tsize, with_min = QK[qtype], TYPE_SIZE[qtype], qtype in _WITH_MIN

    @cuda.jit
    def matmul(w, xa, corr, y):
        t = cuda.threadIdx.x
        n = xa.shape[0]
        nb = xa.shape[1] // qk
        vals = cuda.local.array(qk, float32)
        acc = cuda.local.array(NT, float32)
        part = cuda.shared.array((NT, TB), float32)
        # grid-stride over (weight row, group of NT tokens): a GPU launches one block per pair, the
        # simulator one block for all
        for row in range(cuda.blockIdx.x, w.shape[0], cuda.gridDim.x):
            for t0 in range(cuda.blockIdx.y * NT, n, cuda.gridDim.y * NT):
                nt = min(NT, n - t0)
                for u in range(NT):
                    acc[u] = 0
                for blk in range(t, nb, TB):
                    deq(w, row, blk, vals)
                    o = blk * qk
                    m = float32(0)
                    if with_min:
                        o8 = blk * tsize
                        m = f16_to_f32(
                            np.uint32(w[row, o8 + 2]) | (np.uint32(w[row, o8 + 3]) << np.uint32(8))
                        )
                    for u in range(nt):
                        s = float32(0)
                        for j in range(qk):
                            s += vals[j] * xa[t0 + u, o + j]
                        if with_min:
                            s += m * corr[t0 + u, blk * (qk // 32)]
                        acc[u] += s
                for u in range(NT):
                    part[u, t] = acc[u]
                cuda.syncthreads()
                for u in range(t, nt, TB):
                    s = float32(0)
                    for i in range(TB):
                        s += part[u, i]
                    y[t0 + u, row] = s
                cuda.syncthreads()

    return matmul


@functools.cache
def rows_kernel(qtype: int):
    """kernel[blocks, TB](w, ids, out): out (N, K) = the dequantized rows ids (N,) of w."""
    deq = make_dequant(qtype)
    qk = QK[qtype]

    @cuda.jit
    def get_rows(w, ids, out):
        nb = out.shape[1] // qk
        vals = cuda.local.array(qk, float32)
        i = cuda.grid(1)
        for item in range(i, out.shape[0] * nb, cuda.gridsize(1)):
            r = item // nb
            blk = item % nb
            deq(w, ids[r], blk, vals)
            for j in range(qk):
                out[r, blk * qk + j] = vals[j]

    return get_rows
