"""numba.cuda device functions that dequantize one block of a GGML weight row, bit-exact with
edgellm.quants.dequantize: what the cuda backend's matmul and get_rows kernels call per block.

Layouts are ggml's (ggml-org/llama.cpp ggml/src/ggml-common.h block_q4_0 .. block_q6_K, kvalues_iq4nl) and
the loops follow ggml/src/ggml-quants.c dequantize_row_q4_0 .. dequantize_row_q6_K / dequantize_row_iq4_nl.
The float32 operations are edgellm/quants.py's, in gguf-py gguf/quants.py's order, each rounded once
through rn.py (never fused into an FMA): Q4_1 / Q5_1 d * q + m, K-quants (d * sc) * q - (dmin * m), Q3_K /
Q6_K (d * sc) * q, the others d * q. f16 / bf16 / f32 values are rebuilt from their bits with integer code
(rn.bits_f32); F32, F16 and BF16 take "blocks" of 32 values.

Every function is inlined at the Numba IR level (inline="always"): a separately compiled device function
asks the current device for its compute capability, so compile_ptx could not build its callers without a
GPU (compile.py does, for every supported target).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import cuda

from edgellm.backends.cuda_kernels.rn import add, bits_f32, mul, sub

_LEGACY = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL)
_K_QUANTS = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K)

# elements per block, and bytes per block, per ggml type int (ggml-common.h; F32/F16/BF16: 32 values)
QK: dict[int, int] = {
    **{int(t): 32 for t in (T.F32, T.F16, T.BF16, *_LEGACY)},
    **{int(t): 256 for t in _K_QUANTS},
}
TYPE_SIZE: dict[int, int] = {
    int(T.F32): 128,
    int(T.F16): 64,
    int(T.BF16): 64,
    int(T.Q4_0): 18,
    int(T.Q4_1): 20,
    int(T.Q5_0): 22,
    int(T.Q5_1): 24,
    int(T.Q8_0): 34,
    int(T.IQ4_NL): 18,
    int(T.Q2_K): 84,
    int(T.Q3_K): 110,
    int(T.Q4_K): 144,
    int(T.Q5_K): 176,
    int(T.Q6_K): 210,
}

# ggml-common.h kvalues_iq4nl, as float32 like quants.py's table (a constant array when compiled)
_KVALUES_IQ4NL = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32
)


def _device(fn):
    return cuda.jit(device=True, inline="always")(fn)


# ------------------------------------------------------------------------------------------ scalar reads
# Bytes are read as np.int32 / np.uint32 before any shift: the simulator follows numpy 2's scalar rules,
# where a uint8 shifted left would wrap.


@_device
def _int8(w, row, o):
    """Byte o of the row read as a signed int8, as int32."""
    return (np.int32(w[row, o]) ^ 128) - 128


@_device
def _u16(w, row, o):
    """The little-endian 16-bit word at bytes o, o + 1 of the row, as uint32."""
    return np.uint32(w[row, o]) | (np.uint32(w[row, o + 1]) << np.uint32(8))


@_device
def _f16(w, row, o):
    """The little-endian f16 at bytes o, o + 1 of the row as float32, exactly (numpy's astype; NaN payloads
    kept): the bit fields moved into float32's, a subnormal's mantissa first normalized."""
    h = _u16(w, row, o)
    e = np.int32((h >> np.uint32(10)) & np.uint32(0x1F))
    m = h & np.uint32(0x3FF)
    if e == 31:  # inf / nan
        e = 0xFF - 112
    elif e == 0 and m != 0:  # subnormal m * 2**-24: shift the leading 1 into the implicit bit
        e = 1
        while (m & np.uint32(0x400)) == 0:
            m <<= np.uint32(1)
            e -= 1
        m &= np.uint32(0x3FF)
    elif e == 0:  # +-0
        e = -112
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    return bits_f32(sign | (np.uint32(e + 112) << np.uint32(23)) | (m << np.uint32(13)))


@_device
def _scale_min_k4(w, row, o, j):
    """Q4_K / Q5_K sub-block j's 6-bit scale and min from the 12 scale bytes at o (get_scale_min_k4)."""
    if j < 4:
        sc = np.int32(w[row, o + j]) & 63
        mn = np.int32(w[row, o + j + 4]) & 63
    else:
        sc = (np.int32(w[row, o + j + 4]) & 15) | ((np.int32(w[row, o + j - 4]) >> 6) << 4)
        mn = (np.int32(w[row, o + j + 4]) >> 4) | ((np.int32(w[row, o + j]) >> 6) << 4)
    return np.int32(sc), np.int32(mn)


# ------------------------------------------------------------------------------------------ float types


@_device
def _deq_f32(w, row, blk, out):
    o = blk * 128
    for j in range(32):
        p = o + 4 * j
        out[j] = bits_f32(_u16(w, row, p) | (_u16(w, row, p + 2) << np.uint32(16)))


