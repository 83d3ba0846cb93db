"""OpenAI's Responses API (`POST /v1/responses`) for text turns and function tools, over the chat pipeline.

Mirrors the OpenAI API reference for /v1/responses (the request's `input` and `instructions`, the Response
object, its streaming events in order: response.created, response.in_progress, output_item.added,
content_part.added, output_text.delta ..., output_text.done, content_part.done, output_item.done,
response.completed). `input` is a string or a list of messages whose content is text (input_text /
output_text parts); `developer` is the system role. Responses are kept in memory (the last
MAX_STORED, unless `store` is false) so `previous_response_id` continues a conversation and
`GET /v1/responses/{id}` returns one. `text.format` (json_schema, json_object) constrains the output.
Function tools (`tools` of type function, `tool_choice`, `parallel_tool_calls`) go through tools.py as on
chat completions: the model's calls come back as `function_call` output items (streamed as
response.function_call_arguments.delta / .done), and `function_call` / `function_call_output` input items
carry them and their results into the next turn. A thinking model's reasoning (reasoning.py) comes
back as a `reasoning` item before the answer (its text as `reasoning_text`, streamed as
response.reasoning_text.delta, as llama-server gives it); a reasoning item in `input` joins the assistant
turn it led to. Anything else a client may ask (built-in tools, reasoning options, images, files,
background runs) is refused by name.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from edgellm import openai_api as oa
from edgellm import tools as tl

MAX_STORED = 1024


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise oa.bad("input", f"{where}.content must be a string or a list of text parts")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text", "reasoning_text", "summary_text") and isinstance(
            part.get("text"), str
        ):
            out.append(part["text"])
        else:
            raise oa.bad(
                "input", f"{where}.content[{j}]: only text parts are supported, got {kind!r}",
                code="unsupported_parameter",
            )  # fmt: skip
    return "".join(out)


def _string(item: dict, key: str, where: str) -> str:
    v = item.get(key)
    if not isinstance(v, str) or not v:
        raise oa.bad("input", f"{where}.{key} must be a non-empty string")
    return v


def input_messages(body: dict) -> list[dict[str, Any]]:
    """`input` as chat messages: function_call items as an assistant's tool_calls (consecutive ones in one
    message), function_call_output items as tool messages, a reasoning item's text as the reasoning_content
    of the assistant turn it led to (as llama-server reads it)."""
    msgs: list[dict[str, Any]] = []
    x = body.get("input")
    if isinstance(x, str):
        msgs.append({"role": "user", "content": x})
    elif isinstance(x, list) and x:
        for i, item in enumerate(x):
            if not isinstance(item, dict):
                raise oa.bad("input", f"input[{i}] must be an object")
            kind = item.get("type", "message")
            if kind == "reasoning":
                parts = item.get("content") or item.get("summary") or []
                text = _text_of(parts, f"input[{i}]") if parts else ""
                msgs.append(
                    {"role": "assistant", "content": None, "reasoning_content": text, "_thought": True}
                )
                continue
            if kind == "function_call":
                call = {"id": _string(item, "call_id", f"input[{i}]"), "type": "function",
                        "function": {"name": _string(item, "name", f"input[{i}]"),
                                     "arguments": item.get("arguments", "{}")}}  # fmt: skip
                if not isinstance(call["function"]["arguments"], str):
                    raise oa.bad("input", f"input[{i}].arguments must be a string (JSON)")
                if msgs and msgs[-1]["role"] == "assistant" and msgs[-1].get("tool_calls"):
                    msgs[-1]["tool_calls"].append(call)
                else:
                    msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
                continue
            if kind == "function_call_output":
                out = item.get("output")
                text = out if isinstance(out, str) else _text_of(out, f"input[{i}].output")
                msgs.append({"role": "tool", "tool_call_id": _string(item, "call_id", f"input[{i}]"),
                             "content": text})  # fmt: skip
                continue
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
    out: list[dict[str, Any]] = []
    for m in msgs:  # a reasoning item joins the assistant turn after it
        if out and out[-1].pop("_thought", False) and m["role"] == "assistant" and "_thought" not in m:
            m = {**m, "reasoning_content": out.pop()["reasoning_content"]}
        out.append(m)
    if out:
        out[-1].pop("_thought", None)
    return out


def parse_tools(body: dict) -> tl.ToolRequest | None:
    """The Responses API's function tools ({type: function, name, description?, parameters?, strict?},
    flat) and tool_choice ({type: function, name} for a named one) as tools.py's request."""
    raw = body.get("tools")
    choice = body.get("tool_choice", "auto")
    if isinstance(raw, list):
        for i, t in enumerate(raw):
            kind = t.get("type") if isinstance(t, dict) else None
            if kind != "function":
                raise oa.bad("tools", f"tools[{i}]: {kind!r} tools are not supported (only function tools)",
                             code="unsupported_parameter")  # fmt: skip
        raw = [{"type": "function", "function": {**{k: t[k] for k in ("name", "description", "parameters")
                                                    if t.get(k) is not None},
                                                 "strict": t.get("strict", True)}}  # OpenAI's default here
               for t in raw]  # fmt: skip
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise oa.bad("tool_choice", "must be auto, none, required or {'type': 'function', 'name': ...}")
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return tl.parse({"tools": raw, "tool_choice": choice,
                     "parallel_tool_calls": body.get("parallel_tool_calls", True)})  # fmt: skip


