"""Tool calling through the model's own chat template, in the Hermes / Qwen format:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The request's `tools` are rendered by the template (a template that never reads `tools`, such as
SmolLM2's, cannot show them to the model: the request is refused); the answer's `<tool_call>` blocks are
parsed back into OpenAI's `tool_calls`. `tool_choice` "required" or a named function constrains the answer
to such blocks, with the arguments matching the function's parameter schema (structured.py); "auto" lets
the model choose, constrains the calls it writes in the same way (llama.cpp's lazy grammar: the text around
them is free) and parses them; "none" renders no tools. Small models often leave the tags out and answer
with the call's JSON alone: an answer that is nothing but such calls (one or more objects naming a known
function first, then object arguments, perhaps in a ```json fence) is taken as calls too, as llama.cpp's
Hermes 2 Pro parser took a bare `{"name": ...}` (common/chat.cpp, before its PEG parsers). This is the
format of Qwen2.5, Qwen3, Hermes 2/3 and the models trained on them (llama.cpp: common/chat.cpp's Hermes 2
Pro handler); Llama 3.x's JSON calls (`{"name": ..., "parameters": {...}}`, bare) are read the same way,
`parameters` for `arguments`; other families' formats (Mistral [TOOL_CALLS], ...) are not parsed.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from edgellm import openai_api as oa
from edgellm.structured import Grammar

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_CLOSE_RE = CLOSE.replace("/", "\\/")  # in a Lark regex


@dataclass
class ToolRequest:
    tools: list[dict]  # OpenAI's [{"type": "function", "function": {name, description?, parameters?}}]
    choice: str | dict = "auto"  # "auto", "none", "required", or {"type": "function", "function": {name}}
    parallel: bool = True
    names: list[str] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    @property
    def parsed(self) -> list[str] | None:
        """The functions whose calls an answer is parsed for (None: tools off, the answer is text)."""
        return self.names if self.active else None

    @property
    def forced(self) -> list[str]:
        """The functions the answer must call (tool_choice required or named), or [] for auto."""
        if self.choice == "required":
            return self.names
        if isinstance(self.choice, dict):
            return [self.choice["function"]["name"]]
        return []


def parse(body: dict) -> ToolRequest | None:
    """`tools`, `tool_choice` and `parallel_tool_calls` of a chat request, checked; None without tools."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    choice = "auto" if choice is None else choice  # null: the default, as llama-server reads it
    parallel = oa._boolean(body, "parallel_tool_calls", True)
    if tools in (None, []):
        if choice not in ("auto", "none", None):
            raise oa.bad("tool_choice", "needs tools")
        return None
    if not isinstance(tools, list) or len(tools) > 128:
        raise oa.bad("tools", "must be a list of at most 128 tools")
    names = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise oa.bad("tools", f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise oa.bad("tools", f"tools[{i}].function.name must be 1-64 letters, digits, _ . or -")
        if name in names:
            raise oa.bad("tools", f"two tools are named {name!r}")
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, dict):
            raise oa.bad("tools", f"tools[{i}].function.parameters must be a JSON schema object")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise oa.bad("tools", f"tools[{i}].function.description must be a string")
        names.append(name)
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        if not isinstance(fn, dict) or fn.get("name") not in names:
            raise oa.bad("tool_choice", f"must name one of the tools ({', '.join(names)})")
    elif choice not in ("auto", "none", "required"):
        raise oa.bad("tool_choice", "must be auto, none, required or {'type': 'function', 'function': ...}")
    return ToolRequest(tools, choice, parallel, names)


def renders_tools(template_source: str) -> bool:
    """Whether a chat template reads the `tools` variable (so the model sees the tools)."""
    return re.search(r"\btools\b", template_source or "") is not None


def require_shown(template_source: str) -> None:
    """A 400 naming `tools` where the chat template cannot show them to the model."""
    if not renders_tools(template_source):
        why = "this model's chat template does not render tools, so the model cannot see them"
        raise oa.bad("tools", f"{why}: use a model whose template does (Qwen2.5, Hermes, ...)")


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as templates expect them: an assistant's tool-call arguments as objects (OpenAI sends
    them as JSON text; templates write `arguments | tojson`), as llama.cpp's common/chat.cpp does."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and isinstance(calls, list):
            fixed = []
            for c in calls:
                fn = dict(c.get("function") or {}) if isinstance(c, dict) else {}
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except (ValueError, RecursionError):
                        raise oa.bad("messages", "a tool call's arguments must be JSON") from None
                fixed.append({**c, "function": fn})
            m = {**m, "tool_calls": fixed}
        out.append(m)
    return out


