"""Gemma 3 (text): config from GGUF metadata and forward.

Mirrors ggml-org/llama.cpp `src/models/gemma3.cpp` (llm_build_gemma3) and the gemma3 hparams in
`src/llama-model.cpp`: embeddings scaled by sqrt(D); per block RMSNorm -> attention with per-head Q/K
RMSNorm, neox RoPE and queries pre-scaled by 1/sqrt(Dh) -> post-attention RMSNorm -> residual, RMSNorm ->
GeGLU FFN -> post-FFN RMSNorm -> residual. Five of every six layers attend through a sliding window with
RoPE base 10000; every sixth is global with the file's base. The GGUF converter stores Gemma's norm weights
with the +1 already added, so plain RMSNorm applies. Output is tied to the token embedding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgellm.arch.base import DecoderModel
from edgellm.arch.config_checks import (
    attention_shape,
    block_count,
    invalid,
    meta_float,
    meta_int,
    rope_dims,
    vocab_size,
)
from edgellm.arch.llama import _TensorGetter, linear_freq_scale
from edgellm.backends.base import Backend, RopeSpec
from edgellm.gguf import ModelFile

SWA_PATTERN = 6  # hparams.set_swa_pattern(6): layer il is local iff il % 6 < 5
SWA_FREQ_BASE = 10000.0  # hparams.rope_freq_base_train_swa


@dataclass(frozen=True)
class Gemma3Config:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope_global: RopeSpec
    rope_local: RopeSpec
    sliding_window: int | None
    attn_scale: float
    final_softcap: float | None

    @classmethod
    def from_gguf(cls, mf: ModelFile) -> Gemma3Config:
        """Read and check the `{arch}.*` and tokenizer metadata (config_checks); no tensor is read."""
        a = mf.arch
        n_embd, n_head, n_head_kv, head_dim = attention_shape(mf)
        n_layer = block_count(mf)
        n_rot = rope_dims(mf, head_dim)
        window = meta_int(mf, f"{a}.attention.sliding_window", None, minimum=0)  # 0: no window
        # llama.cpp: 1/sqrt(n_embd/n_head) for the 27B (62 layers), 1/sqrt(head_dim) otherwise
        scale = 1.0 / math.sqrt(n_embd / n_head) if n_layer == 62 else 1.0 / math.sqrt(head_dim)
        k_cap = f"{a}.final_logit_softcapping"
        softcap = meta_float(mf, k_cap, None, positive=False)  # 0: no softcapping
        if softcap is not None and softcap < 0:
            raise invalid(mf, k_cap, "must not be negative")
        return cls(
            arch=a,
            n_layer=n_layer,
            n_embd=n_embd,
            n_ff=meta_int(mf, f"{a}.feed_forward_length"),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_vocab=vocab_size(mf),
            n_ctx_train=meta_int(mf, f"{a}.context_length", 8192),
            rms_eps=meta_float(mf, f"{a}.attention.layer_norm_rms_epsilon", 1e-6),
            rope_global=RopeSpec(
                n_rot, meta_float(mf, f"{a}.rope.freq_base", 1e6), neox=True, freq_scale=linear_freq_scale(mf)
            ),
            rope_local=RopeSpec(n_rot, SWA_FREQ_BASE, neox=True, freq_scale=1.0),
            sliding_window=int(window) if window else None,
            attn_scale=scale,
            final_softcap=float(softcap) if softcap else None,
        )

    def is_local(self, il: int) -> bool:
        return self.sliding_window is not None and il % SWA_PATTERN < SWA_PATTERN - 1


@dataclass
class Gemma3Layer:
    attn_norm: np.ndarray  # (D,)
    wq: Any  # (H*Dh, D)
    wk: Any  # (Hkv*Dh, D)
    wv: Any  # (Hkv*Dh, D)
    q_norm: np.ndarray  # (Dh,)
    k_norm: np.ndarray  # (Dh,)
    wo: Any  # (D, H*Dh)
    post_attn_norm: np.ndarray  # (D,)
    ffn_norm: np.ndarray  # (D,)
    w_gate: Any  # (F, D)
    w_up: Any  # (F, D)
    w_down: Any  # (D, F)
    post_ffn_norm: np.ndarray  # (D,)


class Gemma3Model(DecoderModel):
    Config = Gemma3Config
    config_from_gguf = staticmethod(Gemma3Config.from_gguf)  # what __init__ reads; `edgellm info` too

    def __init__(self, mf: ModelFile, backend: Backend, config: Gemma3Config | None = None):
        self.config = cfg = config or Gemma3Config.from_gguf(mf)
        self.backend = b = backend
        t = _TensorGetter(mf)
        D, Dh = cfg.n_embd, cfg.head_dim
        q_dim, kv_dim = cfg.n_head * Dh, cfg.n_head_kv * Dh
        self.tok_embd = b.bind(t("token_embd.weight", (cfg.n_vocab, D)))
        self.output_norm = b.vector(t("output_norm.weight", (D,)))
        out = t.optional("output.weight", (cfg.n_vocab, D))
        self.output = b.bind(out) if out is not None else self.tok_embd
        self.final_softcap = cfg.final_softcap
        self.layers = []
        for i in range(cfg.n_layer):
            p = f"blk.{i}."
            self.layers.append(
                Gemma3Layer(
                    attn_norm=b.vector(t(p + "attn_norm.weight", (D,))),
                    wq=b.bind(t(p + "attn_q.weight", (q_dim, D))),
                    wk=b.bind(t(p + "attn_k.weight", (kv_dim, D))),
                    wv=b.bind(t(p + "attn_v.weight", (kv_dim, D))),
                    q_norm=b.vector(t(p + "attn_q_norm.weight", (Dh,))),
                    k_norm=b.vector(t(p + "attn_k_norm.weight", (Dh,))),
                    wo=b.bind(t(p + "attn_output.weight", (D, q_dim))),
                    post_attn_norm=b.vector(t(p + "post_attention_norm.weight", (D,))),
                    ffn_norm=b.vector(t(p + "ffn_norm.weight", (D,))),
                    w_gate=b.bind(t(p + "ffn_gate.weight", (cfg.n_ff, D))),
                    w_up=b.bind(t(p + "ffn_up.weight", (cfg.n_ff, D))),
                    w_down=b.bind(t(p + "ffn_down.weight", (D, cfg.n_ff))),
                    post_ffn_norm=b.vector(t(p + "post_ffw_norm.weight", (D,))),
                )
            )

    def window_layers(self) -> list[int]:
        return [il for il in range(self.config.n_layer) if self.config.is_local(il)]

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
        n = len(tokens)
        x = b.scale(b.get_rows(self.tok_embd, tokens), math.sqrt(c.n_embd))
        for il, L in enumerate(self.layers):
            local = c.is_local(il)
            rope = c.rope_local if local else c.rope_global
            h = b.rms_norm(x, L.attn_norm, c.rms_eps)
            q = b.matmul(L.wq, h).reshape(n, c.n_head, c.head_dim)
            k = b.matmul(L.wk, h).reshape(n, c.n_head_kv, c.head_dim)
            v = b.matmul(L.wv, h).reshape(n, c.n_head_kv, c.head_dim)
            q = b.scale(b.rope(b.rms_norm(q, L.q_norm, c.rms_eps), positions, rope), c.attn_scale)
            k = b.rope(b.rms_norm(k, L.k_norm, c.rms_eps), positions, rope)
            a = self.attend(
                q, k, v, kv, il, seq_ids, positions, 1.0, window=c.sliding_window if local else None
            )
            a = b.matmul(L.wo, a.reshape(n, -1))
            x = b.add(x, b.rms_norm(a, L.post_attn_norm, c.rms_eps))
            h = b.rms_norm(x, L.ffn_norm, c.rms_eps)
            f = b.matmul(L.w_down, b.gelu_mul(b.matmul(L.w_gate, h), b.matmul(L.w_up, h)))
            x = b.add(x, b.rms_norm(f, L.post_ffn_norm, c.rms_eps))
        return x
