"""Qwen 3 (dense): the Llama graph with per-head Q/K RMSNorm before neox RoPE and a head width of its own.

Mirrors ggml-org/llama.cpp `src/models/qwen3.cpp` (llama_model_qwen3: load_arch_tensors and the graph):
Q, K, V projections (no biases in the released models; used if a file has them) -> RMSNorm of each Q and K
head by `attn_q_norm` / `attn_k_norm` (Dh,) -> RoPE NEOX -> attention scaled by 1/sqrt(Dh), where Dh comes
from `qwen3.attention.key_length` (128 for Qwen3-0.6B although 1024/16 = 64) -> SwiGLU FFN; output tied to
the token embedding when `output.weight` is absent. Checked against a plain-numpy forward on tiny random
GGUFs (tests/test_arch_tiny.py); unverified against a real checkpoint (none ships offline here).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edgellm.arch.llama import LlamaConfig, LlamaModel, _TensorGetter
from edgellm.arch.qwen2 import neox_config
from edgellm.backends.base import Backend
from edgellm.gguf import ModelFile


class Qwen3Model(LlamaModel):
    """LlamaModel plus per-layer Q/K head norms (Dh,), neox RoPE and the file's head width."""

    Config = LlamaConfig
    config_from_gguf = staticmethod(neox_config)  # what __init__ reads; `edgellm info` checks files with it

    def __init__(self, mf: ModelFile, backend: Backend, config: LlamaConfig | None = None):
        cfg = config or neox_config(mf)
        super().__init__(mf, backend, cfg)
        t, shape = _TensorGetter(mf), (cfg.head_dim,)
        self.q_norm = [backend.vector(t(f"blk.{i}.attn_q_norm.weight", shape)) for i in range(cfg.n_layer)]
        self.k_norm = [backend.vector(t(f"blk.{i}.attn_k_norm.weight", shape)) for i in range(cfg.n_layer)]

    def hidden(
        self,
        tokens: np.ndarray,
        positions: np.ndarray,
        seq_ids: np.ndarray,
        kv: Any,
    ) -> Any:
        """Run N tokens (each with its position and sequence) through the blocks: hidden states (N, D)
        on the backend, for DecoderModel.forward's logits step."""
        c, b = self.config, self.backend
        n, Dh = len(tokens), c.head_dim
        x = b.get_rows(self.tok_embd, tokens)  # (N, D)
        scale = 1.0 / math.sqrt(Dh)
        for il, L in enumerate(self.layers):
            h = b.rms_norm(x, L.attn_norm, c.rms_eps)
            q, k, v = b.matmul(L.wq, h), b.matmul(L.wk, h), b.matmul(L.wv, h)
            if L.bq is not None:
                q, k, v = b.add(q, L.bq), b.add(k, L.bk), b.add(v, L.bv)
            q = b.rms_norm(q.reshape(n, c.n_head, Dh), self.q_norm[il], c.rms_eps)
            k = b.rms_norm(k.reshape(n, c.n_head_kv, Dh), self.k_norm[il], c.rms_eps)
            q, k = b.rope(q, positions, c.rope), b.rope(k, positions, c.rope)
            a = self.attend(q, k, v.reshape(n, c.n_head_kv, Dh), kv, il, seq_ids, positions, scale)
            x = b.add(x, b.matmul(L.wo, a.reshape(n, -1)))
            h = b.rms_norm(x, L.ffn_norm, c.rms_eps)
            x = b.add(x, b.matmul(L.w_down, b.silu_mul(b.matmul(L.w_gate, h), b.matmul(L.w_up, h))))
        return x
