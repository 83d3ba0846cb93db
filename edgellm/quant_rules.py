"""Which ggml type each tensor of a model gets when it is quantized to a llama-quantize file type.

Mirrors ggml-org/llama.cpp src/llama-quant.cpp (tensor_allows_quantization, tensor_get_category,
llama_tensor_get_type_impl, tensor_type_fallback, llama_ftype_get_default_type) for the file types
edgellm can write, so `edgellm quantize` picks the same type for every tensor as `llama-quantize`.
Pure functions of names, shapes and a few hyperparameters: the plan is made before a byte is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

T = GGMLQuantizationType
F = LlamaFileType

# llama-quantize's names (tools/quantize/quantize.cpp QUANT_OPTIONS) for the file types edgellm writes
FILE_TYPES: dict[str, LlamaFileType] = {
    "Q4_0": F.MOSTLY_Q4_0,
    "Q4_1": F.MOSTLY_Q4_1,
    "Q5_0": F.MOSTLY_Q5_0,
    "Q5_1": F.MOSTLY_Q5_1,
    "Q8_0": F.MOSTLY_Q8_0,
    "Q2_K": F.MOSTLY_Q2_K,
    "Q3_K": F.MOSTLY_Q3_K_M,  # alias, as in llama-quantize
    "Q3_K_S": F.MOSTLY_Q3_K_S,
    "Q3_K_M": F.MOSTLY_Q3_K_M,
    "Q3_K_L": F.MOSTLY_Q3_K_L,
    "Q4_K": F.MOSTLY_Q4_K_M,  # alias
    "Q4_K_S": F.MOSTLY_Q4_K_S,
    "Q4_K_M": F.MOSTLY_Q4_K_M,
    "Q5_K": F.MOSTLY_Q5_K_M,  # alias
    "Q5_K_S": F.MOSTLY_Q5_K_S,
    "Q5_K_M": F.MOSTLY_Q5_K_M,
    "Q6_K": F.MOSTLY_Q6_K,
    "IQ4_NL": F.MOSTLY_IQ4_NL,
    "F16": F.MOSTLY_F16,
    "BF16": F.MOSTLY_BF16,
    "F32": F.ALL_F32,
}

# llama_ftype_get_default_type
_DEFAULT_TYPE = {
    F.MOSTLY_Q4_0: T.Q4_0,
    F.MOSTLY_Q4_1: T.Q4_1,
    F.MOSTLY_Q5_0: T.Q5_0,
    F.MOSTLY_Q5_1: T.Q5_1,
    F.MOSTLY_Q8_0: T.Q8_0,
    F.MOSTLY_F16: T.F16,
    F.MOSTLY_BF16: T.BF16,
    F.ALL_F32: T.F32,
    F.MOSTLY_Q2_K: T.Q2_K,
    F.MOSTLY_Q3_K_S: T.Q3_K,
    F.MOSTLY_Q3_K_M: T.Q3_K,
    F.MOSTLY_Q3_K_L: T.Q3_K,
    F.MOSTLY_Q4_K_S: T.Q4_K,
    F.MOSTLY_Q4_K_M: T.Q4_K,
    F.MOSTLY_Q5_K_S: T.Q5_K,
    F.MOSTLY_Q5_K_M: T.Q5_K,
    F.MOSTLY_Q6_K: T.Q6_K,
    F.MOSTLY_IQ4_NL: T.IQ4_NL,
}

# tensor_type_fallback: a 256-block type on rows it does not divide goes to this 32-block type
_FALLBACK = {T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}

# tensor types a user may name for --output-tensor-type / --token-embedding-type
TENSOR_TYPES: dict[str, GGMLQuantizationType] = {
    t.name: t
    for t in (
        T.F32,
        T.F16,
        T.BF16,
        T.Q4_0,
        T.Q4_1,
        T.Q5_0,
        T.Q5_1,
        T.Q8_0,
        T.Q2_K,
        T.Q3_K,
        T.Q4_K,
        T.Q5_K,
        T.Q6_K,
        T.IQ4_NL,
    )
}

_NOT_QUANTIZED = (  # substrings tensor_allows_quantization refuses, for the architectures it names
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
)


@dataclass
class Options:
    """llama-quantize's per-tensor knobs (llama_model_quantize_params)."""

    output_tensor_type: GGMLQuantizationType | None = None  # --output-tensor-type
    token_embedding_type: GGMLQuantizationType | None = None  # --token-embedding-type
    pure: bool = False  # --pure: no per-tensor mixture, only the shape fallbacks
    quantize_output_tensor: bool = True  # False: --leave-output-tensor
    has_imatrix: bool = False


