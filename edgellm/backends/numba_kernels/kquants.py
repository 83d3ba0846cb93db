"""Numba matmul kernels for the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) against Q8_K activations.

Each output is what ggml-cpu's scalar dot product computes (ggml-org/llama.cpp
ggml/src/ggml-cpu/quants.c `ggml_vec_dot_q3_K_q8_K_generic`, `_q4_K_`, `_q5_K_`, `_q6_K_q8_K_generic`):
per 256-element super-block, eight int32 lanes aux32[l] += scale * (q8 * q) over the elements l, l+8,
l+16, ...; then float32 lanes sums[l] += d * aux32[l] with d = f16(x.d) * y.d; the minimums enter as
sumf -= f16(x.dmin) * y.d * sum(bsums[j] * mins[j/2]); at the end sumf += sums[0] ... sums[7].
Q2_K (`ggml_vec_dot_q2_K_q8_K_generic`) has no float lanes: per super-block one integer
isum = sum(scale * (q8 * q)) and summs = sum(bsums[j] * mins[j]), then sumf += dall * isum - dmin * summs
(dall = y.d * f16(x.d), dmin = y.d * f16(x.dmin)). Integer sums are exact, so their order is free.
A weight row is unpacked once (each quant times its 16-element group's scale, as int16; mins as int32),
then dotted with every activation row. With few activation rows (decode) Q4_K and Q6_K take their integer
lanes from simd.py (explicit vector IR), Q2_K and Q3_K unpack inside the dot. All give bit-identical
results.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from edgellm.backends.numba_kernels import simd
from edgellm.backends.numba_kernels.legacy import UNPACK_MIN_ROWS, _f16

F32 = np.float32
Q4_K, Q5_K, Q6_K = 6, 7, 8  # kernel kinds (after the legacy ones)
Q2_K, Q3_K = 12, 13  # (after the float ones)
# Q3_K's fused dot does more per element than Q4_K's: unpacking once wins from 3 activation rows, not 4
Q3_K_UNPACK_MIN_ROWS = 3


@njit(cache=True, inline="always")
def _scale_min_k4(sc, j):
    """ggml-quants.c get_scale_min_k4 (the same bytes the *_generic utmp shuffle yields)."""
    if j < 4:
        return np.int32(sc[j] & 63), np.int32(sc[j + 4] & 63)
    return (
        np.int32((sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4)),
        np.int32((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)),
    )


@njit(cache=True, inline="always")
def _q3k_scale(sc, g):
    """Q3_K's 6-bit scale of group g (0..15), minus 32: the bytes the *_generic auxs/kmask shuffle yields
    (low nibble of sc[g] for g < 8, else the high nibble of sc[g - 8]; two high bits from sc[8 + g % 4])."""
    low = np.int32(sc[g] & 15) if g < 8 else np.int32(sc[g - 8] >> 4)
    high = (np.int32(sc[8 + g % 4]) >> np.int32(2 * (g // 4))) & np.int32(3)
    return (low | (high << np.int32(4))) - np.int32(32)


# _superblock_*: one super-block -> quants q (256,) int8, a scale scs (16,) and a min mns (16,) int32 per
# 16 elements; returns (d, dmin) as float32. Scale times quant fits int16 (Q6_K: 128 * 32). One function
# per layout, called once each (_unpack_row): inlining one body that branches on every type into a copy
# per type made the unpack path's compile time grow with the square of the number of types.
@njit(cache=True, inline="always")
def _superblock_q2_k(blk, q, scs, mns):
    # scales[16] (scale low nibble, min high nibble) qs[64] d dmin; chunk c: elements 128c + l, +32,
    # +64, +96 are the bit pairs 0, 2, 4, 6 of qs[32c + l]
    for c in range(2):
        qs = blk[16 + 32 * c : 16 + 32 * c + 32]
        out = q[128 * c : 128 * c + 128]
        for l in range(32):
            out[l] = np.int8(qs[l] & 3)
            out[l + 32] = np.int8((qs[l] >> 2) & 3)
            out[l + 64] = np.int8((qs[l] >> 4) & 3)
            out[l + 96] = np.int8(qs[l] >> 6)
    for g in range(16):
        scs[g] = np.int32(blk[g] & 15)
        mns[g] = np.int32(blk[g] >> 4)
    return _f16(blk, 80), _f16(blk, 82)


@njit(cache=True, inline="always")
def _superblock_q3_k(blk, q, scs, mns):
    # hmask[32] qs[64] scales[12] d; chunk c: elements 128c + 32s + l are bit pair s of qs[32c + l],
    # minus 4 where bit 4c + s of hmask[l] is clear
    hm = blk[0:32]
    for c in range(2):
        qs = blk[32 + 32 * c : 32 + 32 * c + 32]
        out = q[128 * c : 128 * c + 128]
        b0, b1 = np.uint8(1 << 4 * c), np.uint8(2 << 4 * c)
        b2, b3 = np.uint8(4 << 4 * c), np.uint8(8 << 4 * c)
        for l in range(32):
            out[l] = np.int8(qs[l] & 3) - (np.int8(0) if hm[l] & b0 else np.int8(4))
            out[l + 32] = np.int8((qs[l] >> 2) & 3) - (np.int8(0) if hm[l] & b1 else np.int8(4))
            out[l + 64] = np.int8((qs[l] >> 4) & 3) - (np.int8(0) if hm[l] & b2 else np.int8(4))
            out[l + 96] = np.int8(qs[l] >> 6) - (np.int8(0) if hm[l] & b3 else np.int8(4))
    sc = blk[96:108]
    for g in range(16):
        scs[g] = _q3k_scale(sc, g)
    return _f16(blk, 108), F32(0)


@njit(cache=True, inline="always")
def _superblock_q6_k(blk, q, scs, mns):
    # ql[128] qh[64] scales[16] (int8) d; chunk c: elements 128c + l, +32, +64, +96
    # from the nibbles of ql[64c + l], ql[64c + l + 32] and the bit pairs of qh[32c + l]
    for c in range(2):
        ql = blk[64 * c : 64 * c + 64]
        qh = blk[128 + 32 * c : 128 + 32 * c + 32]
        out = q[128 * c : 128 * c + 128]
        for l in range(32):
            out[l] = np.int8((ql[l] & 15) | ((qh[l] & 3) << 4)) - np.int8(32)
            out[l + 32] = np.int8((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - np.int8(32)
            out[l + 64] = np.int8((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - np.int8(32)
            out[l + 96] = np.int8((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - np.int8(32)
    for g in range(16):
        scs[g] = np.int32(np.int8(blk[192 + g]))
    return _f16(blk, 208), F32(0)


@njit(cache=True, inline="always")
def _superblock_q45_k(blk, q, scs, mns, five):
    # d, dmin, scales[12], [qh[32] if five], qs[128]; sub-block s (32 elements) has scale/min s
    sc = blk[4:16]
    for s in range(8):
        a, m = _scale_min_k4(sc, s)
        scs[2 * s] = a
        scs[2 * s + 1] = a
        mns[2 * s] = m
        mns[2 * s + 1] = m
    if not five:
        for c in range(4):
            qs = blk[16 + 32 * c : 16 + 32 * c + 32]
            out = q[64 * c : 64 * c + 64]
            for l in range(32):
                out[l] = np.int8(qs[l] & 15)
                out[l + 32] = np.int8(qs[l] >> 4)
    else:
        hm = blk[16:48]
        for c in range(4):
            qs = blk[48 + 32 * c : 48 + 32 * c + 32]
            out = q[64 * c : 64 * c + 64]
            lo_bit = np.uint8(1 << (2 * c))
            hi_bit = np.uint8(2 << (2 * c))
            for l in range(32):
                out[l] = np.int8(qs[l] & 15) + (np.int8(16) if hm[l] & lo_bit else np.int8(0))
                out[l + 32] = np.int8(qs[l] >> 4) + (np.int8(16) if hm[l] & hi_bit else np.int8(0))
    return _f16(blk, 0), _f16(blk, 2)


@njit(cache=True, inline="always")
def _scale_quants(q, scs, ws):
    """ws (256,) int16 = each quant of q (256,) times its group's scale."""
    for g in range(16):
        out = ws[g * 16 : g * 16 + 16]
        qg = q[g * 16 : g * 16 + 16]
        for l in range(16):
            out[l] = np.int16(scs[g] * qg[l])


