"""Speculative decoding by prompt lookup (llama.cpp's `--spec-type ngram-simple`): a decoding sequence's
next tokens are guessed from an earlier place where its last few tokens occurred (in the prompt or the
text so far), and the target model checks all the guesses in one forward; the accepted ones cost one
step instead of one each. Answers that copy from the prompt (code edits, summaries, extraction) gain most.

Exactness: at temperature 0 a draft is kept while it is the target's argmax, then the target's own token
follows, so the text is the one plain decoding gives. At temperature > 0 a draft token d (proposed with
probability 1) is kept with probability p(d) under the target's sampling distribution, and on rejection
the token is drawn from p without d, renormalized: the standard speculative-sampling rule (Leviathan et
al. 2023, Chen et al. 2023) for a deterministic draft, so each token's distribution is the target's.

Adapting to load: a forward over a sequence's guesses costs more than its one-token decode when the
machine is busy, so the engine drafts only while few sequences decode (`max_batch`), and each sequence's
guess length follows how many of its recent guesses were kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

KINDS = ("none", "ngram-simple", "draft")
PREFILL_CHUNK = 256  # a draft model catches up on a sequence's tokens in chunks of this many


@dataclass(frozen=True)
class SpecConfig:
    """`draft_max`: tokens guessed per step at most; `draft_min`: fewer found than this, no guess;
    `ngram_max`/`ngram_min`: the lengths of the suffix looked up, longest first; `max_batch`: draft only
    while at most this many sequences decode."""

    kind: str = "ngram-simple"
    # the draft model's alias or path (-md/--model-draft): kind "draft" guesses with it; kind
    # "ngram-simple" with a model looks up first and asks the model only where the lookup finds nothing
    model: str | None = None
    draft_max: int = 8
    draft_min: int = 1
    ngram_max: int = 4
    ngram_min: int = 2
    max_batch: int = 2

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown speculative kind {self.kind!r}: expected one of {', '.join(KINDS)}")
        if self.kind == "draft" and self.model is None:
            raise ValueError("speculative kind 'draft' needs a draft model (-md/--model-draft)")
        if self.kind == "none" and self.model is not None:
            raise ValueError("a draft model (-md/--model-draft) needs speculative decoding, not kind 'none'")
        if not (1 <= self.draft_min <= self.draft_max <= 64):
            raise ValueError("draft sizes must satisfy 1 <= draft_min <= draft_max <= 64")
        if not (1 <= self.ngram_min <= self.ngram_max <= 16) or self.max_batch < 1:
            raise ValueError("ngram sizes must satisfy 1 <= ngram_min <= ngram_max <= 16; max_batch >= 1")


def ngram_draft(tokens: list[int], k: int, n_max: int = 4, n_min: int = 2) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the sequence's last n tokens (the
    longest n from n_max down to n_min that occurs), or [] when none does."""
    t = np.asarray(tokens, np.int64)
    size = len(t)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        tail = t[size - n :]
        # windows that start before the tail itself, latest first
        starts = np.flatnonzero(t[: size - n] == tail[0])
        for i in starts[::-1]:
            if i + n <= size - 1 and np.array_equal(t[i : i + n], tail):
                follow = t[i + n : i + n + k]
                if len(follow):
                    return [int(x) for x in follow]
    return []


def bucket(n: int) -> int:
    """The largest guess length of the form 2^j - 1 (1, 3, 7, 15, ...) up to n, or 0: a step then feeds
    2^j tokens per drafted sequence, so a backend that captures a plan per batch size keeps a few."""
    b = 0
    while 2 * (b + 1) - 1 <= n:
        b = 2 * (b + 1) - 1
    return b


