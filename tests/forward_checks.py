"""Shared checks of a model's forward pass against llama.cpp fixtures (scripts/make_llama_fixtures.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

FIX = Path(__file__).parent / "fixtures" / "forward"
TEXT = Path(__file__).parent / "fixtures" / "text" / "licenses.txt"
# logits: where llama.cpp's top-1 led its top-2 by less than this, another pick is excused. Measured with
# the exact (float64-accumulating, so CPU-independent) reference: teacher-forced on llama.cpp's tokens, the
# largest gap by which we prefer another token is 0.336 (SmolLM2, "Water boils at", step 31, where
# llama.cpp's own margin was 0.011; Gemma 3: 0.331 where it was 0.007). SmolLM2 carries ~2e4-sized
# activations that cancel in its last layers, which amplifies float-summation noise there. llama.cpp
# against itself (flash attention on vs off) moves the logits by up to 0.87. Hence 0.5, as CONFIDENT.
NEAR_TIE = 0.5
KL_MAX = 0.01  # mean KL(llama.cpp || edgellm), nats
CONFIDENT = 0.5  # nats: llama.cpp's top-1 may never lead our pick by more than this


def load_fixture(alias: str) -> dict:
    return json.loads((FIX / f"{alias}.json").read_text())


def prefill(model, prompt_ids: list[int], kv, chunk: int = 512) -> np.ndarray:
    """The prompt through model.forward in chunks of sequence 0; logits of its last token (V,)."""
    ids = np.asarray(prompt_ids, np.int64)
    for s in range(0, len(ids), chunk):
        part = ids[s : s + chunk]
        rows = np.array([len(part) - 1]) if s + len(part) == len(ids) else np.array([], np.int64)
        logits = model.forward(part, np.arange(s, s + len(part)), np.zeros(len(part), np.int64), kv, rows)
    return logits[-1]


def greedy(llm, prompt_ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """Greedy continuation straight from the model (no EOG stop), with top-1/top-2 margins: a loop of its
    own, independent of the engine, as a cross-check of it."""
    kv = llm.model.new_kv_cache(len(prompt_ids) + n + 1, 1)
    logits = prefill(llm.model, prompt_ids, kv)
    ids, margins = [], []
    for i in range(n):
        top2 = np.argsort(-logits, kind="stable")[:2]
        ids.append(int(top2[0]))
        margins.append(float(logits[top2[0]] - logits[top2[1]]))
        pos = np.array([len(prompt_ids) + i])
        logits = llm.model.decode_step(np.array([ids[-1]]), pos, np.zeros(1, np.int64), kv)[0]
    return ids, margins


def check_greedy(llm, case: dict) -> int:
    """Identical ids up to llama.cpp's first near-tie; returns how many tokens matched.

    A divergence is excused only where llama.cpp's own margin was below NEAR_TIE (ours says nothing: a
    wrong forward can be unsure anywhere), so every token before llama.cpp's first near-tie must match."""
    ours, our_margins = greedy(llm, case["prompt_ids"], len(case["ids"]))
    ref, ref_margins = case["ids"], case["margins"]
    must = next((i for i, m in enumerate(ref_margins) if m < NEAR_TIE), len(ref))
    matched = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), len(ref))
    if matched < len(ref):
        i = matched
        assert ref_margins[i] < NEAR_TIE, (
            f"{case['prompt']!r}: token {i} differs ({ours[i]} vs llama.cpp {ref[i]}) although llama.cpp's "
            f"margin was {ref_margins[i]:.4f} (ours {our_margins[i]:.4f}); matched {ours[:i]}"
        )
    assert matched >= must, f"{case['prompt']!r}: matched {matched} tokens, llama.cpp was sure of {must}"
    return matched


def check_forced_steps(llm, case: dict) -> tuple[int, list[str]]:
    """Feed llama.cpp's own continuation; at every step our argmax must be llama.cpp's token, or within
    NEAR_TIE of it in our logits. Returns (disagreements, descriptions)."""
    ids = case["prompt_ids"] + case["ids"]
    logits = llm.logits(ids)[len(case["prompt_ids"]) - 1 : -1]
    notes, bad = [], []
    for i, (row, ref) in enumerate(zip(logits, case["ids"])):
        pick = int(np.argmax(row))
        if pick != ref:
            gap = float(row[pick] - row[ref])
            notes.append(
                f"step {i}: ours {pick} vs llama.cpp {ref}, gap {gap:.3f} (llama.cpp margin "
                f"{case['margins'][i]:.3f})"
            )
            if gap >= NEAR_TIE:
                bad.append(notes[-1])
    assert not bad, f"{case['prompt']!r}: confident greedy disagreements: {bad}"
    return len(notes), notes


def teacher_forced_kl(llm, alias: str, n_tokens: int | None = None) -> tuple[float, int, float]:
    """(mean KL(llama.cpp || ours), confident disagreements, top-1 agreement) over the fixture text (its
    first n_tokens tokens, if given).

    llama.cpp's distribution is kept as its top-256 tokens plus one bin for the rest; ours is folded onto
    the same bins, which can only lower the KL by the (tiny) divergence inside the tail bin.
    """
    f = np.load(FIX / f"{alias}-teacher.npz")
    tokens, top_ids, top_lp = f["tokens"], f["top_ids"], f["top_logprobs"].astype(np.float64)
    if n_tokens is not None:
        tokens, top_ids, top_lp = tokens[:n_tokens], top_ids[:n_tokens], top_lp[:n_tokens]
    logits = llm.logits(tokens.tolist()).astype(np.float64)
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) + logits.max(
        1, keepdims=True
    )
    ours = logits - lse
    ours_top = np.take_along_axis(ours, top_ids, axis=1)
    p_tail = np.clip(1 - np.exp(top_lp).sum(1), 1e-12, None)
    q_tail = np.clip(1 - np.exp(ours_top).sum(1), 1e-12, None)
    kl = (np.exp(top_lp) * (top_lp - ours_top)).sum(1) + p_tail * (np.log(p_tail) - np.log(q_tail))
    our_pick = ours.argmax(1)
    # llama.cpp's log-prob of our pick: from its top-256 when there, else at most its tail mass
    in_top = top_ids == our_pick[:, None]
    ref_lp_of_pick = np.where(in_top.any(1), (top_lp * in_top).sum(1), np.log(p_tail))
    lead = top_lp[:, 0] - ref_lp_of_pick
    agree = float((top_ids[:, 0] == our_pick).mean())
    return float(kl.mean()), int((lead > CONFIDENT).sum()), agree


def chunk_perplexity(llm, fixture: dict, n_chunks: int) -> tuple[float, float]:
    """(ours, llama.cpp's) perplexity over the first n_chunks chunks of the fixture text."""
    from edgellm.perplexity import perplexity

    spec = fixture["perplexity"]
    r = perplexity(llm, TEXT.read_text(encoding="utf-8"), spec["ctx"], max_chunks=n_chunks)
    ref = math.exp(float(np.mean(spec["chunk_mean_nll"][:n_chunks])))
    return r.ppl, ref
