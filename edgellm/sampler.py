"""Token sampling: llama.cpp's default sampler chain, one token per row of a [B, V] logits array.

Mirrors ggml-org/llama.cpp `src/llama-sampler.cpp` (the `llama_sampler_*_apply` steps; the file was
`src/llama-sampling.cpp` before its rename) and `common/sampling.cpp` (`common_sampler_init`, which builds the
chain in the order of `common_params_sampling::samplers` in `common/common.h`), read from the copy vendored in
llama-cpp-python 0.3.36. Promise: same params, same seed, same logits and history -> same tokens, in any process.
Each step is a small pure function (like mlx-lm's `sample_utils`); `make_sampler` composes them for one row and
`Sampler` runs one such row sampler per sequence of a batch.
"""

from __future__ import annotations

import math
import numbers
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import numpy as np

# ---------------------------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class SamplingParams:
    """Per-sequence sampling parameters; defaults are llama.cpp's (`common/common.h`, common_params_sampling)."""

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
        `src/llama-arch.cpp`): a value that does not parse as a number is skipped, as llama.cpp's strtol/strtof
        do. Keys for samplers edgellm does not implement (mirostat, xtc, sequence) are ignored. A value that
        parses but is out of range (a NaN temperature in an untrusted file) raises ValueError naming the key.
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


def _field_errors(p: SamplingParams, n_vocab: int | None):
    """Yield (field, message) for every invalid field, in declaration order."""

    def real_in(name: str, lo: float, hi: float, lo_open: bool, hi_open: bool, what: str):
        v = getattr(p, name)
        ok = _is_real(v) and math.isfinite(v)
        ok = ok and (lo < v if lo_open else lo <= v) and (v < hi if hi_open else v <= hi)
        return None if ok else (name, f"must be {what}, got {v!r}")

    checks = [
        real_in("temperature", 0.0, math.inf, False, True, "a finite number >= 0 (0 = greedy)"),
        None if _is_int(p.top_k) and p.top_k >= -1 else ("top_k", f"must be an int >= -1 (<= 0 = off), got {p.top_k!r}"),
        real_in("top_p", 0.0, 1.0, True, False, "in (0, 1] (1 = off)"),
        real_in("min_p", 0.0, 1.0, False, False, "in [0, 1] (0 = off)"),
        real_in("typical_p", 0.0, 1.0, True, False, "in (0, 1] (1 = off)"),
        real_in("repeat_penalty", 0.0, math.inf, True, True, "a finite number > 0 (1 = off)"),
        real_in("frequency_penalty", -math.inf, math.inf, True, True, "a finite number (0 = off)"),
        real_in("presence_penalty", -math.inf, math.inf, True, True, "a finite number (0 = off)"),
        None
        if _is_int(p.repeat_last_n) and p.repeat_last_n >= -1
        else ("repeat_last_n", f"must be an int >= -1 (0 = off, -1 = whole history), got {p.repeat_last_n!r}"),
        None
        if p.seed is None or (_is_int(p.seed) and p.seed >= 0)
        else ("seed", f"must be None or an int >= 0, got {p.seed!r}"),
    ]
    yield from (c for c in checks if c is not None)
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


def candidates(logits: np.ndarray) -> Candidates:
    """All V tokens of one row, in id order."""
    return Candidates(np.arange(logits.size, dtype=np.int64), logits, False)


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


def _top_indices(logits: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest logits, largest first; equal logits keep position order (lowest first)."""
    n = logits.size
    if k < n:
        kth = np.partition(logits, n - k)[n - k]
        idx = np.flatnonzero(logits >= kth)
        if idx.size > k:  # ties at the boundary: keep the lowest positions among those equal to kth
            above = np.flatnonzero(logits > kth)
            tied = np.flatnonzero(logits == kth)[: k - above.size]
            idx = np.sort(np.concatenate([above, tied]))
    else:
        idx = np.arange(n)
    return idx[np.argsort(-logits[idx], kind="stable")]


def _sort_desc(c: Candidates) -> Candidates:
    if c.sorted:
        return c
    order = np.argsort(-c.logits, kind="stable")
    return Candidates(c.ids[order], c.logits[order], True)


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
    the entropy until their probability mass exceeds p. p >= 1: unchanged. The result is in typicality order.
    """
    if p >= 1.0:
        return c
    c = _sort_desc(c)
    probs = softmax(c.logits)
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.log(probs)
        # llama.cpp gets NaN from 0 * log(0) here; a token of probability 0 adds no entropy and is least typical
        entropy = -np.sum(np.where(probs > 0, probs * logp, 0), dtype=np.float32)
        score = np.where(probs > 0, np.abs(-logp - entropy), np.inf)
    order = np.argsort(score, kind="stable")
    cum = np.cumsum(probs[order], dtype=np.float32)
    last = int(np.searchsorted(cum, np.float32(p), side="right")) + 1  # first i with cum[i] > p, inclusive
    order = order[: min(last, order.size)]
    return Candidates(c.ids[order], c.logits[order], False)


def top_p(c: Candidates, p: float) -> Candidates:
    """Nucleus sampling (llama_sampler_top_p_apply): keep the fewest most likely tokens whose probability
    mass reaches p (at least one). p >= 1: unchanged. Sorts only as far as needed, like llama.cpp's adaptive
    partial sort (which starts at 256 candidates; this grows 8x per miss instead of jumping to a full sort).
    """
    if p >= 1.0:
        return c
    probs = softmax(c.logits)
    target = np.float32(p)
    n = c.logits.size
    k = n if c.sorted or n <= 1024 else 256
    while True:
        idx = np.arange(n) if c.sorted else _top_indices(c.logits, k)
        cum = np.cumsum(probs[idx], dtype=np.float32)  # sequential float32 sum, as llama.cpp's cum_sum
        last = int(np.searchsorted(cum, target, side="left")) + 1  # first i with cum[i] >= p, inclusive
        if last <= k or k == n:
            idx = idx[: min(last, k)]
            return Candidates(c.ids[idx], c.logits[idx], True)
        k = min(8 * k, n)


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


def draw(c: Candidates, rng: np.random.Generator) -> int:
    """Draw one token id from softmax(logits) with one uniform from `rng` (llama_sampler_dist_apply:
    the first candidate whose running sum of exp(logit - max) reaches u * total, summed in double)."""
    if c.logits.size == 0 or not np.isfinite(c.logits.max()):
        raise ValueError("no token left to sample: every candidate is banned (-inf) or not finite")
    w = np.exp(c.logits - c.logits.max())
    live = np.flatnonzero(w > 0)  # drop zero weights so that u == 0 can never pick an impossible token
    cum = np.cumsum(w[live], dtype=np.float64)
    i = int(np.searchsorted(cum, cum[-1] * rng.random(), side="left"))
    return int(c.ids[live[min(i, live.size - 1)]])


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
        # None => a fresh seed from the OS, kept so a caller can report it (llama.cpp's seed_cur)
        self.seed = int(np.random.SeedSequence().entropy) if params.seed is None else int(params.seed)
        self.rng = rng if rng is not None else np.random.Generator(np.random.PCG64(self.seed))
        self.is_greedy = params.temperature <= 0.0
        # logit-space steps, then (unless greedy) the candidate filters in common_params_sampling::samplers order
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
        if self.is_greedy:
            return greedy(x)
        c = candidates(x)
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
            out[plain] = np.argmax(x[plain] if len(plain) < B else x, axis=1)
        for b in sorted(set(range(B)) - set(plain)):
            out[b] = self.rows[b](x[b], None if history is None else history[b])
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
