"""Tiny random GGUF models for architecture tests, written with gguf-py's GGUFWriter using the metadata keys
and tensor names llama.cpp's `convert_hf_to_gguf.py` writes (names: gguf-py `constants.py` TENSOR_NAMES, the
same table as llama.cpp `src/llama-arch.cpp`), with a small byte-level BPE vocabulary (pre "qwen2")."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from edgellm import quants

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "e r"]


def byte_chars() -> list[str]:
    """GPT-2's bytes_to_unicode: the printable stand-in for each of the 256 bytes, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


VOCAB = byte_chars() + [m.replace(" ", "") for m in MERGES] + SPECIALS
N_VOCAB = len(VOCAB)  # 264


@dataclass
class Spec:
    """Shape and options of a tiny model; names follow the GGUF keys."""

    arch: str
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 96
    key_length: int | None = None  # written as {arch}.attention.key_length/value_length when set
    n_rot: int | None = None  # written as {arch}.rope.dimension_count when set
    freq_base: float = 10000.0
    rms_eps: float = 1e-6
    tied: bool = False  # no output.weight: the output reuses token_embd
    qkv_bias: bool = False
    output_bias: bool = False
    qk_norm: bool = False
    fused_qkv: bool = False  # phi3: attn_qkv instead of attn_q/k/v
    fused_gate_up: bool = False  # phi3: ffn_up holds gate and up
    sliding_window: int | None = None
    extra: dict = field(default_factory=dict)  # more tensors by name

    @property
    def head_dim(self) -> int:
        return self.key_length or self.n_embd // self.n_head


def random_weights(spec: Spec, seed: int = 0) -> dict[str, np.ndarray]:
    """name -> float32 array in numpy order (rows, row_length), scaled so activations stay O(1)."""
    rng = np.random.default_rng(seed)
    D, F, Dh = spec.n_embd, spec.n_ff, spec.head_dim
    q_dim, kv_dim = spec.n_head * Dh, spec.n_head_kv * Dh

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    def vec(n: int, s: float) -> np.ndarray:
        return (s * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": rng.standard_normal((N_VOCAB, D)).astype(np.float32)}
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(D)
        if spec.fused_qkv:
            w[p + "attn_qkv.weight"] = 2 * mat(q_dim + 2 * kv_dim, D)
        else:
            w[p + "attn_q.weight"], w[p + "attn_k.weight"] = 2 * mat(q_dim, D), 2 * mat(kv_dim, D)
            w[p + "attn_v.weight"] = mat(kv_dim, D)
        if spec.qkv_bias:
            w[p + "attn_q.bias"], w[p + "attn_k.bias"] = vec(q_dim, 0.5), vec(kv_dim, 0.5)
            w[p + "attn_v.bias"] = vec(kv_dim, 0.2)
        if spec.qk_norm:
            w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = norm(Dh), norm(Dh)
        w[p + "attn_output.weight"] = mat(D, q_dim)
        w[p + "ffn_norm.weight"] = norm(D)
        if spec.fused_gate_up:
            w[p + "ffn_up.weight"] = mat(2 * F, D)
        else:
            w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = mat(F, D), mat(F, D)
        w[p + "ffn_down.weight"] = mat(D, F)
    w["output_norm.weight"] = norm(D)
    if not spec.tied:
        w["output.weight"] = mat(N_VOCAB, D)
    if spec.output_bias:
        w["output.bias"] = vec(N_VOCAB, 0.5)
    w.update(spec.extra)
    return w


def _quantize(arr: np.ndarray, t: QT) -> np.ndarray:
    """edgellm.quants' reference quantizer, or for the K-quants (and the types only llama-quantize makes)
    the quantize module's port of ggml_quantize_chunk."""
    try:
        return quants.quantize(arr, t)
    except NotImplementedError:
        from edgellm import quantize

        rows = np.ascontiguousarray(arr, np.float32).reshape(-1, arr.shape[-1])
        return quantize.quantize_rows(t, rows, None, 1).reshape(*arr.shape[:-1], -1)


def write_gguf(
    path: Path,
    spec: Spec,
    weights: dict[str, np.ndarray],
    qtypes: dict[str, QT] | None = None,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write `weights` (F32, or the type in `qtypes` by name, quantized with edgellm.quants) and metadata.

    `metadata` sets keys after the standard ones, replacing them: a value of None drops the key, a
    (value, GGUFValueType) or (value, ARRAY, element type) tuple fixes the type, anything else gets
    gguf-py's (int -> INT32, float -> FLOAT32, str -> STRING, list -> ARRAY of its first item's type)."""
    w = gguf.GGUFWriter(path, spec.arch)
    w.add_name(f"tiny-{spec.arch}")
    w.add_context_length(256)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_rope_freq_base(spec.freq_base)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if spec.key_length:
        w.add_key_length(spec.key_length)
        w.add_value_length(spec.key_length)
    if spec.n_rot is not None:
        w.add_rope_dimension_count(spec.n_rot)
    if spec.sliding_window is not None:
        w.add_sliding_window(spec.sliding_window)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(VOCAB)
    w.add_token_types([1] * (N_VOCAB - len(SPECIALS)) + [3] * len(SPECIALS))  # 3 = control
    w.add_token_merges(MERGES)
    w.add_bos_token_id(VOCAB.index("<|endoftext|>"))
    w.add_eos_token_id(VOCAB.index("<|im_end|>"))
    w.add_add_bos_token(False)
    for key, val in (metadata or {}).items():
        w.kv_data[0].pop(key, None)
        if val is None:
            continue
        if isinstance(val, tuple):
            w.add_key_value(key, *val)
        else:
            vtype = gguf.GGUFValueType.get_type(val)
            w.add_key_value(key, val, vtype)
    for name, arr in weights.items():
        t = (qtypes or {}).get(name)
        if t is None:
            w.add_tensor(name, np.ascontiguousarray(arr, np.float32))
        else:
            w.add_tensor(name, _quantize(arr, t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
