"""What every decoder-only architecture here shares: the shape of its KV cache and its output head."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T

from edgellm.backends.paged_kv import check_cache_type, row_bytes
from edgellm.gguf import QTensor


def hadamard(n: int) -> np.ndarray:
    """The orthonormal Walsh-Hadamard matrix of order n (a power of two) in Sylvester's order, float32,
    every entry +-f32(1 / sqrtf(n)); symmetric, its own inverse. As llama.cpp's ggml_gen_hadamard
    (ggml-org/llama.cpp, src/llama-kv-cache.cpp)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"a Walsh-Hadamard matrix needs a power of two, not {n}")
    h = np.ones((1, 1), np.float32)
    while len(h) < n:
        h = np.block([[h, h], [h, -h]])
    return h * np.float32(1.0 / float(np.sqrt(np.float32(n))))


def kv_rotations(type_k: str, type_v: str, head_dim: int) -> tuple[int, int]:
    """The orders of the Walsh-Hadamard rotations a quantized KV cache takes (0: none), as llama.cpp's
    llama_kv_cache (attn_rot_k / attn_rot_v, build_input_k_rot / _v_rot): K (and q with it) where K is
    quantized and the head a multiple of 64, in blocks of the largest power of two dividing the head;
    V (and the attention's output, rotated back) likewise, in blocks of 64. Rotating spreads a head's
    outliers over its block before q8_0 rounds it: Qwen2.5-Coder-0.5B's perplexity with a q8_0 cache
    (README) moved about a third as far from f16's. EDGELLM_KV_ROTATION=0 turns it off (llama.cpp:
    LLAMA_ATTN_ROT_DISABLE=1)."""
    if os.environ.get("EDGELLM_KV_ROTATION", "1") == "0" or head_dim % 64:
        return 0, 0
    rot_k = 64
    while head_dim % (2 * rot_k) == 0:
        rot_k *= 2
    return (rot_k if type_k != "f16" else 0), (64 if type_v != "f16" else 0)


