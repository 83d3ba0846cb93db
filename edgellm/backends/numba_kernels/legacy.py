"""Numba matmul kernels for the 32-element legacy blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL).

Each output is what ggml-cpu's scalar dot product computes (ggml-org/llama.cpp
ggml/src/ggml-cpu/quants.c `ggml_vec_dot_q4_0_q8_0_generic`, `_q4_1_q8_1_`, `_q5_0_q8_0_`, `_q5_1_q8_1_`,
`_q8_0_q8_0_`, `_iq4_nl_q8_0_generic`): per block an exact integer sum of weight quants times activation
quants, then the block's float32 term in ggml's operand order, summed in float32 in block order.
Few activation rows (decode), every type but IQ4_NL: the integer block dots of simd.py (explicit vector
IR, eight blocks at a time), one compiled loop per type. Many rows (prefill), and IQ4_NL always: each
weight row is unpacked to int8 once, then dotted with every activation row, in one loop shared by all
types. Both give bit-identical results.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from edgellm.backends.numba_kernels import simd
from edgellm.backends.numba_kernels.simd import Q4_0, Q4_1, Q5_0, Q5_1, Q8_0

F32 = np.float32
IQ4_NL = 5  # kernel kinds: simd.py's, and this one
# ggml-org/llama.cpp ggml/src/ggml-common.h kvalues_iq4nl
_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
# _HIGH16[byte, k] = 16 if bit k of byte is set: the Q5 high bits of 8 elements from one byte of qh
# (a table lookup vectorizes; 32 variable shifts of qh do not)
_HIGH16 = (((np.arange(256)[:, None] >> np.arange(8)[None, :]) & 1) * 16).astype(np.int16)
UNPACK_MIN_ROWS = 4  # activation rows from which unpacking a weight row once beats unpacking per dot

# Indexing note: blocks are sliced before they are indexed, so every index below is a non-negative
# constant; Numba then emits no negative-index wraparound and LLVM vectorizes the unrolled loops.


# every f16 bit pattern as float32 (what ggml_compute_fp16_to_fp32 gives): a lookup is cheaper than the
# bit manipulation in the hot loops (ggml-cpu keeps the same table, ggml_table_f32_f16)
_F16_TO_F32 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@njit(cache=True, inline="always")
def _f16(blk, o):
    """The little-endian f16 at bytes o, o+1 of blk, as float32."""
    return _F16_TO_F32[np.uint32(blk[o]) | (np.uint32(blk[o + 1]) << np.uint32(8))]


@njit(cache=True, inline="always")
def _block_bytes(kind):
    if kind == Q4_1:
        return 20
    if kind == Q5_0:
        return 22
    if kind == Q5_1:
        return 24
    if kind == Q8_0:
        return 34
    return 18  # Q4_0, IQ4_NL


@njit(cache=True, inline="always")
def _unpack_block(kind, blk, out):
    """One weight block -> its 32 quants as int8 in element order."""
    if kind == Q4_0:
        for j in range(16):
            out[j] = np.int8(blk[2 + j] & 15) - np.int8(8)
            out[16 + j] = np.int8(blk[2 + j] >> 4) - np.int8(8)
    elif kind == Q4_1:
        for j in range(16):
            out[j] = np.int8(blk[4 + j] & 15)
            out[16 + j] = np.int8(blk[4 + j] >> 4)
    elif kind == Q5_0 or kind == Q5_1:
        p = 2 if kind == Q5_0 else 4
        off = np.int8(16) if kind == Q5_0 else np.int8(0)
        for k in range(4):
            hk = _HIGH16[blk[p + k]]
            for j in range(8):
                e = 8 * k + j
                nib = blk[p + 4 + e] & np.uint8(15) if e < 16 else blk[p + 4 + e - 16] >> np.uint8(4)
                out[e] = np.int8(np.int16(nib) | hk[j]) - off
    elif kind == Q8_0:
        for j in range(32):
            out[j] = np.int8(blk[2 + j])
    else:  # IQ4_NL
        for j in range(16):
            out[j] = _IQ4NL[blk[2 + j] & 15]
            out[16 + j] = _IQ4NL[blk[2 + j] >> 4]


@njit(cache=True, inline="always")
def _term(kind, s, dx, mx, dy, sy):
    """A block's float32 contribution in each *_generic's operand order."""
    if kind == Q4_0:
        return (F32(s) * dx) * dy  # sumi*d_x*d_y
    if kind == Q8_0:
        return F32(s) * (dx * dy)  # sumi*(d_x*d_y)
    if kind == Q4_1 or kind == Q5_1:
        return (dx * dy) * F32(s) + mx * sy  # (d_x*d_y)*sumi + m_x*s_y
    if kind == IQ4_NL:
        return (dy * dx) * F32(s)  # d_y*d_x*(sumi1 + sumi2)
    return (dx * dy) * F32(s)  # Q5_0


@njit(cache=True, inline="always")
def _acc8(kind, row, o, a, ao, dy, sy, b0, sumf):
    """sumf plus the terms of the 8 blocks from byte o of row (activation blocks b0 .., a[ao : ao + 256])."""
    if kind == Q4_0:
        return simd.acc8_q4_0(row, o, a, ao, dy, sy, b0, sumf)
    if kind == Q4_1:
        return simd.acc8_q4_1(row, o, a, ao, dy, sy, b0, sumf)
    if kind == Q5_0:
        return simd.acc8_q5_0(row, o, a, ao, dy, sy, b0, sumf)
    if kind == Q5_1:
        return simd.acc8_q5_1(row, o, a, ao, dy, sy, b0, sumf)
    return simd.acc8_q8_0(row, o, a, ao, dy, sy, b0, sumf)


@njit(cache=True, inline="always")
def _sum1(kind, row, o, a, ao):
    """The integer dot of the block at byte o of row with a[ao : ao + 32]."""
    if kind == Q4_0:
        return simd.sum1_q4_0(row, o, a, ao)
    if kind == Q4_1:
        return simd.sum1_q4_1(row, o, a, ao)
    if kind == Q5_0:
        return simd.sum1_q5_0(row, o, a, ao)
    if kind == Q5_1:
        return simd.sum1_q5_1(row, o, a, ao)
    return simd.sum1_q8_0(row, o, a, ao)


@njit(cache=True, inline="always")
def _tail(kind, row, a, dy, sy, b0, nb, sumf):
    """sumf plus the terms of blocks b0 .. nb-1, one by one."""
    bb = _block_bytes(kind)
    for b in range(b0, nb):
        mx = _f16(row, b * bb + 2) if kind == Q4_1 or kind == Q5_1 else F32(0)
        sumf += _term(kind, _sum1(kind, row, b * bb, a, b * 32), _f16(row, b * bb), mx, dy[b], sy[b])
    return sumf


@njit(cache=True, inline="always")
def _rows_fused(kind, w, qa, da, sa, out, lo, hi):
    """Few activation rows: eight blocks at a time on explicit vectors (simd.py: integer dots, float terms,
    then the terms added in block order), the rest one by one. Two weight rows side by side: each row's
    sum is a chain of dependent float adds, and two chains overlap."""
    bb = _block_bytes(kind)
    nb = qa.shape[1] // 32
    groups = nb // simd.GROUP * simd.GROUP
    r = lo
    while r + 1 < hi:
        row0, row1 = w[r], w[r + 1]
        for n in range(qa.shape[0]):
            a = qa[n]
            dy, sy = da[n], sa[n]
            s0 = F32(0)
            s1 = F32(0)
            for b0 in range(0, groups, simd.GROUP):
                s0 = _acc8(kind, row0, b0 * bb, a, b0 * 32, dy, sy, b0, s0)
                s1 = _acc8(kind, row1, b0 * bb, a, b0 * 32, dy, sy, b0, s1)
            out[n, r] = _tail(kind, row0, a, dy, sy, groups, nb, s0)
            out[n, r + 1] = _tail(kind, row1, a, dy, sy, groups, nb, s1)
        r += 2
    if r < hi:
        row = w[r]
        for n in range(qa.shape[0]):
            a = qa[n]
            dy, sy = da[n], sa[n]
            sumf = F32(0)
            for b0 in range(0, groups, simd.GROUP):
                sumf = _acc8(kind, row, b0 * bb, a, b0 * 32, dy, sy, b0, sumf)
            out[n, r] = _tail(kind, row, a, dy, sy, groups, nb, sumf)


@njit(cache=True, inline="always")
def _unpack_row(kind, row, nb, wq, dw, mw):
    bb = _block_bytes(kind)
    for b in range(nb):
        blk = row[b * bb : b * bb + bb]
        dw[b] = _f16(blk, 0)
        if kind == Q4_1 or kind == Q5_1:
            mw[b] = _f16(blk, 2)
        _unpack_block(kind, blk, wq[b * 32 : b * 32 + 32])


@njit(cache=True, nogil=True)
def _rows_unpacked(kind, w, qa, da, sa, out, lo, hi):
    """Unpack each weight row once, then integer block sums against every activation row (the same for
    every type), then each type's float terms. `kind` is a runtime value: its branches sit outside the
    vectorized loops, so one compiled function serves every legacy type."""
    nb = qa.shape[1] // 32
    wq = np.empty(nb * 32, np.int8)
    dw = np.empty(nb, F32)
    mw = np.empty(nb, F32)
    sums = np.empty(nb, np.int32)
    for r in range(lo, hi):
        row = w[r]
        if kind == Q4_0:
            _unpack_row(Q4_0, row, nb, wq, dw, mw)
        elif kind == Q4_1:
            _unpack_row(Q4_1, row, nb, wq, dw, mw)
        elif kind == Q5_0:
            _unpack_row(Q5_0, row, nb, wq, dw, mw)
        elif kind == Q5_1:
            _unpack_row(Q5_1, row, nb, wq, dw, mw)
        elif kind == Q8_0:
            _unpack_row(Q8_0, row, nb, wq, dw, mw)
        else:
            _unpack_row(IQ4_NL, row, nb, wq, dw, mw)
        for n in range(qa.shape[0]):
            a = qa[n]
            for b in range(nb):
                wb = wq[b * 32 : b * 32 + 32]
                ab = a[b * 32 : b * 32 + 32]
                s = np.int32(0)
                for j in range(32):
                    s = np.int32(s + np.int16(wb[j]) * np.int16(ab[j]))
                sums[b] = s
            dy, sy = da[n], sa[n]
            sumf = F32(0)
            if kind == Q4_0:
                for b in range(nb):
                    sumf += _term(Q4_0, sums[b], dw[b], mw[b], dy[b], sy[b])
            elif kind == Q8_0:
                for b in range(nb):
                    sumf += _term(Q8_0, sums[b], dw[b], mw[b], dy[b], sy[b])
            elif kind == Q4_1 or kind == Q5_1:
                for b in range(nb):
                    sumf += _term(Q4_1, sums[b], dw[b], mw[b], dy[b], sy[b])
            elif kind == Q5_0:
                for b in range(nb):
                    sumf += _term(Q5_0, sums[b], dw[b], mw[b], dy[b], sy[b])
            else:
                for b in range(nb):
                    sumf += _term(IQ4_NL, sums[b], dw[b], mw[b], dy[b], sy[b])
            out[n, r] = sumf


# Few activation rows: one compiled loop per type, the block dots of simd.py.
@njit(cache=True, nogil=True)
def _fused_q4_0(w, qa, da, sa, out, lo, hi):
    _rows_fused(Q4_0, w, qa, da, sa, out, lo, hi)


@njit(cache=True, nogil=True)
def _fused_q4_1(w, qa, da, sa, out, lo, hi):
    _rows_fused(Q4_1, w, qa, da, sa, out, lo, hi)


@njit(cache=True, nogil=True)
def _fused_q5_0(w, qa, da, sa, out, lo, hi):
    _rows_fused(Q5_0, w, qa, da, sa, out, lo, hi)


@njit(cache=True, nogil=True)
def _fused_q5_1(w, qa, da, sa, out, lo, hi):
    _rows_fused(Q5_1, w, qa, da, sa, out, lo, hi)


@njit(cache=True, nogil=True)
def _fused_q8_0(w, qa, da, sa, out, lo, hi):
    _rows_fused(Q8_0, w, qa, da, sa, out, lo, hi)


@njit(cache=True, nogil=True)
def rows(kind, w, qa, da, sa, out, lo, hi):
    """out[:, lo:hi] = weight rows lo..hi-1 of a legacy `kind` times activations quantized to Q8_0/Q8_1
    (qa (N, K) int8, da and sa (N, K/32) float32: f16-rounded d and Q8_1's s)."""
    few = qa.shape[0] < UNPACK_MIN_ROWS
    if few and kind == Q4_0:
        _fused_q4_0(w, qa, da, sa, out, lo, hi)
    elif few and kind == Q4_1:
        _fused_q4_1(w, qa, da, sa, out, lo, hi)
    elif few and kind == Q5_0:
        _fused_q5_0(w, qa, da, sa, out, lo, hi)
    elif few and kind == Q5_1:
        _fused_q5_1(w, qa, da, sa, out, lo, hi)
    elif few and kind == Q8_0:
        _fused_q8_0(w, qa, da, sa, out, lo, hi)
    else:  # many rows; or IQ4_NL (its table lookup has no place in simd.py's portable vector IR)
        _rows_unpacked(kind, w, qa, da, sa, out, lo, hi)
