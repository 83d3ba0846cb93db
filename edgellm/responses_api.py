"""OpenAI's Responses API (`POST /v1/responses`) for plain text turns, over the chat pipeline.

Mirrors the OpenAI API reference for /v1/responses (the request's `input` and `instructions`, the Response
object, its streaming events in order: response.created, response.in_progress, output_item.added,
content_part.added, output_text.delta ..., output_text.done, content_part.done, output_item.done,
response.completed). `input` is a string or a list of messages whose content is text (input_text /
output_text parts); `developer` is the system role. Responses are kept in memory (the last
MAX_STORED, unless `store` is false) so `previous_response_id` continues a conversation and
`GET /v1/responses/{id}` returns one. `text.format` (json_schema, json_object) constrains the output.
Anything else a client may ask (tools, reasoning, images, files, background runs) is refused by name.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from edgellm import openai_api as oa

MAX_STORED = 1024


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise oa.bad("input", f"{where}.content must be a string or a list of text parts")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            out.append(part["text"])
        else:
            raise oa.bad(
                "input", f"{where}.content[{j}]: only text parts are supported, got {kind!r}",
                code="unsupported_parameter",
            )  # fmt: skip
    return "".join(out)


def input_messages(body: dict) -> list[dict[str, str]]:
    """`instructions` and `input` as chat messages."""
    msgs: list[dict[str, str]] = []
    x = body.get("input")
    if isinstance(x, str):
        msgs.append({"role": "user", "content": x})
    elif isinstance(x, list) and x:
        for i, item in enumerate(x):
            if not isinstance(item, dict):
                raise oa.bad("input", f"input[{i}] must be an object")
            kind = item.get("type", "message")
            if kind != "message":
                raise oa.bad(
                    "input", f"input[{i}]: {kind!r} items are not supported", code="unsupported_parameter"
                )
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise oa.bad("input", f"input[{i}].role must be user, assistant, system or developer")
            role = "system" if role == "developer" else role
            msgs.append({"role": role, "content": _text_of(item.get("content"), f"input[{i}]")})
    else:
        raise oa.bad("input", "must be a string or a non-empty list of messages")
    return msgs


def parse(body: Any, lim: oa.Limits) -> tuple[oa.GenerationParams, list[dict], dict[str, Any]]:
    """(params, the turn's new messages, the fields echoed back in the Response)."""
    if not isinstance(body, dict):
        raise oa.bad("", "the request body must be a JSON object")
    ref = oa._refuse_if_set
    ref(body, "tools", lambda v: v == [], "tools are not supported")
    ref(body, "tool_choice", lambda v: v in ("auto", "none"), "tools are not supported")
    ref(body, "reasoning", lambda v: v == {}, "reasoning options are not supported")
    ref(body, "include", lambda v: v == [], "include is not supported")
    ref(body, "background", lambda v: v is False, "background responses are not supported")
    ref(body, "conversation", lambda v: False, "conversations are not supported: use previous_response_id")
    ref(body, "prompt", lambda v: False, "prompt templates are not supported")
    ref(body, "truncation", lambda v: v == "disabled", "only truncation 'disabled' is supported")
    ref(body, "top_logprobs", lambda v: v == 0, "logprobs are not supported on /v1/responses")
    text = body.get("text")
    if text is not None and not isinstance(text, dict):
        raise oa.bad("text", "must be an object")
    fmt = (text or {}).get("format")
    grammar = oa.response_format(fmt, "text.format") if fmt is not None else None
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise oa.bad("instructions", "must be a string")
    prev = body.get("previous_response_id")
    if prev is not None and not isinstance(prev, str):
        raise oa.bad("previous_response_id", "must be a string")
    store = oa._boolean(body, "store", True)
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise oa.bad("metadata", "must be an object")
    fields = {k: body[k] for k in ("n", "logprobs", "echo", "suffix", "stop", "max_tokens") if k in body}
    if fields:
        raise oa.bad(next(iter(fields)), "is not a /v1/responses field", code="unsupported_parameter")
    p = oa._common(dict(body, stream_options=None), lim, ("max_output_tokens",), logprobs="chat")
    if grammar is not None:
        p.grammar, p.grammar_field = grammar, "text.format"
    msgs = input_messages(body)
    echo = {
        "instructions": instructions, "max_output_tokens": p.max_tokens, "previous_response_id": prev,
        "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0), "store": store,
        "metadata": metadata, "text": {"format": fmt or {"type": "text"}},
    }  # fmt: skip
    return p, msgs, echo


class Store:
    """The last MAX_STORED responses, with the conversation each ended (thread-safe)."""

    def __init__(self, limit: int = MAX_STORED):
        self.limit = limit
        self._items: collections.OrderedDict[str, tuple[dict, list[dict]]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def put(self, response: dict, conversation: list[dict]) -> None:
        with self._lock:
            self._items[response["id"]] = (response, conversation)
            while len(self._items) > self.limit:
                self._items.popitem(last=False)

    def get(self, rid: str) -> tuple[dict, list[dict]]:
        with self._lock:
            hit = self._items.get(rid)
        if hit is None:
            raise oa.APIError(404, f"no response with id {rid!r} (responses are kept in memory, the last "
                              f"{self.limit})", param="previous_response_id", code="not_found")  # fmt: skip
        return hit


def response(
    rid: str,
    msg_id: str,
    model: str,
    created: int,
    echo: dict,
    text: str | None,
    finish: str | None,
    usage: tuple[int, int, int] = (0, 0, 0),
) -> dict[str, Any]:
    """A Response object: in progress (text None) or finished (finish "stop" / "length")."""
    done = text is not None
    status = "in_progress" if not done else ("incomplete" if finish == "length" else "completed")
    output = []
    if done:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        output = [{"type": "message", "id": msg_id, "status": "completed", "role": "assistant",
                   "content": [part]}]  # fmt: skip
    n_in, n_out, cached = usage
    return {
        "id": rid, "object": "response", "created_at": created, "status": status,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "error": None, "model": model, "output": output, "parallel_tool_calls": True,
        "tool_choice": "auto", "tools": [], "truncation": "disabled",
        "usage": {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": cached},
                  "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": n_in + n_out} if done else None,
        **echo,
    }  # fmt: skip


def now() -> int:
    return int(time.time())