class DecoderModel:
    """Base of the model classes; a subclass sets config, backend, output_norm and output (and, where its
    architecture has them, output_bias and final_softcap), and a forward() that ends in head()."""

    config: Any
    backend: Any
    output_norm: Any  # (D,)
    output: Any  # (V, D), or the tied token embedding
    output_bias: Any = None  # (V,) added to the logits (qwen2's optional output.bias)
    final_softcap: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma's final soft-capping)
    cache_type_k: str = "f16"  # how its KV caches store K and V (set_cache_types)
    cache_type_v: str = "f16"
    kv_rotation: tuple[Any, Any] = (None, None)  # (order, bound Hadamard matrix) for K and V, or None

    def set_cache_types(self, type_k: str = "f16", type_v: str = "f16") -> None:
        """Store K and V of every KV cache made from now on as `type_k` / `type_v` ("f16" or "q8_0",
        llama.cpp's -ctk / -ctv). ValueError, naming what is wrong, for a type this model's heads or this
        backend cannot hold."""
        for which, kind in (("K", type_k), ("V", type_v)):
            check_cache_type(kind, self.config.head_dim, which)
            if not self.backend.supports("kv_cache", kind):
                raise ValueError(f"the {self.backend.name} backend cannot hold a {kind} {which} cache")
        self.cache_type_k, self.cache_type_v = type_k, type_v
        orders = kv_rotations(type_k, type_v, self.config.head_dim)
        self.kv_rotation = tuple((n, self._bound_hadamard(n)) if n else None for n in orders)

    def _bound_hadamard(self, n: int) -> Any:
        data = hadamard(n).view(np.uint8)
        data.flags.writeable = False
        return self.backend.bind(QTensor(f"hadamard.{n}", T.F32, (n, n), 0, data.nbytes, data))

    def attend(
        self, q: Any, k: Any, v: Any, kv: Any, il: int, seq_ids: Any, positions: Any, scale: float, **kw: Any
    ) -> Any:
        """backend.attention (q (N, H, Dh), k and v (N, Hkv, Dh)), through the Walsh-Hadamard rotations
        of a quantized cache (kv_rotations): q and k rotated alike keep their dot products; v is stored
        rotated and the output rotated back (the matrix is its own inverse)."""
        b, (rot_k, rot_v) = self.backend, self.kv_rotation
        if rot_k is not None:
            q, k = self._rotate(q, rot_k), self._rotate(k, rot_k)
        if rot_v is not None:
            v = self._rotate(v, rot_v)
        a = b.attention(q, k, v, kv, il, seq_ids, positions, scale, **kw)
        return self._rotate(a, rot_v) if rot_v is not None else a

    def _rotate(self, x: Any, rot: tuple[int, Any]) -> Any:
        """x's rows in blocks of the rotation's order n, each multiplied by the n x n matrix."""
        n, w = rot
        return self.backend.matmul(w, x.reshape(-1, n)).reshape(x.shape)

    def new_kv_cache(
        self,
        n_ctx: int,
        n_seqs: int = 1,
        block_size: int | None = None,
        n_blocks: int | None = None,
        window_rings: bool = True,
    ) -> Any:
        """The backend's paged KV cache for this model (see Backend.new_kv_cache). With `window_rings`,
        sliding-window layers keep only a ring of their window (plus one prefill chunk) per sequence; a
        prefix cache, which shares blocks between sequences, needs them off."""
        c = self.config
        b = self.backend
        local = self.window_layers() if window_rings else ()
        window = c.sliding_window if local else None
        return b.new_kv_cache(
            c.n_layer, c.n_head_kv, c.head_dim, n_ctx, n_seqs, block_size, n_blocks, local, window,
            type_k=self.cache_type_k, type_v=self.cache_type_v,
        )  # fmt: skip

    def window_layers(self) -> list[int]:
        """Layers that attend through a sliding window (none by default)."""
        return []

    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V (of the cache types set) one position takes over all layers."""
        c = self.config
        per_head = row_bytes(self.cache_type_k, c.head_dim) + row_bytes(self.cache_type_v, c.head_dim)
        return c.n_layer * c.n_head_kv * per_head

    def decode_step(
        self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, kv: Any
    ) -> np.ndarray:
        """Logits (B, V) for one token of each of B sequences: forward() through the backend's decode
        path (which may replay a captured plan instead of calling the ops one by one)."""
        return self.backend.decode_step(self, tokens, positions, seq_ids, kv)

    def decode_top_k(
        self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, kv: Any, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """decode_step's k best candidates per row (ids, logits), largest first (Backend.decode_top_k)."""
        return self.backend.decode_top_k(self, tokens, positions, seq_ids, kv, k)

    def hidden(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, kv: Any) -> Any:
        """The architecture's blocks: hidden states (N, D) on the backend, before the logits step."""
        raise NotImplementedError

    def forward(
        self,
        tokens: np.ndarray,
        positions: np.ndarray,
        seq_ids: np.ndarray,
        kv: Any,
        logits_rows: np.ndarray | None = None,
    ) -> np.ndarray:
        """Run N tokens (each with its position and sequence id, host int64 arrays) and return host
        logits (len(logits_rows), V); `logits_rows` selects which of the N tokens need them (default:
        all)."""
        return self.head(self.hidden(tokens, positions, seq_ids, kv), logits_rows)

    def decode_greedy(
        self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, kv: Any
    ) -> np.ndarray:
        """decode_step's argmax token per row (B,) int64, without bringing the logits to the host."""
        return self.backend.decode_greedy(self, tokens, positions, seq_ids, kv)

    def logits(self, x: Any, logits_rows: np.ndarray | None = None) -> Any:
        """The logits step every architecture ends with, on the backend: the rows that need logits ->
        final RMSNorm -> output matrix -> + output bias -> soft-cap. (N, D) -> (len(rows), V)."""
        b = self.backend
        if logits_rows is not None:
            x = b.take_rows(x, logits_rows)
        out = b.matmul(self.output, b.rms_norm(x, self.output_norm, self.config.rms_eps))
        if self.output_bias is not None:
            out = b.add(out, self.output_bias)
        if self.final_softcap:
            out = b.softcap(out, self.final_softcap)
        return out

    def head(self, x: Any, logits_rows: np.ndarray | None) -> np.ndarray:
        """logits() brought to the host: what forward() returns."""
        return self.backend.to_host(self.logits(x, logits_rows))

    def embeddings(self, tokens: np.ndarray, chunk: int = 512) -> np.ndarray:
        """Hidden states after the final norm, (N, D) float32 on the host, for one sequence run through a
        KV cache of its own: what llama.cpp calls t_embd (the input of the output matrix), pooled into
        embeddings by edgellm/embed.py."""
        b = self.backend
        n = len(tokens)
        kv = self.new_kv_cache(n, 1)
        out = []
        for s in range(0, n, chunk):
            part = np.asarray(tokens[s : s + chunk], np.int64)
            pos = np.arange(s, s + len(part), dtype=np.int64)
            x = self.hidden(part, pos, np.zeros(len(part), np.int64), kv)
            out.append(b.to_host(b.rms_norm(x, self.output_norm, self.config.rms_eps)))
        return np.concatenate(out, axis=0).astype(np.float32, copy=False)
