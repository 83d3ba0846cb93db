"""Perplexity the way llama.cpp's `llama-perplexity` measures it, plus KL divergence between two runs.

Method (ggml-org/llama.cpp `tools/perplexity/perplexity.cpp`, perplexity()): tokenize the whole text
(adding BOS if the vocabulary does), cut it into chunks of n_ctx tokens, put BOS first in each chunk when
the vocabulary adds one, evaluate each chunk from an empty cache, and score only the second half: the logits
at positions first..n_ctx-2 (first = n_ctx/2) predict the tokens after them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass
class PerplexityResult:
    ppl: float
    ppl_err: float
    n_chunks: int
    n_scored: int
    nll: np.ndarray  # (n_scored,) negative log-likelihoods
    log_probs: np.ndarray | None  # (n_scored, V) float16 log-softmax of the scored positions, if kept
    tokens: np.ndarray  # (n_scored,) the tokens that were predicted


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def perplexity(
    llm,
    text: str,
    n_ctx: int = 512,
    *,
    max_chunks: int | None = None,
    keep_log_probs: bool = False,
    progress: Callable[[int, int, float], None] | None = None,
) -> PerplexityResult:
    tokens = llm.tokenize(text, add_special=True, parse_special=False)
    n_chunks = len(tokens) // n_ctx
    if max_chunks is not None:
        n_chunks = min(n_chunks, max_chunks)
    if n_chunks < 1:
        raise ValueError(
            f"need at least {n_ctx} tokens for one chunk of -c {n_ctx}; the text has {len(tokens)}"
        )
    if n_ctx > llm.n_ctx:
        raise ValueError(f"-c {n_ctx} exceeds the model's context of {llm.n_ctx} (raise --ctx-size)")
    first = n_ctx // 2
    bos = llm.tokenizer.bos_id if llm.tokenizer.add_bos else None
    nll, kept, targets = [], [], []
    nll_sum, n_scored = 0.0, 0
    for i in range(n_chunks):
        chunk = list(tokens[i * n_ctx : (i + 1) * n_ctx])
        if bos is not None:
            chunk[0] = bos
        logits = llm.logits(chunk)  # (n_ctx, V)
        lp = log_softmax(logits[first : n_ctx - 1])
        tgt = np.asarray(tokens[i * n_ctx + first + 1 : (i + 1) * n_ctx], np.int64)
        nll.append(-lp[np.arange(len(tgt)), tgt])
        targets.append(tgt)
        if keep_log_probs:
            kept.append(lp.astype(np.float16))
        nll_sum, n_scored = nll_sum + float(nll[-1].sum()), n_scored + len(tgt)
        if progress:
            progress(i + 1, n_chunks, math.exp(nll_sum / n_scored))
    all_nll = np.concatenate(nll)
    mean = float(all_nll.mean())
    ppl = math.exp(mean)
    n = len(all_nll)
    # llama.cpp reports PPL ± ppl * stderr(nll) (first-order error propagation)
    err = ppl * math.sqrt(max(float((all_nll**2).mean()) - mean * mean, 0.0) / max(n - 1, 1))
    return PerplexityResult(
        ppl, err, n_chunks, n, all_nll, np.concatenate(kept) if kept else None, np.concatenate(targets)
    )


@dataclass
class KLResult:
    mean_kl: float
    max_kl: float
    top1_agreement: float
    confident_disagreements: int  # base's top-1 leads our pick by > 0.5 nats in base's own log-probs


def kl_divergence(base_log_probs: np.ndarray, log_probs: np.ndarray, margin: float = 0.5) -> KLResult:
    """KL(base || ours) per position from log-softmax arrays (N, V)."""
    p = base_log_probs.astype(np.float64)
    q = log_probs.astype(np.float64)
    kl = (np.exp(p) * (p - q)).sum(axis=-1)
    base_top = p.argmax(axis=-1)
    our_top = q.argmax(axis=-1)
    rows = np.arange(len(p))
    lead = p[rows, base_top] - p[rows, our_top]
    return KLResult(
        float(kl.mean()), float(kl.max()), float((base_top == our_top).mean()), int((lead > margin).sum())
    )
