"""OpenAI's HTTP API as edgellm speaks it: request validation and the response and error shapes.

Field names and shapes follow the OpenAI API reference for `/v1/completions` and `/v1/chat/completions`,
plus llama.cpp server's sampling extras (`top_k`, `min_p`, `typical_p`, `repeat_penalty`,
`repeat_last_n`). Every request is untrusted: each field is checked for type and range and a bad one is
an APIError(400) naming it, never an exception from deeper down. Fields edgellm cannot honour
(`tools`, `echo`, ...) are refused with 400 rather than silently ignored; unknown fields are ignored, as
llama.cpp's server does.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgellm import reasoning

MAX_CHOICES = 16  # n times the number of prompts
MAX_STOPS = 16
MAX_STOP_CHARS = 1024


class APIError(Exception):
    """An error returned to the client as OpenAI's error JSON with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.extra: dict[str, Any] = {}  # more fields of the error object (llama-server's n_ctx, ...)

    def body(self) -> dict[str, Any]:
        e = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return {"error": {**e, **self.extra}}


def bad(param: str, message: str, code: str | None = None) -> APIError:
    return APIError(400, f"{param}: {message}" if param else message, param=param or None, code=code)


# ---------------------------------------------------------------------------------------------- fields


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _number(body: dict, name: str, lo: float, hi: float, lo_open: bool = False) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if not _is_num(v):
        raise bad(name, f"must be a number, got {type(v).__name__}")
    if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise bad(name, f"must be a finite number in {interval}, got {v!r}")
    return float(v)


