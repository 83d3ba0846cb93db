"""Ollama's HTTP API over the same engine: request parsing and response shapes (the routes are in
server.py). Mirrors ollama/ollama docs/api.md and api/types.go: `/api/generate` and `/api/chat` stream
NDJSON (one JSON object per line, `done: false` pieces then one `done: true` with counts and nanosecond
durations) unless `"stream": false`; sampling comes in `options` under Ollama's names.

`think: true` takes a thinking model's reasoning apart into `thinking` (reasoning.py), `false` tells a
template that can think not to (`enable_thinking`). A field edgellm cannot honour is refused with a 400
naming it (`images`, `think` levels, a per-request `template`, options such as `mirostat`), never ignored.
`/api/chat`'s `tools` go through the model's chat template and come back as `message.tool_calls` with
object arguments (tools.py: the Hermes / Qwen format).
Options that only tune Ollama's own runner (`num_gpu`, `num_thread`, `num_batch`, `use_mmap`, ...) change
nothing here and are accepted.
"""

from __future__ import annotations

import json
import math
import time
from datetime import datetime, timezone
from typing import Any

from edgellm import openai_api as oa
from edgellm.openai_api import APIError

OLLAMA_VERSION = "0.12.0"  # the API version edgellm answers as (/api/version)

# Ollama option -> (edgellm sampling name, low, high) for the numbers that map one to one
SAMPLING_OPTIONS: dict[str, tuple[str, float, float]] = {
    "temperature": ("temperature", 0.0, 2.0),
    "top_p": ("top_p", 0.0, 1.0),
    "min_p": ("min_p", 0.0, 1.0),
    "typical_p": ("typical_p", 0.0, 1.0),
    "repeat_penalty": ("repeat_penalty", 0.0, 100.0),
    "presence_penalty": ("presence_penalty", -2.0, 2.0),
    "frequency_penalty": ("frequency_penalty", -2.0, 2.0),
    "mirostat_tau": ("mirostat_tau", -math.inf, math.inf),
    "mirostat_eta": ("mirostat_eta", -math.inf, math.inf),
}
INT_OPTIONS = {
    "top_k": ("top_k", 0, 1 << 31),
    "repeat_last_n": ("repeat_last_n", -1, 1 << 31),
    "mirostat": ("mirostat", 0, 2),
}
# options that tune Ollama's runner (memory, threads, batching): nothing to do here
RUNNER_OPTIONS = {
    "num_gpu", "main_gpu", "num_thread", "num_batch", "use_mmap", "use_mlock", "numa", "low_vram",
    "f16_kv", "vocab_only", "num_keep",
}  # fmt: skip
# options that would change the answer and that edgellm does not implement: refused by name
UNSUPPORTED_OPTIONS = {"tfs_z": 1.0, "penalize_newline": None}


def _dict(body: dict, name: str) -> dict:
    v = body.get(name)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise oa.bad(name, "must be an object")
    return v


def parse_options(body: dict, n_ctx: int) -> tuple[dict[str, Any], int | None, list[str]]:
    """(sampling overrides, max tokens (None: until the context is full), stop strings) from `options`."""
    opts = _dict(body, "options")
    sampling: dict[str, Any] = {}
    for name, value in opts.items():
        if value is None:
            continue
        if name in SAMPLING_OPTIONS:
            key, lo, hi = SAMPLING_OPTIONS[name]
            if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
                raise oa.bad(f"options.{name}", f"must be a finite number in [{lo}, {hi}]")
            sampling[key] = float(value)
        elif name in INT_OPTIONS:
            key, lo, hi = INT_OPTIONS[name]
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise oa.bad(f"options.{name}", f"must be an integer in [{lo}, {hi}]")
            sampling[key] = value
        elif name == "seed":
            if isinstance(value, bool) or not isinstance(value, int):
                raise oa.bad("options.seed", "must be an integer")
            sampling["seed"] = None if value < 0 else value % (1 << 64)
        elif name == "num_ctx":
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise oa.bad("options.num_ctx", "must be a positive integer")
            if value > n_ctx:
                raise oa.bad("options.num_ctx", f"this server's context is {n_ctx} tokens per sequence")
        elif name in ("num_predict", "stop"):
            continue
        elif name in RUNNER_OPTIONS:
            continue
        elif name in UNSUPPORTED_OPTIONS:
            if value != UNSUPPORTED_OPTIONS[name]:
                raise oa.bad(f"options.{name}", f"{name} is not supported", code="unsupported_parameter")
        else:
            raise oa.bad(f"options.{name}", "unknown option", code="unsupported_parameter")
    n = opts.get("num_predict")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < -2 or n == 0):
        raise oa.bad(
            "options.num_predict", "must be a positive integer, -1 (no limit) or -2 (fill the context)"
        )
    max_tokens = None if n is None or n < 0 else min(n, n_ctx)
    stop = opts.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > oa.MAX_STOPS:
        raise oa.bad("options.stop", f"must be a list of at most {oa.MAX_STOPS} strings")
    return sampling, max_tokens, [s for s in stop if s]