def grammar(req: ToolRequest, other: Grammar | None = None) -> Grammar | None:
    """The constraint of a request with tools, in Lark for llguidance; `other` is the request's own
    response format, if any.

    - tool_choice required or a named function: the answer is one (or, with parallel calls, one or more)
      <tool_call> blocks whose JSON names a forced function and whose arguments match its schema.
    - auto, as llama.cpp's lazy grammars (common/chat.cpp's Hermes 2 Pro handler): `other` where there is
      one; else any text, but from `<tool_call>` on a call's JSON must name one of the tools, its
      arguments match that tool's schema, and `</tool_call>` follow; an answer that opens as a bare call's
      JSON (`{"name":`, perhaps in a ```json fence) is nothing but such calls; with parallel_tool_calls
      false, one call at most (no other `<tool_call>` after it). llguidance's lazy lexemes
      (its docs/syntax.md, "Tool calling") keep the free text's mask cheap (~0.05 ms a token on 151k).
    - none: `other`.

    Each function's arguments are their own JSON schema (so a pydantic schema's `#/$defs/...` resolves);
    a keyword llguidance does not implement (`not`, `if`, an unknown `format`, ...) is refused for a
    `strict` function and skipped otherwise (llguidance's lenient mode), as llama.cpp's schema converter
    skips what it does not know; a wrong schema (a bad type or reference) is a 400 naming the function."""
    forced = req.forced
    if not forced and (not req.active or other is not None):
        return other
    fns = [t["function"] for t in req.tools]
    w = "[ \\t\\r\\n]*"  # JSON's blanks, in a Lark regex
    rules = [
        f'OBJ: /{w}\\{{{w}"name"{w}:{w}/',
        f'SEP: /{w},{w}"(arguments|parameters)"{w}:{w}/',  # parameters: Llama 3.x's JSON calls
        f"SHUT: /{w}\\}}/",
        f"END: /{w}{_CLOSE_RE}/",
    ]
    for i, fn in enumerate(fns):
        rules.append(f"fn_{i}: {json.dumps(json.dumps(fn['name']))} SEP args_{i} SHUT")
        rules.append(f"args_{i}: %json {json.dumps(_arguments_schema(fn))}")
    if forced:
        repeat = "+" if req.parallel and len(forced) > 1 else ""
        alts = " | ".join(f"fn_{i}" for i, fn in enumerate(fns) if fn["name"] in forced)
        head = [f"start: call{repeat}", f'call: "{OPEN}\\n" OBJ ({alts}) END "\\n"?']
    elif req.parallel:
        head = [
            "start: bare | call* tail",
            "bare: OBJ fn (OBJ fn)* BLANK? | FENCED fn (OBJ fn)* FENCE_END",
        ]
    else:  # parallel_tool_calls false: one call at most, the text after it holds no other
        head = [
            "start: bare | call AFTER | tail",
            "bare: OBJ fn BLANK? | FENCED fn FENCE_END",
            f"AFTER: /(?s:.*)/ & ~/(?s:.*){OPEN}(?s:.*)/",
        ]
    if not forced:
        head += [
            "tail: TEXT",
            f'TEXT: /(?s:.*)/ & ~/{w}(```(json)?{w})?\\{{{w}"name"(?s:.*)/',
            f'call_head[lazy]: TEXT "{OPEN}"',
            "call: call_head OBJ fn END",
            f'FENCED: /{w}```(json)?{w}\\{{{w}"name"{w}:{w}/',
            f"FENCE_END: /{w}```{w}/",
            "BLANK: /[ \\t\\r\\n]+/",
            f"fn: {' | '.join(f'fn_{i}' for i in range(len(fns)))}",
        ]
    return Grammar("lark", "\n".join(head + rules) + "\n")


