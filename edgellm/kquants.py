"""llama.cpp's quantizers in Numba: `quantize_rows` returns the bytes ggml_quantize_chunk writes, bit for bit.

Ports of ggml-org/llama.cpp ggml/src/ggml-quants.c: `quantize_row_q2_K_ref` .. `quantize_row_q6_K_ref`
(no imatrix) and `quantize_row_q2_K_impl` .. `quantize_row_q6_K_impl` (with one), chosen as `quantize_q2_K`
.. `quantize_q6_K` choose; `quantize_row_q4_0_ref` .. `_q5_1_ref` / `_impl`, `quantize_row_q8_0_ref` (Q8_0
ignores the imatrix), and `quantize_row_iq4_nl_impl` for IQ4_NL / IQ4_XS. Block layouts are ggml-common.h's.
The scale searches they share live in edgellm/quant_search.py.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from edgellm import quants
from edgellm.backends.numba_kernels.common import f16_to_f32, f32_to_f16_bits
from edgellm.quant_search import (
    F32,
    GROUP_MAX_EPS,
    best_index_int8,
    clamp,
    inline,
    kernel,
    make_q3_quants,
    make_qkx_quants,
    make_qp_quants,
    make_qx_quants,
    nearest_int,
)

QK_K = 256
# the float arguments the C passes to make_qkx2_quants / make_qkx3_quants, as float32
_M0_5, _M0_9, _M1 = F32(-0.5), F32(-0.9), F32(-1.0)
_P0_05, _P0_1 = F32(0.05), F32(0.1)
_FLT_MAX = F32(np.finfo(np.float32).max)
_IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)


@kernel
def _put_f16(y, o, f):
    """y[o:o+2] = GGML_FP32_TO_FP16(f) (little-endian); returns GGML_FP16_TO_FP32 of it."""
    h = f32_to_f16_bits(f)
    y[o] = h & 0xFF
    y[o + 1] = h >> 8
    return f16_to_f32(h)


@kernel
def _i8(v):
    """v converted to int8_t as the C does (keep the low byte, two's complement)."""
    return ((v + 128) & 0xFF) - 128


@kernel
def _row_sigma_weights(x, xo, n, qw, wt, sigma2):
    """wt[l] = qw[xo+l] * sqrtf(sigma2 + x[xo+l]^2), l < n; returns their sum (the C's sw[j] / sumw)."""
    s = F32(0)
    for l in range(n):
        xi = x[xo + l]
        wt[l] = qw[xo + l] * np.sqrt(sigma2 + xi * xi)
    for l in range(n):
        s += wt[l]
    return s


@kernel
def _sum_sq(x, xo, n):
    s = F32(0)
    for j in range(n):
        s += x[xo + j] * x[xo + j]
    return s


@kernel
def _pack_2bit(L, y, o):
    """The Q2_K / Q3_K qs layout: byte j/4 + l of each 128-half holds L[j+l], L[j+l+32], +64, +96."""
    for j in range(0, QK_K, 128):
        for l in range(32):
            y[o + j // 4 + l] = (
                L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6)
            ) & 0xFF


# ------------------------------------------------------------------------------------------------ Q2_K
# block_q2_K: scales[16] @0 (low nibble scale, high nibble min), qs[64] @16, d @80, dmin @82


