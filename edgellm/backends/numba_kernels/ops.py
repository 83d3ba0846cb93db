"""Numba versions of the reference backend's non-matmul ops (RMSNorm, RoPE rotation, attention over the
float16 KV cache, SwiGLU, GeGLU), with the reference's float32 operations in the same order.

What can differ from the reference is float summation order (dot products, softmax and RMS sums) and the
last bit of exp/tanh (libm here, numpy's SIMD routines there). The KV cache is the reference's paged float16
cache seen as uint16 bits (Numba has no float16): values are stored rounded to nearest even like numpy's
astype(float16), and read back exactly.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from edgellm.backends.numba_kernels.common import f16_to_f32, f32_to_f16_bits
from edgellm.backends.numba_kernels.floats import _f16_bits_to_f32

F32 = np.float32


@njit(cache=True, nogil=True)
def rms_norm(x, weight, has_weight, eps, out):
    """x, out (N, D) float32: ggml_compute_forward_rms_norm_f32 (sum of squares in double), then * weight."""
    n, d = x.shape
    for r in range(n):
        s = 0.0
        for j in range(d):
            v = np.float64(x[r, j])
            s += v * v
        scale = F32(1) / np.sqrt(F32(s / d + eps))
        for j in range(d):
            y = x[r, j] * scale
            out[r, j] = y * weight[j] if has_weight else y


@njit(cache=True, nogil=True)
def rope(x, cos, sin, positions, n_dims, neox, out):
    """x, out (N, H, Dh); cos, sin (positions, n_dims/2) tables, row positions[r] for token r: rotate pairs
    (i, i + n_dims/2) (neox) or (2i, 2i+1)."""
    n, h, dh = x.shape
    half = n_dims // 2
    for r in range(n):
        p = positions[r]
        for hh in range(h):
            for j in range(dh):
                out[r, hh, j] = x[r, hh, j]
            for i in range(half):
                c, s = cos[p, i], sin[p, i]
                if neox:
                    a, b = x[r, hh, i], x[r, hh, i + half]
                    out[r, hh, i] = a * c - b * s
                    out[r, hh, i + half] = a * s + b * c
                else:
                    a, b = x[r, hh, 2 * i], x[r, hh, 2 * i + 1]
                    out[r, hh, 2 * i] = a * c - b * s
                    out[r, hh, 2 * i + 1] = a * s + b * c


@njit(cache=True, inline="always")
def _slot(table, block_size, s, p):
    """Cache slot of position p of sequence s through the block table (see reference.KVCache)."""
    return table[s, p // block_size] * block_size + p % block_size


@njit(cache=True, inline="always")
def _softmax_rows(scores, rows, t, round_f16):
    """Each of rows rows of t scores -> exp(s - max) / their sum (taken in order), then rounded to f16
    where the values are f16 (the weights meet f16 values rounded, q8_0 values unrounded)."""
    for i in range(rows):
        mx = F32(-np.inf)
        for j in range(t):
            if scores[i, j] > mx:
                mx = scores[i, j]
        total = F32(0)
        for j in range(t):
            e = np.exp(scores[i, j] - mx)
            scores[i, j] = e
            total += e
        for j in range(t):
            w = scores[i, j] / total
            scores[i, j] = f16_to_f32(f32_to_f16_bits(w)) if round_f16 else w


@njit(cache=True, inline="always")
def _key_slots(table, block_size, s_id, pos, window):
    """Cache slots of the positions a token at pos attends to: max(0, pos - window + 1) .. pos."""
    lo = max(0, pos - window + 1) if window > 0 else 0
    slots = np.empty(pos + 1 - lo, np.int64)
    for j in range(len(slots)):
        slots[j] = _slot(table, block_size, s_id, lo + j)
    return slots


@njit(cache=True, inline="always")
def _add_weighted(acc, scores, j, row):
    """acc[i] += scores[i, j] * row for each query head i of the group (one key's value row)."""
    for i in range(acc.shape[0]):
        p = scores[i, j]
        for d in range(acc.shape[1]):
            acc[i, d] += p * row[d]


@njit(cache=True, inline="always")
def _write_heads(out, acc, r, g):
    """The group's heads of token r (kv head g) into out."""
    group = acc.shape[0]
    for i in range(group):
        for d in range(acc.shape[1]):
            out[r, g * group + i, d] = acc[i, d]


KEYS = 8  # keys scored together: 8 independent sums, each over d in order


@njit(cache=True, inline="always")
def _attend_pair(q, kc, vc, table, block_size, s_id, pos, r, g, group, scale, window, softcap, out):
    """Query heads g * group .. of token r (sequence s_id, position pos) over the f16 cache rows of kv head
    g: each cached key is decoded from f16 once, transposed into kt so that KEYS keys' dot products run
    side by side (each still summed over d in order: the reference's per-score order), then the softmax
    and the weighted values."""
    dh = q.shape[2]
    slots = _key_slots(table, block_size, s_id, pos, window)
    t = len(slots)
    qg = np.empty((group, dh), F32)
    kt = np.zeros((dh, KEYS), F32)
    kf = np.empty(dh, F32)
    acc = np.zeros((group, dh), F32)
    scores = np.empty((group, t), F32)
    for i in range(group):
        for d in range(dh):
            qg[i, d] = f16_to_f32(f32_to_f16_bits(q[r, g * group + i, d]))
    for j0 in range(0, t, KEYS):
        nk = min(KEYS, t - j0)
        for u in range(nk):
            krow = kc[slots[j0 + u], g]
            for d in range(dh):
                kt[d, u] = _f16_bits_to_f32(krow[d])
        for i in range(group):
            s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = F32(0)
            for d in range(dh):
                x = qg[i, d]
                s0 += x * kt[d, 0]
                s1 += x * kt[d, 1]
                s2 += x * kt[d, 2]
                s3 += x * kt[d, 3]
                s4 += x * kt[d, 4]
                s5 += x * kt[d, 5]
                s6 += x * kt[d, 6]
                s7 += x * kt[d, 7]
            sums = (s0, s1, s2, s3, s4, s5, s6, s7)
            for u in range(nk):
                sc = sums[u] * scale
                if softcap > 0:
                    sc = softcap * np.tanh(sc / softcap)
                scores[i, j0 + u] = sc
    _softmax_rows(scores, group, t, True)
    for j in range(t):
        vrow = vc[slots[j], g]
        for d in range(dh):
            kf[d] = _f16_bits_to_f32(vrow[d])
        _add_weighted(acc, scores, j, kf)
    _write_heads(out, acc, r, g)


@njit(cache=True, nogil=True)
def _store_kv(k, v, kc, vc, table, block_size, seq_ids, positions):
    n, n_kv, dh = k.shape
    for r in range(n):
        slot = _slot(table, block_size, seq_ids[r], positions[r])
        for hh in range(n_kv):
            for d in range(dh):
                kc[slot, hh, d] = f32_to_f16_bits(k[r, hh, d])
                vc[slot, hh, d] = f32_to_f16_bits(v[r, hh, d])


@njit(cache=True, nogil=True, parallel=True)
def _attend_parallel(q, kc, vc, table, block_size, seq_ids, positions, group, scale, window, softcap, out):
    n_kv = kc.shape[1]
    for pair in prange(q.shape[0] * n_kv):
        r, g = pair // n_kv, pair % n_kv
        _attend_pair(
            q, kc, vc, table, block_size, seq_ids[r], positions[r], r, g, group, scale, window, softcap, out
        )


@njit(cache=True, nogil=True)
def attention(q, k, v, kc, vc, table, block_size, seq_ids, positions, scale, window, softcap, out, parallel):
    """Store k, v (N, Hkv, Dh) into this layer's caches kc, vc (slots, Hkv, Dh) uint16 (f16 bits) at
    (seq, position) through the int32 block table (seqs, max blocks), then causal attention of q (N, H, Dh)
    -> out (N, H, Dh), like ReferenceBackend: q rounded to f16, scores * scale, optional softcap, masked
    beyond the position (and before the window), softmax in float32, weights rounded to f16 before their
    product with the values. The caller has checked that every block read or written is mapped. With
    `parallel`, the (token, kv head) pairs run on Numba's threads (each pair's operations are the same)."""
    n, n_head, dh = q.shape
    n_kv = k.shape[1]
    group = n_head // n_kv
    _store_kv(k, v, kc, vc, table, block_size, seq_ids, positions)
    if parallel:
        _attend_parallel(
            q, kc, vc, table, block_size, seq_ids, positions, group, F32(scale), window, F32(softcap), out
        )
        return
    sc, cap = F32(scale), F32(softcap)
    for r in range(n):
        for g in range(n_kv):
            _attend_pair(
                q, kc, vc, table, block_size, seq_ids[r], positions[r], r, g, group, sc, window, cap, out
            )


@njit(cache=True, inline="always")
def _q8_store(x, row):
    """x (Dh,) float32 -> row (Dh / 32 * 34,) uint8 of q8_0 blocks (paged_kv.q8_0_encode)."""
    for b in range(x.shape[0] // 32):
        amax = F32(0)
        for j in range(32):
            a = abs(x[b * 32 + j])
            if a > amax:
                amax = a
        inv = F32(127) / amax if amax != F32(0) else F32(0)
        h = f32_to_f16_bits(amax / F32(127))
        row[b * 34] = np.uint8(h & np.uint32(255))
        row[b * 34 + 1] = np.uint8(h >> np.uint32(8))
        for j in range(32):
            q = np.int32(np.rint(x[b * 32 + j] * inv))
            row[b * 34 + 2 + j] = np.uint8(q & 255)


@njit(cache=True, inline="always")
def _q8_scale(row, b):
    return f16_to_f32(np.uint32(row[b * 34]) | (np.uint32(row[b * 34 + 1]) << np.uint32(8)))


@njit(cache=True, inline="always")
def _q8_int(row, b, j):
    v = np.int32(row[b * 34 + 2 + j])
    return v - 256 if v > 127 else v


@njit(cache=True, nogil=True)
def attention_q8(q, k, v, kc, vc, k8, v8, table, block_size, seq_ids, positions, scale, window, softcap, out):
    """attention() over a cache whose K (k8) and/or V (v8) rows are q8_0 blocks (uint8 (slots, Hkv,
    Dh / 32 * 34)); the other is float16 bits as in attention(). The reference's operations
    (reference.q8_0_scores): over q8_0 keys each query head is quantized to q8_0 and a score is the blocks'
    f32(d_k * d_q) * exact integer sum, added in block order; q8_0 values are d * q, met by float32 weights
    (not rounded to f16). The caller has checked that every block read or written is mapped."""
    n, n_head, dh = q.shape
    n_kv = k.shape[1]
    group = n_head // n_kv
    nb = dh // 32
    scale = F32(scale)
    softcap = F32(softcap)
    for r in range(n):
        slot = _slot(table, block_size, seq_ids[r], positions[r])
        for hh in range(n_kv):
            if k8:
                _q8_store(k[r, hh], kc[slot, hh])
            else:
                for d in range(dh):
                    kc[slot, hh, d] = f32_to_f16_bits(k[r, hh, d])
            if v8:
                _q8_store(v[r, hh], vc[slot, hh])
            else:
                for d in range(dh):
                    vc[slot, hh, d] = f32_to_f16_bits(v[r, hh, d])
    qg = np.empty((group, dh), F32)
    qrow = np.empty((group, nb * 34), np.uint8)
    qi = np.empty((group, dh), np.int32)
    qd = np.empty((group, nb), F32)
    kf = np.empty(dh, F32)
    acc = np.empty((group, dh), F32)
    for r in range(n):
        slots = _key_slots(table, block_size, seq_ids[r], positions[r], window)
        t = len(slots)
        scores = np.empty((group, t), F32)
        for g in range(n_kv):
            for i in range(group):
                if k8:
                    _q8_store(q[r, g * group + i], qrow[i])
                    for b in range(nb):
                        qd[i, b] = _q8_scale(qrow[i], b)
                        for j in range(32):
                            qi[i, b * 32 + j] = _q8_int(qrow[i], b, j)
                else:
                    for d in range(dh):
                        qg[i, d] = f16_to_f32(f32_to_f16_bits(q[r, g * group + i, d]))
            for j in range(t):
                krow = kc[slots[j], g]
                if k8:
                    for i in range(group):
                        s = F32(0)
                        for b in range(nb):
                            isum = 0
                            for e in range(32):
                                isum += qi[i, b * 32 + e] * _q8_int(krow, b, e)
                            dd = _q8_scale(krow, b) * qd[i, b]
                            s = s + dd * F32(isum)
                        scores[i, j] = s
                else:
                    for d in range(dh):
                        kf[d] = _f16_bits_to_f32(krow[d])
                    for i in range(group):
                        s = F32(0)
                        for d in range(dh):
                            s += qg[i, d] * kf[d]
                        scores[i, j] = s
                for i in range(group):
                    s = scores[i, j] * scale
                    if softcap > 0:
                        s = softcap * np.tanh(s / softcap)
                    scores[i, j] = s
            _softmax_rows(scores, group, t, not v8)
            for i in range(group):
                for d in range(dh):
                    acc[i, d] = F32(0)
            for j in range(t):
                vrow = vc[slots[j], g]
                if v8:
                    for b in range(nb):
                        db = _q8_scale(vrow, b)
                        for e in range(32):
                            kf[b * 32 + e] = db * F32(_q8_int(vrow, b, e))
                else:
                    for d in range(dh):
                        kf[d] = _f16_bits_to_f32(vrow[d])
                _add_weighted(acc, scores, j, kf)
            _write_heads(out, acc, r, g)


@njit(cache=True, nogil=True)
def silu_mul(gate, up, out):
    """SwiGLU over flat float32 arrays: gate / (1 + exp(-gate)) * up."""
    for i in range(gate.size):
        g = gate[i]
        out[i] = g / (F32(1) + np.exp(-g)) * up[i]


@njit(cache=True, nogil=True)
def gelu_mul(gate, up, table, out):
    """GeGLU with ggml's GELU(tanh) table indexed by the f16 bits of gate (table: 65536 float32 values)."""
    for i in range(gate.size):
        g = gate[i]
        if g <= F32(-10):
            y = F32(0)
        elif g >= F32(10):
            y = g
        else:
            y = table[f32_to_f16_bits(g)]
        out[i] = y * up[i]


# -- element-wise ops: HostBackend's numpy defaults, compiled (the same float32 operations) --------------
@njit(cache=True, nogil=True)
def add(a, b, out):
    for i in range(a.size):
        out[i] = a[i] + b[i]


@njit(cache=True, nogil=True)
def add_row(a, b, out):
    """a (N, K) + b (K,) on every row."""
    n, k = a.shape
    for r in range(n):
        for j in range(k):
            out[r, j] = a[r, j] + b[j]


@njit(cache=True, nogil=True)
def scale(x, s, out):
    s = F32(s)
    for i in range(x.size):
        out[i] = x[i] * s


@njit(cache=True, nogil=True)
def softcap(x, cap, out):
    """cap * tanh(x / cap), tanh in double as base.Backend.softcap."""
    c = F32(cap)
    for i in range(x.size):
        out[i] = c * F32(np.tanh(np.float64(x[i] / c)))


@njit(cache=True, nogil=True)
def columns(x, start, out):
    n, w = out.shape
    for r in range(n):
        for j in range(w):
            out[r, j] = x[r, start + j]
