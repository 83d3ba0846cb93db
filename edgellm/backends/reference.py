"""The reference backend: every op in plain numpy, written to be read and to match llama.cpp's numbers.

Weights are dequantized to float32 once, when first used in a matmul (embeddings are dequantized row by
row on lookup). The KV cache is float16, like llama.cpp's default, and queries and attention weights are
rounded to float16 before their products with it, as ggml's f16 matmul does (ggml-cpu: `vec_dot_f16`
converts the f32 operand to f16). Slow, simple and the oracle for every fast backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from gguf import GGMLQuantizationType as T

from edgellm import quants
from edgellm.backends.base import Backend, RopeSpec
from edgellm.gguf import QTensor


@dataclass
class RefWeight:
    qt: QTensor
    _f32: np.ndarray | None = field(default=None, repr=False)
    _mins: np.ndarray | None = field(default=None, repr=False)

    @property
    def f32(self) -> np.ndarray:
        """(M, K) float32, dequantized on first use."""
        if self._f32 is None:
            self._f32 = quants.dequantize(self.qt.data, self.qt.type, self.qt.shape).reshape(
                -1, self.qt.ne[0]
            )
        return self._f32

    @property
    def block_mins(self) -> np.ndarray:
        """(M, K/32) float32 block minimums `m` of a Q4_1/Q5_1 weight (the f16 at bytes 2..4 of a block)."""
        if self._mins is None:
            qt = self.qt
            blocks = qt.data.reshape(qt.data.shape[0], qt.ne[0] // 32, -1)
            self._mins = np.ascontiguousarray(blocks[:, :, 2:4]).view(np.float16)[..., 0].astype(np.float32)
        return self._mins


DEFAULT_BLOCK_SIZE = 16  # positions per KV block (vLLM's default; llama.cpp's unified cache is one block)
WINDOW_CHUNK = 512  # most tokens of one sequence per forward on a sliding-window ring (PREFILL_CHUNK)


class KVCache:
    """Paged float16 cache: k, v of shape (layers, slots, Hkv, Dh), slots = n_blocks * block_size.

    block_table (seqs, max_blocks_per_seq) int32 names the block holding each run of block_size positions
    of a sequence (-1: unmapped); position p of sequence s lives at slot
    block_table[s, p // block_size] * block_size + p % block_size. Without n_blocks, every sequence owns
    its own consecutive blocks (the layout `generate.py` uses); with n_blocks the table starts unmapped
    and `edgellm.kvcache` fills it from one shared pool.

    Sliding-window layers (`window_layers`, attending to at most `window` positions) can keep a ring
    instead: each sequence owns R blocks, R * block_size >= window + window_chunk - 1, and logical block j
    of sequence s is ring block s * R + j % R (`ring_table`). A forward may then carry at most
    window_chunk tokens of one sequence (so none of them overwrites a position another still reads); the
    ring rows live in k_ring, v_ring. llama.cpp sizes its SWA cache the same way (n_swa + n_ubatch).
    Use `layer_view(layer)` for a layer's (k, v, block table).
    """

    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        n_ctx: int,
        n_seqs: int,
        block_size: int | None = None,
        n_blocks: int | None = None,
        window_layers: Sequence[int] = (),
        window: int | None = None,
        window_chunk: int = WINDOW_CHUNK,
    ):
        bs = int(block_size or DEFAULT_BLOCK_SIZE)
        if bs <= 0 or n_ctx <= 0 or n_seqs <= 0:
            raise ValueError(f"KV cache needs positive sizes, got block {bs}, ctx {n_ctx}, seqs {n_seqs}")
        per_seq = -(-n_ctx // bs)  # blocks one sequence may map
        if n_blocks is None:
            n_blocks = n_seqs * per_seq
            table = np.arange(n_blocks, dtype=np.int32).reshape(n_seqs, per_seq)
        else:
            table = np.full((n_seqs, per_seq), -1, np.int32)
        ring_blocks = -(-(int(window or 0) + window_chunk - 1) // bs)
        self.window_chunk = int(window_chunk)
        ring = sorted({int(i) for i in window_layers}) if window and ring_blocks < per_seq else []
        full = [i for i in range(n_layers) if i not in set(ring)]
        self._where = [(i in ring, (ring if i in ring else full).index(i)) for i in range(n_layers)]
        self.k = np.zeros((len(full), int(n_blocks) * bs, n_kv_heads, head_dim), np.float16)
        self.v = np.zeros_like(self.k)
        self.ring_layers = ring
        self.ring_blocks = ring_blocks if ring else 0
        self.ring_table = (
            (
                np.arange(n_seqs, dtype=np.int32)[:, None] * ring_blocks + np.arange(per_seq) % ring_blocks
            ).astype(np.int32)
            if ring
            else None
        )
        ring_shape = (len(ring), n_seqs * ring_blocks * bs if ring else 0, n_kv_heads, head_dim)
        self.k_ring = np.zeros(ring_shape, np.float16)
        self.v_ring = np.zeros_like(self.k_ring)
        self.block_table = table
        self.block_size = bs
        self.n_blocks = int(n_blocks)
        self.n_ctx = n_ctx  # positions per sequence
        self.n_seqs = n_seqs
        self._checked: tuple = ()  # the arrays check() last passed, and copies of their values

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + self.k_ring.nbytes + self.v_ring.nbytes

    def arrays(self) -> tuple[np.ndarray, ...]:
        """Every array the attention kernels read (a captured plan checks they are still these)."""
        return (self.k, self.v, self.block_table, self.k_ring, self.v_ring)

    def layer_view(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """k, v (slots, Hkv, Dh) float16 and the int32 block table of one layer."""
        ring, i = self._where[layer]
        if ring:
            return self.k_ring[i], self.v_ring[i], self.ring_table
        return self.k[i], self.v[i], self.block_table

    def check_window_chunk(self, seq_ids: np.ndarray) -> None:
        """Ring layers hold window + WINDOW_CHUNK - 1 positions: refuse a forward with more tokens of one
        sequence than that allows."""
        if self.ring_layers and len(seq_ids) > self.window_chunk:
            most = int(np.bincount(np.asarray(seq_ids, np.int64)).max())
            if most > self.window_chunk:
                raise ValueError(
                    f"{most} tokens of one sequence in one forward; a sliding-window cache takes at most "
                    f"{self.window_chunk}"
                )

    def check(self, seq_ids: np.ndarray, positions: np.ndarray) -> None:
        """check_window_chunk and slots' checks, made once per forward: every layer of a forward passes
        the same arrays, so a repeat of the last checked (unchanged) arrays returns at once."""
        c = self._checked
        if c and c[0] is seq_ids and c[1] is positions:
            if np.array_equal(c[2], seq_ids) and np.array_equal(c[3], positions):
                return
        self.check_window_chunk(seq_ids)
        self.slots(seq_ids, positions)
        self._checked = (seq_ids, positions, np.copy(seq_ids), np.copy(positions))

    def slots(
        self, seq_ids: np.ndarray, positions: np.ndarray, table: np.ndarray | None = None
    ) -> np.ndarray:
        """Cache slots (int64) of (seq, position) pairs, through `table` (default: the block table; a
        ring layer passes ring_table). Raises ValueError if a position is outside the context, or if a
        block holding it or any earlier position of its sequence is unmapped: attention reads positions
        0..p, and native kernels rely on this check having been made."""
        seq_ids = np.asarray(seq_ids, np.int64)
        positions = np.asarray(positions, np.int64)
        if positions.size == 0:
            return positions
        if positions.max() >= self.n_ctx or positions.min() < 0:
            bad = int(positions.max()) if positions.max() >= self.n_ctx else int(positions.min())
            raise ValueError(f"position {bad} is outside the context of {self.n_ctx}")
        if seq_ids.min() < 0 or seq_ids.max() >= self.n_seqs:
            raise ValueError(f"sequence id outside 0..{self.n_seqs - 1}")
        seqs, row_seq = np.unique(seq_ids, return_inverse=True)
        unmapped = self.block_table[seqs] < 0  # (distinct seqs, max blocks)
        first_hole = np.where(unmapped.any(axis=1), unmapped.argmax(axis=1), unmapped.shape[1])[row_seq]
        blk = positions // self.block_size
        if (blk >= first_hole).any():
            i = int(np.argmax(blk >= first_hole))
            raise ValueError(f"sequence {int(seq_ids[i])} has no KV block for position {int(positions[i])}")
        table = self.block_table if table is None else table
        return table[seq_ids, blk].astype(np.int64) * self.block_size + positions % self.block_size

    def clear(self, seq: int | None = None) -> None:
        """Nothing to free: positions are overwritten before they are read."""


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
        if w.qt.type not in (T.Q4_1, T.Q5_1):
            return activation_roundtrip(x, w.qt.type) @ w.f32.T
        # Q8_1 activations. ggml's q4_1 x q8_1 dot adds m * s with s = f16(d * sum(q)) precomputed per
        # activation block, not m * f16(d) * sum(q) as the dequantized product would: add the difference.
        d, q = _q8_blocks(x)
        d16 = _f16_round(d)
        sq = q.sum(axis=1, keepdims=True)
        correction = (_f16_round(d * sq) - d16 * sq).reshape(x.shape[0], -1)  # (N, K/32)
        return (d16 * q).reshape(x.shape) @ w.f32.T + correction @ w.block_mins.T

    def rms_norm(self, x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
        # ggml_compute_forward_rms_norm_f32: sum of squares in double, scale = 1/sqrtf(mean + eps)
        mean = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
        scale = (1.0 / np.sqrt((mean + eps).astype(np.float32))).astype(np.float32)
        y = x * scale
        return y * weight if weight is not None else y

    def rope(self, x: np.ndarray, positions: np.ndarray, spec: RopeSpec) -> np.ndarray:
        # ggml-cpu ops.cpp ggml_rope_cache_init: theta_0 = p, theta_{i+1} = theta_i * base^(-2/n_dims), in f32
        # (the running product's rounding matters at long positions), then theta / factor_i * freq_scale
        half = spec.n_dims // 2
        theta_scale = np.float32(spec.freq_base) ** np.float32(-2.0 / spec.n_dims)
        theta = np.empty((len(positions), half), np.float32)
        theta[:, 0] = positions.astype(np.float32)
        for i in range(1, half):
            theta[:, i] = theta[:, i - 1] * theta_scale
        if spec.freq_factors is not None:
            theta = theta / spec.freq_factors.astype(np.float32)
        theta = theta * np.float32(spec.freq_scale)
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

    def new_kv_cache(
        self,
        n_layers,
        n_kv_heads,
        head_dim,
        n_ctx,
        n_seqs,
        block_size=None,
        n_blocks=None,
        window_layers=(),
        window=None,
    ) -> KVCache:
        return KVCache(
            n_layers, n_kv_heads, head_dim, n_ctx, n_seqs, block_size, n_blocks, window_layers, window
        )

    def attention(self, q, k, v, kv: KVCache, layer, seq_ids, positions, scale, window=None, softcap=None):
        n, n_head, dh = q.shape
        n_kv_head = k.shape[1]
        group = n_head // n_kv_head
        kv.check_window_chunk(seq_ids)
        kc, vc, table = kv.layer_view(layer)
        slots = kv.slots(seq_ids, positions, table)
        kc[slots] = k  # every row's k, v first, then attention
        vc[slots] = v
        out = np.empty((n, n_head, v.shape[-1]), np.float32)
        for s in np.unique(seq_ids):
            rows = np.nonzero(seq_ids == s)[0]
            pos = positions[rows]
            t = int(pos.max()) + 1
            # positions 0..t-1 of s through its block table (on a ring, those before the window now
            # hold later positions: the window masks them)
            slots = kv.slots(np.full(t, s), np.arange(t), table)
            keys = kc[slots].astype(np.float32)  # (T, Hkv, Dh)
            vals = vc[slots].astype(np.float32)
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