@kernel
def _q2_k_block(x, qw, use_qw, y, L, Laux, wt, scales, mins, sw, Ls, Lm, tmp):
    if use_qw:  # quantize_row_q2_K_impl
        sigma2 = _sum_sq(x, 0, QK_K) / F32(QK_K)
        for j in range(16):
            sw[j] = _row_sigma_weights(x, 16 * j, 16, qw, wt, sigma2)
            scales[j], mins[j] = make_qkx_quants(
                16, 3, x, 16 * j, wt, 0, L, 16 * j, Laux, _M0_9, _P0_05, 36, False, True, tmp
            )
        dm = make_qp_quants(16, 15, scales, Ls, sw)
        mm = make_qp_quants(16, 15, mins, Lm, sw)
        d = _put_f16(y, 80, dm)
        dmin = _put_f16(y, 82, mm)
        for j in range(16):
            y[j] = (Ls[j] | (Lm[j] << 4)) & 0xFF
    else:  # quantize_row_q2_K_ref
        max_scale = F32(0)
        max_min = F32(0)
        for j in range(16):
            for l in range(16):
                wt[l] = abs(x[16 * j + l])
            s, m = make_qkx_quants(
                16, 3, x, 16 * j, wt, 0, L, 16 * j, Laux, _M0_5, _P0_1, 15, True, False, tmp
            )
            scales[j] = s
            mins[j] = m
            if s > max_scale:
                max_scale = s
            if m > max_min:
                max_min = m
        q4scale = F32(15)
        if max_scale > 0:
            iscale = q4scale / max_scale
            for j in range(16):
                y[j] = nearest_int(iscale * scales[j]) & 0xFF
            d = _put_f16(y, 80, max_scale / q4scale)
        else:
            for j in range(16):
                y[j] = 0
            d = _put_f16(y, 80, F32(0))
        if max_min > 0:
            iscale = q4scale / max_min
            for j in range(16):
                y[j] = (np.int32(y[j]) | (nearest_int(iscale * mins[j]) << 4)) & 0xFF
            dmin = _put_f16(y, 82, max_min / q4scale)
        else:
            dmin = _put_f16(y, 82, F32(0))
    for j in range(16):
        dj = d * F32(y[j] & 0xF)
        if dj == 0:
            continue
        mj = dmin * F32(y[j] >> 4)
        for ii in range(16):
            L[16 * j + ii] = clamp(nearest_int((x[16 * j + ii] + mj) / dj), 0, 3)
    _pack_2bit(L, y, 16)


# ------------------------------------------------------------------------------------------------ Q3_K
# block_q3_K: hmask[32] @0, qs[64] @32, scales[12] @96 (6-bit, offset 32), d @108


