"""Phi-3 / Phi-4-mini (`phi3` in GGUF): the Llama block with a fused QKV matrix and a fused gate/up matrix.

Mirrors ggml-org/llama.cpp `src/models/phi3.cpp` (llama_model_phi3: hparams, tensors, graph):
- `blk.N.attn_qkv.weight` (q_dim + 2*kv_dim, D) is one matmul whose output rows are [Q | K | V]
  (separate attn_q/k/v are accepted too, as create_tensor_qkv does); RoPE NEOX (`llama_model_rope_type`),
  possibly over only the first `phi3.rope.dimension_count` dims of each head (Phi-4-mini rotates 96 of 128);
  Q is scaled by 1/sqrt(Dh) after RoPE and attention runs with scale 1, as the graph does.
- `blk.N.ffn_up.weight` is (2*F, D): ggml_swiglu splits its output in halves, silu(first) * second, so the
  first half is the gate (HF Phi3MLP: `gate, up = up_states.chunk(2)`), then `ffn_down`.
- `phi3.attention.sliding_window` is read and ignored: llama.cpp disables Phi SWA ("Phi SWA is currently
  disabled", ggml-org/llama.cpp#13676; its converter writes 0 for Phi-4) and attends over the whole context.
- LongRoPE (`rope_factors_long/short.weight`: Phi-3-*-128k, Phi-3.5, Phi-4-mini) picks a factor set by the
  context size and rescales by `rope.scaling.attn_factor`; not supported yet, so such a file is a ConfigError.
Checked against a plain-numpy forward on tiny random GGUFs (tests/test_arch_tiny.py); unverified against a
real checkpoint (none ships offline here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgellm.arch.base import DecoderModel
from edgellm.arch.llama import ConfigError, LlamaConfig, _TensorGetter
from edgellm.arch.qwen2 import neox_config
from edgellm.backends.base import Backend
from edgellm.gguf import ModelFile

LONGROPE_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")


def phi3_config(mf: ModelFile) -> LlamaConfig:
    """The neox LlamaConfig, rotating `phi3.rope.dimension_count` dims of each head; LongRoPE refused."""
    found = [n for n in LONGROPE_TENSORS if n in mf.tensors]
    if found:
        raise ConfigError(
            f"{mf.path}: Phi-3 LongRoPE scaling ({', '.join(found)}; the 128k-context Phi-3, Phi-3.5 and "
            "Phi-4-mini models) is not supported yet"
        )
    return neox_config(mf, n_rot_is_head_dim=False)  # sliding_window dropped, as llama.cpp does


@dataclass
class Phi3Layer:
    attn_norm: np.ndarray  # (D,)
    wqkv: Any  # (H*Dh + 2*Hkv*Dh, D), or None when the file has separate wq/wk/wv
    wq: Any  # (H*Dh, D) or None
    wk: Any  # (Hkv*Dh, D) or None
    wv: Any  # (Hkv*Dh, D) or None
    wo: Any  # (D, H*Dh)
    ffn_norm: np.ndarray  # (D,)
    w_gate_up: Any  # (2F, D): gate rows, then up rows
    w_down: Any  # (D, F)


class Phi3Model(DecoderModel):
    Config = LlamaConfig
    config_from_gguf = staticmethod(phi3_config)  # what __init__ reads; `edgellm info` checks files with it

    def __init__(self, mf: ModelFile, backend: Backend, config: LlamaConfig | None = None):
        self.config = cfg = config or phi3_config(mf)
        self.backend = b = backend
        t = _TensorGetter(mf)
        D, F = cfg.n_embd, cfg.n_ff
        q_dim, kv_dim = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
        self.tok_embd = b.bind(t("token_embd.weight", (cfg.n_vocab, D)))
        self.output_norm = b.vector(t("output_norm.weight", (D,)))
        out = t.optional("output.weight", (cfg.n_vocab, D))
        self.output = b.bind(out) if out is not None else self.tok_embd  # tied (Phi-4-mini)
        self.layers = []
        for i in range(cfg.n_layer):
            p = f"blk.{i}."
            qkv = t.optional(p + "attn_qkv.weight", (q_dim + 2 * kv_dim, D))
            sep = [None] * 3
            if qkv is None:  # separate q/k/v, as create_tensor_qkv falls back to
                sep = [
                    b.bind(t(f"{p}attn_{x}.weight", (m, D))) for x, m in zip("qkv", (q_dim, kv_dim, kv_dim))
                ]
            self.layers.append(
                Phi3Layer(
                    attn_norm=b.vector(t(p + "attn_norm.weight", (D,))),
                    wqkv=b.bind(qkv) if qkv is not None else None,
                    wq=sep[0],
                    wk=sep[1],
                    wv=sep[2],
                    wo=b.bind(t(p + "attn_output.weight", (D, q_dim))),
                    ffn_norm=b.vector(t(p + "ffn_norm.weight", (D,))),
                    w_gate_up=b.bind(t(p + "ffn_up.weight", (2 * F, D))),
                    w_down=b.bind(t(p + "ffn_down.weight", (D, F))),
                )
            )

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
        n, Dh, F = len(tokens), c.head_dim, c.n_ff
        q_dim, kv_dim = c.n_head * Dh, c.n_head_kv * Dh
        q_scale = 1.0 / math.sqrt(Dh)
        x = b.get_rows(self.tok_embd, tokens)  # (N, D)
        for il, L in enumerate(self.layers):
            h = b.rms_norm(x, L.attn_norm, c.rms_eps)
            if L.wqkv is not None:
                qkv = b.matmul(L.wqkv, h)  # (N, q_dim + 2*kv_dim): llm_build_phi3's three views
                q, k, v = (b.columns(qkv, lo, hi) for lo, hi in _spans(q_dim, kv_dim, kv_dim))
            else:
                q, k, v = b.matmul(L.wq, h), b.matmul(L.wk, h), b.matmul(L.wv, h)
            q = b.scale(b.rope(q.reshape(n, c.n_head, Dh), positions, c.rope), q_scale)
            k = b.rope(k.reshape(n, c.n_head_kv, Dh), positions, c.rope)
            a = self.attend(q, k, v.reshape(n, c.n_head_kv, Dh), kv, il, seq_ids, positions, 1.0)
            x = b.add(x, b.matmul(L.wo, a.reshape(n, -1)))
            h = b.rms_norm(x, L.ffn_norm, c.rms_eps)
            gu = b.matmul(L.w_gate_up, h)  # (N, 2F)
            f = b.silu_mul(b.columns(gu, 0, F), b.columns(gu, F, 2 * F))
            x = b.add(x, b.matmul(L.w_down, f))
        return x


def _spans(*widths: int) -> list[tuple[int, int]]:
    """Consecutive column ranges of the given widths: [(0, w0), (w0, w0 + w1), ...]."""
    out, lo = [], 0
    for w in widths:
        out.append((lo, lo + w))
        lo += w
    return out