def _integer(body: dict, name: str, lo: int, hi: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer() and lo <= v <= hi:
        v = int(v)  # JSON has one number type: 16.0 is 16
    if not _is_int(v):
        raise bad(name, f"must be an integer, got {type(v).__name__}")
    if v < lo or v > hi:
        raise bad(name, f"must be an integer in [{lo}, {hi}], got {v}")
    return v


def _boolean(body: dict, name: str, default: bool = False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(name, f"must be true or false, got {type(v).__name__}")
    return v


def _refuse_if_set(body: dict, name: str, ok: Callable[[Any], bool], why: str) -> None:
    if name in body and body[name] is not None and not ok(body[name]):
        raise bad(name, why, code="unsupported_parameter")


# ---------------------------------------------------------------------------------------------- requests


# (field, "this value is the same as not sending it", why) for llama-server's and vLLM's request fields not
# honoured
LLAMA_SERVER_UNSUPPORTED: list[tuple[str, Callable[[Any], bool], str]] = [
    (
        "post_sampling_probs",
        lambda v: v is False,
        "post-sampling probabilities are only given by the "
        "native routes (/completion, /infill): use n_probs there",
    ),
    ("n_cmpl", lambda v: v == 1, "several completions (n_cmpl) are asked with n on this route"),
    (
        "response_fields",
        lambda v: v == [],
        "response_fields is only taken by the native routes (/completion, /infill)",
    ),
    ("parse_tool_calls", lambda v: v is False, "tool calls are not supported"),
    ("grammar_lazy", lambda v: v is False, "lazy grammars (triggered by a word) are not supported"),
    ("grammar_triggers", lambda v: v == [], "lazy grammars (triggered by a word) are not supported"),
    ("preserved_tokens", lambda v: v == [], "preserved_tokens is not supported"),
    ("lora", lambda v: v == [], "LoRA adapters are not supported"),
    ("image_data", lambda v: v == [], "images are not supported"),
    ("multimodal_data", lambda v: v == [], "images and audio (multimodal_data) are not supported"),
    # vLLM's sampling extras
    ("use_beam_search", lambda v: v is False, "beam search is not supported"),
    ("length_penalty", lambda v: v == 1, "length_penalty (beam search) is not supported"),
    ("skip_special_tokens", lambda v: v is True, "special tokens are always left out of the text"),
    ("spaces_between_special_tokens", lambda v: v is True, "spaces_between_special_tokens is not supported"),
    ("include_stop_str_in_output", lambda v: v is False, "the stop string is never part of the output"),
    ("guided_whitespace_pattern", lambda v: False, "guided_whitespace_pattern is not supported"),
]


# llama-server's fields for its native answer's shape alone (/completion, /infill): refused elsewhere
NATIVE_FIELDS = ("post_sampling_probs", "response_fields", "n_cmpl")


@dataclass
class Limits:
    """What the loaded model and engine allow."""

    n_ctx: int
    n_vocab: int
    n_predict: int = -1  # the server's -n: tokens a request generates at most, and its default (-1: none)
    n_slots: int = 1 << 16  # the server's -np: llama-server's id_slot names one of them


def capped(max_tokens: int | None, n_predict: int) -> int | None:
    """A request's token limit under the server's -n (llama-server's: the default for a request that
    names none, and the ceiling of one that names more); None is until the end or the context is full."""
    if n_predict < 0:
        return max_tokens
    return n_predict if max_tokens is None else min(max_tokens, n_predict)


@dataclass
class GenerationParams:
    """A validated request: prompts (text or token ids; chat: one rendered prompt), sampling overrides
    (only fields the client set), and the rest of the knobs."""

    prompts: list[Any]  # str or list[int]; chat: a list of messages (rendered later)
    n: int = 1
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    sampling: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    logprobs: int | None = None  # None: none; k: the sampled tokens' log-probabilities and the top k
    ignore_eos: bool = False  # llama-server's: end-of-generation tokens are banned
    continue_final: bool = False  # chat: the last (assistant) message is continued, not answered
    suffix: str = ""  # completions: the text after the insertion (fill-in-the-middle)
    grammar: Any = None  # a structured.Grammar the output must match
    grammar_field: str = ""  # the request field it came from (errors name it)
    tools: Any = None  # chat: a tools.ToolRequest
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # chat: chat_template_kwargs
    speculative: bool = True  # false (or llama-server's speculative.n_max 0): no guessing for this one
    reasoning_format: str | None = None  # chat: llama-server's reasoning_format (None: the server's)
    timings_per_token: bool = False  # llama-server's: every streamed chunk carries the timings so far
    return_progress: bool = False  # llama-server's: streamed chunks say how far the prompt is read
    sse_ping_interval: int | None = None  # llama-server's: seconds silent before a ping (None: the server's)
    # chat: llama-server's reasoning budget (tokens of reasoning before its end is written; -1 none; None:
    # the server's), the message written before that end, and whether it may be ended on request
    reasoning_budget: int | None = None
    reasoning_budget_message: str | None = None
    reasoning_control: bool = False
    # native routes: n_probs as the sampler's own probabilities (after its filters and temperature), and
    # the answer's fields kept ("a/b" a nested one), as llama-server's post_sampling_probs, response_fields
    post_sampling_probs: bool = False
    response_fields: list[str] = field(default_factory=list)
    id_slot: int = -1  # llama-server's: the slot whose conversation this is (its save / restore); -1 any
    # completions: the prompt comes back before the answer (OpenAI's echo; with logprobs, its tokens'
    # too), and vLLM's prompt_logprobs (each prompt token's log-probability, rank and the top k)
    echo: bool = False
    prompt_logprobs: int | None = None
    # vLLM's: tokens generated before an end or a stop string may come; words never generated (tokenized
    # by the server); the prompt cut to its last so many tokens
    min_tokens: int = 0
    bad_words: list[str] = field(default_factory=list)
    truncate_prompt_tokens: int | None = None
    # llama-server's, for code completion (llama.vim, llama.vscode): a new line indented less than n_indent
    # ends the answer (the line left out); after t_max_predict_ms of generation the next new line ends it
    n_indent: int = 0
    t_max_predict_ms: int = 0


def _sampling(body: dict, lim: Limits) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in (
        ("temperature", _number(body, "temperature", 0.0, 2.0)),
        ("top_p", _number(body, "top_p", 0.0, 1.0, lo_open=True)),
        ("min_p", _number(body, "min_p", 0.0, 1.0)),
        ("typical_p", _number(body, "typical_p", 0.0, 1.0, lo_open=True)),
        ("repeat_penalty", _number(body, "repeat_penalty", 0.0, 100.0, lo_open=True)),
        ("presence_penalty", _number(body, "presence_penalty", -2.0, 2.0)),
        ("frequency_penalty", _number(body, "frequency_penalty", -2.0, 2.0)),
        ("top_k", _integer(body, "top_k", 0, 1 << 31)),
        ("repeat_last_n", _integer(body, "repeat_last_n", -1, 1 << 31)),
        # llama-server's other samplers (server-schema.cpp's ranges; -1 for dry_penalty_last_n is the
        # whole conversation, as llama-server's before it took only counts)
        ("min_keep", _integer(body, "min_keep", 0, 1 << 31)),
        ("top_n_sigma", _number(body, "top_n_sigma", -math.inf, math.inf)),
        ("xtc_probability", _number(body, "xtc_probability", 0.0, 1.0)),
        ("xtc_threshold", _number(body, "xtc_threshold", 0.0, 1.0)),
        ("dynatemp_range", _number(body, "dynatemp_range", 0.0, math.inf)),
        ("dynatemp_exponent", _number(body, "dynatemp_exponent", -math.inf, math.inf)),
        ("dry_multiplier", _number(body, "dry_multiplier", 0.0, math.inf)),
        ("dry_base", _number(body, "dry_base", -math.inf, math.inf)),
        ("dry_allowed_length", _integer(body, "dry_allowed_length", 0, 1 << 31)),
        ("dry_penalty_last_n", _integer(body, "dry_penalty_last_n", -1, 1 << 31)),
        ("mirostat", _integer(body, "mirostat", 0, 2)),
        ("mirostat_tau", _number(body, "mirostat_tau", -math.inf, math.inf)),
        ("mirostat_eta", _number(body, "mirostat_eta", -math.inf, math.inf)),
        ("adaptive_target", _number(body, "adaptive_target", -math.inf, 1.0)),
        ("adaptive_decay", _number(body, "adaptive_decay", 0.0, 0.99)),
    ):
        if value is not None:
            out[name] = value
    if out.get("dry_base", 1.0) < 1.0:
        del out["dry_base"]  # llama-server's handler: a base under 1 is the default
    # vLLM's: repetition_penalty is llama.cpp's repeat_penalty over the whole prompt and answer
    rep = _number(body, "repetition_penalty", 0.0, 100.0, lo_open=True)
    if rep is not None and rep != 1.0:
        if out.get("repeat_penalty", rep) != rep:
            raise bad("repetition_penalty", "differs from repeat_penalty: give one of them")
        out["repeat_penalty"] = rep
        out.setdefault("repeat_last_n", -1)
    allowed = body.get("allowed_token_ids")
    if allowed is not None:
        ok = isinstance(allowed, list) and all(_is_int(t) and 0 <= t < lim.n_vocab for t in allowed)
        if not ok or not allowed:
            raise bad("allowed_token_ids", f"must be a non-empty list of token ids in [0, {lim.n_vocab})")
        out["allowed_token_ids"] = tuple(allowed)
    breakers = _dry_breakers(body.get("dry_sequence_breakers"))
    if breakers is not None:
        out["dry_sequence_breakers"] = breakers
    chain = samplers(body)
    for name, neutral in _SAMPLER_OFF.items():
        if chain is not None and name not in chain:
            out.update(neutral)
    for name in ("infill", "adaptive_p"):  # off unless named (no default turns them on)
        if chain is not None and name in chain:
            out[name] = True
    seed = _integer(body, "seed", -(1 << 63), (1 << 64) - 1)
    if seed is not None:
        out["seed"] = None if seed == -1 else seed % (1 << 64)  # -1: random, as llama.cpp's server
    bias = body.get("logit_bias")
    if bias is not None:
        out["logit_bias"] = _logit_bias(bias, lim.n_vocab)
    return out


MAX_BIAS_TEXT = 256  # characters of a logit_bias text key
MAX_DRY_BREAKERS = 64
MAX_BAD_WORDS = 256


def _dry_breakers(v: Any) -> tuple[str, ...] | None:
    """llama-server's dry_sequence_breakers: a non-empty array of strings. A string holding such an array
    in JSON (text-generation-webui's, koboldcpp's and SillyTavern's form) is read as the array. Each is
    cut to its first 40 bytes when used (sampler.DRY_MAX_BREAKER_BYTES), as llama.cpp does."""
    if v is None:
        return None
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            raise bad(
                "dry_sequence_breakers", "must be an array of strings (or one in a JSON string)"
            ) from None
    if not isinstance(v, list) or not v or not all(isinstance(b, str) and b for b in v):
        raise bad("dry_sequence_breakers", "must be a non-empty array of non-empty strings")
    if len(v) > MAX_DRY_BREAKERS:
        raise bad("dry_sequence_breakers", f"at most {MAX_DRY_BREAKERS} breakers")
    return tuple(v)


def _logit_bias(bias: Any, n_vocab: int) -> dict[int | str, float]:
    """OpenAI's logit_bias ({"token id": bias}) and llama-server's other forms: a text key stands for
    every token of the text (tokenized later, _params), a list of [id or text, bias] pairs, and `false`
    as the bias bans the token (server-schema.cpp's logit_bias handler). Entries llama-server skips
    without a word (a bad pair, an id out of range) are a 400 here, naming them."""
    if isinstance(bias, dict):
        pairs = list(bias.items())
    elif isinstance(bias, list):
        if not all(isinstance(x, list) and len(x) == 2 for x in bias):
            raise bad("logit_bias", "a list must hold [token id or text, bias] pairs")
        pairs = [(k, v) for k, v in bias]
    else:
        raise bad("logit_bias", f"must be an object mapping token ids to numbers, got {type(bias).__name__}")
    if len(pairs) > 1024:
        raise bad("logit_bias", "at most 1024 entries")
    parsed: dict[int | str, float] = {}
    for k, v in pairs:
        # an id is ASCII digits (a minus allowed, as strtol reads it): str.isdigit() also takes "²" (int()
        # then fails) and "١٢" (int() reads 12), which are texts here
        if isinstance(k, str) and k.isascii() and k.removeprefix("-").isdigit() and len(k) < 12:
            k = int(k)
        if _is_int(k):
            if not 0 <= k < n_vocab:
                raise bad("logit_bias", f"token ids must be in [0, {n_vocab}), got {k!r}")
        elif not isinstance(k, str) or not k or len(k) > MAX_BIAS_TEXT:
            raise bad("logit_bias", f"keys must be token ids or texts of 1 to {MAX_BIAS_TEXT} characters, "
                      f"got {k!r}")  # fmt: skip
        if v is False:
            parsed[k] = -math.inf  # llama-server's ban
        elif _is_num(v) and math.isfinite(v) and -100 <= v <= 100:
            parsed[k] = float(v)
        else:
            raise bad("logit_bias", f"values must be numbers in [-100, 100] or false (a ban), got {v!r} "
                      f"for {k!r}")  # fmt: skip
    return parsed


# llama-server's `samplers`: names and one-letter codes (common/sampling.cpp), in the order of edgellm's chain
# (common_params_sampling's default order).
# infill, not in llama.cpp's default order, sits where llama.vim's and llama.vscode's lists put it (after
# top_k and top_p); naming it turns it on.
# adaptive_p, a draw of its own, comes last and is on only when named (as in llama.cpp).
SAMPLER_ORDER = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "infill",
                 "temperature", "adaptive_p"]  # fmt: skip
_SAMPLER_CODES = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p", "p": "top_p",
                  "m": "min_p", "x": "xtc", "i": "infill", "t": "temperature", "a": "adaptive_p"}  # fmt: skip