class DraftModel:
    """A small model with the target's vocabulary that guesses a sequence's next tokens greedily. It keeps
    a KV cache of its own, one row per engine slot, and catches up on each sequence's tokens (its prompt
    on the first guess, then what was kept) before guessing; guesses the target rejects leave stale K/V
    past the sequence's end, overwritten when the real tokens come (attention stops at a row's position)."""

    def __init__(self, model: Any, n_ctx: int, n_seqs: int):
        self.model = model
        self.n_ctx = n_ctx
        self.cache = model.new_kv_cache(n_ctx, n_seqs, window_rings=False)
        self._state: dict[int, tuple[int, int]] = {}  # seq id -> (slot, positions with sound K/V)

    def propose(self, seq: Any, k: int) -> list[int]:
        slot, tokens = seq.slot, seq.tokens
        known_slot, done = self._state.get(seq.id, (slot, 0))
        done = done if known_slot == slot else 0
        done = min(done, len(tokens) - 1)
        m = self.model
        x = None
        if len(tokens) - done == 1:  # the usual catch-up: the target's last token, one decode step
            t = np.array([tokens[-1]], np.int64)
            x = np.asarray(m.decode_step(t, np.array([done]), np.array([slot]), self.cache))[0]
            done = len(tokens)
        for s in range(done, len(tokens), PREFILL_CHUNK):
            part = np.asarray(tokens[s : s + PREFILL_CHUNK], np.int64)
            pos = np.arange(s, s + len(part), dtype=np.int64)
            x = m.forward(part, pos, np.full(len(part), slot, np.int64), self.cache,
                          logits_rows=np.array([len(part) - 1], np.int64))[0]  # fmt: skip
        out: list[int] = []
        n = len(tokens)
        for i in range(k):
            t = int(np.argmax(x))
            out.append(t)
            if i == k - 1 or n + i + 1 >= self.n_ctx:
                break
            x = np.asarray(m.decode_step(np.array([t]), np.array([n + i]), np.array([slot]), self.cache))[0]
        self._state[seq.id] = (slot, n + len(out) - 1)
        return out

    def kept(self, seq: Any, n_before: int, n_draft: int, n_kept: int) -> None:
        """After the check: the draft's K/V are sound for the sequence's tokens before this step and the
        guesses kept (the last guess was never fed to it)."""
        self._state[seq.id] = (seq.slot, n_before + min(n_kept, n_draft - 1))

    def forget(self, seq: Any) -> None:
        self._state.pop(seq.id, None)


def same_vocabulary(a: Any, b: Any) -> bool:
    """Whether two tokenizers have the same tokens, in the same order (a draft must)."""
    return a.vocab_size == b.vocab_size and a.vocab.texts == b.vocab.texts


class SeqSpec:
    """One sequence's drafting state: how long its next guess is, from how its guesses fared."""

    def __init__(self, cfg: SpecConfig):
        self.cfg = cfg
        self.k = cfg.draft_max
        self.drafted = 0
        self.accepted = 0
        self.rest = 0  # steps to skip guessing (after guesses that were all rejected)
        self.by_model = False  # whether this step's guesses came from the draft model (else lookup)
        self._backoff = 0

    def ready(self) -> bool:
        """Whether to guess this step (a sequence whose guesses keep failing pauses, longer each time)."""
        if self.rest > 0:
            self.rest -= 1
            return False
        return True

    def record(self, n_draft: int, n_kept: int) -> None:
        self.drafted += n_draft
        self.accepted += n_kept
        # all kept: guess further; some rejected: guess as far as was kept this time (at least 1)
        self.k = min(self.cfg.draft_max, self.k * 2) if n_kept == n_draft else max(1, n_kept)
        if n_kept == 0:  # a wasted step: pause 1, 2, 4 ... 32 steps before the next guess
            self._backoff = min(32, max(1, self._backoff * 2))
            self.rest = self._backoff
        else:
            self._backoff = 0


def verify(sampler: Any, rows: np.ndarray, draft: list[int], history: list[int]) -> list[int]:
    """The tokens a sequence takes from one speculative step: `rows` are the target's logits after the
    last real token and after each draft token (len(draft) + 1 rows; for plain greedy rows, their argmax
    ids instead). Greedy: drafts while they are
    the argmax, then the argmax. Sampling: the speculative-sampling rule (module docstring). Returns the
    kept drafts followed by one token of the target's."""
    out: list[int] = []
    if rows.ndim == 1:  # plain greedy rows as the backend's argmax ids (decode_greedy; -1: not finite)
        if (rows < 0).any():
            raise ValueError("the logits are not finite")
        for i, d in enumerate(draft):
            if int(rows[i]) != d:
                return out + [int(rows[i])]
            out.append(d)
        return out + [int(rows[len(draft)])]
    for i, d in enumerate(draft):
        ids, probs = sampler.distribution(rows[i], history + out)
        if sampler.is_greedy:
            top = int(ids[0])
            if top != d:
                return out + [top]
            out.append(d)
            continue
        hit = np.flatnonzero(ids == d)
        p_d = float(probs[hit[0]]) if hit.size else 0.0
        if sampler.rng.random() < p_d:
            out.append(d)
            continue
        rest = probs.copy()
        if hit.size:
            rest[hit[0]] = 0.0
        total = rest.sum()
        if total <= 0:  # p was all on d (cannot happen after a rejection, but keep it safe)
            return out + [d]
        return out + [int(ids[_draw(sampler.rng, rest / total)])]
    ids, probs = sampler.distribution(rows[len(draft)], history + out)
    if sampler.is_greedy:
        return out + [int(ids[0])]
    return out + [int(ids[_draw(sampler.rng, probs)])]


def _draw(rng: np.random.Generator, p: np.ndarray) -> int:
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(p) - 1))
