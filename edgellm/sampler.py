"""Token sampling: llama.cpp's default sampler chain, one token per row of a [B, V] logits array.

Mirrors ggml-org/llama.cpp `src/llama-sampler.cpp` (the `llama_sampler_*_apply` steps; the file was
`src/llama-sampling.cpp` before its rename) and `common/sampling.cpp` (`common_sampler_init`, which builds
the chain in the order of `common_params_sampling::samplers` in `common/common.h`), as vendored in
llama-cpp-python 0.3.36. Promise: same params, seed, logits and history -> same tokens, in any process.
Each step is a small pure function (like mlx-lm's `sample_utils`); `make_sampler` composes them for one
row and `Sampler` runs one such row sampler per sequence of a batch. Beyond the default chain: DRY,
top-n-sigma, XTC, min_keep, dynamic temperature, mirostat 1 and 2, the infill step and adaptive-p, each
checked against libllama's on real vocabularies (scripts/make_sampler_fixtures.py), and vLLM's
allowed_token_ids and bad_words. The draws come from numpy's PCG64, not llama.cpp's mt19937: the same
distributions, not the same tokens as llama.cpp for a given seed.
"""

from __future__ import annotations

import math
import numbers
import types
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, NamedTuple

import numpy as np

# ---------------------------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class SamplingParams:
    """Per-sequence sampling parameters; defaults are llama.cpp's (common/common.h)."""

    temperature: float = 0.8  # 0 => greedy argmax of the logits after logit bias and penalties
    top_k: int = 40  # <= 0 => disabled
    top_p: float = 0.95  # 1.0 => disabled
    min_p: float = 0.05  # 0 => disabled
    typical_p: float = 1.0  # 1.0 => disabled
    repeat_penalty: float = 1.0  # 1.0 => disabled
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_last_n: int = 64  # penalty window over the last N history tokens; 0 disables, -1 = whole history
    logit_bias: Mapping[int, float] | None = None  # token id -> added logit; -inf bans the token
    seed: int | None = None  # None => a fresh random seed per row sampler
    min_keep: int = 0  # top_p, min_p, typical_p and xtc keep at least this many tokens (0 = no floor)
    top_n_sigma: float = -1.0  # keep logits within n standard deviations of the largest; <= 0 => disabled
    xtc_probability: float = 0.0  # XTC: chance per token of removing the likely tokens; 0 => disabled
    xtc_threshold: float = 0.1  # XTC: tokens at or above this probability (all but the last) go; > 0.5 => off
    dynatemp_range: float = 0.0  # temperature in [t - range, t + range] by the entropy; 0 => fixed
    dynatemp_exponent: float = 1.0
    dry_multiplier: float = 0.0  # DRY (don't repeat yourself) penalty; 0 => disabled
    dry_base: float = 1.75  # penalty = multiplier * base ** (repeat length - allowed length); < 1 => disabled
    dry_allowed_length: int = 2  # repeats up to this long go unpenalized
    dry_penalty_last_n: int = 64  # window scanned for repeats; 0 disables, -1 = whole history
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", '"', "*")  # a repeat never runs across these
    mirostat: int = 0  # 1 or 2: Mirostat (v1, v2) replaces the whole chain but logit bias and temperature
    mirostat_tau: float = 5.0  # target surprise (bits)
    mirostat_eta: float = 0.1  # learning rate
    allowed_token_ids: tuple[int, ...] | None = None  # vLLM's: only these may be sampled (None: all)
    # vLLM's bad_words as token ids: a sequence's last token is banned where the history ends with the rest
    banned_sequences: tuple[tuple[int, ...], ...] = ()
    infill: bool = False  # llama.cpp's infill sampler (after top_p, before temperature): code completion
    # llama.cpp's adaptive-p: the draw favours tokens near a target probability, adapted to what was drawn
    # (an exponential moving average); on only when named in a samplers list, as llama.cpp's
    adaptive_p: bool = False
    adaptive_target: float = -1.0  # < 0: a plain draw
    adaptive_decay: float = 0.9  # clamped to [0, 0.99]

    def __post_init__(self) -> None:
        if self.logit_bias is not None:  # freeze a private copy so a caller's later edits cannot leak in
            object.__setattr__(self, "logit_bias", types.MappingProxyType(dict(self.logit_bias)))
        if isinstance(self.dry_sequence_breakers, list):
            object.__setattr__(self, "dry_sequence_breakers", tuple(self.dry_sequence_breakers))
        if self.allowed_token_ids is not None and not isinstance(self.allowed_token_ids, tuple):
            object.__setattr__(self, "allowed_token_ids", tuple(self.allowed_token_ids))
        if not isinstance(self.banned_sequences, tuple) or not all(
            type(b) is tuple for b in self.banned_sequences
        ):
            object.__setattr__(self, "banned_sequences", tuple(tuple(b) for b in self.banned_sequences))

    @property
    def dry_on(self) -> bool:
        """Whether DRY changes anything (llama_sampler_init_dry's test; mirostat replaces it)."""
        return (
            self.mirostat == 0
            and self.dry_multiplier != 0.0
            and self.dry_base >= 1.0
            and self.dry_penalty_last_n != 0
        )

    @property
    def xtc_on(self) -> bool:
        return self.mirostat == 0 and self.xtc_probability > 0.0 and self.xtc_threshold <= 0.5

    def validate(self, n_vocab: int | None = None) -> None:
        """Raise ValueError naming the first bad field; with `n_vocab`, logit_bias ids must be < n_vocab."""
        for name, error in _field_errors(self, n_vocab):
            raise ValueError(f"SamplingParams.{name} {error}")

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any], **overrides: Any) -> SamplingParams:
        """Defaults from a model's `general.sampling.*` keys; explicit `overrides` win.

        Mirrors `common_init_sampler_from_model` (llama.cpp `common/common.cpp`; key names from
        `src/llama-arch.cpp`): a value that does not parse as a number is skipped, as llama.cpp's
        strtol/strtof do. `general.sampling.sequence` (a sampler order) is ignored: edgellm runs one order.
        A value that parses but is out of range (a NaN temperature in an untrusted file) raises ValueError
        naming the key.
        """
        from_file: dict[str, str] = {}
        kwargs: dict[str, Any] = {}
        for key, (field, kind) in GGUF_SAMPLING_KEYS.items():
            if key in metadata and field not in overrides:
                value = _parse_metadata_number(metadata[key], kind)
                if value is not None:
                    kwargs[field] = value
                    from_file[field] = key
        kwargs.update(overrides)
        params = cls(**kwargs)
        for name, error in _field_errors(params, None):
            where = f" (from GGUF metadata key {from_file[name]})" if name in from_file else ""
            raise ValueError(f"SamplingParams.{name} {error}{where}")
        return params


