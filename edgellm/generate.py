"""What generation hands out, whichever way it is driven (edgellm.LLM, the CLI, the server: all through
edgellm.engine): the `Chunk`s of a stream, the `Timings` of a call, the `StopMatcher` that finds stop
strings across token boundaries, and the prefill chunk size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PREFILL_CHUNK = 512  # prompt tokens per forward: bounds attention scratch memory on long prompts


@dataclass(frozen=True)
class Chunk:
    """A piece of one sequence's output: new text, the token that completed it, and why it ended."""

    index: int  # which request of the batch
    text: str
    token: int | None
    finish_reason: str | None = None  # "stop" | "length" (or "tool_calls") once the sequence has ended
    tool_call: dict | None = None  # chat_stream(tools=...): a call, once written (OpenAI's shape)
    reasoning: str = ""  # chat_stream: a piece of a thinking model's reasoning (text is then empty)


@dataclass
class Timings:
    """One call's figures: prompt tokens computed (cache misses) and their time to the first token,
    prompt tokens read from the prefix cache, generated tokens and the time after the first."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    prompt_s: float = 0.0
    generated_tokens: int = 0
    generation_s: float = 0.0
    draft_tokens: int = 0  # speculative guesses checked
    draft_accepted: int = 0  # of those, kept

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_s if self.prompt_s else 0.0

    @property
    def generation_tps(self) -> float:
        return self.generated_tokens / self.generation_s if self.generation_s else 0.0


class StopMatcher:
    """Finds stop strings across token boundaries; holds back text that could still become one."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.buf = ""

    def push(self, text: str, check: bool = True) -> tuple[str, bool]:
        """Add text; return (text safe to emit, whether a stop string was hit). check=False: the text is
        not searched (vLLM's min_tokens), only emitted with what was held back."""
        self.buf += text
        if not self.stops or not check:
            out, self.buf = self.buf, ""
            return out, False
        hits = [i for i in (self.buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.buf = self.buf[: min(hits)], ""
            return out, True
        hold = 0
        for s in self.stops:  # longest suffix of buf that is a proper prefix of a stop string
            for n in range(min(len(s) - 1, len(self.buf)), hold, -1):
                if self.buf.endswith(s[:n]):
                    hold = n
                    break
        out, self.buf = self.buf[: len(self.buf) - hold], self.buf[len(self.buf) - hold :]
        return out, False

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out


class IndentLimit:
    """llama-server's n_indent (server-context.cpp, process_token): after a new line, a line that starts
    (its first character other than a space or a tab, a new line included) less indented than `n` ends
    the answer there, keeping that line's indentation as llama-server's cut does. The first line, which
    goes on from the prompt, is not checked. Indentation is held back until it is known to pass."""

    def __init__(self, n: int):
        self.n = n
        self.col: int | None = None  # spaces and tabs so far at the start of a line; None: inside a line
        self.held = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit, whether a line fell short and the answer ends)."""
        out = []
        for ch in text:
            if self.col is not None:
                if ch in " \t":
                    self.col += 1
                    self.held += ch
                    continue
                out.append(self.held)
                self.held = ""
                if self.col < self.n:
                    return "".join(out), True
                self.col = None
            out.append(ch)
            if ch == "\n":
                self.col = 0
        return "".join(out), False

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out
