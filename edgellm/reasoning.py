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
"""

from __future__ import annotations

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