@dataclass
class ModelShape:
    """The hyperparameters the type choice reads (llama_hparams)."""

    arch: str
    n_layer: int
    n_head: int = 1
    n_head_kv: int = 1
    n_expert: int = 0

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        # llama-model.cpp load_hparams: 80 layers is LLM_TYPE_70B for the llama and qwen2 families
        return self.n_layer == 80 and self.arch in ("llama", "qwen2")


def default_type(ftype: LlamaFileType) -> GGMLQuantizationType:
    return _DEFAULT_TYPE[ftype]


def is_quantized(t: GGMLQuantizationType) -> bool:
    return t not in (T.F32, T.F16, T.BF16, T.F64, T.I8, T.I16, T.I32, T.I64)


def allows_quantization(name: str, n_dims: int, opts: Options) -> bool:
    """tensor_allows_quantization: 2-D and 3-D weights, except norms, routers and small special tables."""
    if n_dims < 2 or not name.endswith("weight"):
        return False
    if not opts.quantize_output_tensor and name == "output.weight":
        return False
    if name in ("position_embd.weight", "token_types.weight"):
        return False
    return not any(s in name for s in _NOT_QUANTIZED)


def category(name: str) -> str:
    """tensor_get_category (the order of the tests matters: attn_qkv before attn_v, and so on)."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for key, cat in (
        ("attn_qkv.weight", "attn_qkv"),
        ("attn_kv_b.weight", "attn_kv_b"),
        ("attn_v.weight", "attn_v"),
        ("attn_k.weight", "attn_k"),
        ("attn_q.weight", "attn_q"),
        ("attn_output.weight", "attn_output"),
        ("ffn_up", "ffn_up"),
        ("ffn_gate", "ffn_gate"),
        ("ffn_down", "ffn_down"),
    ):
        if key in name:
            return cat
    return "other"


def tensor_order_key(name: str) -> tuple[int, str]:
    """llama_model_loader's weight_name_comparer: by layer number ("blk.N."; -1 for others), then by name."""
    layer = -1
    if name.startswith("blk."):
        digits = name[4:].split(".", 1)[0]
        if digits.isdigit():
            layer = int(digits)
    return layer, name


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


@dataclass
class _Counters:  # quantize_state_impl
    n_attention_wv: int = 0
    i_attention_wv: int = 0
    i_ffn_down: int = 0
    tied_embeddings: bool = True
    fallbacks: list[str] = field(default_factory=list)


def _mixture_type(c: _Counters, m: ModelShape, ftype, t, name: str, ne0: int, cat: str, opts: Options):
    """llama_tensor_get_type_impl for the file types in FILE_TYPES (its IQ1/IQ2/IQ3 branches left out)."""
    falcon = m.arch == "falcon"
    if cat == "output" or (c.tied_embeddings and cat == "token_embd"):
        if opts.output_tensor_type is not None:
            return opts.output_tensor_type
        if falcon or ne0 % GGML_QUANT_SIZES[t][0]:
            return T.Q8_0
        return t if t == T.Q8_0 else T.Q6_K
    if cat == "token_embd":
        return opts.token_embedding_type if opts.token_embedding_type is not None else t
    if cat in ("attn_v", "attn_qkv", "attn_kv_b"):
        if ftype == F.MOSTLY_Q2_K:
            t = T.Q4_K if m.n_gqa >= 4 else T.Q3_K
        elif ftype == F.MOSTLY_Q3_K_M:
            t = T.Q5_K if c.i_attention_wv < 2 else T.Q4_K
        elif ftype == F.MOSTLY_Q3_K_L:
            t = T.Q5_K
        elif ftype == F.MOSTLY_IQ4_NL and m.n_gqa >= 4:
            t = T.Q5_K
        elif ftype in (F.MOSTLY_Q4_K_M, F.MOSTLY_Q5_K_M) and _use_more_bits(
            c.i_attention_wv, c.n_attention_wv
        ):
            t = T.Q6_K
        elif ftype == F.MOSTLY_Q4_K_S and c.i_attention_wv < 4:
            t = T.Q5_K
        if m.is_70b and t in (T.Q3_K, T.Q4_K):
            t = T.Q5_K
        if m.n_expert == 8:
            t = T.Q8_0
        c.i_attention_wv += 1
    elif cat == "attn_k":
        if m.n_expert == 8:
            t = T.Q8_0
    elif cat == "ffn_down":
        i_layer, n_layer = _layer(c.i_ffn_down, m, name)
        if ftype == F.MOSTLY_Q2_K:
            t = T.Q3_K
        elif ftype == F.MOSTLY_Q3_K_M:
            if i_layer < n_layer // 16:
                t = T.Q5_K
            elif not falcon or _use_more_bits(i_layer, n_layer):
                t = T.Q4_K
            else:
                t = T.Q3_K
        elif ftype == F.MOSTLY_Q3_K_L:
            t = T.Q4_K if falcon else T.Q5_K
        elif ftype == F.MOSTLY_Q4_K_M:
            if falcon:
                if i_layer < n_layer // 16:
                    t = T.Q6_K
                elif _use_more_bits(i_layer, n_layer):
                    t = T.Q5_K
                else:
                    t = T.Q4_K
            elif _use_more_bits(i_layer, n_layer):
                t = T.Q6_K
        elif i_layer < n_layer // 8 and ftype == F.MOSTLY_IQ4_NL and not opts.has_imatrix:
            t = T.Q5_K
        elif ftype == F.MOSTLY_Q5_K_M and _use_more_bits(i_layer, n_layer):
            t = T.Q6_K
        elif ftype == F.MOSTLY_Q4_K_S and not falcon and i_layer < n_layer // 8:
            t = T.Q5_K
        elif ftype in (F.MOSTLY_Q4_0, F.MOSTLY_Q5_0) and opts.has_imatrix and i_layer < n_layer // 8:
            t = T.Q4_1 if ftype == F.MOSTLY_Q4_0 else T.Q5_1
        c.i_ffn_down += 1
    elif cat == "attn_output":
        if not falcon:
            if m.n_expert == 8:
                if ftype in (
                    F.MOSTLY_Q2_K,
                    F.MOSTLY_Q3_K_S,
                    F.MOSTLY_Q3_K_M,
                    F.MOSTLY_IQ4_NL,
                    F.MOSTLY_Q4_K_S,
                    F.MOSTLY_Q4_K_M,
                ):
                    t = T.Q5_K
            elif ftype == F.MOSTLY_Q2_K:
                t = T.Q3_K
            elif ftype == F.MOSTLY_Q3_K_M:
                t = T.Q4_K
            elif ftype == F.MOSTLY_Q3_K_L:
                t = T.Q5_K
        elif ftype == F.MOSTLY_Q3_K_L:
            t = T.Q4_K
    # (llama-quant.cpp's own attn_qkv branch after this one is unreachable: attn_qkv is attn_v-like above;
    # its ffn_gate/ffn_up branches change only IQ3_XS, which edgellm does not write)
    return t


