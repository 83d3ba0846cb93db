"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) over the chat pipeline, as
llama-server serves it to Anthropic's SDKs and tools.

The request becomes an OpenAI chat body (after ggml-org/llama.cpp tools/server/server-chat.cpp,
server_chat_convert_anthropic_to_oai): `system` (a string or text blocks) as the system message; content
blocks `text` joined, an assistant's `tool_use` blocks as its tool_calls, a user's `tool_result` blocks as
tool messages (after the user's own text); `tools` ({name, description, input_schema}) as function tools
and `tool_choice` (auto, any, tool, none) as OpenAI's; `stop_sequences` as stop; temperature, top_p,
top_k. The answer is a Message: a text block (unless the answer is only tool calls), a `tool_use` block
per call, `stop_reason` end_turn / max_tokens / stop_sequence / tool_use; streamed as Anthropic's events
(message_start, content_block_start / _delta / _stop per block, message_delta, message_stop). Errors take
Anthropic's shape ({"type": "error", "error": {"type", "message"}}).

Structured outputs: `output_config.format` (or the beta's `output_format`) {type: json_schema, schema}
constrains the answer's text to the schema, and a tool's `strict: true` its calls' input, as Anthropic
guarantees them (structured.py, tools.py).

A thinking model's reasoning (reasoning.py) comes back as a `thinking` block before the text, as
llama-server's; an earlier turn's thinking blocks go to the template as reasoning_content; `thinking:
{type: disabled}` tells a template that can think not to (`enable_thinking` false); `{type: enabled,
budget_tokens: N}` tells it to (`enable_thinking` true) and ends the reasoning after N tokens (the server's
reasoning budget, as llama.cpp's).

What a local text model cannot give is refused by name: images and documents, other `thinking` types,
`output_config.effort`, server tools (web search, code execution, ...), `mcp_servers`, `container`.
`metadata` and `service_tier` change nothing here and are accepted.
"""

from __future__ import annotations

import json
from typing import Any

from edgellm import openai_api as oa
from edgellm.openai_api import APIError

# APIError status -> Anthropic's error type
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error"}  # fmt: skip


PING = 'event: ping\ndata: {"type": "ping"}\n\n'  # what Anthropic's stream sends to keep a connection


def error_body(e: APIError) -> dict[str, Any]:
    where = f"{e.param}: " if e.param and not e.message.startswith(f"{e.param}:") else ""
    return {
        "type": "error",
        "error": {"type": ERROR_TYPES.get(e.status, "api_error"), "message": where + e.message},
    }


def _text(blocks: Any, where: str) -> str:
    """A string, or text blocks joined; anything else refused by name."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise oa.bad("messages", f"{where} must be a string or a list of content blocks")
    out = []
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind != "text" or not isinstance(b.get("text"), str):
            raise oa.bad("messages", f"{where}[{j}]: only text blocks are supported here, got {kind!r}",
                         code="unsupported_parameter")  # fmt: skip
        out.append(b["text"])
    return "".join(out)


def _message(i: int, msg: Any) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: the role's text and tool calls, then tool results."""
    if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
        raise oa.bad("messages", f"messages[{i}] must be an object with role user or assistant")
    role, content = msg["role"], msg.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise oa.bad("messages", f"messages[{i}].content must be a string or a list of content blocks")
    texts, calls, results, thoughts = [], [], [], []
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        where = f"messages[{i}].content[{j}]"
        if kind == "text" and isinstance(b.get("text"), str):
            texts.append(b["text"])
        elif kind == "tool_use" and role == "assistant":
            name, args = b.get("name"), b.get("input", {})
            if not isinstance(b.get("id"), str) or not isinstance(name, str) or not isinstance(args, dict):
                raise oa.bad("messages", f"{where}: a tool_use block needs an id, a name and an input object")
            arguments = json.dumps(args, ensure_ascii=False)
            calls.append(
                {"id": b["id"], "type": "function", "function": {"name": name, "arguments": arguments}}
            )
        elif kind == "tool_result" and role == "user":
            if not isinstance(b.get("tool_use_id"), str):
                raise oa.bad("messages", f"{where}: a tool_result block needs a tool_use_id")
            out = b.get("content", "")
            text = "" if out is None else _text(out, f"{where}.content")
            if b.get("is_error"):  # the model should know the call failed
                text = f"Error: {text}"
            results.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": text})
        elif kind == "thinking" and role == "assistant" and isinstance(b.get("thinking"), str):
            thoughts.append(b["thinking"])  # the template shows it where it shows reasoning (Qwen3's)
        elif kind == "redacted_thinking" and role == "assistant":
            continue  # encrypted reasoning of another model: nothing to show
        else:
            raise oa.bad("messages", f"{where}: {kind!r} blocks are not supported",
                         code="unsupported_parameter")  # fmt: skip
    said: list[dict[str, Any]] = []
    if texts or calls or thoughts or not results:
        m: dict[str, Any] = {"role": role, "content": "".join(texts) if texts or not calls else None}
        if calls:
            m["tool_calls"] = calls
        if thoughts:  # as reasoning_content, as llama-server carries it (server-chat.cpp)
            m["reasoning_content"] = "".join(thoughts)
        said.append(m)
    return said + results


def _thinking(v: Any) -> int | None:
    """Anthropic's `thinking`: None (not sent), -1 (disabled), or the enabled reasoning's budget."""
    if v is None:
        return None
    kind = v.get("type") if isinstance(v, dict) else None
    if kind == "disabled":
        return -1
    if kind != "enabled":
        raise oa.bad("thinking", f"type {kind!r} is not supported (enabled and disabled are)",
                     code="unsupported_parameter")  # fmt: skip
    n = v.get("budget_tokens")
    if not oa._is_int(n) or n < 1:
        raise oa.bad("thinking", "budget_tokens must be a positive integer")
    return n


def to_openai(body: Any, n_ctx: int, count_only: bool = False) -> dict[str, Any]:
    """An Anthropic Messages request as the OpenAI chat body parse_chat reads (`count_only`: for
    count_tokens, where max_tokens is not needed). max_tokens, which Anthropic's clients must send and
    often send large, is held to the context: no answer can outgrow it anyway."""
    if not isinstance(body, dict):
        raise oa.bad("", "the request body must be a JSON object")
    thinking = _thinking(body.get("thinking"))
    oa._refuse_if_set(body, "mcp_servers", lambda v: v == [], "MCP servers are not supported")
    oa._refuse_if_set(body, "container", lambda v: False, "containers (code execution) are not supported")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise oa.bad("messages", "must be a non-empty list of messages")
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _text(system, "system")})
    for i, m in enumerate(msgs):
        out += _message(i, m)
    chat: dict[str, Any] = {"messages": out}
    if thinking is not None:  # a template that can think (Qwen3's) is told whether to
        chat["chat_template_kwargs"] = {"enable_thinking": thinking >= 0}
        if thinking > 0:
            chat["reasoning_budget_tokens"] = thinking
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise oa.bad("tools", "must be a list of tools")
        fns = []
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or t.get("type") not in (None, "custom"):
                kind = t.get("type") if isinstance(t, dict) else None
                raise oa.bad("tools", f"tools[{i}]: {kind!r} tools are not supported (only custom tools)",
                             code="unsupported_parameter")  # fmt: skip
            fn = {"name": t.get("name"), "parameters": t.get("input_schema", {"type": "object"})}
            for key in ("description", "strict"):
                if t.get(key) is not None:
                    fn[key] = t[key]
            fns.append({"type": "function", "function": fn})
        chat["tools"] = fns
    tc = body.get("tool_choice")
    if tc is not None:
        kind = tc.get("type") if isinstance(tc, dict) else None
        names = {"auto": "auto", "any": "required", "none": "none"}
        if kind in names:
            chat["tool_choice"] = names[kind]
        elif kind == "tool" and isinstance(tc.get("name"), str):
            chat["tool_choice"] = {"type": "function", "function": {"name": tc["name"]}}
        else:
            raise oa.bad(
                "tool_choice", "must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}"
            )
        if tc.get("disable_parallel_tool_use"):
            chat["parallel_tool_calls"] = False
    fmt = _output_format(body)
    if fmt is not None:  # structured outputs: the answer's text is JSON matching the schema, guaranteed
        chat["response_format"] = {"type": "json_schema", "json_schema": {"schema": fmt, "strict": True}}
    if "stop_sequences" in body:
        chat["stop"] = body["stop_sequences"]
    if not count_only:
        if "max_tokens" not in body:
            raise oa.bad("max_tokens", "is required")
        n = body["max_tokens"]
        chat["max_tokens"] = min(n, n_ctx) if isinstance(n, int) and not isinstance(n, bool) else n
    for key in ("temperature", "top_p", "top_k", "stream", "chat_template_kwargs"):
        if key in body:
            chat[key] = body[key]
    return chat


def _output_format(body: dict) -> dict | None:
    """Structured outputs' schema: `output_config.format` ({type: json_schema, schema}), or the beta's
    top-level `output_format`; None for free text. `output_config.effort` (how hard a reasoning model
    thinks) is refused by name."""
    config = body.get("output_config")
    if config is not None and not isinstance(config, dict):
        raise oa.bad("output_config", "must be an object")
    config = config or {}
    if config.get("effort") is not None:
        raise oa.bad("output_config.effort", "is not supported", code="unsupported_parameter")
    fmts = [(k, v) for k, v in (("output_config.format", config.get("format")),
                                 ("output_format", body.get("output_format"))) if v is not None]  # fmt: skip
    if not fmts:
        return None
    if len(fmts) > 1:
        raise oa.bad("output_format", "cannot be combined with output_config.format: give one")
    where, fmt = fmts[0]
    schema = fmt.get("schema") if isinstance(fmt, dict) and fmt.get("type") == "json_schema" else None
    if not isinstance(schema, dict):
        raise oa.bad(where, "must be {'type': 'json_schema', 'schema': {...}}")
    return schema


def tool_use_block(call: dict, input: dict | None = None) -> dict[str, Any]:
    """A call (tools.new_call's) as a tool_use content block; `input` for its arguments (a streamed
    block starts with {})."""
    fn = call["function"]
    uid = "toolu_" + call["id"].removeprefix("call_")
    args = json.loads(fn["arguments"]) if input is None else input
    return {"type": "tool_use", "id": uid, "name": fn["name"], "input": args}


def stop_reason(finish: str, calls: list[dict], stop_sequence: str | None) -> str:
    if calls:
        return "tool_use"
    if finish == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def message(mid: str, model: str, content: list[dict], reason: str | None, stop_sequence: str | None,
            usage: tuple[int, int, int]) -> dict[str, Any]:  # fmt: skip
    """A Message object (`reason` None while it is still being written)."""
    n_in, n_out, cached = usage
    return {
        "id": mid, "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": reason, "stop_sequence": stop_sequence,
        "usage": {"input_tokens": n_in - cached, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": cached, "output_tokens": n_out},
    }  # fmt: skip


class Blocks:
    """An answer's content blocks as Anthropic streams them, from tools.stream_parts' parts: a thinking
    block for a thinking model's reasoning (thinking_delta pieces; its signature empty, as llama-server's),
    a text block while text comes, a tool_use block per call (its input as input_json_delta pieces), in
    the order the model wrote them. `feed` and `close` give (event, data) pairs."""

    def __init__(self, calls: list[dict] | None = None):
        self.calls = calls if calls is not None else []  # the CallStream's calls
        self.n = 0  # blocks opened
        self.text_at: int | None = None  # the text block open, if any
        self.tool_at: int | None = None  # the tool_use block open, if any
        self.thought_at: int | None = None  # the thinking block open, if any (a thinking model's reasoning)
        self.shown: list[str] = []  # the text sent
        self.answered = False  # a text or tool_use block was opened

    def feed(self, part: Any) -> list[tuple[str, dict]]:
        out: list[tuple[str, dict]] = []
        if part.kind == "reasoning":
            if self.thought_at is None:
                self.thought_at, self.n = self.n, self.n + 1
                block = {"type": "thinking", "thinking": "", "signature": ""}
                out.append(("content_block_start", {"index": self.thought_at, "content_block": block}))
            delta = {"type": "thinking_delta", "thinking": part.text}
            out.append(("content_block_delta", {"index": self.thought_at, "delta": delta}))
            return out
        out += self._stop("thought_at")  # the reasoning comes first: what follows ends it
        if part.kind == "text":
            if self.text_at is None:
                self.text_at, self.n, self.answered = self.n, self.n + 1, True
                block = {"type": "text", "text": ""}
                out.append(("content_block_start", {"index": self.text_at, "content_block": block}))
            self.shown.append(part.text)
            delta = {"type": "text_delta", "text": part.text}
            out.append(("content_block_delta", {"index": self.text_at, "delta": delta}))
        elif part.kind == "begins":
            out += self._stop("text_at")
            self.tool_at, self.n, self.answered = self.n, self.n + 1, True
            block = tool_use_block(self.calls[part.index], {})
            out.append(("content_block_start", {"index": self.tool_at, "content_block": block}))
        elif part.kind == "args":
            delta = {"type": "input_json_delta", "partial_json": part.text}
            out.append(("content_block_delta", {"index": self.tool_at, "delta": delta}))
        else:
            out += self._stop("tool_at")
        return out

    def close(self) -> list[tuple[str, dict]]:
        """The open blocks stopped (a tool_use block still open: a call cut short); an answer with no
        text and no call gets one empty text block."""
        out = self._stop("thought_at") + self._stop("text_at") + self._stop("tool_at")
        if not self.answered:
            at, self.n = self.n, self.n + 1
            out += [("content_block_start", {"index": at, "content_block": {"type": "text", "text": ""}}),
                    ("content_block_stop", {"index": at})]  # fmt: skip
        return out

    def _stop(self, which: str) -> list[tuple[str, dict]]:
        at = getattr(self, which)
        setattr(self, which, None)
        return [] if at is None else [("content_block_stop", {"index": at})]
