"""Numba matmul kernels for float weights (F32, F16, BF16) against float32 activations.

ggml converts the activations to the weight's vec_dot_type first (f16 for F16, bf16 for BF16: done by
common.round_rows_*), then multiplies in float32. Like ggml-cpu's SIMD `ggml_vec_dot_f16` (vec.cpp,
GGML_F16_STEP lanes) the products go into independent float32 lanes, here 16 lanes over elements
j = l (mod 16), added in lane order at the end, then the leftover elements in order; products are not
fused (no FMA), so the result is independent of the machine. Only summation order separates this
from the reference's BLAS product.
"""

from __future__ import annotations

import numpy as np
from numba import njit

F32 = np.float32
F32_KIND, F16_KIND, BF16_KIND = 9, 10, 11  # kernel kinds (after the K-quants)
LANES = 16


@njit(cache=True, inline="always")
def _f16_bits_to_f32(h):
    """ggml_compute_fp16_to_fp32 without branches, so that a loop of it vectorizes."""
    w = np.uint32(h) << np.uint32(16)
    sign = w & np.uint32(0x80000000)
    two_w = np.uint32(w + w)
    norm = np.uint32((two_w >> np.uint32(4)) + np.uint32(0xE0 << 23)).view(np.float32) * F32(2.0**-112)
    den = np.uint32((two_w >> np.uint32(17)) | np.uint32(126 << 23)).view(np.float32) - F32(0.5)
    nb = np.float32(norm).view(np.uint32)
    db = np.float32(den).view(np.uint32)
    return np.uint32(sign | (db if two_w < np.uint32(1 << 27) else nb)).view(np.float32)


@njit(cache=True, inline="always")
def _lanes(acc, wb, xb):
    """acc[l] + wb[l] * xb[l] for the 16 lanes (a tuple: LLVM keeps it in registers)."""
    return (
        acc[0] + wb[0] * xb[0],
        acc[1] + wb[1] * xb[1],
        acc[2] + wb[2] * xb[2],
        acc[3] + wb[3] * xb[3],
        acc[4] + wb[4] * xb[4],
        acc[5] + wb[5] * xb[5],
        acc[6] + wb[6] * xb[6],
        acc[7] + wb[7] * xb[7],
        acc[8] + wb[8] * xb[8],
        acc[9] + wb[9] * xb[9],
        acc[10] + wb[10] * xb[10],
        acc[11] + wb[11] * xb[11],
        acc[12] + wb[12] * xb[12],
        acc[13] + wb[13] * xb[13],
        acc[14] + wb[14] * xb[14],
        acc[15] + wb[15] * xb[15],
    )


@njit(cache=True, nogil=True)
def rows(kind, w, xf, out, lo, hi):
    """out[:, lo:hi] = float weight rows lo..hi-1 (raw bytes, F32/F16/BF16 `kind`) times xf (N, K) float32
    activations already rounded to the weight's vec_dot_type."""
    k = xf.shape[1]
    wf = np.empty(k, F32)
    main = k - k % LANES
    z = F32(0)
    for r in range(lo, hi):
        row = w[r]
        if kind == F32_KIND:
            src = row.view(np.float32)
            for j in range(k):
                wf[j] = src[j]
        elif kind == F16_KIND:
            h = row.view(np.uint16)
            for j in range(k):
                wf[j] = _f16_bits_to_f32(h[j])
        else:
            h = row.view(np.uint16)
            for j in range(k):
                wf[j] = np.uint32(np.uint32(h[j]) << np.uint32(16)).view(np.float32)
        for n in range(xf.shape[0]):
            x = xf[n]
            acc = (z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z)
            for j0 in range(0, main, LANES):
                acc = _lanes(acc, wf[j0 : j0 + LANES], x[j0 : j0 + LANES])
            sumf = F32(0)
            for l in range(LANES):
                sumf += acc[l]
            for j in range(main, k):
                sumf += wf[j] * x[j]
            out[n, r] = sumf