# general.sampling.* key -> (SamplingParams field, int or float), as read by llama.cpp's common/common.cpp
GGUF_SAMPLING_KEYS: dict[str, tuple[str, type]] = {
    "general.sampling.top_k": ("top_k", int),
    "general.sampling.top_p": ("top_p", float),
    "general.sampling.min_p": ("min_p", float),
    "general.sampling.temp": ("temperature", float),
    "general.sampling.penalty_last_n": ("repeat_last_n", int),
    "general.sampling.penalty_repeat": ("repeat_penalty", float),
    "general.sampling.xtc_probability": ("xtc_probability", float),
    "general.sampling.xtc_threshold": ("xtc_threshold", float),
    "general.sampling.mirostat": ("mirostat", int),
    "general.sampling.mirostat_tau": ("mirostat_tau", float),
    "general.sampling.mirostat_eta": ("mirostat_eta", float),
}


def _parse_metadata_number(value: Any, kind: type) -> int | float | None:
    if isinstance(value, (bool, np.bool_)):
        return None  # llama.cpp formats a bool as "true"/"false", which strtol/strtof reject
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if not isinstance(value, numbers.Real):
        return None
    if kind is int:
        v = float(value)
        return int(v) if math.isfinite(v) else None  # strtol of "40.000000" reads 40
    return float(value)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _field_errors(p: SamplingParams, n_vocab: int | None) -> Iterator[tuple[str, str]]:
    """Yield (field, message) for every invalid field, in declaration order."""

    def real(name: str, ok: Callable[[float], bool], what: str) -> Iterator[tuple[str, str]]:
        v = getattr(p, name)
        if not (_is_real(v) and math.isfinite(v) and ok(v)):
            yield name, f"must be {what}, got {v!r}"

    def int_(name: str, lo: int, what: str) -> Iterator[tuple[str, str]]:
        v = getattr(p, name)
        if not (_is_int(v) and v >= lo):
            yield name, f"must be an int >= {lo} ({what}), got {v!r}"

    yield from real("temperature", lambda v: v >= 0, "a finite number >= 0 (0 = greedy)")
    yield from int_("top_k", -1, "<= 0 = off")
    yield from real("top_p", lambda v: 0 < v <= 1, "in (0, 1] (1 = off)")
    yield from real("min_p", lambda v: 0 <= v <= 1, "in [0, 1] (0 = off)")
    yield from real("typical_p", lambda v: 0 < v <= 1, "in (0, 1] (1 = off)")
    yield from real("repeat_penalty", lambda v: v > 0, "a finite number > 0 (1 = off)")
    yield from real("frequency_penalty", lambda v: True, "a finite number (0 = off)")
    yield from real("presence_penalty", lambda v: True, "a finite number (0 = off)")
    yield from int_("repeat_last_n", -1, "0 = off, -1 = whole history")
    yield from int_("min_keep", 0, "0 = no floor")
    yield from real("top_n_sigma", lambda v: True, "a finite number (<= 0 = off)")
    yield from real("xtc_probability", lambda v: 0 <= v <= 1, "in [0, 1] (0 = off)")
    yield from real("xtc_threshold", lambda v: True, "a finite number (> 0.5 = off)")
    yield from real("dynatemp_range", lambda v: v >= 0, "a finite number >= 0 (0 = off)")
    yield from real("dynatemp_exponent", lambda v: True, "a finite number")
    yield from real("dry_multiplier", lambda v: v >= 0, "a finite number >= 0 (0 = off)")
    yield from real("dry_base", lambda v: True, "a finite number (< 1 = off)")
    yield from int_("dry_allowed_length", 0, "repeats up to this long are free")
    yield from int_("dry_penalty_last_n", -1, "0 = off, -1 = whole history")
    breakers = p.dry_sequence_breakers
    if not isinstance(breakers, tuple) or not all(isinstance(b, str) for b in breakers):
        yield "dry_sequence_breakers", f"must be a tuple of strings, got {breakers!r}"
    if p.mirostat not in (0, 1, 2) or not _is_int(p.mirostat):
        yield "mirostat", f"must be 0 (off), 1 or 2, got {p.mirostat!r}"
    yield from real("mirostat_tau", lambda v: True, "a finite number")
    yield from real("mirostat_eta", lambda v: True, "a finite number")
    limit = f" < {n_vocab}" if n_vocab is not None else ""

    def ids_ok(ids: Any) -> bool:
        return all(_is_int(t) and 0 <= t < (n_vocab if n_vocab is not None else 1 << 62) for t in ids)

    if p.allowed_token_ids is not None and not (p.allowed_token_ids and ids_ok(p.allowed_token_ids)):
        yield "allowed_token_ids", f"must be a non-empty list of token ids >= 0{limit}"
    yield from real("adaptive_target", lambda v: v <= 1, "a finite number <= 1 (< 0 = a plain draw)")
    yield from real("adaptive_decay", lambda v: True, "a finite number (clamped to [0, 0.99])")
    if p.infill and not 0 < p.top_k <= INFILL_MAX_CANDIDATES:
        yield "infill", f"needs a top_k in [1, {INFILL_MAX_CANDIDATES}] before it (it compares every pair)"
    if not all(b and ids_ok(b) for b in p.banned_sequences):
        yield "banned_sequences", f"must hold non-empty sequences of token ids >= 0{limit}"
    if p.seed is not None:
        yield from int_("seed", 0, "or None for a random seed")
    for tok, bias in (p.logit_bias or {}).items():
        if not _is_int(tok) or tok < 0 or (n_vocab is not None and tok >= n_vocab):
            limit = f" < {n_vocab}" if n_vocab is not None else ""
            yield "logit_bias", f"keys must be token ids >= 0{limit}, got {tok!r}"
        elif not _is_real(bias) or math.isnan(bias) or bias == math.inf:
            yield "logit_bias", f"[{tok}] must be a number or -inf (ban), not NaN or +inf; got {bias!r}"


# ---------------------------------------------------------------------------------------------- steps
# Each step returns new arrays and never writes into its input, so the caller's logits stay untouched.


class Candidates(NamedTuple):
    """The tokens still in play: ids (int64) with their logits (float32); `sorted` = logits descending."""

    ids: np.ndarray
    logits: np.ndarray
    sorted: bool = False


@lru_cache(maxsize=8)
def _all_ids(n: int) -> np.ndarray:
    ids = np.arange(n, dtype=np.int64)
    ids.flags.writeable = False  # shared by every row: steps only ever index it
    return ids


def candidates(logits: np.ndarray) -> Candidates:
    """All V tokens of one row, in id order."""
    return Candidates(_all_ids(logits.size), logits, False)