@_device
def _deq_f16(w, row, blk, out):
    o = blk * 64
    for j in range(32):
        out[j] = _f16(w, row, o + 2 * j)


@_device
def _deq_bf16(w, row, blk, out):
    # ggml-impl.h ggml_compute_bf16_to_fp32: the bits shifted into the top half of a float32
    o = blk * 64
    for j in range(32):
        out[j] = bits_f32(_u16(w, row, o + 2 * j) << np.uint32(16))


# --------------------------------------------------------------- legacy 32-element blocks (Q4_0 .. Q8_0)
# element j (< 16) is byte j's low nibble, element j + 16 its high nibble


@_device
def _deq_q4_0(w, row, blk, out):  # d, qs[16]
    o = blk * 18
    d = _f16(w, row, o)
    for j in range(16):
        x = np.int32(w[row, o + 2 + j])
        out[j] = mul(d, np.float32((x & 15) - 8))
        out[j + 16] = mul(d, np.float32((x >> 4) - 8))


@_device
def _deq_q4_1(w, row, blk, out):  # d, m, qs[16]
    o = blk * 20
    d = _f16(w, row, o)
    m = _f16(w, row, o + 2)
    for j in range(16):
        x = np.int32(w[row, o + 4 + j])
        out[j] = add(mul(d, np.float32(x & 15)), m)
        out[j + 16] = add(mul(d, np.float32(x >> 4)), m)


@_device
def _deq_q5_0(w, row, blk, out):  # d, qh[4] (bit j: element j's 5th bit), qs[16]
    o = blk * 22
    d = _f16(w, row, o)
    for j in range(16):
        x = np.int32(w[row, o + 6 + j])
        h0 = (np.int32(w[row, o + 2 + (j >> 3)]) >> (j & 7)) & 1  # bit j
        h1 = (np.int32(w[row, o + 4 + (j >> 3)]) >> (j & 7)) & 1  # bit j + 16
        out[j] = mul(d, np.float32(((x & 15) | (h0 << 4)) - 16))
        out[j + 16] = mul(d, np.float32(((x >> 4) | (h1 << 4)) - 16))


@_device
def _deq_q5_1(w, row, blk, out):  # d, m, qh[4], qs[16]
    o = blk * 24
    d = _f16(w, row, o)
    m = _f16(w, row, o + 2)
    for j in range(16):
        x = np.int32(w[row, o + 8 + j])
        h0 = (np.int32(w[row, o + 4 + (j >> 3)]) >> (j & 7)) & 1
        h1 = (np.int32(w[row, o + 6 + (j >> 3)]) >> (j & 7)) & 1
        out[j] = add(mul(d, np.float32((x & 15) | (h0 << 4))), m)
        out[j + 16] = add(mul(d, np.float32((x >> 4) | (h1 << 4))), m)


@_device
def _deq_q8_0(w, row, blk, out):  # d, qs[32] int8
    o = blk * 34
    d = _f16(w, row, o)
    for j in range(32):
        out[j] = mul(np.float32(_int8(w, row, o + 2 + j)), d)


@_device
def _deq_iq4_nl(w, row, blk, out):  # d, qs[16]: indices into kvalues_iq4nl
    o = blk * 18
    d = _f16(w, row, o)
    for j in range(16):
        x = np.int32(w[row, o + 2 + j])
        out[j] = mul(d, _KVALUES_IQ4NL[x & 15])
        out[j + 16] = mul(d, _KVALUES_IQ4NL[x >> 4])


# ------------------------------------------------------------------ K-quants: 256-element super-blocks
# ggml walks each half of 128 elements as 4 quarters of 32, each a bit field of the half's quant bytes
# (32 bytes for Q2_K / Q3_K, 64 for Q6_K's low nibbles). Sub-block s of 16 (of 32 for Q4_K / Q5_K) is here
# one loop iteration: half n = s >> 3, quarter j = (s >> 1) & 3, and its first or second 16 (s & 1).


@_device
def _deq_q2_k(w, row, blk, out):  # scales[16] (low nibble scale, high nibble min), qs[64], d, dmin
    o = blk * 84
    d = _f16(w, row, o + 80)
    dmin = _f16(w, row, o + 82)
    for s in range(16):
        sc = np.int32(w[row, o + s])
        dl = mul(d, np.float32(sc & 15))
        ml = mul(dmin, np.float32(sc >> 4))
        qs = o + 16 + 32 * (s >> 3) + 16 * (s & 1)
        shift = 2 * ((s >> 1) & 3)
        for i in range(16):
            q = (np.int32(w[row, qs + i]) >> shift) & 3
            out[16 * s + i] = sub(mul(dl, np.float32(q)), ml)


