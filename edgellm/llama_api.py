"""llama-server's native API over the same engine: request parsing and answer shapes for `/completion`
(also `/completions`, as llama-server maps it), `/props` and `/slots` (the routes are in server.py).
Mirrors ggml-org/llama.cpp tools/server/server.cpp (handle_completions, handle_props, handle_slots) and
the fields its tests (tools/server/tests/unit/test_completion.py) read: `content`, `tokens`, `stop`,
`stop_type` ("eos" | "word" | "limit"), `stopping_word`, `truncated`, `tokens_predicted`,
`tokens_evaluated`, `tokens_cached`, `generation_settings`, `timings`.

`prompt` is text, token ids, a list mixing both (ids and strings concatenated in order), or a list of such
prompts (one answer each). Sampling fields are the OpenAI route's (openai_api.py), so what that route
refuses is refused here too.
"""

from __future__ import annotations

import math
from typing import Any

from edgellm import openai_api as oa


def parse_completion(body: Any, lim: oa.Limits) -> tuple[oa.GenerationParams, list[list]]:
    """(the request's params, its prompts: each a list of pieces, strings and ints in order). A list of
    prompts answers one completion each (llama-server's tokenize_input_prompts), or `n_cmpl` each."""
    if not isinstance(body, dict):
        raise oa.bad("", "the request body must be a JSON object")
    p = oa._common(body, lim, ("n_predict", "max_tokens"), logprobs="native")  # the shared fields
    p.n = oa._integer(body, "n_cmpl", 1, oa.MAX_CHOICES) or p.n  # llama-server's n_cmpl (n its alias)
    prompt = body.get("prompt")
    prompts = oa.prompt_list([prompt] if oa._is_int(prompt) else prompt, "prompt", lim, oa.MAX_CHOICES)
    if len(prompts) * p.n > oa.MAX_CHOICES:
        raise oa.bad("n_cmpl", f"at most {oa.MAX_CHOICES} completions per request (prompts times n_cmpl)")
    cache = body.get("cache_prompt", True)
    if not isinstance(cache, bool):
        raise oa.bad("cache_prompt", "must be a boolean")
    return p, prompts


def prompt_ids(tokenizer: Any, pieces: list) -> list[int]:
    """Token ids of a mixed prompt: BOS once at the start, strings tokenized without parsing special
    tokens, ids as they are (llama-server's tokenize_mixed)."""
    ids: list[int] = []
    for i, x in enumerate(pieces):
        ids += [int(x)] if not isinstance(x, str) else tokenizer.encode(x, add_special=i == 0)
    if pieces and not isinstance(pieces[0], str) and tokenizer.vocab.add_bos:
        ids.insert(0, tokenizer.vocab.bos_id)
    return ids


def probabilities(items: list, piece: Any, post_sampling: bool = False) -> list[dict[str, Any]]:
    """`completion_probabilities` (n_probs) from (token id, TokenLogprob) pairs, as llama-server's
    completion_token_output::to_json: log-probabilities of the raw logits, or with post_sampling the
    probabilities the sampler drew from (`prob`, `top_probs`)."""
    key, top = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")

    def entry(tok: int, lp: float) -> dict[str, Any]:
        b = piece(tok)
        v = math.exp(lp) if post_sampling else lp
        return {"id": tok, "token": b.decode("utf-8", "replace"), key: v, "bytes": list(b)}

    return [{**entry(t, x.logprob), top: [entry(i, v) for i, v in x.top]} for t, x in items]