def _layer(i: int, m: ModelShape, name: str) -> tuple[int, int]:
    """layer_info: the running count, or for mixtures of experts the layer parsed from the name."""
    if max(1, m.n_expert) > 1:
        layer, _ = tensor_order_key(name)
        if not 0 <= layer < m.n_layer:
            raise ValueError(f"cannot tell the layer of tensor {name!r} (the model has {m.n_layer} layers)")
        return layer, m.n_layer
    return i, m.n_layer


def _fallback(c: _Counters, name: str, ne0: int, t: GGMLQuantizationType) -> GGMLQuantizationType:
    """tensor_type_fallback: rows a block size does not divide get a smaller block, else F16."""
    block = GGML_QUANT_SIZES[t][0]
    if ne0 % block == 0:
        return t
    c.fallbacks.append(name)
    out = _FALLBACK.get(t, t)
    if ne0 % GGML_QUANT_SIZES[out][0]:
        out = T.F16
    return out


def plan_types(
    tensors: list[tuple[str, tuple[int, ...], GGMLQuantizationType]],
    ftype: LlamaFileType,
    model: ModelShape,
    opts: Options,
) -> tuple[dict[str, GGMLQuantizationType], list[str]]:
    """(name, ggml shape ne, current type) in llama.cpp's tensor order -> ({name: new type}, fallbacks).

    The preliminary loop of llama_model_quantize_impl: counters advance in the order given, so pass the
    tensors sorted by `tensor_order_key`."""
    c = _Counters()
    for name, _, _ in tensors:
        cat = category(name)
        if cat in ("attn_v", "attn_qkv", "attn_kv_b"):
            c.n_attention_wv += 1
        if cat == "output":
            c.tied_embeddings = False
    default = default_type(ftype)
    out: dict[str, GGMLQuantizationType] = {}
    for name, ne, cur in tensors:
        if not allows_quantization(name, len(ne), opts):
            out[name] = cur
            continue
        cat = category(name)
        if opts.token_embedding_type is not None and cat == "token_embd":
            out[name] = opts.token_embedding_type
            continue
        if opts.output_tensor_type is not None and cat == "output":
            out[name] = opts.output_tensor_type
            continue
        t = default
        if is_quantized(default):
            if not opts.pure:
                t = _mixture_type(c, model, ftype, t, name, ne[0], cat, opts)
            t = _fallback(c, name, ne[0], t)
        out[name] = t
    return out, c.fallbacks
