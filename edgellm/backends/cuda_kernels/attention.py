"""numba.cuda kernels for attention over the paged f16 KV cache: store K and V rows, then attend.

The operations are the reference backend's (reference.py ReferenceBackend.attention): q rounded to f16,
q.k in float32, times scale, optional softcap c * tanh(s / c) (tanh in double, rounded once), softmax
with exp in double rounded once and the sum in double, weights rounded to f16 before their product with
the values. Position p of sequence s is slot table[s, p // bs] * bs + p % bs (paged_kv.KVCache); K and V
are (slots, Hkv, Dh) f16 bit patterns.
"""

from __future__ import annotations

import math

from numba import cuda, float32, float64

from edgellm.backends.cuda_kernels.ops import TB, f16_round, f16_to_f32, f32_to_f16
from edgellm.backends.cuda_kernels.rn import add, div, mul, sub

MAX_HEAD_DIM = 256


@cuda.jit
def store(k, v, kc, vc, table, seqs, pos, bs):
    """kc, vc[slot of (seqs[i], pos[i]), h, :] = f16 of k, v[i, h, :] for every row i."""
    n, hkv, dh = k.shape
    i = cuda.grid(1)
    for e in range(i, n * hkv * dh, cuda.gridsize(1)):
        r = e // (hkv * dh)
        h = (e // dh) % hkv
        d = e % dh
        p = pos[r]
        slot = table[seqs[r], p // bs] * bs + p % bs
        kc[slot, h, d] = f32_to_f16(k[r, h, d])
        vc[slot, h, d] = f32_to_f16(v[r, h, d])


@cuda.jit
def attend(q, kc, vc, table, seqs, pos, out, scores, bs, window, scale, softcap):
    """A block per (row, query head), striding past the grid: scores over positions lo..p of the row's
    sequence into scores[block, :], their softmax, then the f16-rounded weights times the values."""
    n, n_head, dh = q.shape
    hkv = kc.shape[1]
    t = cuda.threadIdx.x
    qh = cuda.shared.array(MAX_HEAD_DIM, float32)
    red = cuda.shared.array(TB, float64)
    sc = float32(scale)
    cap = float32(softcap)
    for b in range(cuda.blockIdx.x, n * n_head, cuda.gridDim.x):
        r = b // n_head
        h = b % n_head
        g = h // (n_head // hkv)
        s = seqs[r]
        p = pos[r]
        lo = max(0, p - window + 1) if window > 0 else 0
        for d in range(t, dh, TB):
            qh[d] = f16_round(q[r, h, d])
        cuda.syncthreads()
        m = float32(-math.inf)
        for j in range(lo + t, p + 1, TB):
            slot = table[s, j // bs] * bs + j % bs
            acc = float32(0)
            for d in range(dh):
                acc += qh[d] * f16_to_f32(kc[slot, g, d])
            x = mul(acc, sc)
            if cap > 0:
                x = mul(cap, float32(math.tanh(float64(div(x, cap)))))
            scores[b, j] = x
            m = max(m, x)
        red[t] = m
        cuda.syncthreads()
        if t == 0:
            for u in range(1, TB):
                red[0] = max(red[0], red[u])
        cuda.syncthreads()
        m = float32(red[0])
        cuda.syncthreads()
        total = float64(0)
        for j in range(lo + t, p + 1, TB):
            e = float32(math.exp(float64(sub(scores[b, j], m))))
            scores[b, j] = e
            total += float64(e)
        red[t] = total
        cuda.syncthreads()
        if t == 0:
            for u in range(1, TB):
                red[0] += red[u]
        cuda.syncthreads()
        norm = float32(red[0])
        for j in range(lo + t, p + 1, TB):
            scores[b, j] = f16_round(div(scores[b, j], norm))
        cuda.syncthreads()
        for d in range(t, dh, TB):
            acc = float32(0)
            for j in range(lo, p + 1):
                slot = table[s, j // bs] * bs + j % bs
                acc = add(acc, scores[b, j] * f16_to_f32(vc[slot, g, d]))
            out[r, h, d] = acc
        cuda.syncthreads()