@njit(cache=True, inline="always")
def _unpack_row(kind, row, nsb, q, scs, ws, mns, dw, mw):
    """Row -> ws (K,) int16, each quant times its group's scale; mins mns (K/16,) int32; d and dmin per
    super-block (float32). One loop per layout, so the branch on `kind` is taken once per row."""
    if kind == Q4_K:
        for i in range(nsb):
            blk = row[i * 144 : i * 144 + 144]
            dw[i], mw[i] = _superblock_q45_k(blk, q, scs, mns[i * 16 : i * 16 + 16], False)
            _scale_quants(q, scs, ws[i * 256 : i * 256 + 256])
    elif kind == Q5_K:
        for i in range(nsb):
            blk = row[i * 176 : i * 176 + 176]
            dw[i], mw[i] = _superblock_q45_k(blk, q, scs, mns[i * 16 : i * 16 + 16], True)
            _scale_quants(q, scs, ws[i * 256 : i * 256 + 256])
    elif kind == Q6_K:
        for i in range(nsb):
            blk = row[i * 210 : i * 210 + 210]
            dw[i], mw[i] = _superblock_q6_k(blk, q, scs, mns[i * 16 : i * 16 + 16])
            _scale_quants(q, scs, ws[i * 256 : i * 256 + 256])
    elif kind == Q3_K:
        for i in range(nsb):
            blk = row[i * 110 : i * 110 + 110]
            dw[i], mw[i] = _superblock_q3_k(blk, q, scs, mns[i * 16 : i * 16 + 16])
            _scale_quants(q, scs, ws[i * 256 : i * 256 + 256])
    else:  # Q2_K
        for i in range(nsb):
            blk = row[i * 84 : i * 84 + 84]
            dw[i], mw[i] = _superblock_q2_k(blk, q, scs, mns[i * 16 : i * 16 + 16])
            _scale_quants(q, scs, ws[i * 256 : i * 256 + 256])


