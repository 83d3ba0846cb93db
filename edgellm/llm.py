"""The Python API: `LLM(model).generate / stream / chat / tokenize / logits`.

llm = edgellm.LLM("smollm2-135m")
print(llm.chat([{"role": "user", "content": "Why is the sky blue?"}], max_tokens=64).text)
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgellm import store
from edgellm.arch import load_model, matrices
from edgellm.backends import get_backend
from edgellm.chat import ChatTemplate
from edgellm.generate import Chunk, Generator, Request, Timings
from edgellm.gguf import ModelFile
from edgellm.sampler import SamplingParams
from edgellm.tokenizer import Tokenizer

DEFAULT_CTX = 4096


@dataclass
class Completion:
    """A finished generation: text, generated token ids, why it ended, and timings."""

    text: str
    tokens: list[int]
    finish_reason: str
    prompt_tokens: int
    timings: Timings = field(default_factory=Timings)


def _will_use_numba(backend: str) -> bool:
    """Whether `backend` resolves to numba here (auto does when the native backend cannot run)."""
    if backend == "numba":
        return True
    if backend != "auto":
        return False
    try:
        from edgellm.backends.native import available
    except ImportError:
        return True
    return available() is not None


def _numba_kernels_cached() -> bool:
    try:
        from edgellm.backends.numba_cpu import NumbaBackend
    except ImportError:
        return True  # no numba: nothing will compile
    return NumbaBackend.kernels_cached()


class LLM:
    """A loaded model with its tokenizer, chat template and a generator."""

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        backend: str = "auto",
        threads: int | None = None,
        n_ctx: int | None = None,
        chat_template: str | None = None,
        use_mmap: bool = True,
        log=None,
    ):
        t0 = time.perf_counter()
        self.path = store.resolve(str(model) if model is not None else None, log=log)
        self.file = ModelFile(self.path, use_mmap=use_mmap)
        if log is not None and _will_use_numba(backend) and not _numba_kernels_cached():
            log("compiling the numba kernels (first run only; about a minute)...")
        self.backend = get_backend(backend, threads, {t.type for t in matrices(self.file)})
        self.model = load_model(self.file, self.backend)
        self.tokenizer = Tokenizer.from_gguf(self.file)
        self.template = ChatTemplate.from_gguf(self.file, override=chat_template)
        n_train = self.model.config.n_ctx_train
        self.n_ctx = int(n_ctx) if n_ctx else min(DEFAULT_CTX, n_train)
        if self.n_ctx <= 0:
            raise ValueError(f"context size must be positive, got {self.n_ctx}")
        self.generator = Generator(self.model, self.tokenizer, self.n_ctx)
        self.default_params = SamplingParams.from_gguf_metadata(self.file.metadata)
        self.load_s = time.perf_counter() - t0

    # -- text <-> tokens ---------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int], special: bool = False) -> str:
        return self.tokenizer.decode(list(ids), special=special)

    def chat_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        """Render messages with the chat template and tokenize (special tokens parsed, one BOS)."""
        # like llama.cpp (common/chat.cpp): a template's own BOS is dropped when the tokenizer adds one
        text = self.template.render(messages, add_generation_prompt=True, strip_bos=self.tokenizer.add_bos)
        return self.tokenizer.encode(text, add_special=True, parse_special=True)

    # -- sampling params -----------------------------------------------------------------------------
    def params(self, **overrides: Any) -> SamplingParams:
        """Defaults (llama.cpp's, then the file's general.sampling.*) with explicit overrides."""
        given = {k: v for k, v in overrides.items() if v is not None}
        if "temp" in given:
            given["temperature"] = given.pop("temp")
        p = replace(self.default_params, **given)
        p.validate()
        return p

    # -- generation ----------------------------------------------------------------------------------
    def _requests(self, prompts, max_tokens, stop, raw_ids, sampling) -> list[Request]:
        reqs = []
        for i, p in enumerate(prompts):
            ids = p if raw_ids else self.tokenize(p, add_special=True, parse_special=False)
            params = self.params(**sampling)
            if params.seed is not None and len(prompts) > 1:
                params = replace(params, seed=params.seed + i)  # distinct but reproducible streams
            reqs.append(Request(list(ids), params, max_tokens, tuple(stop or ())))
        return reqs

    def stream(
        self,
        prompt: str | list[int],
        *,
        max_tokens: int = 256,
        stop: Sequence[str] | None = None,
        **sampling: Any,
    ) -> Iterator[Chunk]:
        """Plain completion of one prompt (text or token ids), streamed as chunks."""
        raw = not isinstance(prompt, str)
        yield from self.generator.run(self._requests([prompt], max_tokens, stop, raw, sampling))

    def generate(
        self,
        prompt: str | list[str] | list[int],
        *,
        max_tokens: int = 256,
        stop: Sequence[str] | None = None,
        **sampling: Any,
    ) -> Completion | list[Completion]:
        """Plain completion. A list of strings is decoded together as one batch; returns one per prompt."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            return self._collect(self._requests(prompt, max_tokens, stop, False, sampling))
        raw = not isinstance(prompt, str)
        return self._collect(self._requests([prompt], max_tokens, stop, raw, sampling))[0]

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int = 256,
        stop: Sequence[str] | None = None,
        **sampling: Any,
    ) -> Completion:
        """One assistant turn for a conversation, through the model's chat template."""
        return self._collect(self._requests([self.chat_prompt(messages)], max_tokens, stop, True, sampling))[
            0
        ]

    def chat_stream(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int = 256,
        stop: Sequence[str] | None = None,
        **sampling: Any,
    ) -> Iterator[Chunk]:
        yield from self.generator.run(
            self._requests([self.chat_prompt(messages)], max_tokens, stop, True, sampling)
        )

    def _collect(self, reqs: list[Request]) -> list[Completion]:
        texts = [[] for _ in reqs]
        toks: list[list[int]] = [[] for _ in reqs]
        reasons = ["length"] * len(reqs)
        for c in self.generator.run(reqs):
            texts[c.index].append(c.text)
            if c.token is not None and not (c.finish_reason == "stop" and c.token in self.tokenizer.eog_ids):
                toks[c.index].append(c.token)
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
        t = self.generator.timings
        return [
            Completion("".join(x), k, r, len(q.prompt_ids), t)
            for x, k, r, q in zip(texts, toks, reasons, reqs)
        ]

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits (N, V) for a token sequence, e.g. for perplexity or KL evaluation."""
        return self.generator.logits(list(tokens))
