"""Embeddings from a decoder model: its final-norm hidden states pooled into one vector per input and
normalized, as llama.cpp does (src/llama-context.cpp, the pooling of t_embd; common/common.cpp
common_embd_normalize).

Pooling: "mean" (average over the tokens), "cls" (the first token), "last" (the last token: what a causal
model's embedding models such as Qwen3-Embedding use), "none" (every token's vector). The default is the
file's `{arch}.pooling_type` and, for a file that names none (a chat model), "last": in a causal model only
the last position has seen the whole input.
"""

from __future__ import annotations

from typing import Any

import numpy as np

POOLINGS = ("mean", "cls", "last", "none")
_GGUF_POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last"}  # llama.cpp's enum llama_pooling_type


def default_pooling(pooling_type: Any) -> str:
    """The pooling a file asks for (its `{arch}.pooling_type` value), or "last"."""
    try:
        return _GGUF_POOLING.get(int(pooling_type), "last")
    except (TypeError, ValueError):
        return "last"


def pool(hidden: np.ndarray, pooling: str) -> np.ndarray:
    """(N, D) hidden states -> (D,) for mean/cls/last, (N, D) for none."""
    if pooling == "mean":
        return hidden.astype(np.float64).mean(axis=0).astype(np.float32)
    if pooling == "cls":
        return hidden[0].copy()
    if pooling == "last":
        return hidden[-1].copy()
    if pooling == "none":
        return hidden
    raise ValueError(f"unknown pooling {pooling!r}: expected one of {', '.join(POOLINGS)}")


def normalize(v: np.ndarray, p: int) -> np.ndarray:
    """llama.cpp's common_embd_normalize along the last axis: -1 none, 0 max-absolute scaled to int16's
    range, 2 Euclidean (the default), any other p the p-norm."""
    if p < 0:
        return v
    x = v.astype(np.float64)
    if p == 0:
        s = np.abs(x).max(axis=-1, keepdims=True) / 32760.0
    elif p == 2:
        s = np.sqrt((x * x).sum(axis=-1, keepdims=True))
    else:
        s = (np.abs(x) ** p).sum(axis=-1, keepdims=True) ** (1.0 / p)
    s = np.where(s > 0, s, 1.0)
    return (x / s).astype(np.float32)