def apply_logit_bias(logits: np.ndarray, bias: Mapping[int, float]) -> np.ndarray:
    """Add bias[id] to logits[id] (llama_sampler_logit_bias); ids outside the row are ignored, as there."""
    ids = np.fromiter(bias.keys(), np.int64, len(bias))
    vals = np.fromiter(bias.values(), np.float32, len(bias))
    keep = (ids >= 0) & (ids < logits.size)
    out = logits.copy()
    out[ids[keep]] += vals[keep]
    return out


def apply_penalties(
    logits: np.ndarray,
    history: Sequence[int] | np.ndarray,
    *,
    last_n: int = 64,
    repeat: float = 1.0,
    frequency: float = 0.0,
    presence: float = 0.0,
) -> np.ndarray:
    """llama_sampler_penalties over the last `last_n` tokens of `history` (-1: all of it, 0: off).

    For each token seen `count` > 0 times in the window: a logit <= 0 is multiplied by `repeat`, a positive
    one divided by it, then `count * frequency + presence` is subtracted. float32 throughout, as in llama.cpp.
    """
    if last_n == 0 or (repeat == 1.0 and frequency == 0.0 and presence == 0.0) or len(history) == 0:
        return logits
    window = np.asarray(history[-last_n:] if last_n > 0 else history, dtype=np.int64)
    window = window[(window >= 0) & (window < logits.size)]
    ids, counts = np.unique(window, return_counts=True)
    x = logits[ids]
    x = np.where(x <= 0, x * np.float32(repeat), x / np.float32(repeat))
    x -= counts.astype(np.float32) * np.float32(frequency) + np.float32(presence)
    out = logits.copy()
    out[ids] = x
    return out


def allow_only(logits: np.ndarray, ids: Sequence[int]) -> np.ndarray:
    """vLLM's allowed_token_ids: every other token's logit is -inf (ids outside the row are ignored)."""
    keep = np.asarray(ids, np.int64)
    keep = keep[(keep >= 0) & (keep < logits.size)]
    out = np.full_like(logits, -np.inf)
    out[keep] = logits[keep]
    return out


def ban_sequences(
    logits: np.ndarray, history: Sequence[int], banned: Sequence[tuple[int, ...]]
) -> np.ndarray:
    """vLLM's bad_words (NoBadWordsLogitsProcessor) as token ids: a one-token sequence is banned always, a
    longer one's last token where the history ends with the rest. (vLLM matches the generated tokens
    only; here the prompt's end counts too, so a banned word cannot straddle it.)"""
    ban = [b[-1] for b in banned if len(b) == 1 or tuple(history[len(history) - len(b) + 1 :]) == b[:-1]]
    ban = [t for t in ban if 0 <= t < logits.size]
    if not ban:
        return logits
    out = logits.copy()
    out[ban] = -np.inf
    return out


def greedy(logits: np.ndarray) -> int:
    """Index of the largest logit; ties go to the lowest id (llama.cpp breaks them by candidate order)."""
    return int(np.argmax(logits))


# Survivor sets larger than this stay in id order instead of being sorted: the order of candidates changes
# which token a given uniform draw maps to, never the distribution, and sorting 100k+ ids costs ~20 ms.
SORT_LIMIT = 4096


def _smallest(key: np.ndarray, k: int, ordered: bool = True) -> np.ndarray:
    """Positions of the k smallest keys; equal keys at the boundary keep the lowest positions.
    ordered: smallest first (ties by position); otherwise in position order. Costs O(n) plus a sort of k."""
    n = key.size
    if k < n:
        kth = np.partition(key, k - 1)[k - 1]
        idx = np.flatnonzero(key <= kth)
        if idx.size > k:  # ties at the boundary: keep the lowest positions among those equal to kth
            below = np.flatnonzero(key < kth)
            tied = np.flatnonzero(key == kth)[: k - below.size]
            idx = np.sort(np.concatenate([below, tied]))
    else:
        idx = np.arange(n)
    return idx[np.argsort(key[idx], kind="stable")] if ordered else idx


def _top_indices(logits: np.ndarray, k: int, ordered: bool = True) -> np.ndarray:
    """Positions of the k largest logits (ties: lowest position), largest first if `ordered`."""
    return _smallest(-logits, k, ordered)


def softmax(logits: np.ndarray) -> np.ndarray:
    """float32 probabilities (llama_sampler_softmax_impl); -inf logits get probability 0."""
    p = np.exp(logits - logits.max())
    return p / p.sum(dtype=np.float32)


def top_k(c: Candidates, k: int) -> Candidates:
    """Keep the k highest logits, sorted descending (llama_sampler_top_k_impl). k <= 0: unchanged."""
    if k <= 0:
        return c
    k = min(k, c.logits.size)
    if c.sorted:
        return Candidates(c.ids[:k], c.logits[:k], True)
    idx = _top_indices(c.logits, k)
    return Candidates(c.ids[idx], c.logits[idx], True)


def typical_p(c: Candidates, p: float, min_keep: int = 0) -> Candidates:
    """Locally typical sampling (llama_sampler_typical_apply): keep the tokens whose surprise is closest to
    the entropy until their probability mass exceeds p (and at least min_keep). p >= 1: unchanged. The
    result is in typicality order (ties by current order). Like top_p, it orders only as many candidates as
    the cutoff needs.
    """
    if p >= 1.0:
        return c
    probs = softmax(c.logits)
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.log(probs)
        # llama.cpp gets NaN from 0 * log(0); a token of probability 0 adds no entropy and is least typical
        entropy = -np.sum(np.where(probs > 0, probs * logp, 0), dtype=np.float32)
        score = np.where(probs > 0, np.abs(-logp - entropy), np.float32(np.inf))
    n = probs.size
    k = n if n <= 1024 else 256
    while True:
        order = _smallest(score, k)
        cum = np.cumsum(probs[order], dtype=np.float32)
        last = int(np.searchsorted(cum, np.float32(p), side="right")) + 1  # first i with cum[i] > p, incl.
        last = max(last, min_keep)
        if last <= k or k == n:
            break
        k = min(8 * k, n)
    order = order[: min(last, n)]
    return Candidates(c.ids[order], c.logits[order], False)