def parse(body: Any, lim: oa.Limits) -> tuple[oa.GenerationParams, list[dict], dict[str, Any]]:
    """(params, the turn's new messages, the fields echoed back in the Response)."""
    if not isinstance(body, dict):
        raise oa.bad("", "the request body must be a JSON object")
    ref = oa._refuse_if_set
    ref(body, "reasoning", lambda v: v == {}, "reasoning options are not supported")
    ref(body, "include", lambda v: v == [], "include is not supported")
    ref(body, "background", lambda v: v is False, "background responses are not supported")
    ref(body, "conversation", lambda v: False, "conversations are not supported: use previous_response_id")
    ref(body, "prompt", lambda v: False, "prompt templates are not supported")
    ref(body, "truncation", lambda v: v == "disabled", "only truncation 'disabled' is supported")
    ref(body, "top_logprobs", lambda v: v == 0, "logprobs are not supported on /v1/responses")
    ref(body, "reasoning_control", lambda v: v is False, "reasoning control is only on chat completions")
    text = body.get("text")
    if text is not None and not isinstance(text, dict):
        raise oa.bad("text", "must be an object")
    if (text or {}).get("verbosity") not in (None, "medium"):
        raise oa.bad("text.verbosity", "is not supported (only OpenAI's default, medium)",
                     code="unsupported_parameter")  # fmt: skip
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
    p = oa._common(
        dict(body, stream_options=None, tools=None, parallel_tool_calls=None),
        lim,
        ("max_output_tokens",),
        logprobs="chat",
    )
    if grammar is not None:
        p.grammar, p.grammar_field = grammar, "text.format"
    p.tools = parse_tools(body)
    if p.tools is not None and p.tools.forced and p.grammar is not None:
        raise oa.bad("tool_choice", "a forced tool call cannot be combined with text.format")
    msgs = input_messages(body)
    echo = {
        "instructions": instructions, "max_output_tokens": p.max_tokens, "previous_response_id": prev,
        "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0), "store": store,
        "metadata": metadata, "text": {"format": fmt or {"type": "text"}},
        "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": p.tools.parallel if p.tools is not None else True,
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

    def delete(self, rid: str) -> None:
        """Forget a stored response (404 if it is not kept)."""
        self.get(rid)
        with self._lock:
            self._items.pop(rid, None)

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
    calls: list[dict] | None = None,
    output: list[dict] | None = None,
    thought: str | None = None,
) -> dict[str, Any]:
    """A Response object: in progress (text None) or finished (finish "stop" / "length"), its output the
    answer's message (unless the answer is only tool calls) and a function_call item per call
    (tools.new_call's), after a reasoning item for `thought` (a thinking model's reasoning); or `output`,
    the items a stream sent, in its order."""
    done = text is not None
    status = "in_progress" if not done else ("incomplete" if finish == "length" else "completed")
    if output is None:
        output = [reasoning_item(oa.new_id("rs", "_"), thought)] if thought is not None else []
        if done and (text or not calls):
            output += [{"type": "message", "id": msg_id, "status": "completed", "role": "assistant",
                        "content": [_part(text)]}]  # fmt: skip
        output += [function_call_item(c) for c in calls or []]
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


def reasoning_item(rid: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    """A thinking model's reasoning as a reasoning output item (its text in content, as llama-server and
    gpt-oss's open reasoning give it; no summary, no encrypted content); text None: an empty, open one."""
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"type": "reasoning", "id": rid, "summary": [], "content": content, "encrypted_content": None,
            "status": status}  # fmt: skip


def function_call_item(call: dict, status: str = "completed") -> dict[str, Any]:
    """A call (tools.new_call's) as the Responses API's function_call output item."""
    fn = call["function"]
    return {"type": "function_call", "id": "fc_" + call["id"].removeprefix("call_"), "call_id": call["id"],
            "name": fn["name"], "arguments": fn["arguments"], "status": status}  # fmt: skip


def now() -> int:
    return int(time.time())


