"""Generation: prefill each prompt as one matrix pass, then decode all live sequences together, one token
each per step, sampling rows with their own parameters; stop strings, end-of-generation tokens and
max_tokens end a sequence. Yields small `Chunk`s as text becomes complete UTF-8.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgellm.sampler import SamplingParams, make_sampler

PREFILL_CHUNK = 512  # prompt tokens per forward: bounds attention scratch memory on long prompts


class ContextOverflow(ValueError):
    """A prompt does not fit in the context window."""


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 256
    stop: Sequence[str] = ()


@dataclass(frozen=True)
class Chunk:
    """A piece of one sequence's output: new text, the token that completed it, and why it ended."""

    index: int  # which request of the batch
    text: str
    token: int | None
    finish_reason: str | None = None  # "stop" | "length" once the sequence has ended


@dataclass
class Timings:
    prompt_tokens: int = 0
    prompt_s: float = 0.0
    generated_tokens: int = 0
    generation_s: float = 0.0

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

    def push(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit, whether a stop string was hit)."""
        self.buf += text
        if not self.stops:
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


class _Seq:
    def __init__(self, index: int, req: Request, tokenizer: Any):
        self.index = index
        self.req = req
        self.history = list(req.prompt_ids)
        self.sample = make_sampler(req.params)
        self.detok = tokenizer.stream()
        self.stop = StopMatcher(req.stop)
        self.n_generated = 0
        self.done = False


class Generator:
    """Runs a model + tokenizer for a batch of requests. One KV cache, reused across calls."""

    def __init__(self, model: Any, tokenizer: Any, n_ctx: int):
        self.model = model
        self.tokenizer = tokenizer
        self.n_ctx = n_ctx
        self._kv = None
        self._kv_seqs = 0
        self.timings = Timings()

    def _cache(self, n_seqs: int) -> Any:
        if self._kv is None or self._kv_seqs < n_seqs:
            self._kv = self.model.new_kv_cache(self.n_ctx, n_seqs)
            self._kv_seqs = n_seqs
        return self._kv

    def check_fits(self, prompt_ids: Sequence[int], need_room: bool = True) -> None:
        if len(prompt_ids) == 0:
            raise ValueError("empty prompt: nothing to condition on (add BOS or some text)")
        if len(prompt_ids) + int(need_room) > self.n_ctx:
            raise ContextOverflow(
                f"prompt is {len(prompt_ids)} tokens but the context holds {self.n_ctx} "
                f"(raise -c/--ctx-size, or shorten the prompt)"
            )

    def prefill(self, tokens: Sequence[int], seq: int, kv: Any, start: int = 0, all_logits: bool = False):
        """Run a prompt through the model in chunks; logits of the last token (or of all, if asked)."""
        out = []
        ids = np.asarray(tokens, np.int64)
        for s in range(0, len(ids), PREFILL_CHUNK):
            part = ids[s : s + PREFILL_CHUNK]
            n = len(part)
            pos = np.arange(start + s, start + s + n, dtype=np.int64)
            rows = (
                None if all_logits else (np.array([n - 1]) if s + n == len(ids) else np.array([], np.int64))
            )
            logits = self.model.forward(part, pos, np.full(n, seq, np.int64), kv, logits_rows=rows)
            out.append(logits)
        return np.concatenate(out, axis=0)

    def run(self, requests: Sequence[Request]) -> Iterator[Chunk]:
        """Generate for every request together; yields chunks in step order."""
        for r in requests:
            self.check_fits(r.prompt_ids)
            r.params.validate()
        seqs = [_Seq(i, r, self.tokenizer) for i, r in enumerate(requests)]
        kv = self._cache(len(seqs))
        t = self.timings = Timings()
        eog = self.tokenizer.eog_ids

        t0 = time.perf_counter()
        first_logits = [self.prefill(s.req.prompt_ids, s.index, kv)[-1] for s in seqs]
        t.prompt_tokens = sum(len(s.req.prompt_ids) for s in seqs)
        t.prompt_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        live = [s for s in seqs if not self._finish_if_no_budget(s)]
        for s in seqs:
            if s.done:
                yield Chunk(s.index, "", None, "length")
        logits_of = {s.index: first_logits[s.index] for s in live}
        while live:
            step_tokens = []
            for s in live:
                tok = s.sample(logits_of[s.index], s.history)
                s.n_generated += 1
                t.generated_tokens += 1
                if tok in eog:
                    s.done = True
                    yield Chunk(s.index, s.stop.flush() + s.detok.flush(), tok, "stop")
                    continue
                s.history.append(tok)
                text, hit = s.stop.push(s.detok.push(tok))
                if hit:
                    s.done = True
                    yield Chunk(s.index, text, tok, "stop")
                    continue
                if s.n_generated >= s.req.max_tokens or len(s.history) >= self.n_ctx:
                    s.done = True
                    yield Chunk(s.index, text + s.stop.flush() + s.detok.flush(), tok, "length")
                    continue
                if text:
                    yield Chunk(s.index, text, tok)
                step_tokens.append(s)
            live = step_tokens
            if not live:
                break
            toks = np.array([s.history[-1] for s in live], np.int64)
            pos = np.array([len(s.history) - 1 for s in live], np.int64)
            ids = np.array([s.index for s in live], np.int64)
            logits = self.model.decode_step(toks, pos, ids, kv)  # a captured plan on the native backend
            logits_of = {s.index: logits[i] for i, s in enumerate(live)}
        t.generation_s = time.perf_counter() - t0

    @staticmethod
    def _finish_if_no_budget(s: _Seq) -> bool:
        if s.req.max_tokens <= 0:
            s.done = True
        return s.done

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits (N, V) for every position of one token sequence."""
        self.check_fits(tokens, need_room=False)
        return self.prefill(tokens, 0, self._cache(1), all_logits=True)