@njit(cache=True, inline="always")
def _lanes(acc, wb, ab):
    """ggml's aux32[l] += scale * (q8[l] * q[l]) over the 16 elements of wb (already scaled) and ab:
    lane l takes elements l and 8 + l. Scalar lanes in a tuple: LLVM keeps them in one vector register."""
    return (
        np.int32(acc[0] + np.int32(wb[0]) * np.int32(ab[0]) + np.int32(wb[8]) * np.int32(ab[8])),
        np.int32(acc[1] + np.int32(wb[1]) * np.int32(ab[1]) + np.int32(wb[9]) * np.int32(ab[9])),
        np.int32(acc[2] + np.int32(wb[2]) * np.int32(ab[2]) + np.int32(wb[10]) * np.int32(ab[10])),
        np.int32(acc[3] + np.int32(wb[3]) * np.int32(ab[3]) + np.int32(wb[11]) * np.int32(ab[11])),
        np.int32(acc[4] + np.int32(wb[4]) * np.int32(ab[4]) + np.int32(wb[12]) * np.int32(ab[12])),
        np.int32(acc[5] + np.int32(wb[5]) * np.int32(ab[5]) + np.int32(wb[13]) * np.int32(ab[13])),
        np.int32(acc[6] + np.int32(wb[6]) * np.int32(ab[6]) + np.int32(wb[14]) * np.int32(ab[14])),
        np.int32(acc[7] + np.int32(wb[7]) * np.int32(ab[7]) + np.int32(wb[15]) * np.int32(ab[15])),
    )


@njit(cache=True, inline="always")
def _lanes_q(acc, qb, ab, sc):
    """As _lanes for 16 unpacked quants qb (int16, unscaled): aux32[l] += sc * (q8 * q products)."""
    return (
        np.int32(acc[0] + sc * np.int32(qb[0] * np.int16(ab[0]) + qb[8] * np.int16(ab[8]))),
        np.int32(acc[1] + sc * np.int32(qb[1] * np.int16(ab[1]) + qb[9] * np.int16(ab[9]))),
        np.int32(acc[2] + sc * np.int32(qb[2] * np.int16(ab[2]) + qb[10] * np.int16(ab[10]))),
        np.int32(acc[3] + sc * np.int32(qb[3] * np.int16(ab[3]) + qb[11] * np.int16(ab[11]))),
        np.int32(acc[4] + sc * np.int32(qb[4] * np.int16(ab[4]) + qb[12] * np.int16(ab[12]))),
        np.int32(acc[5] + sc * np.int32(qb[5] * np.int16(ab[5]) + qb[13] * np.int16(ab[13]))),
        np.int32(acc[6] + sc * np.int32(qb[6] * np.int16(ab[6]) + qb[14] * np.int16(ab[14]))),
        np.int32(acc[7] + sc * np.int32(qb[7] * np.int16(ab[7]) + qb[15] * np.int16(ab[15]))),
    )


