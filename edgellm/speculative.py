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
guess length follows how many of its recent guesses were kept. A draft model's guesses also cost a step
of the draft each: the engine times its own steps (`StepCosts`) and asks the model for guesses only where
the expected tokens per second beat plain decoding's (`adaptive`), so a text the draft guesses badly
decodes at plain speed instead of slower.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

KINDS = ("none", "ngram-simple", "draft")
PREFILL_CHUNK = 256  # a draft model catches up on a sequence's tokens in chunks of this many
CATCH_UP = 2  # up to this many (the usual: a kept guess and the target's token) in one decode step


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
    # ask the draft model only where its guesses pay, by the engine's timings (StepCosts); False: always
    adaptive: bool = True

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
        self.decode_s, self.decode_n = 0.0, 0  # the last propose's one-token steps (StepCosts.guessed)
        self._state: dict[int, tuple[int, int]] = {}  # seq id -> (slot, positions with sound K/V)

    def propose(self, seq: Any, k: int) -> list[int]:
        """k greedy guesses for seq (fewer where its logits are not finite). Sets `decode_s` / `decode_n`:
        the seconds and count of its decode steps (a catch-up of up to CATCH_UP tokens is one step, as
        is each guess after the first; a longer catch-up, a prompt, is left out)."""
        slot, tokens = seq.slot, seq.tokens
        known_slot, done = self._state.get(seq.id, (slot, 0))
        done = done if known_slot == slot else 0
        done = min(done, len(tokens) - 1)
        m = self.model
        n = len(tokens)
        self.decode_s, self.decode_n = 0.0, 0
        t0 = time.perf_counter()
        if n - done <= CATCH_UP:  # the target's last token and the guesses it kept: one decode step
            part = np.asarray(tokens[done:], np.int64)
            t = int(
                m.decode_greedy(part, np.arange(done, n), np.full(len(part), slot, np.int64), self.cache)[-1]
            )
            self.decode_s, self.decode_n = time.perf_counter() - t0, 1
        else:
            x = self._feed(slot, tokens, done)
            t = int(np.argmax(x)) if np.isfinite(x).all() else -1
        out: list[int] = []
        for i in range(k):
            if t < 0:  # logits that are not finite: no guess
                break
            out.append(t)
            if i == k - 1 or n + i + 1 >= self.n_ctx:
                break
            t0 = time.perf_counter()
            t = int(m.decode_greedy(np.array([t]), np.array([n + i]), np.array([slot]), self.cache)[0])
            self.decode_s += time.perf_counter() - t0
            self.decode_n += 1
        self._state[seq.id] = (slot, n + max(len(out) - 1, 0))
        return out

    def _feed(self, slot: int, tokens: list[int], start: int) -> np.ndarray:
        """Run tokens[start:] through the draft as a prompt, in chunks; the last one's logits."""
        x = None
        for s in range(start, len(tokens), PREFILL_CHUNK):
            part = np.asarray(tokens[s : s + PREFILL_CHUNK], np.int64)
            pos = np.arange(s, s + len(part), dtype=np.int64)
            x = self.model.forward(part, pos, np.full(len(part), slot, np.int64), self.cache,
                                   logits_rows=np.array([len(part) - 1], np.int64))[0]  # fmt: skip
        return x

    def prefill(self, seq: Any) -> None:
        """Feed the draft a sequence's prompt (as the target's prompt ends: its time is the prompt's, and
        the first guesses need only the usual one-token catch-up)."""
        slot, done = self._state.get(seq.id, (seq.slot, 0))
        done = done if slot == seq.slot else 0
        if len(seq.tokens) - done > CATCH_UP:
            self._feed(seq.slot, seq.tokens, done)
            self._state[seq.id] = (seq.slot, len(seq.tokens))

    def kept(self, seq: Any, n_before: int, n_draft: int, n_kept: int) -> None:
        """After the check: the draft's K/V are sound for the sequence's tokens before this step and the
        guesses kept (the last guess was never fed to it)."""
        self._state[seq.id] = (seq.slot, n_before + min(n_kept, n_draft - 1))

    def forget(self, seq: Any) -> None:
        self._state.pop(seq.id, None)


MAX_PAUSE = 4  # the model's longest pause; after it the model is asked no more for a sequence
ACCEPT_DECAY = 0.9  # per drafted step: the acceptance estimate follows the text's last ten or so steps
STEP_WEIGHT = 0.3  # moving average of step times
GAIN = 1.03  # guesses must promise 3% more tokens per second than plain decoding


