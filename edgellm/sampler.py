"""Token sampling: llama.cpp's default sampler chain, one token per row of a [B, V] logits array.

Mirrors ggml-org/llama.cpp `src/llama-sampler.cpp` (the `llama_sampler_*_apply` steps; the file was
`src/llama-sampling.cpp` before its rename) and `common/sampling.cpp` (`common_sampler_init`, which builds
the chain in the order of `common_params_sampling::samplers` in `common/common.h`), as vendored in
llama-cpp-python 0.3.36. Promise: same params, seed, logits and history -> same tokens, in any process.
Each step is a small pure function (like mlx-lm's `sample_utils`); `make_sampler` composes them for one
row and `Sampler` runs one such row sampler per sequence of a batch.
"""

from __future__ import annotations

import math
import numbers
import types
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

    def __post_init__(self) -> None:
        if self.logit_bias is not None:  # freeze a private copy so a caller's later edits cannot leak in
            object.__setattr__(self, "logit_bias", types.MappingProxyType(dict(self.logit_bias)))

    def validate(self, n_vocab: int | None = None) -> None:
        """Raise ValueError naming the first bad field; with `n_vocab`, logit_bias ids must be < n_vocab."""
        for name, error in _field_errors(self, n_vocab):
            raise ValueError(f"SamplingParams.{name} {error}")

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any], **overrides: Any) -> SamplingParams:
        """Defaults from a model's `general.sampling.*` keys; explicit `overrides` win.

        Mirrors `common_init_sampler_from_model` (llama.cpp `common/common.cpp`; key names from
        `src/llama-arch.cpp`): a value that does not parse as a number is skipped, as llama.cpp's
        strtol/strtof do. Keys for samplers edgellm does not implement (mirostat, xtc, sequence) are ignored.
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


def typical_p(c: Candidates, p: float) -> Candidates:
    """Locally typical sampling (llama_sampler_typical_apply): keep the tokens whose surprise is closest to
    the entropy until their probability mass exceeds p. p >= 1: unchanged. The result is in typicality
    order (ties by current order). Like top_p, it orders only as many candidates as the cutoff needs.
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
        if last <= k or k == n:
            break
        k = min(8 * k, n)
    order = order[: min(last, n)]
    return Candidates(c.ids[order], c.logits[order], False)