_SAMPLER_ALIASES = {"nucleus": "top_p", "temp": "temperature", "typ": "typ_p", "typical_p": "typ_p",
                    "top-k": "top_k", "top-p": "top_p", "min-p": "min_p"}  # fmt: skip
# what leaving a sampler out of the list means: its step is skipped (the request's value for it too)
_SAMPLER_OFF = {"penalties": {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0},
                "top_k": {"top_k": 0}, "typ_p": {"typical_p": 1.0}, "top_p": {"top_p": 1.0},
                "min_p": {"min_p": 0.0}, "temperature": {"temperature": 1.0, "dynatemp_range": 0.0},
                "dry": {"dry_multiplier": 0.0}, "top_n_sigma": {"top_n_sigma": -1.0},
                "xtc": {"xtc_probability": 0.0}}  # fmt: skip


def samplers(body: dict) -> list[str] | None:
    """llama-server's `samplers` (a list of names or a string of codes such as "edkypmxt") as canonical
    names, or None when not given. A list in another order than edgellm's chain, or naming a sampler
    edgellm lacks, is refused."""
    v = body.get("samplers")
    if v is None:
        return None
    if isinstance(v, str):
        unknown = [c for c in v if c not in _SAMPLER_CODES]
        if unknown:
            raise bad(
                "samplers",
                f"unknown or unsupported sampler code {unknown[0]!r}",
                code="unsupported_parameter",
            )
        names = [_SAMPLER_CODES[c] for c in v]
    elif isinstance(v, list) and all(isinstance(x, str) for x in v):
        names = [_SAMPLER_ALIASES.get(x.lower(), x.lower()) for x in v]
        unknown = [x for x in names if x not in SAMPLER_ORDER]
        if unknown:
            raise bad(
                "samplers", f"unknown or unsupported sampler {unknown[0]!r}", code="unsupported_parameter"
            )
    else:
        raise bad("samplers", "must be a list of sampler names or a string of sampler codes")
    ranks = [SAMPLER_ORDER.index(x) for x in names]
    if ranks != sorted(ranks) or len(set(ranks)) != len(ranks):
        raise bad(
            "samplers", f"edgellm runs its samplers in one order ({', '.join(SAMPLER_ORDER)}); a list may "
            "leave some out but not reorder or repeat them", code="unsupported_parameter",
        )  # fmt: skip
    return names


