"""Scalar helpers and activation quantizers shared by the Numba kernels, bit-exact with ggml-cpu.

f16 <-> f32 mirror ggml-org/llama.cpp ggml/src/ggml-impl.h (ggml_compute_fp16_to_fp32 /
ggml_compute_fp32_to_fp16, round to nearest even, as F16C's `_cvtss_sh` does). The activation quantizers
mirror ggml-cpu's x86 `quantize_row_q8_0` / `quantize_row_q8_1` (ggml-cpu/arch/x86/quants.c: d = amax/127,
x * (127/amax) rounded to nearest even by `_mm256_round_ps`) and `quantize_row_q8_K_ref`
(ggml/src/ggml-quants.c: d = 1/(-127/max), `nearest_int`, which also rounds half to even).
"""

from __future__ import annotations

import numpy as np
from numba import njit

F32 = np.float32
_EXP_SCALE = F32(2.0**-112)
_TO_INF = F32(2.0**112)
_TO_ZERO = F32(2.0**-110)


@njit(cache=True, inline="always")
def f16_to_f32(h):
    """ggml_compute_fp16_to_fp32 on the integer bits h (0..65535)."""
    w = np.uint32(h) << np.uint32(16)
    sign = w & np.uint32(0x80000000)
    two_w = np.uint32(w + w)
    normalized = np.uint32((two_w >> np.uint32(4)) + np.uint32(0xE0 << 23)).view(np.float32) * _EXP_SCALE
    denormalized = np.uint32((two_w >> np.uint32(17)) | np.uint32(126 << 23)).view(np.float32) - F32(0.5)
    if two_w < np.uint32(1 << 27):
        bits = np.float32(denormalized).view(np.uint32)
    else:
        bits = np.float32(normalized).view(np.uint32)
    return np.uint32(sign | bits).view(np.float32)


@njit(cache=True, inline="always")
def f16_at(raw, r, o):
    """The little-endian f16 at bytes o, o+1 of row r of a uint8 array, as float32."""
    return f16_to_f32(np.uint32(raw[r, o]) | (np.uint32(raw[r, o + 1]) << np.uint32(8)))


@njit(cache=True, inline="always")
def f32_to_f16_bits(f):
    """ggml_compute_fp32_to_fp16: float32 -> f16 bits (uint32), round to nearest even."""
    f = F32(f)
    base = (abs(f) * _TO_INF) * _TO_ZERO
    w = np.float32(f).view(np.uint32)
    shl1_w = np.uint32(w + w)
    sign = w & np.uint32(0x80000000)
    bias = shl1_w & np.uint32(0xFF000000)
    if bias < np.uint32(0x71000000):
        bias = np.uint32(0x71000000)
    base = np.uint32((bias >> np.uint32(1)) + np.uint32(0x07800000)).view(np.float32) + base
    bits = np.float32(base).view(np.uint32)
    nonsign = ((bits >> np.uint32(13)) & np.uint32(0x7C00)) + (bits & np.uint32(0x0FFF))
    if shl1_w > np.uint32(0xFF000000):
        nonsign = np.uint32(0x7E00)
    return np.uint32((sign >> np.uint32(16)) | nonsign)


@njit(cache=True, inline="always")
def f16_round(f):
    """f rounded to the nearest f16 value, as float32 (GGML_FP32_TO_FP16 then back)."""
    return f16_to_f32(f32_to_f16_bits(f))


@njit(cache=True, inline="always")
def bf16_round(f):
    """ggml_compute_fp32_to_bf16 then back to float32 (round to nearest even, NaNs made quiet)."""
    u = np.float32(f).view(np.uint32)
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        h = (u >> np.uint32(16)) | np.uint32(64)
    else:
        h = np.uint32(u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return np.uint32(h << np.uint32(16)).view(np.float32)


@njit(cache=True, nogil=True)
def quantize_q8_0(x, qa, da, sa, with_sum):
    """x (N, K) float32 -> qa (N, K) int8, da (N, K/32) f16-rounded scales as float32; with_sum also
    fills sa (N, K/32) with Q8_1's s = f16(d * sum(q)) (x86 quantize_row_q8_1)."""
    n_rows, k = x.shape
    for r in range(n_rows):
        for b in range(k // 32):
            o = b * 32
            amax = F32(0)
            for j in range(32):
                a = abs(x[r, o + j])
                if a > amax:
                    amax = a
            d = amax / F32(127)
            inv = F32(127) / amax if amax != F32(0) else F32(0)
            total = 0
            for j in range(32):
                q = np.int32(np.rint(x[r, o + j] * inv))
                qa[r, o + j] = q
                total += q
            da[r, b] = f16_round(d)
            if with_sum:
                sa[r, b] = f16_round(d * F32(total))


@njit(cache=True, nogil=True)
def quantize_q8_k(x, qa, da, bsums):
    """x (N, K) float32 -> qa (N, K) int8, da (N, K/256) float32, bsums (N, K/16) int32 sums of 16 quants."""
    n_rows, k = x.shape
    for r in range(n_rows):
        for b in range(k // 256):
            o = b * 256
            amax = F32(0)
            vmax = F32(0)
            for j in range(256):
                a = abs(x[r, o + j])
                if a > amax:
                    amax = a
                    vmax = x[r, o + j]
            if amax == F32(0):
                da[r, b] = F32(0)
                for j in range(256):
                    qa[r, o + j] = 0
                for j in range(16):
                    bsums[r, b * 16 + j] = 0
                continue
            iscale = F32(-127) / vmax
            for g in range(16):
                s = 0
                for j in range(16):
                    q = min(127, np.int32(np.rint(iscale * x[r, o + g * 16 + j])))
                    qa[r, o + g * 16 + j] = q
                    s += q
                bsums[r, b * 16 + g] = s
            da[r, b] = F32(1) / iscale


@njit(cache=True, nogil=True)
def round_rows_f16(x, out):
    """out = x rounded to f16 values (ggml converts activations to f16 for F16 weights)."""
    n_rows, k = x.shape
    for r in range(n_rows):
        for j in range(k):
            out[r, j] = f16_round(x[r, j])


@njit(cache=True, nogil=True)
def round_rows_bf16(x, out):
    """out = x rounded to bf16 values (the vec_dot_type of BF16 weights is BF16)."""
    n_rows, k = x.shape
    for r in range(n_rows):
        for j in range(k):
            out[r, j] = bf16_round(x[r, j])