def _arguments_schema(fn: dict) -> dict:
    """A function's parameter schema as its calls' arguments are held to (see `grammar`)."""
    from edgellm.structured import schema_error

    schema = fn.get("parameters") or {"type": "object"}
    strict = fn.get("strict") is True
    if not strict:  # llguidance's lenient mode: keywords it does not implement are skipped
        extra = schema.get("x-guidance")
        schema = {**schema, "x-guidance": {**(extra if isinstance(extra, dict) else {}), "lenient": True}}
    why = schema_error(schema)
    if why is not None:
        named = f"function {fn['name']!r}" + (" (strict)" if strict else "")
        raise oa.bad("tools", f"the parameters of {named} cannot be enforced: {why}")
    return schema


def new_call(name: str, arguments: Any) -> dict:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _call(obj: Any, names: list[str]) -> dict | None:
    """A parsed block's call: a known function's name with object arguments, else None."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))  # parameters: Llama 3.x's JSON calls
    return new_call(obj["name"], args) if isinstance(args, dict) else None


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


def _bare_calls(text: str, names: list[str]) -> list[dict]:
    """The calls of an answer that is nothing but calls' JSON objects without tags (perhaps fenced), or []."""
    body = text.strip()
    fenced = _FENCE.match(body)
    body = fenced.group(1) if fenced else body
    calls, pos, dec = [], 0, json.JSONDecoder()
    while pos < len(body):
        try:
            obj, pos = dec.raw_decode(body, pos)
        except (ValueError, RecursionError):  # not JSON, or nested past Python's limit
            return []
        first = next(iter(obj), None) if isinstance(obj, dict) else None
        call = _call(obj, names) if first == "name" else None  # as `grammar` constrains them
        if call is None:
            return []
        calls.append(call)
        while pos < len(body) and body[pos] in " \t\r\n":
            pos += 1
    return calls


def split(text: str, names: list[str], single: bool = False) -> tuple[str, list[dict]]:
    """An answer's text outside its tool-call blocks, and the calls (to known functions, with object
    arguments) parsed from them; a block that does not parse stays in the text. Without blocks, an answer
    that is only calls' JSON (see the module's note) is those calls. `single` (parallel_tool_calls false):
    the first call only."""
    content, calls = _split(text, names)
    return content, calls[:1] if single else calls


def _split(text: str, names: list[str]) -> tuple[str, list[dict]]:
    calls: list[dict] = []
    kept: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        try:
            call = _call(json.loads(m.group(1)), names)
        except (ValueError, RecursionError):  # not JSON, or nested past Python's limit
            continue
        if call is None:
            continue
        kept.append(text[pos : m.start()])
        pos = m.end()
        calls.append(call)
    kept.append(text[pos:])
    if not calls and OPEN not in text:
        bare = _bare_calls(text, names)
        if bare:
            return "", bare
    return "".join(kept).strip() if calls else text, calls


def _bare_start(head: str) -> bool | None:
    """Whether an answer beginning `head` (blanks stripped) is bare JSON (an object, or a ```json or ```
    fence around one), or None while too little has come to tell."""
    fence = head[3:].lstrip() if head.startswith("```") else None
    if head.startswith("{") or (fence is not None and fence.removeprefix("json").lstrip().startswith("{")):
        return True
    if not head or "```json".startswith(head) or (fence is not None and "json".startswith(fence.rstrip())):
        return None
    return False


class StreamSplitter:
    """Streams an answer's plain text as it comes and holds back anything that may be a tool call
    (from `<tool_call>` on, or a tail that could begin it, or an answer that begins as bare JSON: `{` or a
    fence); `finish()` parses what was held."""

    def __init__(self, names: list[str], single: bool = False):
        self.names = names
        self.single = single
        self.buf = ""
        self.sent = 0
        self.in_call = False

    def push(self, text: str) -> str:
        self.buf += text
        if self.in_call:
            return ""
        if self.sent == 0:  # the answer's start: bare JSON is held to the end
            bare = _bare_start(self.buf.lstrip())
            if bare is not False:
                self.in_call = bare is True
                return ""
        at = self.buf.find(OPEN, self.sent)
        if at >= 0:
            self.in_call = True
            out, self.sent = self.buf[self.sent : at], at
            return out
        safe = len(self.buf)
        for k in range(min(len(OPEN) - 1, len(self.buf) - self.sent), 0, -1):
            if OPEN.startswith(self.buf[-k:]):
                safe = len(self.buf) - k
                break
        out, self.sent = self.buf[self.sent : safe], safe
        return out

    def finish(self) -> tuple[str, list[dict]]:
        """(text not yet sent, the calls)."""
        rest, calls = split(self.buf[self.sent :], self.names, self.single)
        return rest, calls