def top_p(c: Candidates, p: float, min_keep: int = 0) -> Candidates:
    """Nucleus sampling (llama_sampler_top_p_apply): keep the fewest most likely tokens whose probability
    mass reaches p (at least one, and at least min_keep; all of them if rounding never reaches p). p >= 1:
    unchanged.

    Like llama.cpp's adaptive partial sort, unsorted candidates are not fully sorted: the cutoff is found
    on the top 256 probabilities, growing 8x per miss; the cumulative sum runs over probabilities in
    descending order in float32, as llama.cpp's cum_sum does.
    """
    if p >= 1.0:
        return c
    probs = softmax(c.logits)
    target = np.float32(p)
    n = c.logits.size
    if c.sorted:
        last = int(np.searchsorted(np.cumsum(probs, dtype=np.float32), target, side="left")) + 1
        last = max(last, min_keep)
        return Candidates(c.ids[:last], c.logits[:last], True)
    k = min(n, 256)
    while True:
        top = probs if k == n else np.partition(probs, n - k)[n - k :]
        cum = np.cumsum(np.sort(top)[::-1], dtype=np.float32)
        last = int(np.searchsorted(cum, target, side="left")) + 1  # first i with cum[i] >= p, inclusive
        last = max(last, min_keep)  # the sum is monotone: the first i meeting both conditions
        if last <= k or k == n:
            break
        k = min(8 * k, n)
    last = min(last, n)
    ordered = last <= SORT_LIMIT
    idx = _top_indices(c.logits, last, ordered)
    return Candidates(c.ids[idx], c.logits[idx], ordered)


def min_p(c: Candidates, p: float, min_keep: int = 0) -> Candidates:
    """Keep tokens with probability >= p * max probability, i.e. logit >= max + log(p)
    (llama_sampler_min_p_apply). Order is preserved. p <= 0: unchanged. Fewer than min_keep pass: the
    min_keep most likely are kept, sorted (llama.cpp's sorted fallback)."""
    if p <= 0.0 or c.logits.size == 0:
        return c
    min_logit = c.logits.max() + np.log(np.float32(p))
    keep = np.flatnonzero(c.logits >= min_logit)
    if keep.size >= min_keep:
        return Candidates(c.ids[keep], c.logits[keep], c.sorted)
    idx = _top_indices(c.logits, min(min_keep, c.logits.size))
    return Candidates(c.ids[idx], c.logits[idx], True)


def top_n_sigma(c: Candidates, n: float) -> Candidates:
    """Top-nσ (llama_sampler_top_n_sigma_apply): logits below max - n * std (over the logits that are not
    -inf) become -inf; the candidates keep their places. n <= 0 or fewer than 2 candidates: unchanged. The
    sums run one by one in float32 as llama.cpp's (which adds each square in double before rounding: the
    cut can differ from its in the last bit)."""
    x = c.logits
    if n <= 0.0 or x.size <= 1:
        return c
    valid = x[x != -np.inf]
    if valid.size == 0:
        return c
    f32 = np.float32
    mean = np.cumsum(valid, dtype=f32)[-1] / f32(valid.size)
    acc = np.cumsum(((valid - mean).astype(np.float64) ** 2).astype(f32), dtype=f32)[-1]
    cut = valid.max() - f32(n) * np.sqrt(acc / f32(valid.size))
    return Candidates(c.ids, np.where(x < cut, np.float32(-np.inf), x), c.sorted)


def xtc(
    c: Candidates, probability: float, threshold: float, min_keep: int, rng: np.random.Generator
) -> Candidates:
    """Exclude Top Choices (llama_sample_xtc_apply): with chance `probability` (one uniform from `rng`,
    drawn only when the step is on and 2+ candidates remain), every token at or above `threshold`
    probability but the least likely of them is removed, unless fewer than min_keep would remain.
    threshold > 0.5 or probability <= 0: unchanged."""
    n = c.logits.size
    if probability <= 0.0 or threshold > 0.5 or n < 2:
        return c
    if rng.random() > probability:
        return c
    probs = softmax(c.logits)
    # at most 1/threshold tokens can reach the threshold: order only those (all when it is <= 0)
    m = n if threshold <= 0 else min(n, int(1.0 / threshold) + 2)
    order = np.arange(n) if c.sorted else _top_indices(c.logits, m)
    run = probs[order[:m]] >= np.float32(threshold)
    pos_last = (m if run.all() else int(np.argmin(run))) - 1  # the last of the leading run
    if pos_last <= 0 or n - pos_last < min_keep:
        return c
    keep = np.ones(n, bool)
    keep[order[:pos_last]] = False
    return Candidates(c.ids[keep], c.logits[keep], c.sorted)


INFILL_MAX_CANDIDATES = 1024  # the infill step compares every pair of candidates: a top_k must come first


def infill(c: Candidates, eog: frozenset[int], piece: Callable[[int], bytes], eot: int) -> Candidates:
    """llama.cpp's infill sampler (llama_sampler_infill_apply), for code completion: when end-of-generation
    tokens hold enough of the mass (3 * p_eog * n > p_text) only they remain; else a token whose text
    begins another's gives its probability to the likelier of the two and leaves; then tokens under 0.2
    go (end-of-generation ones stay; none left but those: the end-of-turn token alone), and of the rest
    those under 1 / (kept + 1). The draw after it reads the logits, so it is the set that counts here."""
    n = c.logits.size
    if n > INFILL_MAX_CANDIDATES:
        raise ValueError(
            f"the infill sampler needs at most {INFILL_MAX_CANDIDATES} candidates: put top_k first"
        )
    order = np.arange(n) if c.sorted else _top_indices(c.logits, n)
    ids, logits = c.ids[order], c.logits[order].copy()
    e = _f32_of(np.exp, logits - logits[0])
    p = e / np.cumsum(e, dtype=np.float32)[-1]
    is_eog = np.fromiter((int(t) in eog for t in ids), bool, n)
    p_eog = np.cumsum(p[is_eog], dtype=np.float32)[-1] if is_eog.any() else np.float32(0)
    p_txt = np.cumsum(p[~is_eog], dtype=np.float32)[-1] if (~is_eog).any() else np.float32(0)
    if 3 * p_eog * n > p_txt:
        return Candidates(ids[is_eog], logits[is_eog], True)
    pieces = [piece(int(t)) for t in ids]
    for i0 in range(n):  # a token whose text begins another's: merged into the likelier (llama.cpp's order)
        for i1 in range(n):
            if logits[i0] == -np.inf:
                break
            if i0 == i1 or logits[i1] == -np.inf:
                continue
            a, b = pieces[i0], pieces[i1]
            if a and b.startswith(a):
                dst, src = (i1, i0) if p[i1] > p[i0] else (i0, i1)
                p[dst] += p[src]
                logits[src], p[src] = -np.inf, 0.0
    keep = (p >= np.float32(0.2)) | is_eog
    n_text = int(np.count_nonzero(keep & ~is_eog))
    if n_text == 0:
        return Candidates(np.array([eot], np.int64), np.array([1.0], np.float32), True)
    ids, logits, p, is_eog = ids[keep], logits[keep], p[keep], is_eog[keep]
    p = p / np.cumsum(p, dtype=np.float32)[-1]
    keep = (p >= np.float32(1.0 / (n_text + 1))) | is_eog
    return Candidates(ids[keep], logits[keep], True)