def _stop(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("stop", "must be a string or a list of strings")
    if len(stops) > MAX_STOPS:
        raise bad("stop", f"at most {MAX_STOPS} stop strings")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise bad("stop", f"stop strings are at most {MAX_STOP_CHARS} characters")
    return [s for s in stops if s]


MAX_LOGPROBS = 20  # top alternatives per token (OpenAI's top_logprobs limit)


def _common(
    body: Any, lim: Limits, max_tokens_names: tuple[str, ...], logprobs: str = "completion"
) -> GenerationParams:
    """The fields every generation route shares. `logprobs` says how this route asks for them:
    "completion" (`logprobs`: an integer), "chat" (`logprobs`: true plus `top_logprobs`), "native"
    (llama-server's `n_probs`)."""
    if not isinstance(body, dict):
        raise bad("", "the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", "must be a string")
    max_tokens = None
    for name in max_tokens_names:
        # -1: until the end or the context is full (llama-server's n_predict and its aliases: its web UI
        # sends max_tokens -1 by default); the Responses API's max_output_tokens is OpenAI's alone. 0: the
        # prompt is only read into the cache (llama-server's n_predict 0, which its web UI sends to warm
        # the cache for the next turn); OpenAI's max_tokens is at least 1
        v = _integer(body, name, 1 if name == "max_output_tokens" else -1, lim.n_ctx)
        if v == 0 and name != "n_predict" and logprobs != "native":
            raise bad(name, "must be at least 1, or -1 (until the end); n_predict 0 reads the prompt only")
        if v is not None:
            max_tokens = None if v == -1 else v
    n = _integer(body, "n", 1, MAX_CHOICES) or 1
    stream = _boolean(body, "stream")
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise bad("stream_options", "must be an object")
        include_usage = _boolean(opts, "include_usage")
    if logprobs != "completion":  # the completions route echoes its prompt (parse_completion)
        _refuse_if_set(body, "echo", lambda v: v is False, "echo is only supported on completions")
        _refuse_if_set(body, "prompt_logprobs", lambda v: False, "prompt_logprobs is only supported on "
                       "/v1/completions")  # fmt: skip
    _refuse_if_set(body, "best_of", lambda v: v == 1, "best_of is not supported")
    if logprobs != "chat":  # the chat route reads tools (tools.py) and reasoning_format
        _refuse_if_set(body, "tools", lambda v: v == [], "tools are only supported on chat completions")
        _refuse_if_set(body, "reasoning_format", lambda v: v in ("none", ""),
                       "reasoning is only taken apart on chat completions")  # fmt: skip
    # llama-server's and vLLM's fields that edgellm cannot honour yet: refused by name, never silently ignored
    for name, default_ok, what in LLAMA_SERVER_UNSUPPORTED:
        if logprobs != "native" or name not in NATIVE_FIELDS:
            _refuse_if_set(body, name, default_ok, what)
    _refuse_if_set(body, "functions", lambda v: v == [], "functions are not supported")
    grammar, grammar_field = constraint(body)
    slot = _integer(body, "id_slot", -1, lim.n_slots - 1)
    min_tokens = _integer(body, "min_tokens", 0, lim.n_ctx) or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise bad("min_tokens", f"must not exceed the token limit ({max_tokens})")
    bad_words = body.get("bad_words") or []
    if isinstance(bad_words, str):
        bad_words = [bad_words]
    if not isinstance(bad_words, list) or not all(isinstance(w, str) and w.strip() for w in bad_words):
        raise bad("bad_words", "must be a list of non-empty strings")
    if len(bad_words) > MAX_BAD_WORDS or any(len(w) > MAX_BIAS_TEXT for w in bad_words):
        raise bad("bad_words", f"at most {MAX_BAD_WORDS} words of {MAX_BIAS_TEXT} characters")
    n_indent = _integer(body, "n_indent", 0, 1 << 31) or 0
    t_max_predict_ms = _integer(body, "t_max_predict_ms", -1, 1 << 62) or 0
    # t_max_prompt_ms: llama-server reads it but sets no limit (server-schema.cpp: "TODO: implement"):
    # taken and checked the same way, with no effect, so that llama.vim's requests (which send it) run
    _integer(body, "t_max_prompt_ms", -1, 1 << 62)
    truncate = _integer(body, "truncate_prompt_tokens", -1, lim.n_ctx)
    if truncate == 0:
        raise bad("truncate_prompt_tokens", "must be at least 1 (the prompt's last tokens kept), or -1 (all)")
    return GenerationParams(
        prompts=[],
        n=n,
        max_tokens=capped(max_tokens, lim.n_predict),
        stop=_stop(body),
        stream=stream,
        include_usage=include_usage,
        sampling=_sampling(body, lim),
        model=model,
        logprobs=_logprobs(body, logprobs),
        ignore_eos=_boolean(body, "ignore_eos"),
        grammar=grammar,
        grammar_field=grammar_field,
        speculative=_boolean(body, "speculative", True) and body.get("speculative.n_max") != 0,
        timings_per_token=_boolean(body, "timings_per_token"),
        return_progress=_boolean(body, "return_progress"),
        sse_ping_interval=_integer(body, "sse_ping_interval", -1, (1 << 31) - 1),
        reasoning_budget=_reasoning_budget(body, logprobs == "chat"),
        reasoning_budget_message=_string(body, "reasoning_budget_message", 4096),
        reasoning_control=_reasoning_control(body, logprobs == "chat"),
        post_sampling_probs=_boolean(body, "post_sampling_probs") and logprobs == "native",
        response_fields=_response_fields(body) if logprobs == "native" else [],
        id_slot=-1 if slot is None else slot,
        min_tokens=min_tokens,
        bad_words=bad_words,
        truncate_prompt_tokens=None if truncate in (None, -1) else truncate,
        n_indent=n_indent,
        t_max_predict_ms=max(0, t_max_predict_ms),
    )


def _response_fields(body: dict) -> list[str]:
    """llama-server's response_fields: the answer's fields to keep, "a/b" for a nested one."""
    v = body.get("response_fields")
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(x, str) and 0 < len(x) <= 256 for x in v) or len(v) > 64:
        raise bad(
            "response_fields", "must be a list of at most 64 field paths (such as generation_settings/seed)"
        )
    return v