@_device
def _deq_q3_k(w, row, blk, out):  # hmask[32], qs[64], scales[12] (16 6-bit, biased by 32), d
    o = blk * 110
    d = _f16(w, row, o + 108)
    for s in range(16):
        lo = (np.int32(w[row, o + 96 + (s & 7)]) >> (4 * (s >> 3))) & 15
        hi = (np.int32(w[row, o + 104 + (s & 3)]) >> (2 * (s >> 2))) & 3
        dl = mul(d, np.float32((lo | (hi << 4)) - 32))
        qs = o + 32 + 32 * (s >> 3) + 16 * (s & 1)
        hm = o + 16 * (s & 1)  # hmask bit s >> 1 (4n + j) of the same 16 bytes in both halves
        shift = 2 * ((s >> 1) & 3)
        for i in range(16):
            high = (np.int32(w[row, hm + i]) >> (s >> 1)) & 1
            q = ((np.int32(w[row, qs + i]) >> shift) & 3) - 4 + 4 * high  # minus 4 where high is clear
            out[16 * s + i] = mul(dl, np.float32(q))


@_device
def _deq_q4_k(w, row, blk, out):  # d, dmin, scales[12] (8 6-bit scales and mins), qs[128]
    o = blk * 144
    d = _f16(w, row, o)
    dmin = _f16(w, row, o + 2)
    for s in range(8):  # sub-blocks of 32: the low (s even) or high nibbles of qs[32 (s >> 1) ..]
        sc, mn = _scale_min_k4(w, row, o + 4, s)
        d1 = mul(d, np.float32(sc))
        m1 = mul(dmin, np.float32(mn))
        qs = o + 16 + 32 * (s >> 1)
        shift = 4 * (s & 1)
        for i in range(32):
            q = (np.int32(w[row, qs + i]) >> shift) & 15
            out[32 * s + i] = sub(mul(d1, np.float32(q)), m1)


@_device
def _deq_q5_k(w, row, blk, out):  # d, dmin, scales[12], qh[32] (bit s: sub-block s's 5th bits), qs[128]
    o = blk * 176
    d = _f16(w, row, o)
    dmin = _f16(w, row, o + 2)
    for s in range(8):
        sc, mn = _scale_min_k4(w, row, o + 4, s)
        d1 = mul(d, np.float32(sc))
        m1 = mul(dmin, np.float32(mn))
        qs = o + 48 + 32 * (s >> 1)
        shift = 4 * (s & 1)
        for i in range(32):
            q = ((np.int32(w[row, qs + i]) >> shift) & 15) | (((np.int32(w[row, o + 16 + i]) >> s) & 1) << 4)
            out[32 * s + i] = sub(mul(d1, np.float32(q)), m1)


@_device
def _deq_q6_k(w, row, blk, out):  # ql[128] (low nibbles), qh[64] (2 high bits), scales[16] int8, d
    o = blk * 210
    d = _f16(w, row, o + 208)
    for s in range(16):
        dl = mul(d, np.float32(_int8(w, row, o + 192 + s)))
        j = (s >> 1) & 3
        ql = o + 64 * (s >> 3) + 32 * (j & 1) + 16 * (s & 1)  # nibble j >> 1
        qh = o + 128 + 32 * (s >> 3) + 16 * (s & 1)  # bits 2j, 2j + 1
        for i in range(16):
            lo = (np.int32(w[row, ql + i]) >> (4 * (j >> 1))) & 15
            hi = (np.int32(w[row, qh + i]) >> (2 * j)) & 3
            out[16 * s + i] = mul(dl, np.float32((lo | (hi << 4)) - 32))


# ------------------------------------------------------------------------------------------- public API

_DEQUANT = {
    int(T.F32): _deq_f32,
    int(T.F16): _deq_f16,
    int(T.BF16): _deq_bf16,
    int(T.Q4_0): _deq_q4_0,
    int(T.Q4_1): _deq_q4_1,
    int(T.Q5_0): _deq_q5_0,
    int(T.Q5_1): _deq_q5_1,
    int(T.Q8_0): _deq_q8_0,
    int(T.IQ4_NL): _deq_iq4_nl,
    int(T.Q2_K): _deq_q2_k,
    int(T.Q3_K): _deq_q3_k,
    int(T.Q4_K): _deq_q4_k,
    int(T.Q5_K): _deq_q5_k,
    int(T.Q6_K): _deq_q6_k,
}
assert set(_DEQUANT) == set(QK) == set(TYPE_SIZE)


def make_dequant(qtype: int):
    """The device function deq(w, row, blk, out) of ggml type `qtype` (one per type, made once): writes the
    QK[qtype] float32 values of block `blk` of row `row` of the 2-D uint8 array w (rows, row bytes) into
    out[0:QK[qtype]] (a 1-D float32 array, local or global), as edgellm.quants.dequantize gives them."""
    try:
        return _DEQUANT[int(qtype)]
    except KeyError:
        names = ", ".join(T(t).name for t in _DEQUANT)
        raise ValueError(f"no cuda dequantizer for ggml type {int(qtype)}; supported: {names}") from None
