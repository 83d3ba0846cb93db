"""The reference backend: every op in plain numpy, written to be read and to match llama.cpp's numbers.

Weights are dequantized to float32 once, when first used in a matmul (embeddings are dequantized row by
row on lookup). The KV cache is float16, like llama.cpp's default, and queries and attention weights are
rounded to float16 before their products with it, as ggml's f16 matmul does (ggml-cpu: `vec_dot_f16`
converts the f32 operand to f16). Slow, simple and the oracle for every fast backend.

The oracle is the same on every CPU: sums of products (matmuls, attention) accumulate in float64, where
every product of two float32 operands is exact and the order of the sum moves the result by ~1e-13 of
its size, and transcendental functions (exp, tanh, cos, sin) are evaluated in float64 and rounded once
to float32. Float32 BLAS kernels and numpy's float32 SIMD math differ between CPUs (AVX2 and AVX-512
sum in other orders) by ~1e-4 relative, enough to cross a Q8_0 rounding boundary of the next layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T

from edgellm import quants
from edgellm.backends.base import Backend, RopeSpec, rope_table
from edgellm.backends.paged_kv import CACHE_TYPES, KVCache, q8_0_decode, q8_0_encode, q8_0_values
from edgellm.gguf import QTensor


@dataclass
class RefWeight:
    qt: QTensor
    _f32: np.ndarray | None = field(default=None, repr=False)
    _mins: np.ndarray | None = field(default=None, repr=False)
    _f64: np.ndarray | None = field(default=None, repr=False)

    @property
    def f32(self) -> np.ndarray:
        """(M, K) float32, dequantized on first use."""
        if self._f32 is None:
            self._f32 = quants.dequantize(self.qt.data, self.qt.type, self.qt.shape).reshape(
                -1, self.qt.ne[0]
            )
        return self._f32

    @property
    def f64(self) -> np.ndarray:
        """(M, K) float64 (the same values), cached for the reference's exact matmuls."""
        if self._f64 is None:
            self._f64 = (
                self._f32.astype(np.float64)
                if self._f32 is not None
                else quants.dequantize(self.qt.data, self.qt.type, self.qt.shape)
                .reshape(-1, self.qt.ne[0])
                .astype(np.float64)
            )
        return self._f64

    @property
    def block_mins(self) -> np.ndarray:
        """(M, K/32) float32 block minimums `m` of a Q4_1/Q5_1 weight (the f16 at bytes 2..4 of a block)."""
        if self._mins is None:
            qt = self.qt
            blocks = qt.data.reshape(qt.data.shape[0], qt.ne[0] // 32, -1)
            self._mins = np.ascontiguousarray(blocks[:, :, 2:4]).view(np.float16)[..., 0].astype(np.float32)
        return self._mins


def activation_roundtrip(x: np.ndarray, weight_type: T) -> np.ndarray:
    """x as ggml's CPU dot products see it: quantized to the weight type's activation type and back.

    ggml-cpu multiplies a quantized weight with activations quantized once per matmul (type_traits_cpu
    vec_dot_type): Q8_0 (blocks of 32, d = amax/127 stored as f16) for the legacy types, Q8_1 (same values)
    for Q4_1/Q5_1, Q8_K (blocks of 256, d = max/-127 kept in f32) for K-quants, f16 / bf16 for F16 / BF16.
    Reproducing that rounding here keeps the reference within float-summation noise of llama.cpp.
    """
    t = quants.quant_type(weight_type).vec_dot_type
    if t is None or t == T.F32:
        return x
    if t == T.F16:
        return _f16_round(x)
    if t == T.BF16:
        return _bf16_round(x)
    shape = x.shape
    if t in (T.Q8_0, T.Q8_1):
        d, q = _q8_blocks(x)
        return (_f16_round(d) * q).reshape(shape)
    if t == T.Q8_K:
        b = x.reshape(-1, 256)
        idx = np.abs(b).argmax(axis=1)
        vmax = b[np.arange(len(b)), idx][:, None]  # signed value of largest magnitude
        with np.errstate(divide="ignore", invalid="ignore"):
            iscale = np.where(vmax != 0, np.float32(-127) / vmax, np.float32(0)).astype(np.float32)
            q = np.minimum(np.float32(127), np.rint(iscale * b))  # ggml nearest_int: halves to even
            d = np.where(iscale != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
        return (d * q).reshape(shape)
    return x


def _q8_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml-cpu quantize_row_q8_0/q8_1 on blocks of 32: (d (..., 1) = amax/127 in f32, q (..., 32) as f32).
    Its SIMD path rounds to nearest even and multiplies by 127/amax."""
    b = x.reshape(-1, 32)
    amax = np.abs(b).max(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0))
    return amax / np.float32(127), np.rint(b * inv)


def _bf16_round(x: np.ndarray) -> np.ndarray:
    """ggml_compute_fp32_to_bf16: round to nearest even on the top 16 bits (NaN stays NaN)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, r).reshape(x.shape)


def _f16_round(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def exact_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b of float32 operands accumulated in float64 and rounded once to float32: the same bits on
    every CPU (bar a ~1e-6 chance per element of a last-bit difference), unlike a float32 BLAS product."""
    return (a.astype(np.float64) @ b.astype(np.float64, copy=False)).astype(np.float32)


def exact_einsum(spec: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """np.einsum of float32 operands in float64, rounded once to float32 (see exact_dot)."""
    return np.einsum(spec, a.astype(np.float64), b.astype(np.float64), optimize=True).astype(np.float32)


def q8_0_scores(q: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Scores (Hkv, group, n, T) of queries q (n, Hkv, group, Dh) float32 against q8_0 keys (T, Hkv, Dh / 32 *
    34), as ggml-cpu's flash attention computes them over a q8_0 K cache: each query head quantized to q8_0
    (the cache's own quantizer), then vec_dot_q8_0_q8_0: per block the exact integer sum times
    f32(d_k * d_q), the blocks added in order in float32 (every step rounded once, as every backend does)."""
    qd, qi = q8_0_decode(q8_0_encode(q))  # (n, Hkv, g, nb), (n, Hkv, g, nb, 32)
    kd, ki = q8_0_decode(keys)  # (T, Hkv, nb), (T, Hkv, nb, 32)
    isum = np.einsum("nhgbi,thbi->hgntb", qi.astype(np.int32), ki.astype(np.int32)).astype(np.float32)
    d = np.einsum("nhgb,thb->hgntb", qd, kd)  # one product each: exact float32 rounding of d_q * d_k
    s = np.zeros(isum.shape[:-1], np.float32)
    for b in range(isum.shape[-1]):
        s = s + d[..., b] * isum[..., b]
    return s


def exp32(x: np.ndarray) -> np.ndarray:
    """exp of float32 values, correctly rounded to float32 (float64 exp, one rounding): numpy's float32
    exp has per-CPU SIMD variants."""
    return np.exp(np.asarray(x, np.float64)).astype(np.float32)


def tanh32(x: np.ndarray) -> np.ndarray:
    """tanh of float32 values through float64, rounded once (see exp32)."""
    return np.tanh(np.asarray(x, np.float64)).astype(np.float32)


class ReferenceBackend(Backend):
    name = "reference"

    def __init__(self, threads: int | None = None, exact: bool = True):
        self.threads = threads  # numpy's BLAS picks its own thread count
        # exact=False: float32 BLAS matmuls on float32 weights (half the memory, CPU-dependent sums), for
        # the fast backends' fallback; the oracle is exact
        self.exact = exact

    def bind(self, t: QTensor) -> RefWeight:
        return RefWeight(t)

    def vector(self, t: QTensor) -> np.ndarray:
        return quants.dequantize(t.data, t.type, t.shape).reshape(-1).astype(np.float32)

    def get_rows(self, w: RefWeight, ids: np.ndarray) -> np.ndarray:
        rows = w.qt.data[np.asarray(ids, np.int64)]
        return quants.dequantize(rows, w.qt.type, (len(ids), w.qt.ne[0]))

    def matmul(self, w: RefWeight, x: np.ndarray) -> np.ndarray:
        if w.qt.type not in (T.Q4_1, T.Q5_1):
            xa = activation_roundtrip(x, w.qt.type)
            return exact_dot(xa, w.f64.T) if self.exact else xa @ w.f32.T
        # Q8_1 activations. ggml's q4_1 x q8_1 dot adds m * s with s = f16(d * sum(q)) precomputed per
        # activation block, not m * f16(d) * sum(q) as the dequantized product would: add the difference.
        d, q = _q8_blocks(x)
        d16 = _f16_round(d)
        sq = q.sum(axis=1, keepdims=True)
        correction = (_f16_round(d * sq) - d16 * sq).reshape(x.shape[0], -1)  # (N, K/32)
        main = (d16 * q).reshape(x.shape).astype(np.float64) @ w.f64.T
        return (main + correction.astype(np.float64) @ w.block_mins.T.astype(np.float64)).astype(np.float32)

    def rms_norm(self, x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
        # ggml_compute_forward_rms_norm_f32: sum of squares in double, scale = 1/sqrtf(mean + eps)
        mean = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
        scale = (1.0 / np.sqrt((mean + eps).astype(np.float32))).astype(np.float32)
        y = x * scale
        return y * weight if weight is not None else y

    def rope(self, x: np.ndarray, positions: np.ndarray, spec: RopeSpec) -> np.ndarray:
        # ggml-cpu ops.cpp ggml_rope_cache_init (see base.rope_table), at these positions
        half = spec.n_dims // 2
        cos, sin = rope_table(spec, int(np.max(positions, initial=0)) + 1)
        pos = np.asarray(positions, np.int64)
        cos, sin = cos[pos][:, None, :], sin[pos][:, None, :]
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

    def supports(self, op: str, qtype: Any = None) -> bool:
        return qtype in CACHE_TYPES if op == "kv_cache" else True

    def new_kv_cache(self, *args: Any, **kwargs: Any) -> KVCache:
        # Backend.new_kv_cache's arguments are paged_kv.KVCache's
        return KVCache(*args, **kwargs)

    def attention(self, q, k, v, kv: KVCache, layer, seq_ids, positions, scale, window=None, softcap=None):
        n, n_head, dh = q.shape
        n_kv_head = k.shape[1]
        group = n_head // n_kv_head
        kv.check_window_chunk(seq_ids)
        kc, vc, table = kv.layer_view(layer)
        slots = kv.slots(seq_ids, positions, table)
        k8, v8 = kv.type_k == "q8_0", kv.type_v == "q8_0"
        kc[slots] = q8_0_encode(k) if k8 else k  # every row's k, v first, then attention
        vc[slots] = q8_0_encode(v) if v8 else v
        out = np.empty((n, n_head, v.shape[-1]), np.float32)
        for s in np.unique(seq_ids):
            rows = np.nonzero(seq_ids == s)[0]
            pos = positions[rows]
            t = int(pos.max()) + 1
            # positions 0..t-1 of s through its block table (on a ring, those before the window now
            # hold later positions: the window masks them)
            slots = kv.slots(np.full(t, s), np.arange(t), table)
            vals = q8_0_values(vc[slots]) if v8 else vc[slots].astype(np.float32)
            if k8:
                scores = q8_0_scores(q[rows].reshape(len(rows), n_kv_head, group, dh), kc[slots])
            else:
                qs = _f16_round(q[rows]).reshape(len(rows), n_kv_head, group, dh)
                # scores (Hkv, group, n, T)
                scores = exact_einsum("nhgd,thd->hgnt", qs, kc[slots].astype(np.float32))
            scores = scores * np.float32(scale)
            if softcap:
                scores = np.float32(softcap) * tanh32(scores / np.float32(softcap))
            j = np.arange(t)
            masked = j[None, :] > pos[:, None]
            if window:
                masked |= j[None, :] <= pos[:, None] - window
            scores = np.where(masked[None, None], np.float32(-np.inf), scores)
            scores -= scores.max(axis=-1, keepdims=True)
            p = exp32(scores)
            p /= p.astype(np.float64).sum(axis=-1, keepdims=True).astype(np.float32)
            # float16 values meet weights rounded to f16 (ggml's f16 matmul); q8_0 values meet them in
            # float32, as ggml-cpu's flash attention does with a quantized V (v_to_float, then mad in f32)
            o = exact_einsum("hgnt,thd->nhgd", p if v8 else _f16_round(p), vals)
            out[rows] = o.reshape(len(rows), n_head, -1)
        return out