def top_p(c: Candidates, p: float) -> Candidates:
    """Nucleus sampling (llama_sampler_top_p_apply): keep the fewest most likely tokens whose probability
    mass reaches p (at least one; all of them if rounding never reaches p). p >= 1: unchanged.

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
        return Candidates(c.ids[:last], c.logits[:last], True)
    k = min(n, 256)
    while True:
        top = probs if k == n else np.partition(probs, n - k)[n - k :]
        cum = np.cumsum(np.sort(top)[::-1], dtype=np.float32)
        last = int(np.searchsorted(cum, target, side="left")) + 1  # first i with cum[i] >= p, inclusive
        if last <= k or k == n:
            break
        k = min(8 * k, n)
    last = min(last, n)
    ordered = last <= SORT_LIMIT
    idx = _top_indices(c.logits, last, ordered)
    return Candidates(c.ids[idx], c.logits[idx], ordered)


def min_p(c: Candidates, p: float) -> Candidates:
    """Keep tokens with probability >= p * max probability, i.e. logit >= max + log(p)
    (llama_sampler_min_p_apply). Order is preserved. p <= 0: unchanged."""
    if p <= 0.0 or c.logits.size == 0:
        return c
    min_logit = c.logits.max() + np.log(np.float32(p))
    keep = np.flatnonzero(c.logits >= min_logit)
    return Candidates(c.ids[keep], c.logits[keep], c.sorted)


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
    if c.logits.size == 0 or not np.isfinite(c.logits.max()):
        raise ValueError(_NO_TOKEN)
    w = np.exp(c.logits - c.logits.max())
    cum = np.cumsum(w, dtype=np.float64)
    i = int(np.searchsorted(cum, cum[-1] * rng.random(), side="left"))  # u < 1, so i < n
    if w[i] == 0:  # only when u == 0 and leading weights are 0: never pick an impossible token
        i = int(np.argmax(w > 0))
    return int(c.ids[i])


# ---------------------------------------------------------------------------------------------- one row


def _penalties_active(p: SamplingParams) -> bool:
    return p.repeat_last_n != 0 and not (
        p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0
    )


class RowSampler:
    """One sequence's sampler: the composed chain and its own RNG stream. Call it as `fn(logits, history)`."""

    def __init__(self, params: SamplingParams, rng: np.random.Generator | None = None):
        params.validate()
        self.params = params
        # seed None => a fresh one from the OS, kept so a caller can report it (llama.cpp's seed_cur)
        self.seed: int | None = params.seed
        if rng is None:
            if self.seed is None:
                self.seed = int(np.random.SeedSequence().entropy)
            rng = np.random.Generator(np.random.PCG64(self.seed))
        self.rng = rng
        self.is_greedy = params.temperature <= 0.0
        # logit-space steps, then (unless greedy) the candidate filters in common_params_sampling order
        self.pre: list[Callable[[np.ndarray, Sequence[int]], np.ndarray]] = []
        if params.logit_bias:
            self.pre.append(lambda x, h: apply_logit_bias(x, params.logit_bias))
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
        self.filters: list[Callable[[Candidates], Candidates]] = []
        if params.top_k > 0:
            self.filters.append(partial(top_k, k=params.top_k))
        if params.typical_p < 1.0:
            self.filters.append(partial(typical_p, p=params.typical_p))
        if params.top_p < 1.0:
            self.filters.append(partial(top_p, p=params.top_p))
        if params.min_p > 0.0:
            self.filters.append(partial(min_p, p=params.min_p))
        if params.temperature != 1.0:
            self.filters.append(partial(temperature, t=params.temperature))

    def __call__(self, logits: np.ndarray, history: Sequence[int] | None = None) -> int:
        x = np.asarray(logits, dtype=np.float32)
        if x.ndim != 1 or x.size == 0:
            raise ValueError(f"expected one row of logits of shape (V,), got shape {x.shape}")
        hist: Sequence[int] = () if history is None else history
        for step in self.pre:
            x = step(x, hist)
        if not np.isfinite(x.max()):  # one cheap pass; NaN anywhere also lands here
            raise ValueError(_NO_TOKEN)
        if self.is_greedy:
            return greedy(x)
        c = candidates(x)
        for step in self.filters:
            c = step(c)
        return draw(c, self.rng)

    def distribution(
        self, logits: np.ndarray, history: Sequence[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The distribution __call__ draws from, as (ids, probabilities): after the logit steps and the
        filters, the softmax of what survives (greedy: the argmax with probability 1). Speculative
        decoding checks drafts against it."""
        x = np.asarray(logits, dtype=np.float32)
        hist: Sequence[int] = () if history is None else history
        for step in self.pre:
            x = step(x, hist)
        if not np.isfinite(x.max()):
            raise ValueError(_NO_TOKEN)
        if self.is_greedy:
            return np.array([greedy(x)], np.int64), np.ones(1)
        c = candidates(x)
        for step in self.filters:
            c = step(c)
        w = np.exp((c.logits - c.logits.max()).astype(np.float64))
        return np.asarray(c.ids, np.int64), w / w.sum()

    @property
    def top_k_first(self) -> bool:
        """Whether the chain can start from the row's top-k candidates (greedy, or top-k is its first
        step and nothing is added to the logits before it): then `from_top` gives __call__'s token."""
        return not self.pre and (self.is_greedy or self.params.top_k > 0)

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
        c = Candidates(np.asarray(ids, np.int64), x, True)
        for step in self.filters:
            c = step(c)
        return draw(c, self.rng)


def make_sampler(params: SamplingParams, rng: np.random.Generator | None = None) -> RowSampler:
    """Compose one row's chain: logit bias -> penalties -> top_k -> typical_p -> top_p -> min_p ->
    temperature -> softmax -> draw (greedy argmax after penalties when temperature is 0)."""
    return RowSampler(params, rng)


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
    "apply_logit_bias",
    "apply_penalties",
    "candidates",
    "draw",
    "greedy",
    "make_sampler",
    "min_p",
    "softmax",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
]
