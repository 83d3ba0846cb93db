"""What every decoder-only architecture here shares: the shape of its KV cache and its output head."""

from __future__ import annotations

from typing import Any

import numpy as np


class DecoderModel:
    """Base of the model classes; a subclass sets config, backend, output_norm and output, and forward()."""

    config: Any
    backend: Any
    output_norm: np.ndarray  # (D,)
    output: Any  # (V, D), or the tied token embedding

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
            c.n_layer, c.n_head_kv, c.head_dim, n_ctx, n_seqs, block_size, n_blocks, local, window
        )

    def window_layers(self) -> list[int]:
        """Layers that attend through a sliding window (none by default)."""
        return []

    def kv_bytes_per_token(self) -> int:
        """Bytes of float16 K and V one position takes over all layers."""
        c = self.config
        return 2 * 2 * c.n_layer * c.n_head_kv * c.head_dim

    def decode_step(
        self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, kv: Any
    ) -> np.ndarray:
        """Logits (B, V) for one token of each of B sequences: forward() through the backend's decode
        path (which may replay a captured plan instead of calling the ops one by one)."""
        return self.backend.decode_step(self, tokens, positions, seq_ids, kv)

    def head(self, x: np.ndarray, logits_rows: np.ndarray | None) -> np.ndarray:
        """Final RMSNorm and output matrix over the rows that need logits: (N, D) -> (len(rows), V)."""
        if logits_rows is not None:
            x = x[logits_rows]
        b = self.backend
        return b.matmul(self.output, b.rms_norm(x, self.output_norm, self.config.rms_eps))
