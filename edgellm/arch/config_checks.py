"""Model metadata read and checked at load, before any tensor is touched.

Promises: every bad value is a `ConfigError` of one line, "<path>: <key> = <value>: <what is wrong>", never
a ZeroDivisionError or a TypeError from deep inside. Like ggml-org/llama.cpp `src/llama-model-loader.cpp`
(GKV::get_kv throws "key %s has wrong type"), a wrong-typed key is an error, not a guess; unlike it, any
integer width is accepted for an integer key and an integer for a float key.
"""

from __future__ import annotations

import math
from typing import Any

from edgellm.gguf import ModelFile, describe_value
from edgellm.tokenizer.errors import TokenizerError
from edgellm.tokenizer.vocab import check_special_ids, check_token_arrays

_REQUIRED: Any = object()


class ConfigError(ValueError):
    """Metadata needed to build the model is missing or inconsistent."""


def invalid(mf: ModelFile, key: str, why: str) -> ConfigError:
    """The one-line error for a present but bad metadata value."""
    return ConfigError(f"{mf.path}: {key} = {describe_value(mf.get(key))}: {why}")


def _present(mf: ModelFile, key: str, default: Any) -> bool:
    if key in mf.metadata:
        return True
    if default is _REQUIRED:
        raise ConfigError(f"{mf.path}: missing metadata key {key!r}")
    return False


def meta_int(mf: ModelFile, key: str, default: Any = _REQUIRED, *, minimum: int | None = 1) -> Any:
    """Integer metadata `key` (any GGUF integer type), at least `minimum`; `default` when absent."""
    if not _present(mf, key, default):
        return default
    v = mf.metadata[key]
    if not isinstance(v, int) or isinstance(v, bool):
        raise invalid(mf, key, f"expected an integer, got type {mf.type_name(key)}")
    if minimum is not None and v < minimum:
        raise invalid(mf, key, "must be positive" if minimum == 1 else f"must be at least {minimum}")
    return v


def meta_float(mf: ModelFile, key: str, default: Any = _REQUIRED, *, positive: bool = True) -> Any:
    """Finite float metadata `key` (a GGUF float or integer), > 0 if `positive`; `default` when absent."""
    if not _present(mf, key, default):
        return default
    v = mf.metadata[key]
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise invalid(mf, key, f"expected a number, got type {mf.type_name(key)}")
    if not math.isfinite(v):
        raise invalid(mf, key, "must be finite")
    if positive and v <= 0:
        raise invalid(mf, key, "must be positive")
    return float(v)


def meta_str(mf: ModelFile, key: str, default: str | None = None) -> str | None:
    """String metadata `key`, or `default` when absent."""
    if key not in mf.metadata:
        return default
    v = mf.metadata[key]
    if not isinstance(v, str):
        raise invalid(mf, key, f"expected a string, got type {mf.type_name(key)}")
    return v


def block_count(mf: ModelFile) -> int:
    """`{arch}.block_count`, checked against the tensor names: blk.{n-1}.* must be in the file (llama.cpp
    would fail on a missing tensor only after allocating every layer before it)."""
    key = f"{mf.arch}.block_count"
    n = meta_int(mf, key)
    last = f"blk.{n - 1}."
    if not any(name.startswith(last) for name in mf.tensors):
        have = sorted({int(s) for name in mf.tensors if (s := _block_index(name)) is not None})
        found = f"the file has blocks 0..{have[-1]}" if have else "the file has no blk.* tensors"
        raise invalid(mf, key, f"no {last}* tensors ({found})")
    return n


def _block_index(name: str) -> str | None:
    parts = name.split(".", 2)
    return parts[1] if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit() else None


def attention_shape(mf: ModelFile) -> tuple[int, int, int, int]:
    """(n_embd, n_head, n_head_kv, head_dim) from `{arch}.*` metadata, checked for grouped-query attention."""
    a = mf.arch
    n_embd = meta_int(mf, f"{a}.embedding_length")
    k_head, k_kv = f"{a}.attention.head_count", f"{a}.attention.head_count_kv"
    n_head = meta_int(mf, k_head)
    n_head_kv = meta_int(mf, k_kv, n_head)
    if n_head % n_head_kv:
        raise invalid(mf, k_kv, f"does not divide {k_head} = {n_head} (query heads share kv heads evenly)")
    k_len = f"{a}.attention.key_length"
    if k_len in mf.metadata:
        head_dim = meta_int(mf, k_len)
    elif n_embd % n_head:
        raise invalid(mf, k_head, f"does not divide {a}.embedding_length = {n_embd}, and {k_len} is absent")
    else:
        head_dim = n_embd // n_head
    k_vlen = f"{a}.attention.value_length"
    if meta_int(mf, k_vlen, head_dim) != head_dim:  # llm_build_*: GGML_ASSERT(n_embd_head_v == n_embd_head_k)
        raise invalid(mf, k_vlen, f"differs from the key head width {head_dim}")
    return n_embd, n_head, n_head_kv, head_dim


def rope_dims(mf: ModelFile, head_dim: int) -> int:
    """`{arch}.rope.dimension_count` (default: the whole head): even, positive, at most the head width."""
    key = f"{mf.arch}.rope.dimension_count"
    n_rot = meta_int(mf, key, head_dim)
    where = key if key in mf.metadata else f"{key} (absent: the head width)"
    if n_rot > head_dim:
        raise ConfigError(f"{mf.path}: {where} = {n_rot}: exceeds the head width {head_dim}")
    if n_rot % 2:
        raise ConfigError(f"{mf.path}: {where} = {n_rot}: must be even (RoPE rotates pairs)")
    return n_rot


def vocab_size(mf: ModelFile) -> int:
    """`{arch}.vocab_size`, else the length of the token list; the tokenizer metadata is checked too."""
    key = f"{mf.arch}.vocab_size"
    tokens = mf.get("tokenizer.ggml.tokens")
    check_tokenizer(mf)
    n_tokens = len(tokens) if tokens is not None else None
    if key not in mf.metadata and n_tokens is None:
        raise ConfigError(f"{mf.path}: missing metadata key {key!r} (and no tokenizer.ggml.tokens to count)")
    n = meta_int(mf, key, n_tokens)
    if n_tokens is not None and n < n_tokens:
        raise invalid(mf, key, f"fewer than the {n_tokens} tokens in tokenizer.ggml.tokens")
    return n


def check_tokenizer(mf: ModelFile) -> None:
    """Token arrays of the right element types and lengths, special-token ids inside the vocabulary."""
    try:
        check_token_arrays(mf.metadata)
        check_special_ids(mf.metadata)
    except TokenizerError as e:
        raise ConfigError(f"{mf.path}: {e}") from None
