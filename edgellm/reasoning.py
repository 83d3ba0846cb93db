"""A thinking model's reasoning, split from its answer: `<think> ... </think>` (Qwen3, DeepSeek-R1, QwQ and
the models trained on them) becomes `reasoning_content`, the rest the answer's content, as llama-server's
`--reasoning-format deepseek` (its `auto` default) gives them (tools/server/README.md, "reasoning_format").

The reasoning is read only where the answer opens with `<think>` (blanks before it allowed), or where the
prompt already opened it (DeepSeek-R1's template ends its generation prompt with `<think>\\n`: llama.cpp's
"thinking forced open"); an answer without it is all content, so models that do not think are untouched.
An answer a grammar shapes from its first token (structured output, a forced tool call) does not start
inside a reasoning the prompt opened: it is what the grammar says (`auto` tools leave the text free, so
their answers may). An answer cut short inside its reasoning is all reasoning. Blanks around the
reasoning and before the content are dropped, as llama.cpp trims them. Format "none" leaves the answer
whole (llama-server's `none`).

A reasoning budget (`Budget`, llama.cpp's `--reasoning-budget` and a request's reasoning_budget_tokens)
ends the reasoning after so many tokens by writing its end tag in place of what the model samples.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<think>", "</think>"
FORMATS = ("auto", "deepseek", "none")  # llama-server's names; auto is deepseek here
_BLANKS = " \t\r\n"


def opens_in_thought(prompt_tail: str) -> bool:
    """Whether a prompt ending in `prompt_tail` (its last tokens' text, special tokens included) leaves a
    `<think>` open, so the answer starts inside the reasoning."""
    at = prompt_tail.rfind(OPEN)
    return at >= 0 and not prompt_tail[at + len(OPEN) :].strip(_BLANKS)


def split(text: str, inside: bool = False) -> tuple[str | None, str]:
    """(the reasoning, or None where the answer has none; the content)."""
    s = ReasoningStream(inside)
    parts = s.push(text) + s.finish()
    thought = "".join(t for k, t in parts if k == "reasoning")
    return (thought if s.thought else None), "".join(t for k, t in parts if k == "content")


class ReasoningStream:
    """The answer's text as it comes, in ("reasoning", text) and ("content", text) pieces; a tag's
    beginning, and blanks that may end the reasoning or begin the content, are held until they can be
    told apart. `finish()` gives what is held; `thought` says whether the answer had reasoning."""

    def __init__(self, inside: bool = False):
        self.state = "thought" if inside else "start"  # start, thought, gap (after </think>), content
        self.buf = ""
        self.thought = inside
        self._sent = False  # reasoning sent (until then its leading blanks are dropped)

    def push(self, text: str) -> list[tuple[str, str]]:
        self.buf += text
        out: list[tuple[str, str]] = []
        while True:
            if self.state == "start":
                head = self.buf.lstrip(_BLANKS)
                if head.startswith(OPEN):
                    self.state, self.thought, self.buf = "thought", True, head[len(OPEN) :]
                    continue
                if OPEN.startswith(head):  # blanks, or the tag's beginning: wait
                    return out
                self.state = "content"
            elif self.state == "thought":
                at = self.buf.find(CLOSE)
                if at >= 0:
                    self._reason(out, self.buf[:at].rstrip(_BLANKS))
                    self.state, self.buf = "gap", self.buf[at + len(CLOSE) :]
                    continue
                keep = _held(self.buf, CLOSE)
                self._reason(out, self.buf[: len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep :]
                return out
            elif self.state == "gap":
                self.buf = self.buf.lstrip(_BLANKS)
                if not self.buf:
                    return out
                self.state = "content"
            else:
                if self.buf:
                    out.append(("content", self.buf))
                    self.buf = ""
                return out

    def finish(self) -> list[tuple[str, str]]:
        """What is held: the reasoning's last blanks are dropped; an answer that never left its start
        (blanks, or part of `<think>`) is content."""
        out: list[tuple[str, str]] = []
        rest, self.buf = self.buf, ""
        if self.state == "thought":
            self._reason(out, rest.rstrip(_BLANKS))
        elif rest and self.state in ("start", "content"):
            out.append(("content", rest))
        return out

    def _reason(self, out: list[tuple[str, str]], text: str) -> None:
        text = text if self._sent else text.lstrip(_BLANKS)
        if text:
            out.append(("reasoning", text))
            self._sent = True


def _held(buf: str, tag: str) -> int:
    """How many characters at the end of `buf` to hold: a tail that may begin `tag`, and the blanks
    before it (they end the reasoning if the tag follows)."""
    keep = 0
    for k in range(min(len(tag) - 1, len(buf)), 0, -1):
        if tag.startswith(buf[-k:]):
            keep = k
            break
    rest = buf[: len(buf) - keep]
    return keep + len(rest) - len(rest.rstrip(_BLANKS))


# ---------------------------------------------------------------------------------------------- budget


@dataclass(frozen=True)
class BudgetSpec:
    """llama.cpp's reasoning budget (common/reasoning-budget.cpp), in token ids: once `budget` tokens of
    reasoning are written (opened by `start`, or by the prompt: `inside`), `forced` (a message, then the
    end tag) is written in place of what the model samples; a reasoning the model ends itself (with any of
    `ends`) is left alone. budget -1: no limit, but the reasoning may still be ended on request (force)."""

    start: tuple[int, ...]
    ends: tuple[tuple[int, ...], ...]
    forced: tuple[int, ...]
    budget: int
    inside: bool = False


class Budget:
    """One sequence's reasoning budget: take(sampled token) -> the token to write (states as llama.cpp's:
    idle until the start tag, counting the reasoning's tokens, waiting for a character's last UTF-8 byte
    once spent, forcing the end, done for good)."""

    IDLE, COUNTING, UTF8, FORCING, DONE = range(5)

    def __init__(self, spec: BudgetSpec, piece: Callable[[int], bytes]):
        self.spec = spec
        self._piece = piece
        self._keep = max([len(spec.start), *(len(e) for e in spec.ends), 1])
        self._recent: list[int] = []
        self._i = 0  # forced tokens written
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self.state = self.IDLE
        self.left = spec.budget
        if spec.inside:
            self._begin()

    def _begin(self) -> None:
        self.state, self.left, self._recent = self.COUNTING, self.spec.budget, []
        if self.left == 0:
            self.state = self.FORCING

    def force(self) -> bool:
        """End the reasoning now (llama-server's reasoning control): True if it was being written."""
        if self.state not in (self.COUNTING, self.UTF8):
            return False
        self.state = self.UTF8 if self._utf8.getstate()[0] else self.FORCING
        return True

    def take(self, tok: int) -> int:
        if self.state == self.FORCING:
            tok = self.spec.forced[self._i]
            self._i += 1
            if self._i == len(self.spec.forced):
                self.state = self.DONE
            return tok
        if self.state == self.DONE:
            return tok
        self._recent = (self._recent + [tok])[-self._keep :]
        self._utf8.decode(self._piece(tok))
        if self.state == self.IDLE:
            if _ends_with(self._recent, self.spec.start):
                self._begin()
            return tok
        if any(_ends_with(self._recent, e) for e in self.spec.ends):  # the model ended it itself
            self.state = self.DONE
            return tok
        if self.state == self.COUNTING and self.left > 0:
            self.left -= 1
            if self.left == 0:
                self.state = self.UTF8
        if self.state == self.UTF8 and not self._utf8.getstate()[0]:  # a whole character: end here
            self.state = self.FORCING
        return tok


def _ends_with(seq: list[int], tail: tuple[int, ...]) -> bool:
    return bool(tail) and len(seq) >= len(tail) and tuple(seq[-len(tail) :]) == tail


def budget_spec(tokenizer: Any, budget: int, inside: bool, message: str = "") -> BudgetSpec:
    """The budget for `<think> ... </think>` in this tokenizer's ids: after `budget` tokens of reasoning,
    `message` then `</think>` (llama.cpp's --reasoning-budget-message before the end tag)."""

    def enc(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text, add_special=False, parse_special=True)) if text else ()

    end = enc(CLOSE)
    return BudgetSpec(enc(OPEN), (end,), enc(message) + end, budget, inside)