def dynamic_temperature(c: Candidates, t: float, delta: float, exponent: float) -> Candidates:
    """Entropy-scaled temperature (llama_sampler_temp_ext_apply): delta > 0 maps the candidates'
    normalized entropy to a temperature in [max(0, t - delta), t + delta] through `** exponent`;
    delta <= 0 is plain temperature t."""
    if delta <= 0.0:
        return temperature(c, t)
    n = c.logits.size
    if n <= 1:
        return c
    f32 = np.float32
    lo, hi = f32(max(0.0, t - delta)), f32(t + delta)
    # llama.cpp sums in float32, one by one, over the candidates sorted by probability: so here. Its expf,
    # logf and powf are (almost always) correctly rounded: float64 rounded to float32 gives the same on any
    # CPU, where numpy's float32 exp and log differ by an ulp between its SIMD paths
    e = np.sort(_f32_of(np.exp, c.logits - c.logits.max()))[::-1]
    p = e / np.cumsum(e, dtype=f32)[-1]
    p = p[p > 0]
    entropy = -np.cumsum(p * _f32_of(np.log, p), dtype=f32)[-1]
    normalized = entropy / -_f32_of(np.log, f32(1.0) / f32(n))
    scale = f32(np.power(np.float64(normalized), np.float64(f32(exponent))))
    return temperature(c, float(lo + (hi - lo) * scale))


def _f32_of(fn: Callable[[np.ndarray], np.ndarray], x: Any) -> np.ndarray:
    """fn in float64, rounded to float32: a correctly rounded float32 result on every CPU."""
    return np.asarray(fn(np.asarray(x, np.float64)), np.float64).astype(np.float32)


def temperature(c: Candidates, t: float) -> Candidates:
    """Divide logits by t (llama_sampler_temp_impl). t <= 0 keeps only the first largest logit."""
    if t <= 0.0:
        i = int(np.argmax(c.logits))
        return Candidates(c.ids[i : i + 1], c.logits[i : i + 1], True)
    if t == 1.0:
        return c
    return Candidates(c.ids, c.logits / np.float32(t), c.sorted)


_NO_TOKEN = "no token to sample: every logit is -inf (banned) or the row holds NaN/+inf"


def draw(c: Candidates, rng: np.random.Generator) -> int:
    """Draw one token id from softmax(logits) with one uniform from `rng` (llama_sampler_dist_apply:
    the first candidate whose running sum of exp(logit - max) reaches u * total, summed in double)."""
    return int(c.ids[_draw_position(c, rng)])


ADAPTIVE_WIDTH, ADAPTIVE_PEAK, ADAPTIVE_SHARPNESS = np.float32(0.3), np.float32(5.0), np.float32(10.0)


def _probs_in_order(c: Candidates) -> np.ndarray:
    """llama_sampler_softmax_impl without sorting: float32, summed one by one in the candidates' order;
    exp in float64 rounded to float32 (glibc's expf is correctly rounded; numpy's float32 exp can be 1 ulp
    off, which the adaptive-p transform shows)."""
    e = _f32_of(np.exp, c.logits - c.logits.max())
    return e / np.cumsum(e, dtype=np.float32)[-1]


def adaptive_p(
    c: Candidates, target: float, weighted_sum: float, total_weight: float, p: np.ndarray | None = None
) -> Candidates:
    """llama.cpp's adaptive-p transform (llama_sampler_adaptive_p_apply): the target moved against the
    moving average of the drawn tokens' probabilities, each finite logit becomes 5 - 10 d^2 / (1 + d) with
    d = |p - target| / 0.3, p its probability before (`_probs_in_order(c)`, computed here unless given)."""
    f32 = np.float32
    p = _probs_in_order(c) if p is None else p
    t = f32(min(max(target, 0.0), 1.0))
    if total_weight != 0:
        t = f32(2) * t - f32(weighted_sum) / f32(total_weight)
    t = f32(min(max(float(t), 0.0), 1.0))
    d = np.abs((p - t) * (f32(1) / ADAPTIVE_WIDTH))
    y = ADAPTIVE_PEAK - ADAPTIVE_SHARPNESS * d * d / (f32(1) + d)
    return Candidates(c.ids, np.where(c.logits == -np.inf, c.logits, y).astype(f32), False)


def _draw_position(c: Candidates, rng: np.random.Generator) -> int:
    if c.logits.size == 0 or not np.isfinite(c.logits.max()):
        raise ValueError(_NO_TOKEN)
    w = np.exp(c.logits - c.logits.max())
    cum = np.cumsum(w, dtype=np.float64)
    i = int(np.searchsorted(cum, cum[-1] * rng.random(), side="left"))  # u < 1, so i < n
    if w[i] == 0:  # only when u == 0 and leading weights are 0: never pick an impossible token
        i = int(np.argmax(w > 0))
    return i


_INT_MIN = -(1 << 31)


def _c_int(v: float) -> int:
    """C's (int) of a float on x86 (cvttss2si): truncation; NaN and out of range give INT_MIN."""
    return int(v) if math.isfinite(v) and -(2.0**31) <= v < 2.0**31 else _INT_MIN


def mirostat_top(c: Candidates, mu: float, n_vocab: int, m: int = 100) -> Candidates:
    """Mirostat's truncation (llama_sampler_mirostat_apply): estimate the Zipf exponent s from the m most
    likely tokens, then keep the k most likely, k from s, the target surprise mu and the vocabulary size."""
    n = c.logits.size
    top = _top_indices(c.logits, min(m, n))
    p = softmax(c.logits)[top]
    cnt = min(m - 1, n - 1)
    i = np.arange(cnt, dtype=np.float32)
    t = np.log((i + 2) / (i + 1))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        b = np.log(p[:cnt] / p[1 : cnt + 1])
        s_hat = np.float32(np.cumsum(t * b, dtype=np.float32)[-1] if cnt else 0) / np.float32(
            np.cumsum(t * t, dtype=np.float32)[-1] if cnt else 0
        )
        eps = s_hat - np.float32(1)
        scale = eps * np.power(np.float32(2), np.float32(mu)) / (1 - np.power(np.float32(n_vocab), -eps))
        k = np.power(scale, np.float32(1) / s_hat)
    k = max(_c_int(float(k)), 1)
    if k <= top.size:
        return Candidates(c.ids[top[:k]], c.logits[top[:k]], True)
    return top_k(c, k)


