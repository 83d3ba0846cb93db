"""What every decoder-only architecture here shares: the shape of its KV cache and its output head."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgellm.backends.paged_kv import check_cache_type, row_bytes


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

    def set_cache_types(self, type_k: str = "f16", type_v: str = "f16") -> None:
        """Store K and V of every KV cache made from now on as `type_k` / `type_v` ("f16" or "q8_0",
        llama.cpp's -ctk / -ctv). ValueError, naming what is wrong, for a type this model's heads or this
        backend cannot hold."""
        for which, kind in (("K", type_k), ("V", type_v)):
            check_cache_type(kind, self.config.head_dim, which)
            if not self.backend.supports("kv_cache", kind):
                raise ValueError(f"the {self.backend.name} backend cannot hold a {kind} {which} cache")
        self.cache_type_k, self.cache_type_v = type_k, type_v

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
