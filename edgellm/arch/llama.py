"""Llama-family transformer (Llama 2/3, SmolLM, TinyLlama, Mistral): config from GGUF metadata and forward.

Mirrors ggml-org/llama.cpp `src/llama-model.cpp` (llm_build_llama): pre-norm blocks of RMSNorm ->
grouped-query attention with RoPE (ggml "normal" mode: GGUF converters permute Q/K for it) -> residual,
RMSNorm -> SwiGLU FFN -> residual; final RMSNorm; output matrix (or the tied token embedding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgellm.arch.base import DecoderModel
from edgellm.arch.config_checks import (
    ConfigError,
    attention_shape,
    block_count,
    invalid,
    meta_float,
    meta_int,
    meta_str,
    rope_dims,
    vocab_size,
)
from edgellm.backends.base import Backend, RopeSpec
from edgellm.gguf import ModelFile


def linear_freq_scale(mf: ModelFile) -> float:
    """RoPE position multiplier for `rope.scaling.type == "linear"` (1.0 otherwise)."""
    if meta_str(mf, f"{mf.arch}.rope.scaling.type") == "linear":
        return 1.0 / meta_float(mf, f"{mf.arch}.rope.scaling.factor", 1.0)
    return 1.0


@dataclass(frozen=True)
class LlamaConfig:
    arch: str
    n_layer: int
    n_embd: int  # D
    n_ff: int
    n_head: int  # H
    n_head_kv: int  # Hkv
    head_dim: int  # Dh
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope: RopeSpec
    sliding_window: int | None = None  # None: llama.cpp's llama graph attends over the whole context

    @classmethod
    def from_gguf(cls, mf: ModelFile) -> LlamaConfig:
        """Read and check the `{arch}.*` and tokenizer metadata (config_checks); only the small
        rope_freqs tensor, if any, is read."""
        a = mf.arch
        n_embd, n_head, n_head_kv, head_dim = attention_shape(mf)
        scaling = f"{a}.rope.scaling.type"
        if meta_str(mf, scaling) not in (None, "none", "linear"):
            raise invalid(mf, scaling, "not supported yet (only none and linear)")
        n_rot = rope_dims(mf, head_dim)
        factors = mf.tensors.get("rope_freqs.weight")  # Llama 3.1+: per-frequency divisors
        if factors is not None and factors.n_elements != n_rot // 2:  # llama.cpp creates it as {n_rot/2}
            raise ConfigError(
                f"{mf.path}: tensor 'rope_freqs.weight' has shape {factors.shape}, expected ({n_rot // 2},)"
            )
        return cls(
            arch=a,
            n_layer=block_count(mf),
            n_embd=n_embd,
            n_ff=meta_int(mf, f"{a}.feed_forward_length"),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_vocab=vocab_size(mf),
            n_ctx_train=meta_int(mf, f"{a}.context_length", 2048),
            rms_eps=meta_float(mf, f"{a}.attention.layer_norm_rms_epsilon", 1e-5),
            rope=RopeSpec(
                n_dims=n_rot,
                freq_base=meta_float(mf, f"{a}.rope.freq_base", 10000.0),
                neox=False,
                freq_scale=linear_freq_scale(mf),
                freq_factors=factors.dequantize().reshape(-1) if factors is not None else None,
            ),
            # `{arch}.attention.sliding_window` is deliberately ignored: llama.cpp's llama graph (used for
            # Mistral too) builds no sliding-window mask, and matching it is the point
            sliding_window=None,
        )


@dataclass
class LlamaLayer:
    attn_norm: np.ndarray  # (D,)
    wq: Any  # (H*Dh, D)
    wk: Any  # (Hkv*Dh, D)
    wv: Any  # (Hkv*Dh, D)
    wo: Any  # (D, H*Dh)
    ffn_norm: np.ndarray  # (D,)
    w_gate: Any  # (F, D)
    w_up: Any  # (F, D)
    w_down: Any  # (D, F)
    bq: np.ndarray | None = None  # optional biases (Qwen 2 style)
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None


class LlamaModel(DecoderModel):
    """Weights bound to a backend, and the forward pass over a flat batch of tokens."""

    Config = LlamaConfig
    # the checked config __init__ reads when given none; `edgellm info` runs it without binding weights
    config_from_gguf = staticmethod(LlamaConfig.from_gguf)

    def __init__(self, mf: ModelFile, backend: Backend, config: LlamaConfig | None = None):
        self.config = cfg = config or LlamaConfig.from_gguf(mf)
        self.backend = b = backend
        t = _TensorGetter(mf)
        self.tok_embd = b.bind(t("token_embd.weight", (cfg.n_vocab, cfg.n_embd)))
        self.output_norm = b.vector(t("output_norm.weight", (cfg.n_embd,)))
        out = t.optional("output.weight", (cfg.n_vocab, cfg.n_embd))
        self.output = b.bind(out) if out is not None else self.tok_embd  # tied embeddings
        q_dim, kv_dim = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
        self.layers = []
        for i in range(cfg.n_layer):
            p = f"blk.{i}."

            def opt_vec(name: str, n: int, p: str = p) -> np.ndarray | None:
                q = t.optional(p + name, (n,))
                return b.vector(q) if q is not None else None

            self.layers.append(
                LlamaLayer(
                    attn_norm=b.vector(t(p + "attn_norm.weight", (cfg.n_embd,))),
                    wq=b.bind(t(p + "attn_q.weight", (q_dim, cfg.n_embd))),
                    wk=b.bind(t(p + "attn_k.weight", (kv_dim, cfg.n_embd))),
                    wv=b.bind(t(p + "attn_v.weight", (kv_dim, cfg.n_embd))),
                    wo=b.bind(t(p + "attn_output.weight", (cfg.n_embd, q_dim))),
                    ffn_norm=b.vector(t(p + "ffn_norm.weight", (cfg.n_embd,))),
                    w_gate=b.bind(t(p + "ffn_gate.weight", (cfg.n_ff, cfg.n_embd))),
                    w_up=b.bind(t(p + "ffn_up.weight", (cfg.n_ff, cfg.n_embd))),
                    w_down=b.bind(t(p + "ffn_down.weight", (cfg.n_embd, cfg.n_ff))),
                    bq=opt_vec("attn_q.bias", q_dim),
                    bk=opt_vec("attn_k.bias", kv_dim),
                    bv=opt_vec("attn_v.bias", kv_dim),
                )
            )

    def window_layers(self) -> list[int]:
        return list(range(self.config.n_layer)) if self.config.sliding_window else []

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
        x = b.get_rows(self.tok_embd, tokens)  # (N, D)
        scale = 1.0 / math.sqrt(c.head_dim)
        for il, L in enumerate(self.layers):
            h = b.rms_norm(x, L.attn_norm, c.rms_eps)
            q, k, v = b.matmul(L.wq, h), b.matmul(L.wk, h), b.matmul(L.wv, h)
            if L.bq is not None:
                q, k, v = b.add(q, L.bq), b.add(k, L.bk), b.add(v, L.bv)
            q = b.rope(q.reshape(n, c.n_head, c.head_dim), positions, c.rope)
            k = b.rope(k.reshape(n, c.n_head_kv, c.head_dim), positions, c.rope)
            v = v.reshape(n, c.n_head_kv, c.head_dim)
            a = self.attend(q, k, v, kv, il, seq_ids, positions, scale, window=c.sliding_window)
            x = b.add(x, b.matmul(L.wo, a.reshape(n, -1)))
            h = b.rms_norm(x, L.ffn_norm, c.rms_eps)
            f = b.silu_mul(b.matmul(L.w_gate, h), b.matmul(L.w_up, h))
            x = b.add(x, b.matmul(L.w_down, f))
        return x


class _TensorGetter:
    """Fetches tensors by name, checking their shapes against the config (numpy order)."""

    def __init__(self, mf: ModelFile):
        self.mf = mf

    def optional(self, name: str, shape: tuple[int, ...]):
        t = self.mf.tensors.get(name)
        if t is None:
            return None
        got = tuple(d for d in t.shape if d != 1) or (1,)
        if got != tuple(shape):
            raise ConfigError(f"{self.mf.path}: tensor {name!r} has shape {t.shape}, expected {shape}")
        return t

    def __call__(self, name: str, shape: tuple[int, ...]):
        t = self.optional(name, shape)
        if t is None:
            raise ConfigError(f"{self.mf.path}: missing tensor {name!r}")
        return t