def _refuse(body: dict, name: str, ok: Any, why: str) -> None:
    if name in body and body[name] is not None and not ok(body[name]):
        raise oa.bad(name, why, code="unsupported_parameter")


def _common_refusals(body: dict) -> None:
    _refuse(body, "images", lambda v: v == [], "images are not supported")
    _refuse(
        body, "think", lambda v: isinstance(v, bool), "thinking levels (high, medium, low) are not supported"
    )


def think(body: dict) -> bool | None:
    """Ollama's `think`: true, the model's reasoning apart (`thinking`); false, a template that can think is
    told not to (enable_thinking); None (not sent), the answer as the model writes it."""
    v = body.get("think")
    return v if isinstance(v, bool) else None


def _tool_calls(calls: Any, i: int) -> list[dict]:
    """An assistant message's Ollama tool calls ({function: {name, arguments}}, arguments an object or
    its JSON text) as OpenAI-shaped calls with object arguments, as the chat templates read them."""
    if not isinstance(calls, list):
        raise oa.bad("messages", f"messages[{i}].tool_calls must be a list")
    out = []
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise oa.bad("messages", f"messages[{i}].tool_calls: each needs a function with a name")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                raise oa.bad("messages", f"messages[{i}].tool_calls: arguments must be JSON") from None
        if not isinstance(args, dict):
            raise oa.bad("messages", f"messages[{i}].tool_calls: arguments must be an object")
        out.append({"type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def answer_tool_calls(calls: list[dict]) -> list[dict]:
    """tools.split's calls (OpenAI's, arguments as JSON text) as Ollama answers them."""
    return [
        {
            "function": {
                "index": k,
                "name": c["function"]["name"],
                "arguments": json.loads(c["function"]["arguments"]),
            }
        }
        for k, c in enumerate(calls)
    ]


def output_format(body: dict) -> Any:
    """Ollama's `format`: "json" (a JSON object) or a JSON schema, as a
    structured.Grammar; None for free text."""
    from edgellm.structured import Grammar

    f = body.get("format")
    if f in (None, ""):
        return None
    if f == "json":
        return Grammar("json_object")
    if isinstance(f, dict):
        return Grammar("json_schema", f)
    raise oa.bad("format", 'must be "json" or a JSON schema object')


def model_name(body: dict) -> str:
    m = body.get("model")
    if m is not None and not isinstance(m, str):
        raise oa.bad("model", "must be a string")
    return m or ""


def parse_generate(body: Any, n_ctx: int, n_vocab: int) -> dict[str, Any]:
    """POST /api/generate: {prompt, system?, suffix?, raw?, stream?, options?, context?, keep_alive?}.
    With `context`, the prompt continues those tokens; the final answer of a templated (not raw) prompt
    carries `context`: its prompt's tokens and the answer's, to send back with the next prompt."""
    if not isinstance(body, dict):
        raise oa.bad("", "the request body must be a JSON object")
    _common_refusals(body)
    _refuse(body, "tools", lambda v: v == [], "tools are only supported on /api/chat")
    _refuse(body, "template", lambda v: v == "", "a per-request template is not supported")
    prompt = body.get("prompt", "")
    system = body.get("system")
    if not isinstance(prompt, str) or (system is not None and not isinstance(system, str)):
        raise oa.bad("prompt", "prompt and system must be strings")
    suffix = body.get("suffix") or ""
    if not isinstance(suffix, str):
        raise oa.bad("suffix", "must be a string")
    sampling, max_tokens, stop = parse_options(body, n_ctx)
    return dict(
        model=model_name(body), prompt=prompt, system=system, raw=bool(body.get("raw")), suffix=suffix,
        format=output_format(body), think=think(body), context=context(body, n_vocab),
        stream=body.get("stream", True) is not False, sampling=sampling, max_tokens=max_tokens, stop=stop,
    )  # fmt: skip


def context(body: dict, n_vocab: int) -> list[int]:
    """/api/generate's `context`: the token ids an earlier answer returned (its prompt and its answer),
    which this prompt continues (Ollama's conversation memory before /api/chat; deprecated there, still
    sent by its clients' generate examples)."""
    v = body.get("context")
    if v is None:
        return []
    if not isinstance(v, list) or not all(oa._is_int(t) and 0 <= t < n_vocab for t in v):
        raise oa.bad(
            "context", f"must be a list of token ids in [0, {n_vocab}) (an earlier answer's context)"
        )
    return [int(t) for t in v]


def parse_chat(body: Any, n_ctx: int) -> dict[str, Any]:
    """POST /api/chat: {messages: [{role, content, tool_calls?, tool_name?}], tools?, stream?, options?,
    keep_alive?}."""
    from edgellm import tools

    if not isinstance(body, dict):
        raise oa.bad("", "the request body must be a JSON object")
    _common_refusals(body)
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        raise oa.bad("messages", "must be a list of messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"]:
            raise oa.bad("messages", f"messages[{i}] must be an object with a role")
        if not isinstance(m.get("content", ""), str):
            raise oa.bad("messages", f"messages[{i}].content must be a string")
        if m.get("images"):
            raise oa.bad("messages", "images are not supported", code="unsupported_parameter")
        msg = {"role": m["role"], "content": m.get("content", "")}
        if isinstance(m.get("thinking"), str) and m["thinking"]:  # an earlier turn's, for the template
            msg["reasoning_content"] = m["thinking"]
        if m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"], i)
        name = m.get("tool_name")
        if name is not None:  # a tool's answer: which tool gave it
            if not isinstance(name, str):
                raise oa.bad("messages", f"messages[{i}].tool_name must be a string")
            msg["name"] = name
        out.append(msg)
    if body.get("tool_choice") is not None:  # OpenAI's, not Ollama's: the model always chooses here
        raise oa.bad("tool_choice", "Ollama's chat has no tool_choice", code="unsupported_parameter")
    sampling, max_tokens, stop = parse_options(body, n_ctx)
    return dict(
        model=model_name(body), messages=out, tools=tools.parse({"tools": body.get("tools")}),
        format=output_format(body), think=think(body),
        stream=body.get("stream", True) is not False, sampling=sampling, max_tokens=max_tokens, stop=stop,
    )  # fmt: skip


def parse_embed(body: Any) -> dict[str, Any]:
    """POST /api/embed: {model, input: str | [str], truncate?, dimensions?, options?, keep_alive?}."""
    if not isinstance(body, dict):
        raise oa.bad("", "the request body must be a JSON object")
    x = body.get("input")
    texts = [x] if isinstance(x, str) else x
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise oa.bad("input", "must be a non-empty string or a list of non-empty strings")
    if len(texts) > oa.MAX_EMBED_INPUTS:
        raise oa.bad("input", f"at most {oa.MAX_EMBED_INPUTS} inputs per request")
    _refuse(body, "dimensions", lambda v: v == 0, "truncated dimensions are not supported")
    truncate = body.get("truncate", True)
    if not isinstance(truncate, bool):
        raise oa.bad("truncate", "must be true or false")
    return dict(model=model_name(body), input=texts, truncate=truncate)


def now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def final_fields(usage: list[int], t_start: float, ttft: float | None, reason: str) -> dict[str, Any]:
    """The counts and nanosecond durations Ollama's last object carries."""
    total = time.perf_counter() - t_start
    prompt_s = ttft if ttft is not None else 0.0
    return {
        "done": True,
        "done_reason": "length" if reason == "length" else "stop",
        "total_duration": int(total * 1e9),
        "load_duration": 0,
        "prompt_eval_count": usage[0],
        "prompt_eval_duration": int(prompt_s * 1e9),
        "eval_count": usage[1],
        "eval_duration": int(max(total - prompt_s, 0.0) * 1e9),
    }


def model_entry(name: str, size: int, digest: str, details: dict, modified: float) -> dict[str, Any]:
    """One model as /api/tags and /api/ps list it."""
    when = datetime.fromtimestamp(modified, timezone.utc).isoformat().replace("+00:00", "Z")
    return {
        "name": name,
        "model": name,
        "modified_at": when,
        "size": size,
        "digest": digest,
        "details": details,
    }


def not_found(name: str, served: str = "") -> APIError:
    """Ollama's 404 for a model it does not have (`served`: the one this server has, said after it)."""
    also = f" (this server has '{served}')" if served else ""
    return APIError(404, f"model '{name}' not found{also}", code="model_not_found")