@njit(cache=True, inline="always")
def _scaled_add(s, d, acc):
    """ggml's sums[l] += d * aux32[l] on the eight float32 lanes."""
    return (
        s[0] + d * F32(acc[0]),
        s[1] + d * F32(acc[1]),
        s[2] + d * F32(acc[2]),
        s[3] + d * F32(acc[3]),
        s[4] + d * F32(acc[4]),
        s[5] + d * F32(acc[5]),
        s[6] + d * F32(acc[6]),
        s[7] + d * F32(acc[7]),
    )


@njit(cache=True, nogil=True)
def _fused_q4_k(w, qa, da, bs, out, lo, hi):
    """Few activation rows, Q4_K: each super-block's integer lanes and mins on explicit vectors (simd.py),
    then ggml's float lanes and mins."""
    nsb = qa.shape[1] // 256
    aux = np.empty(9, np.int32)
    for r in range(lo, hi):
        row = w[r]
        for n in range(qa.shape[0]):
            a, b = qa[n], bs[n]
            sumf = F32(0)
            s = (F32(0), F32(0), F32(0), F32(0), F32(0), F32(0), F32(0), F32(0))
            for i in range(nsb):
                simd.lanes_q4_k(row, i * 144, a, i * 256, b, i * 16, aux)
                lanes = (aux[0], aux[1], aux[2], aux[3], aux[4], aux[5], aux[6], aux[7])
                s = _scaled_add(s, _f16(row, i * 144) * da[n, i], lanes)
                sumf -= (_f16(row, i * 144 + 2) * da[n, i]) * F32(aux[8])
            for l in range(8):
                sumf += s[l]
            out[n, r] = sumf


@njit(cache=True, nogil=True)
def _fused_q6_k(w, qa, da, bs, out, lo, hi):
    """Few activation rows, Q6_K: each super-block's integer lanes on explicit vectors (simd.py), then
    ggml's float lanes."""
    nsb = qa.shape[1] // 256
    aux = np.empty(8, np.int32)
    for r in range(lo, hi):
        row = w[r]
        for n in range(qa.shape[0]):
            a = qa[n]
            sumf = F32(0)
            s = (F32(0), F32(0), F32(0), F32(0), F32(0), F32(0), F32(0), F32(0))
            for i in range(nsb):
                simd.lanes_q6_k(row, i * 210, a, i * 256, aux)
                d = _f16(row, i * 210 + 208) * da[n, i]
                s = _scaled_add(s, d, (aux[0], aux[1], aux[2], aux[3], aux[4], aux[5], aux[6], aux[7]))
            for l in range(8):
                sumf += s[l]
            out[n, r] = sumf


@njit(cache=True, inline="always")
def _q3k1(blk, qo, ho, ls, hs, j):
    """Element j of a Q3_K group: bit pair ls of qs byte qo + j, minus 4 unless bit hs of hmask[ho + j]."""
    return np.int16(((blk[qo + j] >> ls) & 3) | (((blk[ho + j] >> hs) & 1) << 2)) - np.int16(4)