class StepCosts:
    """What the engine's decode steps cost, learnt from its own steps: seconds per step by the tokens it
    feeds (moving averages; the first step of each size is left out, as it may capture a backend plan)
    and seconds per draft-model guess. `guesses` picks how many guesses pay for a sequence."""

    def __init__(self) -> None:
        self.step_s: dict[int, float] = {}
        self._seen: set[int] = set()
        self.guess_s: float | None = None

    def step(self, n_tokens: int, seconds: float) -> None:
        """A decode step fed n_tokens (one per sequence plus its guesses) in `seconds`."""
        if n_tokens not in self._seen:
            self._seen.add(n_tokens)
            return
        old = self.step_s.get(n_tokens)
        self.step_s[n_tokens] = seconds if old is None else old + STEP_WEIGHT * (seconds - old)

    def guessed(self, n: int, seconds: float) -> None:
        """The draft model took `seconds` for n one-token steps."""
        if n > 0:
            per = seconds / n
            self.guess_s = per if self.guess_s is None else self.guess_s + STEP_WEIGHT * (per - self.guess_s)

    def known(self, n_tokens: int) -> bool:
        return n_tokens in self.step_s

    def estimate(self, n_tokens: int) -> float:
        """A step's seconds: measured, else interpolated between the measured sizes around it, else the
        largest smaller one plus 5% of it per token (hopeful: a size is tried, then known)."""
        if n_tokens in self.step_s:
            return self.step_s[n_tokens]
        below = max((m for m in self.step_s if m < n_tokens), default=None)
        above = min((m for m in self.step_s if m > n_tokens), default=None)
        if below is None:
            return self.step_s[above] if above is not None else 0.0
        t0 = self.step_s[below]
        if above is None:
            return t0 * (1 + 0.05 * (n_tokens - below))
        t1 = self.step_s[above]
        return t0 + (t1 - t0) * (n_tokens - below) / (above - below)

    def guesses(
        self,
        acceptance: float,
        n_decoding: int,
        k_max: int,
        by_model: bool = True,
        step: StepGuesses | None = None,
    ) -> int:
        """How many guesses (0 or a bucket up to k_max) maximize the tokens per second of a step with
        n_decoding sequences, this one guessing: k guesses kept with chance a each (until the first
        rejection) yield (1 - a^(k+1)) / (1 - a) tokens and cost a target step k tokens larger, plus k
        draft steps for a draft model's (a lookup's are free). `step` holds what the sequences asked
        before this one in the same step add (tokens fed, tokens expected, draft seconds): each one's
        guesses must pay on top of theirs, and are added to it. Before the plain step is timed: the
        model's 0, the lookup's k_max."""
        b = n_decoding
        if b not in self.step_s:
            return 0 if by_model else k_max
        step = step if step is not None else StepGuesses()
        a = min(acceptance, 0.999)
        g = 0.0
        if by_model:  # before a draft step is timed: a draft a third as slow as the plain step
            g = self.guess_s if self.guess_s is not None else 0.3 * self.step_s[b]
        fed, tokens0, spent = b + step.fed, b + step.expected, step.spent
        best, best_rate, best_extra = 0, GAIN * tokens0 / (self.estimate(fed) + spent), 0.0
        k = 1
        while k <= k_max:
            extra = (1 - a ** (k + 1)) / (1 - a) - 1
            rate = (tokens0 + extra) / (self.estimate(fed + k) + spent + k * g)
            if rate > best_rate:
                best, best_rate, best_extra = k, rate, extra
            k = 2 * k + 1
        step.fed += best
        step.expected += best_extra
        step.spent += best * g
        return best


@dataclass
class StepGuesses:
    """What the sequences that guessed so far in one engine step add to it: tokens fed beyond one per
    sequence, tokens expected beyond one per sequence, seconds of draft-model steps."""

    fed: int = 0
    expected: float = 0.0
    spent: float = 0.0


@dataclass
class Acceptance:
    """Decayed counts of kept guesses and of first rejections (a step ends at its first rejection), so
    kept / (kept + rejected) estimates the chance that a guess is kept."""

    kept: float = 0.0
    missed: float = 0.0

    def add(self, n_draft: int, n_kept: int) -> None:
        self.kept = ACCEPT_DECAY * self.kept + n_kept
        self.missed = ACCEPT_DECAY * self.missed + (n_kept < n_draft)

    def chance(self) -> float:
        """With a prior of 0.5 weighing one guess before any."""
        return (self.kept + 0.5) / (self.kept + self.missed + 1.0)


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
        self._kept = {True: Acceptance(), False: Acceptance()}  # the draft model's guesses, the lookup's
        self._model_backoff = 0
        self.model_rest = 0  # steps the draft model is not asked (its guesses did not pay)
        self.probe = False  # then one guess, to learn whether they pay again

    def ready(self) -> bool:
        """Whether to guess this step (a sequence whose guesses keep failing pauses, longer each time)."""
        if self.rest > 0:
            self.rest -= 1
            return False
        return True

    def acceptance(self, by_model: bool) -> float:
        """The chance that a guess of the draft model (or of the lookup) is kept, from its recent guesses
        (a prior of 0.5 weighing one guess before any)."""
        return self._kept[by_model].chance()

    def pause(self) -> None:
        """The model's guesses do not pay now: skip them for 1, 2, 4 steps, then try one; after that, for
        good. (Each try first feeds the draft the tokens it skipped, a prompt's cost per token, so trying
        on and on would cost a share of every token however rarely it tried.)"""
        self._model_backoff = 2 * self._model_backoff if self._model_backoff else 1
        self.model_rest = self._model_backoff
        self.probe = True
        if self._model_backoff > MAX_PAUSE:
            self.stop_model()

    def stop_model(self) -> None:
        """The draft model is asked no more for this sequence."""
        self.model_rest = 1 << 62

    def paying(self) -> None:
        """The model's guesses pay again: the next pause starts short."""
        self._model_backoff = 0

    def model_ready(self) -> bool:
        """Whether the draft model may guess this step (not while paused)."""
        if self.model_rest > 0:
            self.model_rest -= 1
            return False
        return True

    def record(self, n_draft: int, n_kept: int) -> None:
        self.drafted += n_draft
        self.accepted += n_kept
        self._kept[self.by_model].add(n_draft, n_kept)
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