def _reasoning_budget(body: dict, chat: bool) -> int | None:
    """llama-server's reasoning_budget_tokens (or thinking_budget_tokens, its web UI's name): -1 none."""
    names = [n for n in ("reasoning_budget_tokens", "thinking_budget_tokens") if body.get(n) is not None]
    if not names:
        return None
    v = _integer(body, names[0], -1, 1 << 31)
    if v != -1 and not chat:
        raise bad(names[0], "a reasoning budget is only supported on chat routes (the template says where "
                  "the reasoning is)", code="unsupported_parameter")  # fmt: skip
    return v


def _reasoning_control(body: dict, chat: bool) -> bool:
    """llama-server's reasoning_control: the chat's reasoning may be ended by its id (chat only)."""
    v = _boolean(body, "reasoning_control")
    if v and not chat:
        raise bad("reasoning_control", "is only supported on chat completions", code="unsupported_parameter")
    return v


def _string(body: dict, name: str, limit: int) -> str | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, str) or len(v) > limit:
        raise bad(name, f"must be a string of at most {limit} characters")
    return v


def response_format(rf: Any, field: str = "response_format") -> Any:
    """OpenAI's response_format (text, json_object, json_schema {name, schema, strict}; llama-server's
    json_object with a schema) as a structured.Grammar, or None for text."""
    from edgellm.structured import Grammar

    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise bad(field, "must be an object with a type")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        schema = rf.get("schema")
        return Grammar("json_schema", schema) if schema else Grammar("json_object")
    if kind == "json_schema":
        spec = rf.get("json_schema", rf)  # the Responses API puts name and schema beside type
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise bad(field, "json_schema needs a schema object")
        return Grammar("json_schema", schema, strict=spec.get("strict") is True)
    raise bad(field, f"unknown type {kind!r}: expected text, json_object or json_schema")


def constraint(body: dict) -> tuple[Any, str]:
    """The request's output constraint and the field that set it: OpenAI's response_format, or
    llama-server's grammar (GBNF) or json_schema. At most one."""
    from edgellm.structured import Grammar

    found: list[tuple[Any, str]] = []
    rf = body.get("response_format")
    if rf is not None:
        g = response_format(rf)
        if g is not None:
            found.append((g, "response_format"))
    gr = body.get("grammar")
    if gr not in (None, ""):
        if not isinstance(gr, str):
            raise bad("grammar", "must be a string (a GBNF grammar)")
        found.append((Grammar("gbnf", gr), "grammar"))
    js = body.get("json_schema")
    if js not in (None, {}):
        if not isinstance(js, dict):
            raise bad("json_schema", "must be a JSON schema object")
        found.append((Grammar("json_schema", js), "json_schema"))
    found += _vllm_constraints(body)
    if len(found) > 1:
        raise bad(found[1][1], f"cannot be combined with {found[0][1]}: give one constraint")
    return found[0] if found else (None, "")


# vLLM's structured-output fields: guided_* (the older names) and structured_outputs {json, regex, choice,
# grammar, json_object}; the grammar is GBNF or Lark (structured.py converts either)
_VLLM_KINDS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "gbnf"}


def _vllm_constraints(body: dict) -> list[tuple[Any, str]]:
    from edgellm.structured import Grammar

    found: list[tuple[Any, str]] = []
    for key, kind in _VLLM_KINDS.items():
        v = body.get(f"guided_{key}")
        if v is not None:
            found.append((Grammar(kind, v), f"guided_{key}"))
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise bad("structured_outputs", "must be an object")
        for key, v in so.items():
            if v is None or (key == "json_object" and v is False):
                continue
            if key == "json_object":
                found.append((Grammar("json_object"), "structured_outputs"))
            elif key in _VLLM_KINDS:
                found.append((Grammar(_VLLM_KINDS[key], v), "structured_outputs"))
            elif key not in ("disable_fallback", "disable_any_whitespace", "disable_additional_properties"):
                raise bad("structured_outputs", f"{key} is not supported", code="unsupported_parameter")
    if body.get("guided_json_object"):
        found.append((Grammar("json_object"), "guided_json_object"))
    return found


def _logprobs(body: dict, style: str) -> int | None:
    if style == "native":
        _refuse_if_set(body, "logprobs", lambda v: v in (False, 0), "the native API asks with n_probs")
        k = _integer(body, "n_probs", 0, MAX_LOGPROBS)
        return k if k else None
    _refuse_if_set(body, "n_probs", lambda v: v == 0, "the OpenAI API asks with logprobs")
    if style == "completion":  # legacy completions: logprobs is how many alternatives (0: the token's own)
        _refuse_if_set(body, "top_logprobs", lambda v: v == 0, "completions ask with logprobs: N")
        return _integer(body, "logprobs", 0, MAX_LOGPROBS)
    want = _boolean(body, "logprobs")
    k = _integer(body, "top_logprobs", 0, MAX_LOGPROBS)
    if k is not None and not want:
        raise bad("top_logprobs", "needs logprobs: true")
    return (k or 0) if want else None


def parse_completion(body: Any, lim: Limits) -> GenerationParams:
    """POST /v1/completions: prompt is a string, a list of token ids, or a list of either."""
    p = _common(body, lim, ("max_tokens", "n_predict"))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(x, (str, list)) for x in prompt):
        prompts = prompt
    else:
        raise bad("prompt", "must be a string, a list of token ids, or a non-empty list of those")
    for i, x in enumerate(prompts):
        if isinstance(x, list):
            if not x or not all(_is_int(t) and 0 <= t < lim.n_vocab for t in x):
                raise bad("prompt", f"prompt {i}: token ids must be integers in [0, {lim.n_vocab})")
        elif not isinstance(x, str):
            raise bad("prompt", f"prompt {i} must be a string or a list of token ids")
    if len(prompts) * p.n > MAX_CHOICES:
        raise bad("n", f"at most {MAX_CHOICES} choices per request (prompts times n)")
    suffix = body.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise bad("suffix", "must be a string")
    if suffix and not all(isinstance(x, str) for x in prompts):
        raise bad("suffix", "an insertion needs text prompts")
    p.suffix = suffix or ""
    p.prompts = prompts
    p.echo = _boolean(body, "echo")
    p.prompt_logprobs = _integer(body, "prompt_logprobs", 0, MAX_LOGPROBS)
    if p.suffix and (p.echo or p.prompt_logprobs is not None):
        raise bad("echo" if p.echo else "prompt_logprobs", "cannot be combined with suffix (an insertion)")
    return p