class Items:
    """An answer's output items as the Responses API streams them, from tools.stream_parts' parts: a
    reasoning item for a thinking model's reasoning (reasoning_text.delta pieces), a message item while
    text comes, a function_call item per call (its arguments as function_call_arguments.delta pieces), in
    the order the model wrote them. `feed` and `close` give
    (event, data) pairs; `items` the items done, the finished Response's output."""

    def __init__(self, msg_id: str, calls: list[dict] | None = None, message: bool = False):
        self.msg_id = msg_id  # the first message item's id
        self.message = message  # an answer without text still has a (empty) message item
        self.calls = calls if calls is not None else []  # the CallStream's calls
        self.items: list[dict] = []
        self.msg: dict[str, Any] | None = None  # the message being written: item_id, output_index, text
        self.fc: dict[str, Any] | None = None  # the call being written: item_id, output_index
        self.rs: dict[str, Any] | None = None  # the reasoning being written: item_id, output_index, text
        self.shown: list[str] = []  # the text sent

    def open_message(self) -> list[tuple[str, dict]]:
        k = len(self.items)
        mid = self.msg_id if not any(i["type"] == "message" for i in self.items) else oa.new_id("msg", "_")
        self.msg = {"item_id": mid, "output_index": k, "text": []}
        item = {"type": "message", "id": mid, "status": "in_progress", "role": "assistant", "content": []}
        return [("response.output_item.added", {"output_index": k, "item": item}),
                ("response.content_part.added", {**self._at(), "part": _part("")})]  # fmt: skip

    def feed(self, part: Any) -> list[tuple[str, dict]]:
        out: list[tuple[str, dict]] = []
        if part.kind == "reasoning":
            if self.rs is None:
                k = len(self.items)
                self.rs = {"item_id": oa.new_id("rs", "_"), "output_index": k, "text": []}
                item = reasoning_item(self.rs["item_id"], None, "in_progress")
                out.append(("response.output_item.added", {"output_index": k, "item": item}))
            self.rs["text"].append(part.text)
            at = {"item_id": self.rs["item_id"], "output_index": self.rs["output_index"], "content_index": 0}
            return out + [("response.reasoning_text.delta", {**at, "delta": part.text})]
        out += self._close_reasoning()  # the reasoning comes first: what follows ends it
        if part.kind == "text":
            out += [] if self.msg is not None else self.open_message()
            assert self.msg is not None
            self.msg["text"].append(part.text)
            self.shown.append(part.text)
            out.append(("response.output_text.delta", {**self._at(), "delta": part.text, "logprobs": []}))
        elif part.kind == "begins":
            out += self._close_message()
            item = {**function_call_item(self.calls[part.index], "in_progress"), "arguments": ""}
            self.fc = {"item_id": item["id"], "output_index": len(self.items)}
            out.append(("response.output_item.added", {"output_index": len(self.items), "item": item}))
        elif part.kind == "args":
            assert self.fc is not None
            out.append(("response.function_call_arguments.delta", {**self.fc, "delta": part.text}))
        else:
            out += self._close_call(part.index, "completed")
        return out

    def close(self) -> list[tuple[str, dict]]:
        """The open items done (a call still open was cut short: incomplete)."""
        out = self._close_reasoning()
        if self.message and self.msg is None and not any(i["type"] == "message" for i in self.items):
            out += self.open_message()
        out += self._close_message()
        if self.fc is not None:
            out += self._close_call(len(self.calls) - 1, "incomplete")
        return out

    def _at(self) -> dict[str, Any]:
        assert self.msg is not None
        return {"item_id": self.msg["item_id"], "output_index": self.msg["output_index"], "content_index": 0}

    def _close_message(self) -> list[tuple[str, dict]]:
        if self.msg is None:
            return []
        at, part = self._at(), _part("".join(self.msg["text"]))
        item = {"type": "message", "id": at["item_id"], "status": "completed", "role": "assistant",
                "content": [part]}  # fmt: skip
        self.items.append(item)
        self.msg = None
        return [
            ("response.output_text.done", {**at, "text": part["text"], "logprobs": []}),
            ("response.content_part.done", {**at, "part": part}),
            ("response.output_item.done", {"output_index": at["output_index"], "item": item}),
        ]

    def _close_reasoning(self) -> list[tuple[str, dict]]:
        if self.rs is None:
            return []
        rs, self.rs = self.rs, None
        item = reasoning_item(rs["item_id"], "".join(rs["text"]))
        self.items.append(item)
        at = {"item_id": rs["item_id"], "output_index": rs["output_index"], "content_index": 0}
        return [
            ("response.reasoning_text.done", {**at, "text": item["content"][0]["text"]}),
            ("response.output_item.done", {"output_index": rs["output_index"], "item": item}),
        ]

    def _close_call(self, index: int, status: str) -> list[tuple[str, dict]]:
        assert self.fc is not None
        item = function_call_item(self.calls[index], status)
        at, self.fc = self.fc, None
        self.items.append(item)
        return [
            ("response.function_call_arguments.done", {**at, "arguments": item["arguments"]}),
            ("response.output_item.done", {"output_index": at["output_index"], "item": item}),
        ]


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
