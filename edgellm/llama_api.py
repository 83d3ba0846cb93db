"""llama-server's native API over the same engine: request parsing and answer shapes for `/completion`
(also `/completions`, as llama-server maps it), `/props` and `/slots` (the routes are in server.py).
Mirrors ggml-org/llama.cpp tools/server/server.cpp (handle_completions, handle_props, handle_slots) and
the fields its tests (tools/server/tests/unit/test_completion.py) read: `content`, `tokens`, `stop`,
`stop_type` ("eos" | "word" | "limit"), `stopping_word`, `truncated`, `tokens_predicted`,
`tokens_evaluated`, `tokens_cached`, `generation_settings`, `timings`.

`prompt` is text, token ids, or a list mixing both (ids and strings concatenated in order). Sampling
fields are the OpenAI route's (openai_api.py), so what that route refuses is refused here too.
"""

from __future__ import annotations

from typing import Any

from edgellm import openai_api as oa


def parse_completion(body: Any, lim: oa.Limits) -> tuple[oa.GenerationParams, list]:
    """(the request's params, its prompt pieces: strings and ints in order)."""
    if not isinstance(body, dict):
        raise oa.bad("", "the request body must be a JSON object")
    p = oa._common(body, lim, ("n_predict", "max_tokens"), logprobs="native")  # the shared fields
    if p.n != 1:
        raise oa.bad("n", "the native /completion API returns one completion")
    prompt = body.get("prompt")
    if isinstance(prompt, str | int):
        pieces = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(x, str) or oa._is_int(x) for x in prompt):
        pieces = prompt
    else:
        raise oa.bad("prompt", "must be a string, token ids, or a list mixing both")
    for x in pieces:
        if not isinstance(x, str) and not 0 <= x < lim.n_vocab:
            raise oa.bad("prompt", f"token ids must be in [0, {lim.n_vocab})")
    cache = body.get("cache_prompt", True)
    if not isinstance(cache, bool):
        raise oa.bad("cache_prompt", "must be a boolean")
    return p, pieces


def prompt_ids(tokenizer: Any, pieces: list) -> list[int]:
    """Token ids of a mixed prompt: BOS once at the start, strings tokenized without parsing special
    tokens, ids as they are (llama-server's tokenize_mixed)."""
    ids: list[int] = []
    for i, x in enumerate(pieces):
        ids += [int(x)] if not isinstance(x, str) else tokenizer.encode(x, add_special=i == 0)
    if pieces and not isinstance(pieces[0], str) and tokenizer.vocab.add_bos:
        ids.insert(0, tokenizer.vocab.bos_id)
    return ids


def probabilities(items: list, piece: Any) -> list[dict[str, Any]]:
    """`completion_probabilities` (n_probs) from (token id, TokenLogprob) pairs, as llama-server's
    completion_token_output::to_json without post_sampling_probs: log-probabilities of the raw logits."""

    def entry(tok: int, lp: float) -> dict[str, Any]:
        b = piece(tok)
        return {"id": tok, "token": b.decode("utf-8", "replace"), "logprob": lp, "bytes": list(b)}

    return [{**entry(t, x.logprob), "top_logprobs": [entry(i, v) for i, v in x.top]} for t, x in items]


def stop_type(reason: str, last_token: int | None, eog: frozenset[int], stops: list[str]) -> str:
    if reason == "length":
        return "limit"
    if last_token is not None and last_token in eog:
        return "eos"
    return "word" if stops else "eos"


def timings(n_prompt: int, prompt_s: float, n_gen: int, gen_s: float) -> dict[str, float]:
    """llama-server's `timings` object (milliseconds, per-token and per-second rates)."""

    def rates(n: int, s: float) -> tuple[float, float, float]:
        ms = s * 1e3
        return ms, (ms / n if n else 0.0), (n / s if s > 0 else 0.0)

    p_ms, p_tok, p_rate = rates(n_prompt, prompt_s)
    g_ms, g_tok, g_rate = rates(n_gen, gen_s)
    return {
        "prompt_n": n_prompt,
        "prompt_ms": p_ms,
        "prompt_per_token_ms": p_tok,
        "prompt_per_second": p_rate,
        "predicted_n": n_gen,
        "predicted_ms": g_ms,
        "predicted_per_token_ms": g_tok,
        "predicted_per_second": g_rate,
    }


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
        "seed": -1 if params.seed is None else params.seed,
        "stop": list(stops),
        "stream": False,
    }