@kernel
def _q3_k_put_scale(y, o, j, l):
    """Store the 6-bit scale l (0..63) of sub-block j in the 12 scale bytes at y[o:]."""
    if j < 8:
        y[o + j] = l & 0xF
    else:
        y[o + j - 8] |= (l & 0xF) << 4
    y[o + j % 4 + 8] |= (l >> 4) << (2 * (j // 4))


@kernel
def _q3_k_block(x, qw, use_qw, y, L, wt, scales, sw, Ls, tmp):
    so = 96
    for k in range(12):
        y[so + k] = 0
    if use_qw:  # quantize_row_q3_K_impl
        sigma2 = F32(2) * _sum_sq(x, 0, QK_K) / F32(QK_K)
        for j in range(16):
            sw[j] = _row_sigma_weights(x, 16 * j, 16, qw, wt, sigma2)
            scales[j] = make_qx_quants(16, 4, x, 16 * j, L, 16 * j, wt, 0, tmp)
        d_block = make_qx_quants(16, 32, scales, 0, Ls, 0, sw, 0, tmp)
        for j in range(16):
            _q3_k_put_scale(y, so, j, np.int32(Ls[j]))
        d = _put_f16(y, 108, d_block)
    else:  # quantize_row_q3_K_ref
        max_scale = F32(0)
        amax = F32(0)
        for j in range(16):
            s = make_q3_quants(16, 4, x, 16 * j, L, 16 * j)
            scales[j] = s
            if abs(s) > amax:
                amax = abs(s)
                max_scale = s
        if max_scale != 0:
            iscale = F32(-32) / max_scale
            for j in range(16):
                l = clamp(_i8(nearest_int(iscale * scales[j])), -32, 31) + 32
                _q3_k_put_scale(y, so, j, l)
            d = _put_f16(y, 108, F32(1) / iscale)
        else:
            d = _put_f16(y, 108, F32(0))
    for j in range(16):
        sc = (y[so + j] & 0xF) if j < 8 else (y[so + j - 8] >> 4)
        sc = (np.int32(sc) | (((y[so + 8 + j % 4] >> (2 * (j // 4))) & 3) << 4)) - 32
        dj = d * F32(sc)
        if dj == 0:
            continue
        for ii in range(16):
            L[16 * j + ii] = clamp(nearest_int(x[16 * j + ii] / dj), -4, 3) + 4
    for m in range(32):  # L[j] is 0..7: its bit 2 goes to bit j/32 of hmask[j%32], L[j] keeps 0..3
        h = 0
        for b in range(8):
            h |= ((L[32 * b + m] >> 2) & 1) << b
            L[32 * b + m] &= 3
        y[m] = h
    _pack_2bit(L, y, 32)


# ---------------------------------------------------------------------------------------- Q4_K and Q5_K
# block_q4_K: d @0, dmin @2, scales[12] @4, qs[128] @16; block_q5_K adds qh[32] @16, qs moves to @48


@kernel
def _put_scale_min_k4(y, o, j, ls, lm):
    """The inverse of get_scale_min_k4: 6-bit scale ls and min lm of sub-block j into y[o:o+12]."""
    if j < 4:
        y[o + j] = ls
        y[o + j + 4] = lm
    else:
        y[o + j + 4] = ((ls & 0xF) | ((lm & 0xF) << 4)) & 0xFF
        y[o + j - 4] |= ((ls >> 4) << 6) & 0xFF
        y[o + j] |= ((lm >> 4) << 6) & 0xFF


@kernel
def _get_scale_min_k4(y, o, j):
    """get_scale_min_k4 on the 12 scale bytes at y[o:]: (scale, min) of sub-block j, as int32."""
    if j < 4:
        return np.int32(y[o + j] & 63), np.int32(y[o + j + 4] & 63)
    lo, hi_s, hi_m = np.int32(y[o + j + 4]), np.int32(y[o + j - 4]) >> 6, np.int32(y[o + j]) >> 6
    return np.int32((lo & 0xF) | (hi_s << 4)), np.int32((lo >> 4) | (hi_m << 4))


@kernel
def _q45_k_block(five, x, qw, use_qw, y, L, Laux, wt, scales, mins, sw, Ls, Lm, tmp):
    """Q4_K (five = False) or Q5_K (five = True): the two differ in nmax, the ref search's parameters,
    Q5_K impl's MIN(63, ...) on the scales and the packing."""
    nmax = 31 if five else 15
    if use_qw:  # quantize_row_q4_K_impl / quantize_row_q5_K_impl
        sigma2 = F32(2) * _sum_sq(x, 0, QK_K) / F32(QK_K)
        for j in range(8):
            sw[j] = _row_sigma_weights(x, 32 * j, 32, qw, wt, sigma2)
            scales[j], mins[j] = make_qkx_quants(
                32, nmax, x, 32 * j, wt, 0, L, 32 * j, Laux, _M0_9, _P0_05, 36, False, True, tmp
            )
        d_block = make_qp_quants(8, 63, scales, Ls, sw)
        m_block = make_qp_quants(8, 63, mins, Lm, sw)
        for j in range(8):
            ls = min(63, Ls[j]) if five else Ls[j]
            lm = min(63, Lm[j]) if five else Lm[j]
            _put_scale_min_k4(y, 4, j, ls, lm)
        d = _put_f16(y, 0, d_block)
        dmin = _put_f16(y, 2, m_block)
    else:  # quantize_row_q4_K_ref / quantize_row_q5_K_ref
        max_scale = F32(0)
        max_min = F32(0)
        for j in range(8):
            av_x = np.sqrt(_sum_sq(x, 32 * j, 32) / F32(32))
            for l in range(32):
                wt[l] = av_x + abs(x[32 * j + l])
            if five:
                s, m = make_qkx_quants(
                    32, 31, x, 32 * j, wt, 0, L, 32 * j, Laux, _M0_5, _P0_1, 15, False, False, tmp
                )
            else:
                s, m = make_qkx_quants(
                    32, 15, x, 32 * j, wt, 0, L, 32 * j, Laux, _M1, _P0_1, 20, False, False, tmp
                )
            scales[j] = s
            mins[j] = m
            if s > max_scale:
                max_scale = s
            if m > max_min:
                max_min = m
        inv_scale = F32(63) / max_scale if max_scale > 0 else F32(0)
        inv_min = F32(63) / max_min if max_min > 0 else F32(0)
        for j in range(8):
            ls = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)  # uint8_t ls = nearest_int(...)
            lm = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
            _put_scale_min_k4(y, 4, j, ls, lm)
        d = _put_f16(y, 0, max_scale / F32(63))
        dmin = _put_f16(y, 2, max_min / F32(63))
    for j in range(8):
        sc, m = _get_scale_min_k4(y, 4, j)
        dj = d * F32(sc)
        if dj == 0:
            continue
        mj = dmin * F32(m)
        for ii in range(32):
            L[32 * j + ii] = clamp(nearest_int((x[32 * j + ii] + mj) / dj), 0, nmax)
    if five:
        qh = 16
        ql = 48
        for j in range(32):
            y[qh + j] = 0
        for n in range(0, QK_K, 64):
            m1 = 1 << (n // 32)
            for j in range(32):
                l1 = np.int32(L[n + j])
                if l1 > 15:
                    l1 -= 16
                    y[qh + j] |= m1
                l2 = np.int32(L[n + j + 32])
                if l2 > 15:
                    l2 -= 16
                    y[qh + j] |= m1 << 1
                y[ql + n // 2 + j] = (l1 | (l2 << 4)) & 0xFF
    else:
        for j in range(0, QK_K, 64):
            for l in range(32):
                y[16 + j // 2 + l] = (L[j + l] | (L[j + l + 32] << 4)) & 0xFF


# ------------------------------------------------------------------------------------------------ Q6_K
# block_q6_K: ql[128] @0, qh[64] @128, scales[16] (int8) @192, d @208


@kernel
def _q6_k_block(x, qw, use_qw, y, L, wt, scales, tmp):
    max_scale = F32(0)
    max_abs_scale = F32(0)
    for ib in range(16):
        if use_qw:  # quantize_row_q6_K_impl weighs by the imatrix alone
            s = make_qx_quants(16, 32, x, 16 * ib, L, 16 * ib, qw, 16 * ib, tmp)
        else:
            for l in range(16):
                wt[l] = x[16 * ib + l] * x[16 * ib + l]
            s = make_qx_quants(16, 32, x, 16 * ib, L, 16 * ib, wt, 0, tmp)
        scales[ib] = s
        if abs(s) > max_abs_scale:
            max_abs_scale = abs(s)
            max_scale = s
    if max_abs_scale < GROUP_MAX_EPS:
        for k in range(210):
            y[k] = 0
        return
    iscale = F32(-128) / max_scale
    d = _put_f16(y, 208, F32(1) / iscale)
    for ib in range(16):
        y[192 + ib] = min(127, nearest_int(iscale * scales[ib])) & 0xFF
    for j in range(16):
        dj = d * F32(_i8(np.int32(y[192 + j])))
        if dj == 0:
            continue
        for ii in range(16):
            L[16 * j + ii] = clamp(nearest_int(x[16 * j + ii] / dj), -32, 31) + 32
    for j in range(0, QK_K, 128):
        ql = j // 2
        qh = 128 + j // 4
        for l in range(32):
            a, b, c, e = L[j + l], L[j + l + 32], L[j + l + 64], L[j + l + 96]
            y[ql + l] = (a & 0xF) | ((c & 0xF) << 4)
            y[ql + l + 32] = (b & 0xF) | ((e & 0xF) << 4)
            y[qh + l] = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6)


# ------------------------------------------------------------------- Q4_0 .. Q5_1: 32-element blocks


@kernel
def _trunc_i32(v):
    """C's float -> int conversion (toward zero), as cvttss2si does it."""
    return np.int32(v)


@kernel
def _put_qs_qh(L, lo, five, y, qs, qh):
    """16 bytes of nibbles L[lo+j] | L[lo+j+16] << 4 at y[qs:], and for Q5 the 5th bits as a uint32 at qh."""
    h = np.uint32(0)
    for j in range(16):
        a = np.int32(L[lo + j]) & 0xFF
        b = np.int32(L[lo + j + 16]) & 0xFF
        y[qs + j] = ((a & 0xF) | ((b & 0xF) << 4)) & 0xFF
        h |= np.uint32(((a & 0x10) >> 4) << j)
        h |= np.uint32(((b & 0x10) >> 4) << (j + 16))
    if five:
        for k in range(4):
            y[qh + k] = (h >> np.uint32(8 * k)) & np.uint32(0xFF)


@inline
def _legacy_ref_block(kind, x, xo, y, yo, L):
    """quantize_row_q4_0_ref / q4_1 / q5_0 / q5_1 / q8_0 on x[xo:xo+32] into y[yo:]; kind 0, 1, 2, 3, 8.
    Inlined with offsets, not handed views: these blocks are so cheap that making views would cost more."""
    if kind == 8:
        amax = F32(0)
        for j in range(32):
            a = abs(x[xo + j])
            amax = amax if amax > a else a  # MAX(amax, fabsf(v)), as the C macro treats NaN
        d = amax / F32(127)
        inv = F32(1) / d if d != 0 else F32(0)
        _put_f16(y, yo, d)
        for j in range(32):
            v = x[xo + j] * inv
            a = abs(v)
            r = np.floor(a)
            if a - r >= F32(0.5):  # roundf: half away from zero (a - floor(a) is exact)
                r += F32(1)
            y[yo + 2 + j] = _trunc_i32(-r if v < 0 else r) & 0xFF
        return
    five = kind >= 2
    if kind == 0 or kind == 2:
        amax = F32(0)
        mx = F32(0)
        for j in range(32):
            if amax < abs(x[xo + j]):
                amax = abs(x[xo + j])
                mx = x[xo + j]
        d = mx / F32(-16 if five else -8)
        inv = F32(1) / d if d != 0 else F32(0)
        _put_f16(y, yo, d)
        bias = F32(16.5) if five else F32(8.5)
        top = 31 if five else 15
        for j in range(32):
            L[j] = min(top, _i8(_trunc_i32(x[xo + j] * inv + bias))) & 0xFF
        _put_qs_qh(L, 0, five, y, yo + (6 if five else 2), yo + 2)
        return
    mn = _FLT_MAX
    mx = -_FLT_MAX
    for j in range(32):
        v = x[xo + j]
        if v < mn:
            mn = v
        if v > mx:
            mx = v
    d = (mx - mn) / F32(31 if five else 15)
    inv = F32(1) / d if d != 0 else F32(0)
    _put_f16(y, yo, d)
    _put_f16(y, yo + 2, mn)
    for j in range(32):
        q = _trunc_i32((x[xo + j] - mn) * inv + F32(0.5))
        L[j] = (q & 0xFF) if five else (min(15, _i8(q)) & 0xFF)
    _put_qs_qh(L, 0, five, y, yo + (8 if five else 4), yo + 4)


@kernel
def _legacy_impl_block(kind, x, qw, sigma2, y, L, Laux, wt, tmp):
    """quantize_row_q4_0_impl / q4_1 / q5_0 / q5_1 on the 32 values x (kind 0..3); sigma2 is the row's."""
    _row_sigma_weights(x, 0, 32, qw, wt, sigma2)
    five = kind >= 2
    if kind == 0 or kind == 2:
        d = make_qx_quants(32, 16 if five else 8, x, 0, L, 0, wt, 0, tmp)
        _put_f16(y, 0, d)
        _put_qs_qh(L, 0, five, y, 6 if five else 2, 2)
    else:
        d, the_min = make_qkx_quants(
            32, 31 if five else 15, x, 0, wt, 0, L, 0, Laux, _M0_9, _P0_05, 36, False, True, tmp
        )
        _put_f16(y, 0, d)
        _put_f16(y, 2, -the_min)
        _put_qs_qh(L, 0, five, y, 8 if five else 4, 4)


# ------------------------------------------------------------------------------------- IQ4_NL, IQ4_XS
# block_iq4_nl: d @0, qs[16] @2; block_iq4_xs: d @0, scales_h (uint16) @2, scales_l[4] @4, qs[128] @8


@kernel
def _iq4_block(sbs, x, qw, use_qw, y, L, wt, scales):
    """quantize_row_iq4_nl_impl(sbs, 32, ..., kvalues_iq4nl, qw, ntry = 7): IQ4_NL (sbs 32), IQ4_XS (256)."""
    values = _IQ4_VALUES
    ntry = 7
    sigma2 = _sum_sq(x, 0, sbs)
    sigma2 *= F32(2) / F32(sbs)
    nb = sbs // 32
    max_scale = F32(0)
    amax_scale = F32(0)
    for ib in range(nb):
        bo = 32 * ib
        for j in range(32):
            xj = x[bo + j]
            wt[j] = qw[bo + j] * np.sqrt(sigma2 + xj * xj) if use_qw else xj * xj
        amax = F32(0)
        mx = F32(0)
        for j in range(32):
            if abs(x[bo + j]) > amax:
                amax = abs(x[bo + j])
                mx = x[bo + j]
        if amax < GROUP_MAX_EPS:
            scales[ib] = F32(0)
            continue
        d = -mx / F32(values[0])
        inv = F32(1) / d
        sumqx = F32(0)
        sumq2 = F32(0)
        for j in range(32):
            l = best_index_int8(16, values, inv * x[bo + j])
            L[32 * ib + j] = l
            q = F32(values[l])
            sumqx += wt[j] * q * x[bo + j]
            sumq2 += wt[j] * q * q
        d = sumqx / sumq2 if sumq2 > 0 else F32(0)
        best = d * sumqx
        for itry in range(-ntry, ntry + 1):
            inv = F32(itry + values[0]) / mx
            sumqx = F32(0)
            sumq2 = F32(0)
            for j in range(32):
                q = F32(values[best_index_int8(16, values, inv * x[bo + j])])
                sumqx += wt[j] * q * x[bo + j]
                sumq2 += wt[j] * q * q
            if sumqx * sumqx > best * sumq2 and sumq2 > 0:  # swapped as in make_qx_quants
                d = sumqx / sumq2
                best = d * sumqx
        scales[ib] = d
        if abs(d) > amax_scale:
            amax_scale = abs(d)
            max_scale = d
    if nb > 1:
        d = -max_scale / F32(32)
        _put_f16(y, 0, d)
        inv = F32(1) / d if d != 0 else F32(0)
        scales_h = 0
        for ib in range(nb):
            l = clamp(nearest_int(inv * scales[ib]), -32, 31)
            dl = d * F32(l)
            idl = F32(1) / dl if dl != 0 else F32(0)
            for j in range(32):
                L[32 * ib + j] = best_index_int8(16, values, idl * x[32 * ib + j])
            l += 32
            if ib % 2 == 0:
                y[4 + ib // 2] = l & 0xF
            else:
                y[4 + ib // 2] |= (l & 0xF) << 4
            scales_h |= (l >> 4) << (2 * (ib % 8))
        y[2] = scales_h & 0xFF
        y[3] = (scales_h >> 8) & 0xFF
        qs = 8
    else:
        _put_f16(y, 0, scales[0])
        inv = F32(1) / scales[0] if scales[0] != 0 else F32(0)
        for j in range(32):
            L[j] = best_index_int8(16, values, inv * x[j])
        qs = 2
    for i in range(nb):
        for j in range(16):
            y[qs + 16 * i + j] = (L[32 * i + j] | (L[32 * i + 16 + j] << 4)) & 0xFF


# ------------------------------------------------------------------------------------------ row loops
# One kernel per family over rows of x (nrows, n_per_row) into out (nrows, row bytes); qw is the imatrix
# (an empty array when use_qw is False). Each block is handed over as views (x, qw, out bytes) indexed
# from 0. The scratch buffers are the C's stack arrays, plus `tmp` for the search routines.


@kernel
def _rows_q2_k(x, qw, use_qw, out):
    tmp = np.zeros(128, F32)
    L, Laux, wt = np.zeros(QK_K, np.uint8), np.zeros(16, np.uint8), np.zeros(16, F32)
    scales, mins, sw = np.zeros(16, F32), np.zeros(16, F32), np.zeros(16, F32)
    Ls, Lm = np.zeros(16, np.uint8), np.zeros(16, np.uint8)
    for r in range(x.shape[0]):
        for i in range(x.shape[1] // QK_K):
            o, y = QK_K * i, out[r, 84 * i : 84 * i + 84]
            xb, qb = x[r, o : o + QK_K], qw[o : o + QK_K]
            _q2_k_block(xb, qb, use_qw, y, L, Laux, wt, scales, mins, sw, Ls, Lm, tmp)


@kernel
def _rows_q3_k(x, qw, use_qw, out):
    tmp = np.zeros(128, F32)
    L, wt = np.zeros(QK_K, np.int8), np.zeros(16, F32)
    scales, sw, Ls = np.zeros(16, F32), np.zeros(16, F32), np.zeros(16, np.int8)
    for r in range(x.shape[0]):
        for i in range(x.shape[1] // QK_K):
            o, y = QK_K * i, out[r, 110 * i : 110 * i + 110]
            _q3_k_block(x[r, o : o + QK_K], qw[o : o + QK_K], use_qw, y, L, wt, scales, sw, Ls, tmp)


@kernel
def _rows_q45_k(five, x, qw, use_qw, out):
    tmp = np.zeros(128, F32)
    L, Laux, wt = np.zeros(QK_K, np.uint8), np.zeros(32, np.uint8), np.zeros(32, F32)
    scales, mins, sw = np.zeros(8, F32), np.zeros(8, F32), np.zeros(8, F32)
    Ls, Lm = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
    tsize = 176 if five else 144
    for r in range(x.shape[0]):
        for i in range(x.shape[1] // QK_K):
            o, y = QK_K * i, out[r, tsize * i : tsize * i + tsize]
            xb, qb = x[r, o : o + QK_K], qw[o : o + QK_K]
            _q45_k_block(five, xb, qb, use_qw, y, L, Laux, wt, scales, mins, sw, Ls, Lm, tmp)


@kernel
def _rows_q6_k(x, qw, use_qw, out):
    tmp = np.zeros(128, F32)
    L, wt, scales = np.zeros(QK_K, np.uint8), np.zeros(16, F32), np.zeros(16, F32)
    for r in range(x.shape[0]):
        for i in range(x.shape[1] // QK_K):
            o, y = QK_K * i, out[r, 210 * i : 210 * i + 210]
            _q6_k_block(x[r, o : o + QK_K], qw[o : o + QK_K], use_qw, y, L, wt, scales, tmp)


@kernel
def _rows_legacy(kind, x, qw, use_qw, out):
    tmp = np.zeros(128, F32)
    L, Laux, wt = np.zeros(32, np.uint8), np.zeros(32, np.uint8), np.zeros(32, F32)
    n = x.shape[1]
    ts = out.shape[1] // (n // 32) if n else 0
    for r in range(x.shape[0]):
        xr, yr = x[r], out[r]
        if use_qw and kind != 8:  # quantize_q8_0 ignores the imatrix
            sigma2 = _sum_sq(xr, 0, n) / F32(n)
            for ib in range(n // 32):
                o, y = 32 * ib, yr[ts * ib : ts * ib + ts]
                _legacy_impl_block(kind, xr[o : o + 32], qw[o : o + 32], sigma2, y, L, Laux, wt, tmp)
        else:
            for ib in range(n // 32):
                _legacy_ref_block(kind, xr, 32 * ib, yr, ts * ib, L)


@kernel
def _rows_iq4(sbs, x, qw, use_qw, out):
    L, wt, scales = np.zeros(QK_K, np.uint8), np.zeros(32, F32), np.zeros(8, F32)
    ts = 18 if sbs == 32 else 136
    for r in range(x.shape[0]):
        for i in range(x.shape[1] // sbs):
            o, y = sbs * i, out[r, ts * i : ts * i + ts]
            _iq4_block(sbs, x[r, o : o + sbs], qw[o : o + sbs], use_qw, y, L, wt, scales)


# ------------------------------------------------------------------------------------------ public API

_ROWS = {
    "Q4_0": lambda x, qw, u, out: _rows_legacy(0, x, qw, u, out),
    "Q4_1": lambda x, qw, u, out: _rows_legacy(1, x, qw, u, out),
    "Q5_0": lambda x, qw, u, out: _rows_legacy(2, x, qw, u, out),
    "Q5_1": lambda x, qw, u, out: _rows_legacy(3, x, qw, u, out),
    "Q8_0": lambda x, qw, u, out: _rows_legacy(8, x, qw, u, out),
    "Q2_K": _rows_q2_k,
    "Q3_K": _rows_q3_k,
    "Q4_K": lambda x, qw, u, out: _rows_q45_k(False, x, qw, u, out),
    "Q5_K": lambda x, qw, u, out: _rows_q45_k(True, x, qw, u, out),
    "Q6_K": _rows_q6_k,
    "IQ4_NL": lambda x, qw, u, out: _rows_iq4(32, x, qw, u, out),
    "IQ4_XS": lambda x, qw, u, out: _rows_iq4(QK_K, x, qw, u, out),
}
_FLOATS = ("F32", "F16", "BF16")  # plain conversions: edgellm.quants' numpy ones are ggml's bit for bit
SUPPORTED: frozenset[str] = frozenset(_ROWS) | frozenset(_FLOATS)


def quantize_rows(
    type_name: str,
    x: np.ndarray,
    imatrix: np.ndarray | None = None,
    threads: int = 1,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """float32 x (nrows, n_per_row) -> uint8 (nrows, row_bytes): ggml_quantize_chunk(type, x, ..., imatrix)
    bit for bit.

    imatrix holds one importance per column (as llama-quantize passes it); `threads` splits the rows over
    a thread pool and never changes the result; `out`, if given, is the uint8 (nrows, row_bytes) array
    written (a buffer reused across calls saves the page faults of a fresh one)."""
    if type_name not in SUPPORTED:
        raise ValueError(f"cannot quantize to {type_name!r}; supported: {', '.join(sorted(SUPPORTED))}")
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D (nrows, n_per_row), got shape {x.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    nrows, n_per_row = x.shape
    if n_per_row % block:
        raise ValueError(f"{type_name} needs n_per_row a multiple of {block}, got {n_per_row}")
    qw = np.zeros(0, np.float32)
    if imatrix is not None:
        qw = np.ascontiguousarray(imatrix, dtype=np.float32)
        if qw.shape != (n_per_row,):
            raise ValueError(f"imatrix must hold one value per column, shape ({n_per_row},); got {qw.shape}")
    shape = (nrows, n_per_row // block * type_size)
    if out is None:
        out = np.empty(shape, np.uint8)
    elif out.shape != shape or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a contiguous uint8 array of shape {shape}")
    if type_name in _FLOATS:
        out[:] = quants.quantize(x, GGMLQuantizationType[type_name]).reshape(out.shape)
        return out
    run, use_qw = _ROWS[type_name], imatrix is not None
    n_chunks = min(nrows, 4 * max(1, threads))
    if threads <= 1 or n_chunks <= 1:
        run(x, qw, use_qw, out)
        return out
    bounds = np.linspace(0, nrows, n_chunks + 1).astype(np.int64)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        jobs = [pool.submit(run, x[a:b], qw, use_qw, out[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        for job in jobs:
            job.result()
    return out