def pick_fields(body: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """llama-server's response_fields: the answer's values at the given paths ("a/b" nested), keyed by
    the path; a path the answer lacks is left out (server-common.cpp's json_get_nested_values)."""
    out: dict[str, Any] = {}
    for path in paths:
        v: Any = body
        for k in path.split("/"):
            if not isinstance(v, dict) or k not in v:
                break
            v = v[k]
        else:
            out[path] = v
    return out


def stop_type(reason: str, last_token: int | None, eog: frozenset[int], stops: list[str]) -> str:
    if reason == "length":
        return "limit"
    if last_token is not None and last_token in eog:
        return "eos"
    return "word" if stops else "eos"


def timings(n_prompt: int, prompt_s: float, n_gen: int, gen_s: float, n_cached: int = 0) -> dict[str, float]:
    """llama-server's `timings` object (milliseconds, per-token and per-second rates; cache_n: prompt
    tokens served by the prefix cache, prompt_n: those computed). prompt_ms runs from the prompt's
    admission to the first token, predicted_ms from the first token to the last, and the generation rate
    is over the tokens after the first (which came with the prompt), as llama-server's."""

    def rates(n: int, s: float) -> tuple[float, float, float]:
        ms = s * 1e3
        return ms, (ms / n if n and ms > 0 else 0.0), (n / s if n and s > 0 else 0.0)

    p_ms, p_tok, p_rate = rates(n_prompt, prompt_s)
    g_ms, g_tok, g_rate = rates(max(0, n_gen - 1), gen_s)
    return {
        "cache_n": n_cached,
        "prompt_n": n_prompt,
        "prompt_ms": p_ms,
        "prompt_per_token_ms": p_tok,
        "prompt_per_second": p_rate,
        "predicted_n": n_gen,
        "predicted_ms": g_ms,
        "predicted_per_token_ms": g_tok,
        "predicted_per_second": g_rate,
    }


def live_timings(progress: Any) -> dict[str, float]:
    """`timings` so far from an engine Progress (llama-server's timings_per_token): the prompt's computed
    part until the first token, then the generated tokens."""
    first = progress.ttft_s if progress.ttft_s is not None else progress.elapsed_s
    prompt_s = max(0.0, first - progress.queue_s)
    n_prompt = progress.prompt_done - progress.cached_tokens
    gen_s = max(0.0, progress.elapsed_s - first)
    return timings(n_prompt, prompt_s, progress.completion_tokens, gen_s, progress.cached_tokens)


def prompt_progress(progress: Any) -> dict[str, float]:
    """llama-server's `prompt_progress` (return_progress): the prompt's tokens, those served by the cache,
    those read so far (the cached ones included), milliseconds since the request arrived."""
    return {"total": progress.prompt_tokens, "cache": progress.cached_tokens,
            "processed": progress.prompt_done, "time_ms": progress.elapsed_s * 1e3}  # fmt: skip


def active_samplers(params: Any) -> list[str]:
    """The steps of the request's chain, under llama-server's names, in order (mirostat's chain is the
    temperature and mirostat alone)."""
    if params.mirostat:
        return ["temperature"] * (params.temperature != 1.0) + [
            "mirostat" if params.mirostat == 1 else "mirostat_v2"
        ]
    on = {
        "penalties": params.repeat_penalty != 1.0 or params.presence_penalty or params.frequency_penalty,
        "dry": params.dry_on, "top_n_sigma": params.top_n_sigma > 0,
        "top_k": params.top_k > 0, "typ_p": params.typical_p < 1.0, "top_p": params.top_p < 1.0,
        "min_p": params.min_p > 0.0, "xtc": params.xtc_on, "infill": params.infill,
        "temperature": params.temperature != 1.0 or params.dynatemp_range > 0,
        "adaptive_p": params.adaptive_p,
    }  # fmt: skip
    return [n for n in oa.SAMPLER_ORDER if on.get(n)]


def generation_settings(params: Any, n_ctx: int, max_tokens: int | None, stops: list[str]) -> dict[str, Any]:
    """The sampling the request ran with, under llama-server's names."""
    return {
        "n_ctx": n_ctx,
        "n_predict": -1 if max_tokens is None else max_tokens,
        "temperature": params.temperature,
        "top_k": params.top_k,
        "top_p": params.top_p,
        "min_p": params.min_p,
        "typical_p": params.typical_p,
        "repeat_penalty": params.repeat_penalty,
        "repeat_last_n": params.repeat_last_n,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "dynatemp_range": params.dynatemp_range,
        "dynatemp_exponent": params.dynatemp_exponent,
        "top_n_sigma": params.top_n_sigma,
        "xtc_probability": params.xtc_probability,
        "xtc_threshold": params.xtc_threshold,
        "dry_multiplier": params.dry_multiplier,
        "dry_base": params.dry_base,
        "dry_allowed_length": params.dry_allowed_length,
        "dry_penalty_last_n": params.dry_penalty_last_n,
        "dry_sequence_breakers": list(params.dry_sequence_breakers),
        "mirostat": params.mirostat,
        "mirostat_tau": params.mirostat_tau,
        "mirostat_eta": params.mirostat_eta,
        "min_keep": params.min_keep,
        "adaptive_target": params.adaptive_target,
        "adaptive_decay": params.adaptive_decay,
        "seed": -1 if params.seed is None else params.seed,
        "logit_bias": [  # llama-server's shape: -inf (a ban) is null in JSON
            {"token": t, "bias": None if math.isinf(b) else b} for t, b in (params.logit_bias or {}).items()
        ],
        "stop": list(stops),
        "samplers": active_samplers(params),
        "stream": False,
    }


def parse_infill(body: Any, lim: oa.Limits) -> tuple[oa.GenerationParams, dict[str, Any]]:
    """POST /infill: input_prefix and input_suffix (required), input_extra ([{filename?, text}]) and
    prompt (optional text), plus /completion's fields (llama-server's handle_infill checks)."""
    if not isinstance(body, dict):
        raise oa.bad("", "the request body must be a JSON object")
    for name in ("input_prefix", "input_suffix"):
        if name not in body:
            raise oa.bad(name, "is required")
        if not isinstance(body[name], str):
            raise oa.bad(name, "must be a string")
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise oa.bad("prompt", "must be a string")
    extra = body.get("input_extra", [])
    if not isinstance(extra, list):
        raise oa.bad("input_extra", 'must be an array of {"filename": string, "text": string}')
    for i, c in enumerate(extra):
        if not isinstance(c, dict) or not isinstance(c.get("text"), str):
            raise oa.bad("input_extra", f"input_extra[{i}] must have a string text")
        if not isinstance(c.get("filename", ""), str):
            raise oa.bad("input_extra", f"input_extra[{i}].filename must be a string")
    p = oa._common(body, lim, ("n_predict", "max_tokens"), logprobs="native")
    p.n = oa._integer(body, "n_cmpl", 1, oa.MAX_CHOICES) or p.n  # llama-server's n_cmpl (n its alias)
    texts = {"prefix": body["input_prefix"], "suffix": body["input_suffix"], "extra": extra, "prompt": prompt}
    return p, texts


class NoInfill(ValueError):
    """The model has no fill-in-the-middle tokens."""


def infill_ids(
    tokenizer: Any,
    prefix: str,
    suffix: str,
    extra: list[dict] = (),  # type: ignore[assignment]
    prompt: str = "",
    n_batch: int = 2048,
    n_predict: int = -1,
    n_ctx: int = 4096,
) -> list[int]:
    """The fill-in-the-middle prompt, as llama.cpp's format_prompt_infill (tools/server/server-common.cpp,
    the repo-level pattern of arXiv 2409.12186; prefix-suffix-middle order):

        [FIM_REP]myproject\\n [FIM_SEP]{filename}\\n{text} ... [FIM_SEP]filename\\n
        [BOS] [FIM_PRE]{prefix}{prompt} [FIM_SUF]{suffix} [FIM_MID]

    The prefix keeps its last 3/4 of a batch, the suffix its first quarter less the prompt; extra chunks
    fill what the context leaves (their tail is kept). Texts are tokenized without parsing special tokens.
    """
    v = tokenizer.vocab
    pre, suf, mid = (v.special_id(r) for r in ("fim_pre", "fim_suf", "fim_mid"))
    missing = [n for n, t in (("prefix", pre), ("suffix", suf), ("middle", mid)) if t is None]
    if missing:
        raise NoInfill(f"this model has no fill-in-the-middle tokens ({', '.join(missing)} missing)")
    rep, sep = v.special_id("fim_rep"), v.special_id("fim_sep")

    def tok(text: str) -> list[int]:
        return tokenizer.encode(text, add_special=False, parse_special=False)

    ex: list[int] = []
    if rep is not None:
        ex += [rep, *tok("myproject\n")]
    for c in extra:
        if sep is not None:
            ex += [sep, *tok(c.get("filename", "tmp") + "\n")]
        else:
            ex += tok("\n\n--- snippet ---\n\n")
        ex += tok(c["text"])
    if sep is not None:
        ex += [sep, *tok("filename\n")]
    t_pre, t_suf, t_prompt = tok(prefix), tok(suffix), tok(prompt)
    n_pre = min(len(t_pre), 3 * (n_batch // 4))
    n_suf = min(len(t_suf), max(0, n_batch // 4 - (2 + len(t_prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(ex))
    head = [pre, *t_pre[len(t_pre) - n_pre :], *t_prompt]
    tail = [suf, *t_suf[:n_suf]]
    if v.add_bos and v.bos_id is not None:
        head.insert(0, v.bos_id)
    return [*ex[len(ex) - n_extra :], *head, *tail, mid]