@dataclass
class Part:
    """One step of a streamed answer (CallStream): `text` to show; a call `begins` (calls[index] has its
    id and name, no arguments yet); a piece of its `args` text; or the call `ends` (its arguments whole)."""

    kind: str  # "text", "begins", "args", "ends" (and stream_parts' "reasoning")
    text: str = ""
    index: int = -1


_W = "[ \t\r\n]*"  # JSON's blanks
# A call's JSON up to its arguments' first character, as the grammar writes it (the name first, a
# known name needs no escapes); bare calls may open a ```json fence first.
_HEAD = re.compile(_W + r'\{' + _W + r'"name"' + _W + ":" + _W + r'"([^"\\]{1,64})"' + _W + ","
                   + _W + r'"(?:arguments|parameters)"' + _W + ":" + _W + r"(?=\S)")  # fmt: skip
_FENCE_OPEN = re.compile(_W + "```(?:json)?")
_SHUT_TAG = re.compile(_W + r"\}" + _W + re.escape(CLOSE))
_SHUT_BARE = re.compile(_W + r"\}")
_HEAD_LIMIT = 256  # characters a call's head may take before the stream stops reading it as one


class CallStream:
    """An answer streamed as it is generated, its tool calls as they are written: `push(text)` and
    `finish()` give Parts. Text that may begin a call is held back (StreamSplitter).

    `live` (the calls are held to their schemas by the request's grammar, tools.grammar): a call begins once
    its name and its arguments' opening brace are written, and its arguments stream as they come, as
    OpenAI, llama-server and Anthropic stream them; it ends at its closing tag (or, bare, its closing
    brace). An answer cut short (max_tokens, a stop string) leaves its last call begun and not ended.
    Otherwise (the calls were not constrained, so one may not parse) each call comes whole at the end,
    as `split` reads the held text. `calls` holds the calls begun (OpenAI's tool_calls shape, arguments
    as streamed) and `ended` how many of them ended."""

    def __init__(self, names: list[str], single: bool = False, live: bool = False):
        self.names, self.single, self.live = names, single, live
        self.calls: list[dict] = []
        self.ended = 0
        self._whole = StreamSplitter(names, single)  # the text, when not live
        self._buf = ""
        self._pos = 0  # read up to here
        self._state = "start"  # start, text, head, args, shut, bare, bare_next, held
        self._bare = False  # the answer is bare calls (no tags)
        self._held_from = 0  # where a call that did not read as one began (held to the end)
        self._blank = ""  # blanks after a call, shown only if text follows them
        self._depth = 0  # the arguments' JSON: open brackets, in a string, after a backslash
        self._in_str = self._esc = False

    def push(self, text: str) -> list[Part]:
        if not self.live:
            shown = self._whole.push(text)
            return [Part("text", shown)] if shown else []
        self._buf += text
        out: list[Part] = []
        while self._step(out):
            pass
        return out

    def finish(self) -> list[Part]:
        if not self.live:
            rest, calls = self._whole.finish()
            return ([Part("text", rest)] if rest else []) + self._whole_calls(calls)
        out: list[Part] = []
        s = self._state
        if s in ("start", "head", "bare", "held"):  # text, or calls not begun: read whole
            rest, calls = split(self._buf[self._held_from :], self.names, self.single)
            out += ([Part("text", rest)] if rest else []) + self._whole_calls(calls)
        elif s == "text":
            self._text(out, self._buf[self._pos :])
        return out  # args, shut: the last call was cut short; bare_next: blanks or the fence's end

    def _whole_calls(self, calls: list[dict]) -> list[Part]:
        out = []
        for c in calls:
            k = len(self.calls)
            self.calls.append(c)
            self.ended += 1
            out += [
                Part("begins", index=k),
                Part("args", c["function"]["arguments"], k),
                Part("ends", index=k),
            ]
        return out

    def _text(self, out: list[Part], text: str) -> None:
        if self.calls and not text.strip():  # blanks between or after calls: shown only before text
            self._blank += text
        elif text:
            out.append(Part("text", self._blank + text))
            self._blank = ""

    def _step(self, out: list[Part]) -> bool:
        """Reads what it can of the buffer; True if the state moved on (read again)."""
        buf, pos, s = self._buf, self._pos, self._state
        if s == "start":  # the answer's start: bare JSON calls, or text
            bare = _bare_start(buf.lstrip())
            if bare is None:
                return False
            self._state, self._bare = ("bare", True) if bare else ("text", False)
            return True
        if s == "text":
            at = buf.find(OPEN, pos)
            if at >= 0:
                self._text(out, buf[pos:at])
                self._pos, self._held_from, self._state = at + len(OPEN), at, "head"
                return True
            safe = len(buf)
            for k in range(min(len(OPEN) - 1, len(buf) - pos), 0, -1):
                if OPEN.startswith(buf[-k:]):
                    safe = len(buf) - k
                    break
            self._text(out, buf[pos:safe])
            self._pos = safe
            return False
        if s in ("head", "bare"):
            at = pos
            if s == "bare" and not self.calls:
                fence = _FENCE_OPEN.match(buf, pos)
                at = fence.end() if fence else pos
            m = _HEAD.match(buf, at)
            if m is None:
                if len(buf) - self._held_from > _HEAD_LIMIT:
                    self._state = "held"  # not a call as the grammar writes one: parsed at the end
                return False
            if m.group(1) not in self.names or buf[m.end()] != "{":
                self._state = "held"
                return False
            k, self._blank = len(self.calls), ""  # blanks between calls are not text
            self.calls.append(new_call(m.group(1), {}))
            self.calls[k]["function"]["arguments"] = ""
            out.append(Part("begins", index=k))
            self._pos, self._state = m.end(), "args"
            self._depth, self._in_str, self._esc = 0, False, False
            return True
        if s == "args":
            end = self._scan(pos)
            piece = buf[pos:end]
            if piece:
                self.calls[-1]["function"]["arguments"] += piece
                out.append(Part("args", piece, len(self.calls) - 1))
            self._pos = end
            if self._depth == 0:  # the arguments' closing brace
                self._state = "shut"
                return True
            return False
        if s == "shut":
            m = (_SHUT_BARE if self._bare else _SHUT_TAG).match(buf, pos)
            if m is None:
                return False
            self.ended += 1
            out.append(Part("ends", index=len(self.calls) - 1))
            self._pos = m.end()
            self._state = "text"
            if self._bare:  # another bare call may follow
                self._state, self._held_from = "bare_next", m.end()
            return True
        if s == "bare_next":
            rest = buf[pos:].lstrip(" \t\r\n")
            if rest.startswith("{"):
                self._state = "bare"
                return True
            return False  # blanks or the fence's end (the grammar allows nothing else)
        return False  # held: read at the end

    def _scan(self, pos: int) -> int:
        """Reads the arguments' JSON from `pos`; where it stopped (after the closing brace, or the end)."""
        buf = self._buf
        for i in range(pos, len(buf)):
            c = buf[i]
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif c == "\\":
                    self._esc = True
                elif c == '"':
                    self._in_str = False
            elif c == '"':
                self._in_str = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
        return len(buf)


def stream_parts(think: Any, calls: CallStream | None, text: str | None) -> list[Part]:
    """A single answer's next text (None: its end) as Parts: the reasoning apart (`think`, a
    reasoning.ReasoningStream, or None: no reasoning is taken apart) as "reasoning" parts, then the text
    with its tool calls (`calls`, a CallStream, or None: plain text)."""
    if think is not None:
        pieces = think.push(text) if text else think.finish() if text is None else []
    else:
        pieces = [("content", text)] if text else []
    out: list[Part] = []
    for kind, t in pieces:
        if kind == "reasoning":
            out.append(Part("reasoning", t))
        else:
            out += calls.push(t) if calls is not None else [Part("text", t)]
    if text is None and calls is not None:
        out += calls.finish()
    return out