@njit(cache=True, inline="always")
def _q3k16(blk, g):
    """The 16 quants of group g of a Q3_K super-block as int16 (a tuple: loads only, no stores): elements
    128c + 32s + 16h .. +15 with c = g // 8, s = g % 8 // 2, h = g % 2."""
    c, s, h = g // 8, g % 8 // 2, g % 2
    # (& 7: shifts known to be < 8 let LLVM narrow the lanes to 32 bits from Numba's int64, ~1.3x faster)
    qo, ho, ls, hs = 32 + 32 * c + 16 * h, 16 * h, (2 * s) & 7, (4 * c + s) & 7
    return (
        _q3k1(blk, qo, ho, ls, hs, 0),
        _q3k1(blk, qo, ho, ls, hs, 1),
        _q3k1(blk, qo, ho, ls, hs, 2),
        _q3k1(blk, qo, ho, ls, hs, 3),
        _q3k1(blk, qo, ho, ls, hs, 4),
        _q3k1(blk, qo, ho, ls, hs, 5),
        _q3k1(blk, qo, ho, ls, hs, 6),
        _q3k1(blk, qo, ho, ls, hs, 7),
        _q3k1(blk, qo, ho, ls, hs, 8),
        _q3k1(blk, qo, ho, ls, hs, 9),
        _q3k1(blk, qo, ho, ls, hs, 10),
        _q3k1(blk, qo, ho, ls, hs, 11),
        _q3k1(blk, qo, ho, ls, hs, 12),
        _q3k1(blk, qo, ho, ls, hs, 13),
        _q3k1(blk, qo, ho, ls, hs, 14),
        _q3k1(blk, qo, ho, ls, hs, 15),
    )


@njit(cache=True, nogil=True)
def _fused_q3_k(w, qa, da, bs, out, lo, hi):
    """Few activation rows, Q3_K: super-blocks unpacked inside the dot, as _fused_q4_k."""
    nsb = qa.shape[1] // 256
    z = np.int32(0)
    for r in range(lo, hi):
        row = w[r]
        for n in range(qa.shape[0]):
            a = qa[n]
            sumf = F32(0)
            s = (F32(0), F32(0), F32(0), F32(0), F32(0), F32(0), F32(0), F32(0))
            for i in range(nsb):
                blk = row[i * 110 : i * 110 + 110]
                d = _f16(blk, 108) * da[n, i]
                acc = (z, z, z, z, z, z, z, z)
                for g in range(16):
                    o = i * 256 + 16 * g
                    acc = _lanes_q(acc, _q3k16(blk, g), a[o : o + 16], _q3k_scale(blk[96:108], g))
                s = _scaled_add(s, d, acc)
            for l in range(8):
                sumf += s[l]
            out[n, r] = sumf


@njit(cache=True, inline="always")
def _q2k16(blk, g):
    """The 16 quants of group g of a Q2_K super-block as int16 (a tuple: loads only): bit pair s of
    qs[32c + 16h ..] with c = g // 8, s = g % 8 // 2, h = g % 2."""
    c, s, h = g // 8, g % 8 // 2, g % 2
    qo, ls = 16 + 32 * c + 16 * h, 2 * s
    return (
        np.int16((blk[qo + 0] >> ls) & 3),
        np.int16((blk[qo + 1] >> ls) & 3),
        np.int16((blk[qo + 2] >> ls) & 3),
        np.int16((blk[qo + 3] >> ls) & 3),
        np.int16((blk[qo + 4] >> ls) & 3),
        np.int16((blk[qo + 5] >> ls) & 3),
        np.int16((blk[qo + 6] >> ls) & 3),
        np.int16((blk[qo + 7] >> ls) & 3),
        np.int16((blk[qo + 8] >> ls) & 3),
        np.int16((blk[qo + 9] >> ls) & 3),
        np.int16((blk[qo + 10] >> ls) & 3),
        np.int16((blk[qo + 11] >> ls) & 3),
        np.int16((blk[qo + 12] >> ls) & 3),
        np.int16((blk[qo + 13] >> ls) & 3),
        np.int16((blk[qo + 14] >> ls) & 3),
        np.int16((blk[qo + 15] >> ls) & 3),
    )


