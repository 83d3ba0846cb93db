"""Qwen 2 / 2.5 (and DeepSeek-R1-Distill-Qwen): the Llama graph with Q/K/V biases and neox RoPE.

Mirrors ggml-org/llama.cpp `src/models/qwen2.cpp` (llm_build_qwen2 and its load_arch_tensors): attn_q/k/v
biases (required there), RoPE mode NEOX (`llama_model_rope_type` lists QWEN2 under "pairs offset by
n_rot/2"), no rope_freqs factors and no sliding window, an optional `output.bias`, and the output matrix
tied to the token embedding only when `output.weight` is absent. Checked against a plain-numpy forward on
tiny random GGUFs (tests/test_arch_tiny.py); unverified against a real checkpoint (none ships offline here).
"""

from __future__ import annotations

from dataclasses import replace

from edgellm.arch.config_checks import invalid
from edgellm.arch.llama import ConfigError, LlamaConfig, LlamaModel, _TensorGetter
from edgellm.backends.base import Backend
from edgellm.gguf import ModelFile


def neox_config(mf: ModelFile, *, n_rot_is_head_dim: bool = True) -> LlamaConfig:
    """LlamaConfig as llama.cpp reads it for the neox-RoPE members of the family (qwen2, qwen3, phi3):
    their graphs pass no rope_freqs tensor and build a plain (non-SWA) KV cache."""
    cfg = LlamaConfig.from_gguf(mf)
    if n_rot_is_head_dim and cfg.rope.n_dims != cfg.head_dim:  # GGML_ASSERT(n_embd_head == n_rot)
        key = f"{cfg.arch}.rope.dimension_count"
        raise invalid(mf, key, f"{cfg.arch} rotates the whole head, which is {cfg.head_dim} wide")
    return replace(cfg, rope=replace(cfg.rope, neox=True, freq_factors=None), sliding_window=None)


class Qwen2Model(LlamaModel):
    """LlamaModel with required Q/K/V biases, neox RoPE and an optional output bias."""

    Config = LlamaConfig
    config_from_gguf = staticmethod(neox_config)  # what __init__ reads; `edgellm info` checks files with it

    def __init__(self, mf: ModelFile, backend: Backend, config: LlamaConfig | None = None):
        cfg = config or neox_config(mf)
        super().__init__(mf, backend, cfg)
        for i, L in enumerate(self.layers):
            for name, bias in (("attn_q", L.bq), ("attn_k", L.bk), ("attn_v", L.bv)):
                if bias is None:
                    raise ConfigError(f"{mf.path}: missing tensor 'blk.{i}.{name}.bias' (qwen2 needs it)")
        out_b = _TensorGetter(mf).optional("output.bias", (cfg.n_vocab,))
        self.output_bias = backend.vector(out_b) if out_b is not None else None  # (V,), added by head()
