"""numba.cuda kernels for the cuda backend's small ops: f16 rounding, the activation quantizers, RMSNorm,
RoPE, the GLUs, add / scale / softcap, column and row copies, argmax.

Each mirrors the reference backend (edgellm/backends/reference.py, base.py) operation for operation, with
the roundings that matter done by rn.py's once-rounded helpers, so RMSNorm, RoPE, GeGLU and the copies give
the reference's bits; exp and tanh are evaluated in float64 and rounded once, as the reference does.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64, int32

from edgellm.backends.cuda_kernels.rn import SIMULATED, add, bits_f32, div, f32_bits, mul, sqrt, sub

# threads per block: a warp's multiple on a GPU; the simulator runs each thread as a Python thread, so
# there a few threads keep the tests quick (every kernel loops over its work with a stride of the block)
TB = 4 if SIMULATED else 128
_EXP_SCALE = float32(2.0**-112)
_TO_INF = float32(2.0**112)
_TO_ZERO = float32(2.0**-110)


# -- f16 and bf16 (ggml-org/llama.cpp ggml/src/ggml-impl.h ggml_compute_fp16_to_fp32 / _fp32_to_fp16) --------
@cuda.jit(device=True, inline=True)
def f16_to_f32(h):
    """The f16 bit pattern h (0..65535) as float32."""
    w = np.uint32(h) << np.uint32(16)
    sign = w & np.uint32(0x80000000)
    two_w = w << np.uint32(1)
    if two_w < np.uint32(1 << 27):
        v = sub(bits_f32((two_w >> np.uint32(17)) | np.uint32(126 << 23)), float32(0.5))
    else:
        v = mul(bits_f32((two_w >> np.uint32(4)) + np.uint32(0xE0 << 23)), _EXP_SCALE)
    return bits_f32(sign | f32_bits(v))


@cuda.jit(device=True, inline=True)
def f32_to_f16(f):
    """float32 -> f16 bits (uint32), round to nearest even."""
    base = mul(mul(abs(f), _TO_INF), _TO_ZERO)
    w = f32_bits(f)
    shl1_w = w << np.uint32(1)
    sign = w & np.uint32(0x80000000)
    bias = shl1_w & np.uint32(0xFF000000)
    if bias < np.uint32(0x71000000):
        bias = np.uint32(0x71000000)
    base = add(bits_f32((bias >> np.uint32(1)) + np.uint32(0x07800000)), base)
    bits = f32_bits(base)
    nonsign = ((bits >> np.uint32(13)) & np.uint32(0x7C00)) + (bits & np.uint32(0x0FFF))
    if shl1_w > np.uint32(0xFF000000):
        nonsign = np.uint32(0x7E00)
    return np.uint32((sign >> np.uint32(16)) | nonsign)


@cuda.jit(device=True, inline=True)
def f16_round(f):
    return f16_to_f32(f32_to_f16(f))


@cuda.jit(device=True, inline=True)
def bf16_round(f):
    """ggml_compute_fp32_to_bf16 then back (round to nearest even, NaNs made quiet)."""
    u = f32_bits(f)
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        h = (u >> np.uint32(16)) | np.uint32(64)
    else:
        h = np.uint32(u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return bits_f32(np.uint32(h << np.uint32(16)))


# -- activations as ggml's dot products see them (reference.activation_roundtrip) --------------------------
# kinds of activation rounding
ACT_NONE, ACT_F16, ACT_BF16, ACT_Q8_0, ACT_Q8_1, ACT_Q8_K = range(6)


@cuda.jit
def round_activations(x, out, corr, kind):
    """x (N, K) -> out (N, K): every block of x quantized and dequantized (Q8_0/Q8_1: 32 values, d = amax /
    127 stored as f16; Q8_K: 256, d = 1 / (-127 / vmax) in f32) or rounded to f16 / bf16. Q8_1 also writes
    corr (N, K/32) = f16(d * sum q) - f16(d) * sum q: what ggml's q4_1/q5_1 dot adds per weight min."""
    n, k = x.shape
    qk = 256 if kind == ACT_Q8_K else 32
    nb = k // qk
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    for item in range(i, n * nb, stride):
        r = item // nb
        o = (item % nb) * qk
        if kind == ACT_F16 or kind == ACT_BF16:
            for j in range(qk):
                out[r, o + j] = f16_round(x[r, o + j]) if kind == ACT_F16 else bf16_round(x[r, o + j])
        elif kind == ACT_Q8_K:
            amax = float32(0)
            vmax = float32(0)
            for j in range(qk):
                a = abs(x[r, o + j])
                if a > amax:
                    amax = a
                    vmax = x[r, o + j]
            iscale = div(float32(-127), vmax) if vmax != 0 else float32(0)
            d = div(float32(1), iscale) if iscale != 0 else float32(0)
            for j in range(qk):
                q = min(float32(127), float32(round(mul(iscale, x[r, o + j]))))
                out[r, o + j] = mul(d, q)
        else:
            amax = float32(0)
            for j in range(qk):
                a = abs(x[r, o + j])
                if a > amax:
                    amax = a
            d = div(amax, float32(127))
            inv = div(float32(127), amax) if amax > 0 else float32(0)
            d16 = f16_round(d)
            total = int32(0)
            for j in range(qk):
                q = float32(round(mul(x[r, o + j], inv)))
                total += int32(q)
                out[r, o + j] = mul(d16, q)
            if kind == ACT_Q8_1:
                sq = float32(total)
                corr[r, o // 32] = sub(f16_round(mul(d, sq)), mul(d16, sq))


# -- RMSNorm, RoPE -----------------------------------------------------------------------------------------
@cuda.jit
def rms_norm(x, w, out, eps, has_w):
    """A block per row of x (rows, n) (striding over rows): ggml_compute_forward_rms_norm_f32's sum of
    squares in double, scale = 1 / sqrtf(mean + eps), then times the weight."""
    t = cuda.threadIdx.x
    n = x.shape[1]
    part = cuda.shared.array(TB, float64)
    for r in range(cuda.blockIdx.x, x.shape[0], cuda.gridDim.x):
        s = float64(0)
        for j in range(t, n, TB):
            v = float64(x[r, j])
            s += v * v
        part[t] = s
        cuda.syncthreads()
        if t == 0:
            total = float64(0)
            for i in range(TB):
                total += part[i]
            part[0] = total
        cuda.syncthreads()
        scale = div(float32(1), sqrt(float32(part[0] / n + eps)))
        cuda.syncthreads()
        for j in range(t, n, TB):
            y = mul(x[r, j], scale)
            out[r, j] = mul(y, w[j]) if has_w else y


@cuda.jit
def rope(x, pos, cos, sin, out, n_dims, neox):
    """x (N, heads, Dh) rotated by the table rows of pos (N,): pairs (2i, 2i+1), or (i, i + n_dims/2) for
    neox; the dims past n_dims copied."""
    n, heads, dh = x.shape
    half = n_dims // 2
    i = cuda.grid(1)
    for item in range(i, n * heads * (dh // 2), cuda.gridsize(1)):
        r = item // (heads * (dh // 2))
        h = (item // (dh // 2)) % heads
        j = item % (dh // 2)
        if j < half:
            p = pos[r]
            c, s = cos[p, j], sin[p, j]
            ia, ib = (j, j + half) if neox else (2 * j, 2 * j + 1)
            a, b = x[r, h, ia], x[r, h, ib]
            out[r, h, ia] = sub(mul(a, c), mul(b, s))
            out[r, h, ib] = add(mul(a, s), mul(b, c))
        else:  # unrotated dims: n_dims + 2 (j - half), +1
            e = n_dims + 2 * (j - half)
            out[r, h, e] = x[r, h, e]
            out[r, h, e + 1] = x[r, h, e + 1]


# -- elementwise (flat float32 arrays) -----------------------------------------------------------------------
SILU_MUL, GELU_MUL, ADD, SCALE, SOFTCAP = range(5)


@cuda.jit
def elementwise(a, b, table, out, kind, b_len, f):
    """out = a (op) b over flat arrays; b is a's size or a row of b_len repeated (a bias)."""
    fc = float32(f)
    i = cuda.grid(1)
    for e in range(i, out.shape[0], cuda.gridsize(1)):
        x = a[e]
        if kind == SILU_MUL:
            ex = float32(math.exp(-float64(x)))
            out[e] = mul(div(x, add(float32(1), ex)), b[e])
        elif kind == GELU_MUL:  # ggml's f16 GELU table (base.gelu_mul)
            if x <= float32(-10):
                g = float32(0)
            elif x >= float32(10):
                g = x
            else:
                g = table[f32_to_f16(x)]
            out[e] = mul(g, b[e])
        elif kind == ADD:
            out[e] = add(x, b[e % b_len])
        elif kind == SCALE:
            out[e] = mul(x, fc)
        else:  # SOFTCAP: cap * tanh(x / cap), tanh in double rounded once
            out[e] = mul(fc, float32(math.tanh(float64(div(x, fc)))))


@cuda.jit
def columns(x, out, start):
    """out (N, w) = x[:, start:start + w]."""
    n, w = out.shape
    i = cuda.grid(1)
    for e in range(i, n * w, cuda.gridsize(1)):
        out[e // w, e % w] = x[e // w, start + e % w]


@cuda.jit
def take_rows(x, rows, out):
    """out (R, C) = x[rows] of a 2-D x."""
    n, c = out.shape
    i = cuda.grid(1)
    for e in range(i, n * c, cuda.gridsize(1)):
        out[e // c, e % c] = x[rows[e // c], e % c]


@cuda.jit
def argmax(logits, ids):
    """ids[r] = the first maximum of row r (the sampler's greedy), -1 where the row's maximum is not finite
    (a NaN anywhere, or an infinity)."""
    t = cuda.threadIdx.x
    n = logits.shape[1]
    best = cuda.shared.array(TB, float32)
    where = cuda.shared.array(TB, int32)
    bad = cuda.shared.array(TB, int32)
    for r in range(cuda.blockIdx.x, logits.shape[0], cuda.gridDim.x):
        bv = float32(-math.inf)
        bi = int32(-1)
        nan = int32(0)
        for j in range(t, n, TB):
            v = logits[r, j]
            if v != v:
                nan = 1
            elif v > bv or bi < 0:
                bv = v
                bi = j
        best[t], where[t], bad[t] = bv, bi, nan
        cuda.syncthreads()
        if t == 0:
            for u in range(1, TB):
                better = best[u] > best[0] or (best[u] == best[0] and where[u] < where[0])
                if where[u] >= 0 and (where[0] < 0 or better):
                    best[0], where[0] = best[u], where[u]
                bad[0] |= bad[u]
            finite = best[0] - best[0] == 0
            ids[r] = where[0] if bad[0] == 0 and finite and where[0] >= 0 else -1
        cuda.syncthreads()
