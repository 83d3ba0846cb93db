"""The reference backend: every op in plain numpy, written to be read and to match llama.cpp's numbers.

Weights are dequantized to float32 once, when first used in a matmul (embeddings are dequantized row by
row on lookup). The KV cache is float16, like llama.cpp's default, and queries and attention weights are
rounded to float16 before their products with it, as ggml's f16 matmul does (ggml-cpu: `vec_dot_f16`
converts the f32 operand to f16). Slow, simple and the oracle for every fast backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgellm import quants
from edgellm.backends.base import Backend, RopeSpec
from edgellm.gguf import QTensor


@dataclass
class RefWeight:
    qt: QTensor
    _f32: np.ndarray | None = field(default=None, repr=False)

    @property
    def f32(self) -> np.ndarray:
        """(M, K) float32, dequantized on first use."""
        if self._f32 is None:
            self._f32 = quants.dequantize(self.qt.data, self.qt.type, self.qt.shape).reshape(-1, self.qt.ne[0])
        return self._f32


class KVCache:
    """Contiguous float16 cache: k, v of shape (layers, seqs, positions, Hkv, Dh)."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, n_ctx: int, n_seqs: int):
        shape = (n_layers, n_seqs, n_ctx, n_kv_heads, head_dim)
        self.k = np.zeros(shape, np.float16)
        self.v = np.zeros(shape, np.float16)
        self.n_ctx = n_ctx
        self.n_seqs = n_seqs

    def clear(self, seq: int | None = None) -> None:
        """Nothing to free: positions are overwritten before they are read."""


def _f16_round(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


class ReferenceBackend(Backend):
    name = "reference"

    def __init__(self, threads: int | None = None):
        self.threads = threads  # numpy's BLAS picks its own thread count

    def bind(self, t: QTensor) -> RefWeight:
        return RefWeight(t)

    def vector(self, t: QTensor) -> np.ndarray:
        return quants.dequantize(t.data, t.type, t.shape).reshape(-1).astype(np.float32)

    def get_rows(self, w: RefWeight, ids: np.ndarray) -> np.ndarray:
        rows = w.qt.data[np.asarray(ids, np.int64)]
        return quants.dequantize(rows, w.qt.type, (len(ids), w.qt.ne[0]))

    def matmul(self, w: RefWeight, x: np.ndarray) -> np.ndarray:
        return x @ w.f32.T

    def rms_norm(self, x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
        # ggml_compute_forward_rms_norm_f32: sum of squares in double, scale = 1/sqrtf(mean + eps)
        mean = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
        scale = (1.0 / np.sqrt((mean + eps).astype(np.float32))).astype(np.float32)
        y = x * scale
        return y * weight if weight is not None else y

    def rope(self, x: np.ndarray, positions: np.ndarray, spec: RopeSpec) -> np.ndarray:
        # ggml-cpu ops.cpp rope_f32 / ggml_rope_cache_init: theta_i = p * base^(-2i/n_dims) [/ factor_i]
        half = spec.n_dims // 2
        inv = np.float32(spec.freq_base) ** (-2.0 * np.arange(half, dtype=np.float32) / np.float32(spec.n_dims))
        if spec.freq_factors is not None:
            inv = inv / spec.freq_factors.astype(np.float32)
        theta = (positions.astype(np.float32) * np.float32(spec.freq_scale))[:, None] * inv[None, :]  # (N, half)
        cos = np.cos(theta).astype(np.float32)[:, None, :]
        sin = np.sin(theta).astype(np.float32)[:, None, :]
        out = x.copy()
        if spec.neox:  # pairs (i, i + n_dims/2)
            a, b = x[..., :half], x[..., half : spec.n_dims]
            out[..., :half] = a * cos - b * sin
            out[..., half : spec.n_dims] = a * sin + b * cos
        else:  # pairs (2i, 2i+1)
            a, b = x[..., 0 : spec.n_dims : 2], x[..., 1 : spec.n_dims : 2]
            out[..., 0 : spec.n_dims : 2] = a * cos - b * sin
            out[..., 1 : spec.n_dims : 2] = a * sin + b * cos
        return out

    def new_kv_cache(self, n_layers, n_kv_heads, head_dim, n_ctx, n_seqs) -> KVCache:
        return KVCache(n_layers, n_kv_heads, head_dim, n_ctx, n_seqs)

    def attention(self, q, k, v, kv: KVCache, layer, seq_ids, positions, scale, window=None, softcap=None):
        n, n_head, dh = q.shape
        n_kv_head = k.shape[1]
        group = n_head // n_kv_head
        if positions.max(initial=0) >= kv.n_ctx:
            raise ValueError(f"position {int(positions.max())} is outside the context of {kv.n_ctx}")
        kv.k[layer, seq_ids, positions] = k
        kv.v[layer, seq_ids, positions] = v
        out = np.empty((n, n_head, v.shape[-1]), np.float32)
        for s in np.unique(seq_ids):
            rows = np.nonzero(seq_ids == s)[0]
            pos = positions[rows]
            t = int(pos.max()) + 1
            keys = kv.k[layer, s, :t].astype(np.float32)  # (T, Hkv, Dh)
            vals = kv.v[layer, s, :t].astype(np.float32)
            qs = _f16_round(q[rows]).reshape(len(rows), n_kv_head, group, dh)
            # scores (Hkv, group, n, T)
            scores = np.einsum("nhgd,thd->hgnt", qs, keys, optimize=True) * np.float32(scale)
            if softcap:
                scores = np.float32(softcap) * np.tanh(scores / np.float32(softcap))
            j = np.arange(t)
            masked = j[None, :] > pos[:, None]
            if window:
                masked |= j[None, :] <= pos[:, None] - window
            scores = np.where(masked[None, None], np.float32(-np.inf), scores)
            scores -= scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=-1, keepdims=True)
            o = np.einsum("hgnt,thd->nhgd", _f16_round(p), vals, optimize=True)
            out[rows] = o.reshape(len(rows), n_head, -1)
        return out