def scored_prompt(p: GenerationParams) -> int | None:
    """How many alternatives each prompt token's log-probability needs (GenRequest.prompt_logprobs): for
    vLLM's prompt_logprobs, and for echo with logprobs; None: the prompt is not scored."""
    wants = [k for k in (p.prompt_logprobs, p.logprobs if p.echo else None) if k is not None]
    return max(wants) if wants else None


def prompt_logprobs_body(ids: list[int], lps: list[Any], piece: Callable[[int], bytes]) -> list[Any]:
    """vLLM's `prompt_logprobs`: None for the first token, then for each prompt token a map of token id
    (a string) to {logprob, rank, decoded_token}, for the token itself and the top k."""
    out: list[Any] = [None]
    for tok, lp in zip(ids[1:], lps[1:], strict=True):
        entry = {str(tok): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": _token_text(piece(tok))}}
        for rank, (t, v) in enumerate(lp.top, 1):
            entry.setdefault(str(t), {"logprob": v, "rank": rank, "decoded_token": _token_text(piece(t))})
        out.append(entry)
    return out


# OpenAI chat fields for what a local text model cannot give: refused by name, as OpenAI refuses them for
# models without the feature (the value that is the same as not sending one is accepted)
CHAT_UNSUPPORTED: list[tuple[str, Callable[[Any], bool], str]] = [
    ("modalities", lambda v: v == ["text"], 'only text output is supported (modalities: ["text"])'),
    ("audio", lambda v: False, "audio output is not supported"),
    ("prediction", lambda v: False, "predicted outputs are not supported"),
    ("web_search_options", lambda v: False, "web search is not supported"),
    ("reasoning_effort", lambda v: v == "none", "reasoning effort levels are not supported (none is)"),
    ("verbosity", lambda v: v == "medium", "verbosity is not supported (only OpenAI's default, medium)"),
]
# the chat template's own variables and ChatTemplate.render's parameters, which chat_template_kwargs
# may not set
TEMPLATE_RESERVED = (
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
    "strip_bos",
    "strip_eos",
)


def _reasoning_format(body: dict) -> str | None:
    """llama-server's `reasoning_format`: auto / deepseek (the reasoning apart) or none (in the content)."""
    v = body.get("reasoning_format")
    if v is None:
        return None
    if v == "deepseek-legacy":
        raise bad("reasoning_format", "deepseek-legacy (the reasoning both apart and in the content) is not "
                  "supported: use deepseek or none", code="unsupported_parameter")  # fmt: skip
    if v not in (*reasoning.FORMATS, ""):
        raise bad("reasoning_format", "must be auto, deepseek or none")
    return v or "none"


def _template_kwargs(body: dict) -> dict[str, Any]:
    """llama-server's and vLLM's chat_template_kwargs: extra variables for the chat template (e.g.
    enable_thinking), an object whose keys are not the template's own variables."""
    kw = body.get("chat_template_kwargs")
    if kw is None:
        return {}
    if not isinstance(kw, dict):
        raise bad("chat_template_kwargs", "must be an object of template variables")
    for k in kw:
        if not k.isidentifier() or k in TEMPLATE_RESERVED or k == "self":
            raise bad("chat_template_kwargs", f"{k!r} cannot be set: give other variable names")
    return dict(kw)


def parse_chat(body: Any, lim: Limits) -> GenerationParams:
    """POST /v1/chat/completions: messages are checked here for shape; the template checks the rest."""
    p = _common(body, lim, ("max_tokens", "max_completion_tokens", "n_predict"), logprobs="chat")
    for name, default_ok, what in CHAT_UNSUPPORTED:
        _refuse_if_set(body, name, default_ok, what)
    p.template_kwargs = _template_kwargs(body)
    if body.get("reasoning_effort") == "none":  # OpenAI's "no reasoning", as llama-server reads it
        p.template_kwargs.setdefault("enable_thinking", False)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages", "must be a non-empty list of messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad("messages", f"messages[{i}] must be an object")
        if not isinstance(m.get("role"), str) or not m["role"]:
            raise bad("messages", f"messages[{i}].role must be a non-empty string")
        c = m.get("content")
        if c is not None and not isinstance(c, (str, list)):
            raise bad("messages", f"messages[{i}].content must be a string, a list of parts or null")
    # continue the last message instead of answering it: vLLM's continue_final_message (with
    # add_generation_prompt false), and llama-server's assistant prefill (a last message from the assistant)
    cont = _boolean(body, "continue_final_message")
    agp = _boolean(body, "add_generation_prompt", True)
    if cont and agp and "add_generation_prompt" in body:
        raise bad("continue_final_message", "cannot be combined with add_generation_prompt: true")
    if not cont and not agp:
        raise bad("add_generation_prompt", "false is only supported with continue_final_message: true")
    last = msgs[-1]
    if cont and last.get("role") != "assistant":
        raise bad("continue_final_message", "the last message must be the assistant's")
    from edgellm import tools

    p.tools = tools.parse(body)
    p.reasoning_format = _reasoning_format(body)
    if p.tools is not None and p.tools.forced and p.grammar is not None:
        raise bad("tool_choice", f"a forced tool call cannot be combined with {p.grammar_field}")
    p.continue_final = cont or (last.get("role") == "assistant" and not last.get("tool_calls"))
    if p.continue_final and not isinstance(last.get("content"), str):
        raise bad("messages", "the assistant message to continue must have text content")
    if p.continue_final and not cont and len(msgs) > 1 and msgs[-2].get("role") == "assistant":
        raise bad(
            "messages", "cannot have 2 or more assistant messages at the end: the last one is a prefill"
        )
    p.prompts = [msgs]
    return p


def parse_tokenize(body: Any) -> tuple[str, bool, bool, bool]:
    """POST /tokenize (llama.cpp's): content, add_special (default false), parse_special (default true),
    with_pieces (default false)."""
    if not isinstance(body, dict):
        raise bad("", "the request body must be a JSON object")
    content = body.get("content")
    if not isinstance(content, str):
        raise bad("content", "must be a string")
    add = _boolean(body, "add_special", False)
    parse = _boolean(body, "parse_special", True)
    pieces = _boolean(body, "with_pieces", False)
    return content, add, parse, pieces


def parse_detokenize(body: Any, n_vocab: int) -> list[int]:
    if not isinstance(body, dict):
        raise bad("", "the request body must be a JSON object")
    toks = body.get("tokens")
    if not isinstance(toks, list) or not all(_is_int(t) and 0 <= t < n_vocab for t in toks):
        raise bad("tokens", f"must be a list of token ids in [0, {n_vocab})")
    return toks


# ---------------------------------------------------------------------------------------------- responses


def new_id(prefix: str, sep: str = "-") -> str:
    """A fresh object id in OpenAI's form: "chatcmpl-…", "cmpl-…"; the Responses API's use "_" (resp_…)."""
    return f"{prefix}{sep}{uuid.uuid4().hex[:24]}"


def usage_body(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _token_text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def chat_logprobs(items: list[tuple[int, Any]], piece: Callable[[int], bytes]) -> dict[str, Any]:
    """OpenAI chat's `logprobs` object from (token id, TokenLogprob) pairs."""

    def entry(tok: int, lp: float) -> dict[str, Any]:
        b = piece(tok)
        return {"token": _token_text(b), "logprob": lp, "bytes": list(b)}

    content = [{**entry(t, x.logprob), "top_logprobs": [entry(i, v) for i, v in x.top]} for t, x in items]
    return {"content": content, "refusal": None}


def completion_logprobs(items: list[tuple[int, Any]], piece: Callable[[int], bytes], offset: int = 0) -> dict:
    """Legacy completions' `logprobs` object (tokens, token_logprobs, top_logprobs, text_offset)."""
    tokens, lps, tops, offsets = [], [], [], []
    for t, x in items:  # x None: an echoed prompt's first token (nothing before it), null as OpenAI's
        text = _token_text(piece(t))
        tokens.append(text)
        lps.append(None if x is None else x.logprob)
        tops.append(None if x is None else {_token_text(piece(i)): v for i, v in x.top})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


@dataclass
class Shaper:
    """Builds one request's response objects (completion or chat), streaming chunks or whole.
    `piece(token id)` gives a token's bytes; set only when the request asked for log-probabilities."""

    chat: bool
    model: str
    id: str = ""
    created: int = 0
    fingerprint: str = ""  # OpenAI's system_fingerprint: which build and backend answered
    piece: Callable[[int], bytes] | None = None
    offsets: dict[int, int] = field(default_factory=dict)  # completions: text offset reached, per choice
    tool_names: list[str] | None = None  # chat with tools: <tool_call> blocks become tool_calls
    one_call: bool = False  # parallel_tool_calls false: the first call only
    live_calls: bool = False  # the calls are held to their schemas: streamed as they are written
    # completions' echo: choice index -> (the prompt's text, its token ids); prompt_piece set when vLLM's
    # prompt_logprobs are asked for
    echo: dict[int, tuple[str, list[int]]] = field(default_factory=dict)
    echo_text: bool = False  # OpenAI's echo: the prompt's text (and tokens) come back; else only scored
    scored: bool = False  # the prompt's tokens are scored (GenRequest.prompt_logprobs)
    prompt_piece: Callable[[int], bytes] | None = None
    reasoning: bool = False  # chat: a <think> reasoning goes apart, as reasoning_content (reasoning.py)
    inside: bool = False  # the prompt opened the reasoning: the answer starts inside it

    def __post_init__(self) -> None:
        self.id = self.id or new_id("chatcmpl" if self.chat else "cmpl")
        self.created = self.created or int(time.time())

    def _head(self, obj: str) -> dict[str, Any]:
        head = {"id": self.id, "object": obj, "created": self.created, "model": self.model}
        if self.fingerprint:
            head["system_fingerprint"] = self.fingerprint
        return head

    def _logprobs(self, index: int, items: list | None) -> dict[str, Any] | None:
        if items is None:
            return None
        assert self.piece is not None
        if self.chat:
            return chat_logprobs(items, self.piece)
        out = completion_logprobs(items, self.piece, self.offsets.get(index, 0))
        self.offsets[index] = self.offsets.get(index, 0) + sum(len(t) for t in out["tokens"])
        return out

    def chunk(
        self,
        index: int,
        text: str | None,
        finish: str | None,
        first: bool = False,
        logprobs: list | None = None,
        thought: str | None = None,
    ) -> dict[str, Any]:
        lp = self._logprobs(index, logprobs)
        if self.chat:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None or first:
                delta["content"] = text
            if thought is not None:
                delta["reasoning_content"] = thought
            choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": index, "text": text or "", "logprobs": lp, "finish_reason": finish}
        return {**self._head("text_completion"), "choices": [choice]}

    def prompt_chunk(self, index: int, lps: list | None) -> dict[str, Any]:
        """A completion choice's first chunk when its prompt is echoed or scored: the prompt's text (echo),
        with its tokens' log-probabilities (echo with logprobs), and vLLM's prompt_logprobs."""
        text, ids = self.echo[index]
        c = self.chunk(index, text if self.echo_text else "", None, logprobs=self._prompt_items(ids, lps))
        if self.prompt_piece is not None and lps is not None:
            c["choices"][0]["prompt_logprobs"] = prompt_logprobs_body(ids, lps, self.prompt_piece)
        return c

    def _prompt_items(self, ids: list[int], lps: list | None) -> list | None:
        """The echoed prompt's (token, log-probability) pairs, when the request asked for logprobs."""
        if self.piece is None or not self.echo_text or lps is None:
            return None
        return list(zip(ids, lps, strict=True))

    def call_chunk(self, index: int, k: int, call: dict, args: str | None = None) -> dict[str, Any]:
        """A streamed tool call's delta as OpenAI sends them: the call's id, type and name as it begins
        (`args` None), then its arguments' text in pieces."""
        if args is None:
            d = {"index": k, "id": call["id"], "type": "function",
                 "function": {"name": call["function"]["name"], "arguments": ""}}  # fmt: skip
        else:
            d = {"index": k, "function": {"arguments": args}}
        choice = {"index": index, "delta": {"tool_calls": [d]}, "logprobs": None, "finish_reason": None}
        return {**self._head("chat.completion.chunk"), "choices": [choice]}

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        head = self._head("chat.completion.chunk" if self.chat else "text_completion")
        return {**head, "choices": [], "usage": usage}

    def whole(
        self,
        texts: list[str],
        finishes: list[str],
        usage: dict[str, Any],
        logprobs: list | None = None,
        prompt_lps: list | None = None,
    ) -> dict[str, Any]:
        extra: dict[int, dict[str, Any]] = {}
        for i, (text, ids) in self.echo.items():  # an echoed prompt comes first, its tokens too
            scored = prompt_lps[i] if prompt_lps else None
            items = self._prompt_items(ids, scored)
            if self.echo_text:
                texts[i] = text + texts[i]
            if items is not None and logprobs:
                logprobs[i] = items + logprobs[i]
            if self.prompt_piece is not None and scored is not None:
                extra[i] = {"prompt_logprobs": prompt_logprobs_body(ids, scored, self.prompt_piece)}
        lps = [self._logprobs(i, logprobs[i] if logprobs else None) for i in range(len(texts))]
        if self.chat:
            choices = []
            for i, (t, f, lp) in enumerate(zip(texts, finishes, lps)):
                thought = None
                if self.reasoning:
                    thought, t = reasoning.split(t, self.inside)
                message: dict[str, Any] = {"role": "assistant", "content": t}
                if self.tool_names is not None:
                    from edgellm.tools import split

                    content, calls = split(t, self.tool_names, self.one_call)
                    if calls:
                        message = {"role": "assistant", "content": content or None, "tool_calls": calls}
                        f = "tool_calls" if f == "stop" else f
                if thought:
                    message["reasoning_content"] = thought
                choices.append({"index": i, "message": message, "logprobs": lp, "finish_reason": f})
            return {**self._head("chat.completion"), "choices": choices, "usage": usage}
        choices = [
            {"index": i, "text": t, "logprobs": lp, "finish_reason": f, **extra.get(i, {})}
            for i, (t, f, lp) in enumerate(zip(texts, finishes, lps))
        ]
        return {**self._head("text_completion"), "choices": choices, "usage": usage}


MAX_EMBED_INPUTS = 2048  # OpenAI's limit on inputs per embeddings request


def _one_prompt(x: Any, name: str) -> list | None:
    """One of llama-server's prompt forms as its pieces (strings and token ids, in order), or None:
    a string, token ids mixed with strings, {"prompt_string": s}, {"content": [text parts]}. Images or
    audio beside the text (multimodal_data) are refused by name."""
    if isinstance(x, str):
        return [x]
    if isinstance(x, list) and x and all(isinstance(t, str) or _is_int(t) for t in x):
        return x
    if isinstance(x, dict) and x.get("multimodal_data"):
        raise bad(name, "images and audio (multimodal_data) are not supported", code="unsupported_parameter")
    if isinstance(x, dict) and isinstance(x.get("prompt_string"), str):
        return [x["prompt_string"]]
    if isinstance(x, dict) and isinstance(x.get("content"), list) and x["content"]:
        parts = x["content"]
        if all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in parts
        ):
            return ["".join(p["text"] for p in parts)]
    return None


def prompt_list(x: Any, name: str, lim: Limits, limit: int) -> list[list]:
    """llama-server's `prompt` (or embeddings' `input`/`content`): one prompt, or a list of them unless
    the list holds token ids (then it is one prompt mixing ids and strings: server-common.cpp's
    tokenize_input_prompts); each prompt as its pieces (_one_prompt) for llama_api.prompt_ids."""
    if isinstance(x, (str, dict)) or (isinstance(x, list) and any(_is_int(t) for t in x)):
        items = [_one_prompt(x, name)]  # one prompt: a string, a prompt object, or ids with strings mixed in
    elif isinstance(x, list) and x:
        items = [_one_prompt(i, name) for i in x]
    else:
        raise bad(name, "must be a string, token ids, or a non-empty list of those")
    if any(i is None for i in items):
        raise bad(name, "each prompt must be a string, token ids (with strings mixed in), "
                  "{'prompt_string': ...} or {'content': [text parts]}")  # fmt: skip
    if len(items) > limit:
        raise bad(name, f"at most {limit} prompts per request")
    for i, it in enumerate(items):
        if any(_is_int(t) and not 0 <= t < lim.n_vocab for t in it):
            raise bad(name, f"prompt {i}: token ids must be integers in [0, {lim.n_vocab})")
    # an empty text is refused once tokenized, unless the model adds tokens of its own (BOS)
    return items  # type: ignore[return-value]


def parse_embeddings(body: Any, lim: Limits, key: str = "input") -> list[list]:
    """POST /v1/embeddings `input` (or `content`, as llama-server takes it; `input` wins): one prompt or
    a list of them, each in one of llama-server's forms (prompt_list); `key` names the field in errors
    when neither is there."""
    if not isinstance(body, dict):
        raise bad("", "the request body must be a JSON object")
    name = "input" if "input" in body else ("content" if "content" in body else key)
    items = prompt_list(body.get(name), name, lim, MAX_EMBED_INPUTS)
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise bad("encoding_format", "must be 'float' or 'base64'")
    return items


def embeddings_body(vectors: list[Any], model: str, n_tokens: int, fmt: str) -> dict[str, Any]:
    """OpenAI's embeddings answer; base64 is the float32 little-endian bytes (the openai client asks for
    it by default)."""
    import base64

    import numpy as np

    def enc(v: Any) -> Any:
        if fmt == "base64":
            return base64.b64encode(np.asarray(v, "<f4").tobytes()).decode("ascii")
        return [float(f) for f in v]

    data = [{"object": "embedding", "index": i, "embedding": enc(v)} for i, v in enumerate(vectors)]
    usage = {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}