def mirostat_v2_top(c: Candidates, mu: float) -> Candidates:
    """Mirostat 2.0's truncation (llama_sampler_mirostat_v2_apply): keep the tokens whose surprise
    -log2(p) is at most mu (at least the most likely one)."""
    with np.errstate(divide="ignore"):
        keep = np.flatnonzero(-np.log2(softmax(c.logits)) <= np.float32(mu))
    if keep.size == 0:
        keep = np.array([int(np.argmax(c.logits))])
    return Candidates(c.ids[keep], c.logits[keep], c.sorted)


# ---------------------------------------------------------------------------------------------- DRY
# Mirrors ggml-org/llama.cpp src/llama-sampler.cpp (llama_sampler_dry_apply and
# get_overlapping_token_sequences, ported there from koboldcpp PR 982 by pi6am).

DRY_MAX_BREAKER_BYTES = 40  # a longer sequence breaker is cut to this many bytes, as llama.cpp does
DRY_MAX_TAIL_TOKENS = 20


def dry_breakers(
    pieces: Sequence[bytes], encode: Callable[[str], list[int]], breakers: Sequence[str]
) -> dict[int, tuple[tuple[int, ...], ...]]:
    """DRY's restart sequences: token id -> the token tails that complete a breaker after it. A token
    whose text contains a breaker has the empty tail; one whose text ends with a breaker's beginning has
    the rest of the breaker, tokenized (`encode`: no special tokens), at most 20 tokens. `pieces`: every
    token's bytes (special tokens as their text). A tail that is not whole UTF-8 is left out (llama.cpp
    tokenizes the raw bytes; only a multi-byte breaker split inside a character can give one)."""
    out: dict[int, list[tuple[int, ...]]] = {}
    for text in breakers:
        s = text.encode()[:DRY_MAX_BREAKER_BYTES]
        if not s:
            continue
        head = s[:1]
        for tok, word in enumerate(pieces):
            if head not in word:
                continue
            if s in word:
                out.setdefault(tok, []).append(())
                continue
            pos = word.find(head)
            while pos != -1:
                rest = word[pos:]
                if s.startswith(rest):  # the word ends with the breaker's first len(rest) bytes
                    try:
                        tail = tuple(encode(s[len(rest) :].decode())[:DRY_MAX_TAIL_TOKENS])
                    except UnicodeDecodeError:
                        tail = None
                    if tail is not None and tail not in out.get(tok, ()):
                        out.setdefault(tok, []).append(tail)
                pos = word.find(head, pos + 1)
    return {tok: tuple(tails) for tok, tails in out.items()}


_VOCAB_BREAKERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def vocab_dry_breakers(tokenizer: Any, breakers: Sequence[str]) -> dict[int, tuple[tuple[int, ...], ...]]:
    """`dry_breakers` over a tokenizer's vocabulary: each token detokenized alone with special tokens as
    text (llama.cpp's `vocab.detokenize({id}, true)`), tails encoded without special tokens. Cached per
    tokenizer and breaker list (the vocabulary's texts once per tokenizer)."""
    cache = _VOCAB_BREAKERS.setdefault(tokenizer, {})
    key = tuple(breakers)
    if key not in cache:
        if "pieces" not in cache:
            cache["pieces"] = [tokenizer.detokenize([t], True) for t in range(tokenizer.vocab_size)]
        cache[key] = dry_breakers(cache["pieces"], lambda s: tokenizer.encode(s, add_special=False), key)
    return cache[key]


def dry_penalties(
    logits: np.ndarray,
    history: Sequence[int],
    *,
    multiplier: float,
    base: float,
    allowed_length: int,
    last_n: int,
    breakers: Mapping[int, Sequence[tuple[int, ...]]],
) -> np.ndarray:
    """DRY: a token that would extend a repeat of the last tokens (a run seen before in the window of the
    last `last_n`, -1: all) longer than `allowed_length` loses multiplier * base ** (length - allowed) from
    its logit. A repeat never reaches back across a sequence breaker; a token that is a breaker on its own
    is never penalized. Off when multiplier is 0, base < 1 or last_n is 0."""
    if multiplier == 0.0 or base < 1.0 or last_n == 0:
        return logits
    r = list(history[-last_n:] if last_n > 0 else history)[::-1]  # r[i]: i tokens back (ring_buffer.rat)
    n = len(r)
    if n <= allowed_length:
        return logits
    # 1: the nearest restart sequence limits how far back a repeat may reach
    rep_limit = n
    for i in range(n):
        tails = breakers.get(r[i])
        if not tails:
            continue
        longest = -1
        for tail in tails:
            k = len(tail)
            if longest < k <= i and all(tail[o] == r[i - o - 1] for o in range(k)):
                longest = k
        if longest >= 0:
            rep_limit = i - longest
            break
    if rep_limit < allowed_length:
        return logits
    # 2: the Z-algorithm backwards: count[last - k] = length of the suffix repeated ending k tokens back
    count = [0] * n
    last, lt, rt = n - 1, 0, 0
    for k in range(1, n):
        if k > rt:
            m = 0
            while m + k < n and r[m] == r[m + k]:
                m += 1
            count[last - k] = min(m, rep_limit)
            if m > 0:
                lt, rt = k, k + m - 1
        elif count[last - (k - lt)] < rt - k + 1:
            count[last - k] = min(count[last - (k - lt)], rep_limit)
        else:
            j = rt + 1
            while j < n and r[j] == r[j - k]:
                j += 1
            count[last - k] = min(j - k, rep_limit)
            lt, rt = k, j - 1
    # 3: the token after each repeat would extend it; keep the longest repeat per token
    longest_for: dict[int, int] = {}
    for i in range(n - 1):
        length = count[i]
        if length >= allowed_length:
            tok = r[n - 2 - i]
            if longest_for.get(tok, -1) < length:
                longest_for[tok] = length
    # 4: penalize (not a token that is a breaker by itself); the exponent is capped so pow stays finite
    max_exponent = int(np.float32(88.7228391) / np.float32(math.log(base))) if base > 1.000001 else 0
    out = logits
    for tok, length in longest_for.items():
        if not 0 <= tok < logits.size or () in breakers.get(tok, ()):
            continue
        e = length - allowed_length
        if max_exponent > 0 and e > max_exponent:
            e = max_exponent
        if out is logits:
            out = logits.copy()
        penalty = np.float32(float(np.float32(multiplier)) * float(np.float32(base)) ** e)  # pow in double
        out[tok] = out[tok] - penalty
    return out


# ---------------------------------------------------------------------------------------------- one row


def _penalties_active(p: SamplingParams) -> bool:
    return p.repeat_last_n != 0 and not (
        p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0
    )