@njit(cache=True, nogil=True)
def _fused_q2_k(w, qa, da, bs, out, lo, hi):
    """Few activation rows, Q2_K: super-blocks unpacked inside the dot, as _fused_q4_k."""
    nsb = qa.shape[1] // 256
    z = np.int32(0)
    for r in range(lo, hi):
        row = w[r]
        for n in range(qa.shape[0]):
            a = qa[n]
            sumf = F32(0)
            for i in range(nsb):
                blk = row[i * 84 : i * 84 + 84]
                # the mins first, in their own loop: inside the dot's loop they stop it vectorizing (3x)
                summs = np.int32(0)
                for g in range(16):
                    summs = np.int32(summs + bs[n, i * 16 + g] * np.int32(blk[g] >> 4))
                acc = (z, z, z, z, z, z, z, z)
                for g in range(16):
                    o = i * 256 + 16 * g
                    acc = _lanes_q(acc, _q2k16(blk, g), a[o : o + 16], np.int32(blk[g] & 15))
                isum = acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7]
                sumf += (da[n, i] * _f16(blk, 80)) * F32(isum) - (da[n, i] * _f16(blk, 82)) * F32(summs)
            out[n, r] = sumf


@njit(cache=True, nogil=True)
def rows(kind, w, qa, da, bs, out, lo, hi):
    """out[:, lo:hi] = weight rows lo..hi-1 of K-quant `kind` times Q8_K activations (qa (N, K) int8,
    da (N, K/256) float32, bs (N, K/16) int32 bsums)."""
    if kind == Q4_K and qa.shape[0] < UNPACK_MIN_ROWS:
        _fused_q4_k(w, qa, da, bs, out, lo, hi)
    elif kind == Q6_K and qa.shape[0] < UNPACK_MIN_ROWS:
        _fused_q6_k(w, qa, da, bs, out, lo, hi)
    elif kind == Q2_K and qa.shape[0] < UNPACK_MIN_ROWS:
        _fused_q2_k(w, qa, da, bs, out, lo, hi)
    elif kind == Q3_K and qa.shape[0] < Q3_K_UNPACK_MIN_ROWS:
        _fused_q3_k(w, qa, da, bs, out, lo, hi)
    else:  # (Q5_K is rare: a fused loop for it is not worth its compile time)
        _rows_unpacked(kind, w, qa, da, bs, out, lo, hi)


@njit(cache=True, nogil=True)
def _rows_unpacked(kind, w, qa, da, bs, out, lo, hi):
    """Many activation rows: each weight row unpacked once (quants times scales as int16), then dotted."""
    nsb = qa.shape[1] // 256
    q = np.empty(256, np.int8)
    scs = np.empty(16, np.int32)
    ws = np.empty(nsb * 256, np.int16)
    mns = np.zeros(nsb * 16, np.int32)
    dw = np.empty(nsb, F32)
    mw = np.empty(nsb, F32)
    z = np.int32(0)
    for r in range(lo, hi):
        row = w[r]
        _unpack_row(kind, row, nsb, q, scs, ws, mns, dw, mw)
        if kind == Q2_K:  # no float lanes: per super-block sumf += dall * isum - dmin * summs
            for n in range(qa.shape[0]):
                a = qa[n]
                sumf = F32(0)
                for i in range(nsb):
                    acc = (z, z, z, z, z, z, z, z)
                    for g in range(16):
                        o = i * 256 + g * 16
                        acc = _lanes(acc, ws[o : o + 16], a[o : o + 16])
                    isum = acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7]
                    summs = np.int32(0)
                    for j in range(16):
                        summs = np.int32(summs + bs[n, i * 16 + j] * mns[i * 16 + j])
                    sumf += (da[n, i] * dw[i]) * F32(isum) - (da[n, i] * mw[i]) * F32(summs)
                out[n, r] = sumf
            continue
        for n in range(qa.shape[0]):
            a = qa[n]
            sumf = F32(0)
            s = (F32(0), F32(0), F32(0), F32(0), F32(0), F32(0), F32(0), F32(0))
            for i in range(nsb):
                acc = (z, z, z, z, z, z, z, z)
                for g in range(16):
                    o = i * 256 + g * 16
                    acc = _lanes(acc, ws[o : o + 16], a[o : o + 16])
                d = dw[i] * da[n, i]
                s = _scaled_add(s, d, acc)
                if kind != Q6_K and kind != Q3_K:
                    sumi = np.int32(0)
                    for j in range(16):
                        sumi = np.int32(sumi + bs[n, i * 16 + j] * mns[i * 16 + j])
                    sumf -= (mw[i] * da[n, i]) * F32(sumi)
            for l in range(8):
                sumf += s[l]
            out[n, r] = sumf
