"""Numba matmul kernels for the K-quants (Q4_K, Q5_K, Q6_K) against Q8_K activations.

Each output is what ggml-cpu's scalar dot product computes (ggml-org/llama.cpp
ggml/src/ggml-cpu/quants.c `ggml_vec_dot_q4_K_q8_K_generic`, `_q5_K_q8_K_generic`, `_q6_K_q8_K_generic`):
per 256-element super-block, eight int32 lanes aux32[l] += scale * (q8 * q) over the elements l, l+8,
l+16, ...; then float32 lanes sums[l] += d * aux32[l] with d = f16(x.d) * y.d; the minimums enter as
sumf -= f16(x.dmin) * y.d * sum(bsums[j] * mins[j/2]); at the end sumf += sums[0] ... sums[7].
A weight row is unpacked once (each quant times its sub-block scale, as int16; mins as int32), then
dotted with every activation row; Q4_K with few activation rows (decode) unpacks inside the dot instead.
Both give bit-identical results.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from edgellm.backends.numba_kernels.legacy import UNPACK_MIN_ROWS, _f16

F32 = np.float32
Q4_K, Q5_K, Q6_K = 6, 7, 8  # kernel kinds (after the legacy ones)


@njit(cache=True, inline="always")
def _block_bytes(kind):
    if kind == Q4_K:
        return 144
    if kind == Q5_K:
        return 176
    return 210  # Q6_K


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
def _unpack_superblock(kind, blk, q, scs, mns):
    """One super-block -> quants q (256,) int8, a scale per 16 elements scs (16,), mins mns (8,) int32;
    returns (d, dmin) as float32. Scale times quant fits int16 (Q6_K: 128 * 32)."""
    if kind == Q6_K:
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
    # Q4_K / Q5_K: d, dmin, scales[12], [qh[32]], qs[128]; sub-block s (32 elements) has scale/min s
    sc = blk[4:16]
    for s in range(8):
        a, m = _scale_min_k4(sc, s)
        scs[2 * s] = a
        scs[2 * s + 1] = a
        mns[s] = m
    if kind == Q4_K:
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
def _unpack_row(kind, row, nsb, q, scs, ws, mns, dw, mw):
    """Row -> ws (K,) int16, each quant times its sub-block scale; mins mns (K/32,) int32; d and dmin per
    super-block (float32)."""
    bb = _block_bytes(kind)
    for i in range(nsb):
        d, dmin = _unpack_superblock(kind, row[i * bb : i * bb + bb], q, scs, mns[i * 8 : i * 8 + 8])
        dw[i] = d
        mw[i] = dmin
        for g in range(16):
            out = ws[i * 256 + g * 16 : i * 256 + g * 16 + 16]
            qg = q[g * 16 : g * 16 + 16]
            for l in range(16):
                out[l] = np.int16(scs[g] * qg[l])


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


@njit(cache=True, inline="always")
def _q4k16(blk, t, h):
    """Quants 32t + 16h .. +15 of a Q4_K super-block as int16 (a tuple: loads only, no stores): sub-block
    t is the low (t even) or high nibbles of qs[32(t//2) ..]."""
    qo = 16 + 32 * (t // 2) + 16 * h
    ls = 4 * (t % 2)
    return (
        np.int16((blk[qo + 0] >> ls) & 15),
        np.int16((blk[qo + 1] >> ls) & 15),
        np.int16((blk[qo + 2] >> ls) & 15),
        np.int16((blk[qo + 3] >> ls) & 15),
        np.int16((blk[qo + 4] >> ls) & 15),
        np.int16((blk[qo + 5] >> ls) & 15),
        np.int16((blk[qo + 6] >> ls) & 15),
        np.int16((blk[qo + 7] >> ls) & 15),
        np.int16((blk[qo + 8] >> ls) & 15),
        np.int16((blk[qo + 9] >> ls) & 15),
        np.int16((blk[qo + 10] >> ls) & 15),
        np.int16((blk[qo + 11] >> ls) & 15),
        np.int16((blk[qo + 12] >> ls) & 15),
        np.int16((blk[qo + 13] >> ls) & 15),
        np.int16((blk[qo + 14] >> ls) & 15),
        np.int16((blk[qo + 15] >> ls) & 15),
    )


@njit(cache=True)
def _fused_q4_k(w, qa, da, bs, out, lo, hi):
    """Few activation rows, Q4_K: super-blocks unpacked inside the dot (loads only, which LLVM vectorizes;
    unpacking to memory first makes it wait on stores it cannot prove independent)."""
    nsb = qa.shape[1] // 256
    z = np.int32(0)
    for r in range(lo, hi):
        row = w[r]
        for n in range(qa.shape[0]):
            a = qa[n]
            sumf = F32(0)
            s = (F32(0), F32(0), F32(0), F32(0), F32(0), F32(0), F32(0), F32(0))
            for i in range(nsb):
                blk = row[i * 144 : i * 144 + 144]
                d = _f16(blk, 0) * da[n, i]
                acc = (z, z, z, z, z, z, z, z)
                sumi = np.int32(0)
                for t in range(8):  # 8 sub-blocks of 32
                    sc, m = _scale_min_k4(blk[4:16], t)
                    o = i * 256 + 32 * t
                    acc = _lanes_q(acc, _q4k16(blk, t, 0), a[o : o + 16], sc)
                    acc = _lanes_q(acc, _q4k16(blk, t, 1), a[o + 16 : o + 32], sc)
                    sumi = np.int32(sumi + (bs[n, i * 16 + 2 * t] + bs[n, i * 16 + 2 * t + 1]) * m)
                s = _scaled_add(s, d, acc)
                sumf -= (_f16(blk, 2) * da[n, i]) * F32(sumi)
            for l in range(8):
                sumf += s[l]
            out[n, r] = sumf


@njit(cache=True)
def rows(kind, w, qa, da, bs, out, lo, hi):
    """out[:, lo:hi] = weight rows lo..hi-1 of K-quant `kind` times Q8_K activations (qa (N, K) int8,
    da (N, K/256) float32, bs (N, K/16) int32 bsums)."""
    if kind == Q4_K and qa.shape[0] < UNPACK_MIN_ROWS:
        _fused_q4_k(w, qa, da, bs, out, lo, hi)
    else:  # (a fused Q6_K was no faster here, and Q5_K is rare: they are not worth their compile time)
        _rows_unpacked(kind, w, qa, da, bs, out, lo, hi)


@njit(cache=True)
def _rows_unpacked(kind, w, qa, da, bs, out, lo, hi):
    """Many activation rows: each weight row unpacked once (quants times scales as int16), then dotted."""
    nsb = qa.shape[1] // 256
    q = np.empty(256, np.int8)
    scs = np.empty(16, np.int32)
    ws = np.empty(nsb * 256, np.int16)
    mns = np.zeros(nsb * 8, np.int32)
    dw = np.empty(nsb, F32)
    mw = np.empty(nsb, F32)
    z = np.int32(0)
    for r in range(lo, hi):
        row = w[r]
        if kind == Q4_K:
            _unpack_row(Q4_K, row, nsb, q, scs, ws, mns, dw, mw)
        elif kind == Q5_K:
            _unpack_row(Q5_K, row, nsb, q, scs, ws, mns, dw, mw)
        else:
            _unpack_row(Q6_K, row, nsb, q, scs, ws, mns, dw, mw)
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
                if kind != Q6_K:
                    sumi = np.int32(0)
                    for j in range(16):
                        sumi = np.int32(sumi + bs[n, i * 16 + j] * mns[i * 8 + j // 2])
                    sumf -= (mw[i] * da[n, i]) * F32(sumi)
            for l in range(8):
                sumf += s[l]
            out[n, r] = sumf