class RowSampler:
    """One sequence's sampler: the composed chain and its own RNG stream. Call it as `fn(logits, history)`.

    `dry_breakers` (from `dry_breakers()` over the model's vocabulary) are DRY's restart sequences; without
    them DRY still runs, with no breakers. `vocab` (the model's tokenizer: eog_ids, eot_id, eos_id,
    token_to_piece) is needed by the infill step. Mirostat keeps its state (mu) here, so a row sampler
    serves one sequence from its first token to its last."""

    def __init__(
        self,
        params: SamplingParams,
        rng: np.random.Generator | None = None,
        *,
        dry_breakers: Mapping[int, Sequence[tuple[int, ...]]] | None = None,
        vocab: Any = None,
    ):
        params.validate()
        self.params = params
        # seed None => a fresh one from the OS, kept so a caller can report it (llama.cpp's seed_cur)
        self.seed: int | None = params.seed
        if rng is None:
            if self.seed is None:
                self.seed = int(np.random.SeedSequence().entropy)
            rng = np.random.Generator(np.random.PCG64(self.seed))
        self.rng = rng
        # temperature 0 is the argmax, unless a step after the filters can still move it (XTC removes the
        # top tokens; a dynamic temperature may rise above 0)
        self.is_greedy = params.temperature <= 0.0 and (
            params.mirostat != 0 or (params.dynatemp_range <= 0.0 and not params.xtc_on and not params.infill)
        )
        self.mu = 2.0 * params.mirostat_tau  # mirostat's running target surprise
        # adaptive-p's moving average of the drawn tokens' probabilities (llama_sampler_init_adaptive_p)
        self.adaptive = params.adaptive_p and params.adaptive_target >= 0 and params.mirostat == 0
        decay = np.float32(min(max(params.adaptive_decay, 0.0), 0.99))
        self.decay = float(decay)
        self.weighted_sum = float(np.float32(params.adaptive_target) / (np.float32(1) - decay))
        self.total_weight = float(np.float32(1) / (np.float32(1) - decay))
        self._before_p: np.ndarray | None = None  # adaptive-p: the probabilities before its transform
        self.last: Candidates | None = None  # what the last token was drawn from (post-sampling logprobs)
        # logit-space steps, then (unless greedy) the candidate filters in common_params_sampling order;
        # mirostat's chain is logit bias, temperature, mirostat (common_sampler_init)
        self.pre: list[Callable[[np.ndarray, Sequence[int]], np.ndarray]] = []
        if params.logit_bias:
            self.pre.append(lambda x, h: apply_logit_bias(x, params.logit_bias))
        if params.allowed_token_ids is not None:  # vLLM's logits processors, before its sampler
            self.pre.append(lambda x, h: allow_only(x, params.allowed_token_ids))
        if params.banned_sequences:
            self.pre.append(lambda x, h: ban_sequences(x, h, params.banned_sequences))
        self.filters: list[Callable[[Candidates], Candidates]] = []
        if params.mirostat:
            if params.temperature != 1.0:
                self.filters.append(partial(temperature, t=params.temperature))
            return
        if _penalties_active(params):
            self.pre.append(
                lambda x, h: apply_penalties(
                    x,
                    h,
                    last_n=params.repeat_last_n,
                    repeat=params.repeat_penalty,
                    frequency=params.frequency_penalty,
                    presence=params.presence_penalty,
                )
            )
        if params.dry_on:
            breakers = dry_breakers or {}
            self.pre.append(
                lambda x, h: dry_penalties(
                    x,
                    h,
                    multiplier=params.dry_multiplier,
                    base=params.dry_base,
                    allowed_length=params.dry_allowed_length,
                    last_n=params.dry_penalty_last_n,
                    breakers=breakers,
                )
            )
        if params.top_n_sigma > 0.0:
            self.filters.append(partial(top_n_sigma, n=params.top_n_sigma))
        if params.top_k > 0:
            self.filters.append(partial(top_k, k=params.top_k))
        keep = params.min_keep
        if params.typical_p < 1.0:
            self.filters.append(partial(typical_p, p=params.typical_p, min_keep=keep))
        if params.top_p < 1.0:
            self.filters.append(partial(top_p, p=params.top_p, min_keep=keep))
        if params.min_p > 0.0:
            self.filters.append(partial(min_p, p=params.min_p, min_keep=keep))
        if params.infill:
            if vocab is None:
                raise ValueError("the infill sampler needs the model's vocabulary")
            eot = vocab.eot_id if vocab.eot_id is not None else vocab.eos_id
            if eot is None:
                raise ValueError("the infill sampler needs an end-of-turn or end-of-sequence token")
            piece = lru_cache(maxsize=4096)(lambda t: vocab.token_to_piece(t, False))
            self.filters.append(partial(infill, eog=vocab.eog_ids, piece=piece, eot=eot))
        if params.xtc_on:
            self.filters.append(
                partial(
                    xtc,
                    probability=params.xtc_probability,
                    threshold=params.xtc_threshold,
                    min_keep=keep,
                    rng=self.rng,
                )  # fmt: skip
            )
        if params.dynatemp_range > 0.0:
            self.filters.append(
                partial(
                    dynamic_temperature,
                    t=params.temperature,
                    delta=params.dynatemp_range,
                    exponent=params.dynatemp_exponent,
                )  # fmt: skip
            )
        elif params.temperature != 1.0:
            self.filters.append(partial(temperature, t=params.temperature))

    @property
    def stateful(self) -> bool:
        """Whether each token changes what the next is drawn from beyond the history (mirostat's mu,
        adaptive-p's average): such a row cannot take speculative guesses."""
        return (self.params.mirostat != 0 or self.adaptive) and not self.is_greedy

    def _logits(self, logits: np.ndarray, history: Sequence[int] | None) -> np.ndarray:
        x = np.asarray(logits, dtype=np.float32)
        if x.ndim != 1 or x.size == 0:
            raise ValueError(f"expected one row of logits of shape (V,), got shape {x.shape}")
        hist: Sequence[int] = () if history is None else history
        for step in self.pre:
            x = step(x, hist)
        if not np.isfinite(x.max()):  # one cheap pass; NaN anywhere also lands here
            raise ValueError(_NO_TOKEN)
        return x

    def _filter(self, c: Candidates) -> Candidates:
        n_vocab = c.logits.size  # mirostat's chain always starts from the whole row (not top_k_first)
        for step in self.filters:
            c = step(c)
        if self.params.mirostat == 1:
            c = mirostat_top(c, self.mu, n_vocab)
        elif self.params.mirostat == 2:
            c = mirostat_v2_top(c, self.mu)
        elif self.adaptive:
            self._before_p = p = _probs_in_order(c)  # the drawn token's feeds the average (_pick)
            c = adaptive_p(c, self.params.adaptive_target, self.weighted_sum, self.total_weight, p)
        return c

    def _pick(self, c: Candidates) -> int:
        """Draw from the filtered candidates; mirostat then moves mu toward its target surprise, adaptive-p
        its average by the drawn token's probability before the transform (llama.cpp's accept)."""
        self.last = c
        i = _draw_position(c, self.rng)
        if self.adaptive and self._before_p is not None:
            f32 = np.float32
            self.weighted_sum = float(self._before_p[i] + f32(self.decay) * f32(self.weighted_sum))
            self.total_weight = float(f32(1) + f32(self.decay) * f32(self.total_weight))
        if self.params.mirostat:
            p = softmax(c.logits)[i]
            surprise = -math.log2(float(p)) if p > 0 else math.inf
            self.mu = float(
                np.float32(self.mu - self.params.mirostat_eta * (surprise - self.params.mirostat_tau))
            )
        return int(c.ids[i])

    def __call__(self, logits: np.ndarray, history: Sequence[int] | None = None) -> int:
        x = self._logits(logits, history)
        if self.is_greedy:
            return greedy(x)
        return self._pick(self._filter(candidates(x)))

    def distribution(
        self, logits: np.ndarray, history: Sequence[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The distribution __call__ draws from, as (ids, probabilities): after the logit steps and the
        filters, the softmax of what survives (greedy: the argmax with probability 1). Speculative
        decoding checks drafts against it (it takes XTC's chance as __call__ would; mirostat rows do not
        guess, `stateful`)."""
        x = self._logits(logits, history)
        if self.is_greedy:
            return np.array([greedy(x)], np.int64), np.ones(1)
        return _probabilities(self._filter(candidates(x)))

    def last_distribution(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The distribution the last sampled token was drawn from (None: greedy or none yet)."""
        return None if self.last is None else _probabilities(self.last)

    @property
    def top_k_first(self) -> bool:
        """Whether the chain can start from the row's top-k candidates (greedy, or top-k is its first
        step and nothing is added to the logits before it): then `from_top` gives __call__'s token."""
        p = self.params
        return not self.pre and (self.is_greedy or (p.top_k > 0 and p.mirostat == 0 and p.top_n_sigma <= 0))

    def from_top(self, ids: np.ndarray, logits: np.ndarray) -> int:
        """The token __call__ would pick, from the row's largest candidates (at least top_k of them,
        largest first, ties by lowest id: backends.base.top_k_rows) instead of the whole row. (A NaN
        outside the candidates goes unseen here, where __call__ would refuse the row.)"""
        if not self.top_k_first:
            raise ValueError("this row's sampler needs the whole row of logits")
        x = np.asarray(logits, dtype=np.float32)
        if x.size == 0 or not np.isfinite(x[0]):
            raise ValueError(_NO_TOKEN)
        if self.is_greedy:
            return int(ids[0])
        return self._pick(self._filter(Candidates(np.asarray(ids, np.int64), x, True)))


def _probabilities(c: Candidates) -> tuple[np.ndarray, np.ndarray]:
    w = np.exp((c.logits - c.logits.max()).astype(np.float64))
    return np.asarray(c.ids, np.int64), w / w.sum()


def make_sampler(params: SamplingParams, rng: np.random.Generator | None = None, **kwargs: Any) -> RowSampler:
    """Compose one row's chain: logit bias -> penalties -> DRY -> top_n_sigma -> top_k -> typical_p ->
    top_p -> min_p -> XTC -> temperature (dynamic or not) -> softmax -> draw (greedy argmax after the
    logit steps when temperature is 0); with mirostat: logit bias -> temperature -> mirostat."""
    return RowSampler(params, rng, **kwargs)


# ---------------------------------------------------------------------------------------------- batch


class Sampler:
    """Samples one token per row from [B, V] logits; each row has its own params and RNG stream.

    Rows follow the engine's batch: `add_row` appends, `remove_row` deletes (later rows move up one),
    `set_row` replaces a row with a fresh sampler.
    """

    def __init__(self, params: Sequence[SamplingParams] = ()):
        self.rows: list[RowSampler] = [RowSampler(p) for p in params]

    def __len__(self) -> int:
        return len(self.rows)

    def add_row(self, params: SamplingParams) -> int:
        """Append a row; returns its index."""
        self.rows.append(RowSampler(params))
        return len(self.rows) - 1

    def set_row(self, b: int, params: SamplingParams) -> None:
        self.rows[b] = RowSampler(params)

    def remove_row(self, b: int) -> None:
        del self.rows[b]

    def sample(self, logits: np.ndarray, history: Sequence[Sequence[int]] | None = None) -> np.ndarray:
        """int64 [B] token ids; history[b] = row b's token ids so far (prompt + generated), for penalties.
        The caller's logits are never modified."""
        x = np.asarray(logits, dtype=np.float32)
        B = len(self.rows)
        if x.ndim != 2 or x.shape[0] != B or x.shape[1] == 0:
            raise ValueError(f"expected logits of shape ({B}, V) for {B} rows, got {x.shape}")
        if history is not None and len(history) != B:
            raise ValueError(f"history has {len(history)} rows, the sampler has {B}")
        out = np.empty(B, np.int64)
        # plain greedy rows (nothing to add to the logits) share one argmax over their rows
        plain = [b for b, r in enumerate(self.rows) if r.is_greedy and not r.pre]
        if plain:
            xg = x[plain] if len(plain) < B else x
            bad = np.flatnonzero(~np.isfinite(xg.max(axis=1)))
            if bad.size:
                raise ValueError(f"row {plain[bad[0]]}: {_NO_TOKEN}")
            out[plain] = np.argmax(xg, axis=1)
        for b in sorted(set(range(B)) - set(plain)):
            try:
                out[b] = self.rows[b](x[b], None if history is None else history[b])
            except ValueError as e:
                raise ValueError(f"row {b}: {e}") from e
        return out


__all__ = [
    "Candidates",
    "GGUF_SAMPLING_KEYS",
    "RowSampler",
    "Sampler",
    "SamplingParams",
    "adaptive_p",
    "allow_only",
    "apply_logit_bias",
    "apply_penalties",
    "ban_sequences",
    "candidates",
    "draw",
    "dry_breakers",
    "dry_penalties",
    "vocab_dry_breakers",
    "dynamic_temperature",
    "greedy",
    "infill",
    "make_sampler",
    "min_p",
    "mirostat_top",
    "mirostat_v2_top",
    "softmax",
    "temperature",
    "top_k",
    "top_n_sigma",
    "top_p",
    "typical_p",
    "xtc",
]
