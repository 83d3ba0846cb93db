"""IQ4_NL quantizer, with or without an importance matrix: bit for bit what llama-quantize writes.

Mirrors ggml-org/llama.cpp ggml/src/ggml-quants.c `quantize_iq4_nl` -> `quantize_row_iq4_nl_impl`
(super_block_size = block_size = 32, ntry = 7) and `best_index_int8`; every float32 operation is in the C
order (sequential sums, no FMA, as ggml-base is built without -mfma), f16 rounding is round-to-nearest-even.
"""

from __future__ import annotations

import threading

import numpy as np
from numba import njit

from edgellm.backends.numba_kernels.common import f32_to_f16_bits

F32 = np.float32
QK = 32  # elements per block
BLOCK_BYTES = 18  # ggml-common.h block_iq4_nl: ggml_half d; uint8_t qs[16]
NTRY = 7
GROUP_MAX_EPS = F32(1e-15)
# ggml-org/llama.cpp ggml/src/ggml-common.h kvalues_iq4nl
KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)


@njit(cache=True, nogil=True, inline="always")
def _best_index(vals, x):
    """best_index_int8(16, vals, x): index of the value nearest x, ties going up, by bisection."""
    if x <= F32(vals[0]):
        return 0
    if x >= F32(vals[15]):
        return 15
    ml = 0
    mu = 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < F32(vals[mav]):
            mu = mav
        else:
            ml = mav
    if x - F32(vals[mu - 1]) < F32(vals[mu]) - x:
        return mu - 1
    return mu


@njit(cache=True, nogil=True)
def _block_scale(xb, qw, has_qw, vals, weight):
    """The float32 scale quantize_row_iq4_nl_impl picks for one 32-element block (before f16 rounding)."""
    sigma2 = F32(0)
    for j in range(QK):
        sigma2 += xb[j] * xb[j]
    sigma2 *= F32(2) / F32(QK)
    for j in range(QK):
        if has_qw:
            weight[j] = qw[j] * np.sqrt(sigma2 + xb[j] * xb[j])
        else:
            weight[j] = xb[j] * xb[j]
    amax = F32(0)
    vmax = F32(0)
    for j in range(QK):
        ax = abs(xb[j])
        if ax > amax:
            amax = ax
            vmax = xb[j]
    if amax < GROUP_MAX_EPS:
        return F32(0)
    v0 = F32(vals[0])
    d = -vmax / v0  # ntry > 0
    inv = F32(1) / d
    sumqx = F32(0)
    sumq2 = F32(0)
    for j in range(QK):
        q = F32(vals[_best_index(vals, inv * xb[j])])
        w = weight[j]
        sumqx += w * q * xb[j]
        sumq2 += w * q * q
    d = sumqx / sumq2 if sumq2 > F32(0) else F32(0)
    best = d * sumqx
    for itry in range(-NTRY, NTRY + 1):
        inv = F32(itry + vals[0]) / vmax
        sumqx = F32(0)
        sumq2 = F32(0)
        for j in range(QK):
            q = F32(vals[_best_index(vals, inv * xb[j])])
            w = weight[j]
            sumqx += w * q * xb[j]
            sumq2 += w * q * q
        if sumq2 > F32(0) and sumqx * sumqx > best * sumq2:
            d = sumqx / sumq2
            best = d * sumqx
    return d


@njit(cache=True, nogil=True)
def quantize_rows(x, qw, has_qw, out, r0, r1):
    """Quantize rows r0..r1 of x (nrows, n_per_row) float32 into out (nrows, n_per_row/32*18) uint8."""
    vals = KVALUES
    weight = np.empty(QK, np.float32)
    nblock = x.shape[1] // QK
    for r in range(r0, r1):
        for ib in range(nblock):
            xb = x[r, ib * QK : (ib + 1) * QK]
            d = _block_scale(xb, qw[ib * QK : (ib + 1) * QK], has_qw, vals, weight)
            h = f32_to_f16_bits(d)
            o = ib * BLOCK_BYTES
            out[r, o] = np.uint8(h & np.uint32(0xFF))
            out[r, o + 1] = np.uint8(h >> np.uint32(8))
            # the single-block branch: L is recomputed from the float32 scale, not the f16 one
            inv = F32(1) / d if d != F32(0) else F32(0)
            for j in range(16):
                lo = _best_index(vals, inv * xb[j])
                hi = _best_index(vals, inv * xb[16 + j])
                out[r, o + 2 + j] = np.uint8(lo | (hi << 4))


def quantize_iq4_nl(x: np.ndarray, imatrix: np.ndarray | None = None, threads: int = 1) -> np.ndarray:
    """float32 (nrows, n_per_row) -> uint8 (nrows, n_per_row // 32 * 18), ggml_quantize_chunk(IQ4_NL, ...)
    bit for bit. imatrix: one float32 per column, shared by all rows (as llama-quantize passes it)."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"IQ4_NL quantizes a 2-d (nrows, n_per_row) array, got shape {x.shape}")
    nrows, n_per_row = x.shape
    if n_per_row == 0 or n_per_row % QK:
        raise ValueError(f"IQ4_NL needs n_per_row to be a positive multiple of {QK}, got {n_per_row}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if imatrix is None:
        qw, has_qw = np.zeros(n_per_row, np.float32), False
    else:
        qw = np.ascontiguousarray(imatrix, dtype=np.float32)
        if qw.shape != (n_per_row,):
            raise ValueError(f"imatrix must hold one float32 per column ({n_per_row},), got shape {qw.shape}")
        has_qw = True
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    out = np.empty((nrows, n_per_row // QK * BLOCK_BYTES), np.uint8)
    threads = min(threads, max(nrows, 1))
    if threads == 1:
        quantize_rows(x, qw, has_qw, out, 0, nrows)
        return out
    bounds = [nrows * i // threads for i in range(threads + 1)]
    workers = [
        threading.Thread(target=quantize_rows, args=(x, qw, has_qw, out, bounds[i], bounds[i + 1]))
        for i in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return out
