"""Chat templates: turn a list of chat messages into the prompt text a model was trained on.

`ChatTemplate.from_gguf(model_file)` takes the file's own Jinja template (`tokenizer.chat_template`), or a
built-in one when the file has none (Gemma's format for Gemma architectures, else ChatML, which is what
llama.cpp falls back to for every model), or an override by name or file. Rendering runs in jinja2's
sandbox with Hugging Face's helpers and bounded time and size (see `sandbox.py`); any failure, from a bad
message to a template that never ends, is a `ChatTemplateError`.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .builtin import ARCH_TEMPLATES, BUILTIN_TEMPLATES
from .sandbox import BoundedEnvironment, ChatTemplateError, render_bounded, value_size

__all__ = ["ARCH_TEMPLATES", "BUILTIN_TEMPLATES", "ChatTemplate", "ChatTemplateError", "normalize_messages"]

MAX_TEMPLATE_CHARS = 1 << 20  # real templates are 0.1-30 KB
MAX_DEPTH = 32  # nesting of message fields (tool calls, JSON arguments)

_ENV = BoundedEnvironment()


class ChatTemplate:
    """A compiled chat template.

    name: "gguf" (the file's own), a `BUILTIN_TEMPLATES` name, "file" or "inline" (an override).
    source: the Jinja text. reason: one line saying why this template was chosen, for --verbose.
    Rendering is bounded by `max_seconds` of wall time and `max_output` characters of output (plus four
    times the size of the messages, so a long conversation is never refused for being long).
    """

    def __init__(
        self,
        source: str,
        *,
        name: str = "inline",
        bos_token: str = "",
        eos_token: str = "",
        reason: str = "",
        max_seconds: float = 1.0,
        max_output: int = 1 << 20,
    ):
        if not isinstance(source, str):
            raise ChatTemplateError(f"chat template must be text, not {type(source).__name__}", "syntax")
        if len(source) > MAX_TEMPLATE_CHARS:
            raise ChatTemplateError(
                f"chat template is {len(source)} characters (limit {MAX_TEMPLATE_CHARS})", "syntax"
            )
        self.name = name
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.reason = reason
        self.max_seconds = max_seconds
        self.max_output = max_output
        self._template = _ENV.compile_template(source)

    @classmethod
    def builtin(cls, name: str, **kwargs) -> ChatTemplate:
        """One of `BUILTIN_TEMPLATES` by name."""
        if name not in BUILTIN_TEMPLATES:
            raise ChatTemplateError(
                f"no built-in chat template {name!r}; have: {', '.join(BUILTIN_TEMPLATES)}", "override"
            )
        kwargs.setdefault("reason", f"using built-in chat template '{name}'")
        return cls(BUILTIN_TEMPLATES[name], name=name, **kwargs)

    @classmethod
    def from_gguf(cls, mf, override: str | None = None, **kwargs) -> ChatTemplate:
        """The template to use for a `ModelFile`: `override` (a built-in name, a path to a Jinja file,
        or Jinja text, as `--chat-template` takes) if given, else the file's own, else a built-in for
        its architecture (see `ARCH_TEMPLATES`), else ChatML. `.reason` says which and why."""
        kwargs.setdefault("bos_token", _token_text(mf, "tokenizer.ggml.bos_token_id"))
        kwargs.setdefault("eos_token", _token_text(mf, "tokenizer.ggml.eos_token_id"))
        if override:
            return cls._from_override(override, **kwargs)
        source = mf.get("tokenizer.chat_template")
        if isinstance(source, str) and source.strip():
            if source.strip() in BUILTIN_TEMPLATES:  # llama.cpp also accepts a bare name stored in the file
                name = source.strip()
                return cls.builtin(name, reason=f"file names the built-in chat template '{name}'", **kwargs)
            return cls(
                source,
                name="gguf",
                reason="using the file's own chat template (tokenizer.chat_template)",
                **kwargs,
            )
        arch = mf.get("general.architecture", "?")
        name = ARCH_TEMPLATES.get(arch, "chatml")
        why = (
            "" if name == "chatml" else "; llama.cpp would use 'chatml', which this model was not trained on"
        )
        return cls.builtin(
            name, reason=f"file has no chat template; using built-in '{name}' for arch {arch}{why}", **kwargs
        )

    @classmethod
    def _from_override(cls, override: str, **kwargs) -> ChatTemplate:
        if override in BUILTIN_TEMPLATES:
            return cls.builtin(
                override, reason=f"using built-in chat template '{override}' (--chat-template)", **kwargs
            )
        if "{{" in override or "{%" in override:
            return cls(
                override,
                name="inline",
                reason="using the chat template given inline (--chat-template)",
                **kwargs,
            )
        path = Path(override)
        if not path.is_file():
            raise ChatTemplateError(
                f"--chat-template {override!r} is neither a built-in template "
                f"({', '.join(BUILTIN_TEMPLATES)}) nor a readable file",
                "override",
            )
        if path.stat().st_size > 4 * MAX_TEMPLATE_CHARS:
            raise ChatTemplateError(f"chat template file {path} is too large", "override")
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ChatTemplateError(f"cannot read chat template file {path}: {e}", "override") from None
        return cls(
            source, name="file", reason=f"using the chat template in {path} (--chat-template)", **kwargs
        )

    def render(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        *,
        strip_bos: bool = False,
        strip_eos: bool = False,
        **extra: Any,
    ) -> str:
        """The prompt text for `messages` (OpenAI-style dicts; see `normalize_messages`).

        `tools` and `extra` (e.g. `enable_thinking=False`) are passed to the template as variables, as
        transformers' `apply_chat_template` does. `strip_bos`/`strip_eos`: pass True when the tokenizer will
        add BOS/EOS itself; a leading `bos_token` / trailing `eos_token` the template wrote is then dropped,
        as llama.cpp's common_chat_templates_apply does, so the prompt does not start with two BOS tokens.
        """
        msgs = normalize_messages(messages)
        # a null content (an assistant turn that only calls tools) is "", as llama.cpp gives every template
        # (common/chat.cpp, common_chat_msg::to_json_oaicompat): SmolLM2's template adds content to a
        # string and Qwen3's looks for '</think>' in it, and both failed on a null
        for m in msgs:
            if m.get("content") is None:
                m["content"] = ""
        tools_ = None if tools is None else _plain(tools, "tools", 0)
        extra_ = {k: _plain(v, k, 0) for k, v in extra.items()}
        # as llama.cpp gives every template (common/chat.cpp): today's date (common_chat_extra_context;
        # Llama 3.x's templates write it as "Today Date", else their own "26 Jul 2024"), and
        # enable_thinking true unless told otherwise (templates written for llama.cpp, such as its
        # DeepSeek-R1 one, close the reasoning where it is not)
        today = datetime.date.today()
        context = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "date_string": today.strftime("%d %b %Y"),
            "datetime": today.strftime("%b %d %Y"),
            "enable_thinking": True,
            **extra_,
            "messages": msgs,
            "tools": tools_,
            "add_generation_prompt": bool(add_generation_prompt),
        }
        max_chars = self.max_output + 4 * value_size([msgs, tools_, extra_], 1 << 62)
        text = render_bounded(self._template, context, max_seconds=self.max_seconds, max_chars=max_chars)
        if strip_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token) :]
        if strip_eos and self.eos_token and text.endswith(self.eos_token):
            text = text[: -len(self.eos_token)]
        return text

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r}, {len(self.source)} chars)"


def normalize_messages(messages: Any) -> list[dict]:
    """Validate chat messages and copy them into plain dicts a template may read but not affect.

    Each message is a mapping with a str `role`; `content` is a str, None (e.g. an assistant turn that only
    carries `tool_calls`), or a list of OpenAI content parts `{"type": "text", "text": ...}`, which are
    joined with "\\n" as llama.cpp does for templates that take plain text. Other fields (tool_calls, name,
    tool_call_id, reasoning_content …) pass through if they are JSON-like.
    """
    if not isinstance(messages, (list, tuple)):
        raise ChatTemplateError(f"messages must be a list, not {type(messages).__name__}", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ChatTemplateError(f"messages[{i}] must be a dict, not {type(m).__name__}", "messages")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ChatTemplateError(f"messages[{i}].role must be a non-empty string", "messages")
        msg = {k: _plain(v, f"messages[{i}].{k}", 0) for k, v in m.items() if k != "content"}
        if "content" in m:
            msg["content"] = _content(m["content"], i)
        out.append(msg)
    return out


def _content(content: Any, i: int) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        texts = []
        for j, part in enumerate(content):
            if (
                not isinstance(part, Mapping)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise ChatTemplateError(
                    f"messages[{i}].content[{j}]: only text parts ({{'type': 'text', 'text': ...}}) are "
                    f"supported, got {kind!r}",
                    "messages",
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise ChatTemplateError(
        f"messages[{i}].content must be a string, null or a list of text parts, not {type(content).__name__}",
        "messages",
    )


def _plain(value: Any, where: str, depth: int) -> Any:
    """A deep copy made only of dict/list/str/int/float/bool/None, so a template sees data, never objects."""
    if depth > MAX_DEPTH:
        raise ChatTemplateError(f"{where} is nested too deeply", "messages")
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ChatTemplateError(f"{where} has a non-string key {k!r}", "messages")
            out[k] = _plain(v, f"{where}.{k}", depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{j}]", depth + 1) for j, v in enumerate(value)]
    raise ChatTemplateError(f"{where} must be JSON-like data, not {type(value).__name__}", "messages")


def _token_text(mf, key: str) -> str:
    tid = mf.get(key)
    tokens = mf.get("tokenizer.ggml.tokens")
    if not isinstance(tid, int) or tokens is None or not 0 <= tid < len(tokens):
        return ""
    return tokens[tid]
