"""The Python API: `LLM(model).generate / stream / chat / tokenize / logits`.

llm = edgellm.LLM("smollm2-135m")
print(llm.chat([{"role": "user", "content": "Why is the sky blue?"}], max_tokens=64).text)
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgellm import embed, memory, slots, speculative, store, structured
from edgellm.arch import load_model, matrices
from edgellm.backends import get_backend
from edgellm.chat import ChatTemplate
from edgellm.engine import ContextOverflow, Engine, GenRequest, Stream
from edgellm.generate import PREFILL_CHUNK, Chunk, Timings
from edgellm.gguf import ModelFile
from edgellm.sampler import SamplingParams
from edgellm.tokenizer import Tokenizer

DEFAULT_CTX = 4096


def _unthinking(text: str, template_kwargs: dict[str, Any]) -> str:
    """A generation prompt told not to think (enable_thinking false) that opens `<think>` all the same
    (DeepSeek-R1's and QwQ's templates, which have no such switch) gets it closed, so that the answer
    comes without reasoning, as llama.cpp's `--reasoning off` does; Qwen3's template closes it itself."""
    from edgellm import reasoning

    if template_kwargs.get("enable_thinking") is False and reasoning.opens_in_thought(text[-64:]):
        return text + reasoning.CLOSE
    return text


def _contents(messages: list[dict[str, Any]]) -> list[str]:
    """The text a caller put in the messages (contents, text parts, tool-call arguments), in order."""
    out: list[str] = []
    for m in messages:
        c = m.get("content")
        if isinstance(c, str):
            out.append(c)
        elif isinstance(c, list):
            out += [p["text"] for p in c if isinstance(p, dict) and isinstance(p.get("text"), str)]
        for call in m.get("tool_calls") or ():
            args = call.get("function", {}).get("arguments") if isinstance(call, dict) else None
            if isinstance(args, str):
                out.append(args)
    return [c for c in out if c]


def _constraint(response_format: Any, grammar: Any) -> structured.Grammar | None:
    """generate/stream/chat's `response_format` ("json", OpenAI's dict, or a structured.Grammar) and
    `grammar` (GBNF or Lark text, or a structured.Grammar) as one constraint."""
    if response_format is not None and grammar is not None:
        raise ValueError("give response_format or grammar, not both")
    if isinstance(response_format, structured.Grammar) or isinstance(grammar, structured.Grammar):
        return response_format or grammar
    if response_format == "json":
        return structured.Grammar("json_object")
    if response_format is not None:
        from edgellm.openai_api import APIError
        from edgellm.openai_api import response_format as parse

        try:
            return parse(response_format)
        except APIError as e:
            raise ValueError(e.message) from None
    if grammar is not None:
        if not isinstance(grammar, str):
            raise ValueError("grammar must be GBNF or Lark text, or a structured.Grammar")
        return structured.Grammar("gbnf", grammar)  # llguidance reads Lark as well as GBNF here
    return None


@dataclass
class Completion:
    """A finished generation: text, generated token ids, why it ended, and timings."""

    text: str
    tokens: list[int]
    finish_reason: str
    prompt_tokens: int
    timings: Timings = field(default_factory=Timings)
    tool_calls: list[dict] = field(default_factory=list)  # chat(tools=...): OpenAI's tool_calls
    reasoning: str | None = None  # chat: a thinking model's <think> reasoning, taken apart from text


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


# the engine an LLM makes for itself: a few sequences (a batch of prompts, or a chat and a side request)
# sharing a pool of two contexts' worth of KV blocks, with the prefix cache on, so that the next turn of a
# conversation, or a prompt sharing a system prompt with an earlier one, computes only what is new
ENGINE_SEQS = 4
ENGINE_CONTEXTS = 2


class LLM:
    """A loaded model with its tokenizer, chat template and one continuous-batching Engine: every call
    (generate, stream, chat, the CLI's run and chat, the server) submits requests to it."""

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        backend: str = "auto",
        threads: int | None = None,
        n_ctx: int | None = None,
        chat_template: str | None = None,
        use_mmap: bool = True,
        use_mlock: bool = False,
        log=None,
        spec: speculative.SpecConfig | str | None = None,
        cache_type_k: str = "f16",
        cache_type_v: str = "f16",
    ):
        t0 = time.perf_counter()
        self.path = store.resolve(str(model) if model is not None else None, log=log)
        # speculative decoding for every call ("ngram-simple", or a SpecConfig): speculative.py
        self.spec = speculative.SpecConfig(kind=spec) if isinstance(spec, str) else spec
        draft_path = None
        if self.spec is not None and self.spec.model is not None:  # -md: a second model, the same backend
            draft_path = store.resolve(self.spec.model, log=log)
        self._weights = {"weights": self.path.stat().st_size}
        if draft_path is not None:
            self._weights["draft weights"] = draft_path.stat().st_size
        memory.require(self.path.name, self._weights, "pick a smaller model or quantization")
        self.file = ModelFile(self.path, use_mmap=use_mmap)
        if log is not None and _will_use_numba(backend) and not _numba_kernels_cached():
            log("compiling the numba kernels (first run only; one to two minutes)...")
        self.backend = get_backend(backend, threads, {t.type for t in matrices(self.file)})
        self.model = load_model(self.file, self.backend)
        self.model.set_cache_types(cache_type_k, cache_type_v)  # -ctk / -ctv: ValueError naming a bad one
        self.tokenizer = Tokenizer.from_gguf(self.file)
        self.template = ChatTemplate.from_gguf(self.file, override=chat_template)
        n_train = self.model.config.n_ctx_train
        self.n_ctx = int(n_ctx) if n_ctx else min(DEFAULT_CTX, n_train)
        if self.n_ctx <= 0:
            raise ValueError(f"context size must be positive, got {self.n_ctx}")
        self.default_params = SamplingParams.from_gguf_metadata(self.file.metadata)
        self._engine: Engine | None = None
        self.draft_model = None
        self.draft_file: ModelFile | None = None
        if draft_path is not None:
            self.draft_file = draft_file = ModelFile(draft_path, use_mmap=use_mmap)
            if not speculative.same_vocabulary(Tokenizer.from_gguf(draft_file), self.tokenizer):
                raise ValueError(
                    f"the draft model {draft_file.path.name} has another vocabulary than {self.path.name}: "
                    "a draft must share the target's tokens"
                )
            self.draft_model = load_model(draft_file, self.backend)
        if use_mlock and (warning := memory.lock(self.model_buffers())):  # --mlock, as llama.cpp's
            logging.getLogger(__name__).warning("warning: %s; continuing unlocked", warning)
        self.last_timings = Timings()  # of the last generate / stream / chat call
        self.load_s = time.perf_counter() - t0

    def model_buffers(self) -> list[memoryview]:
        """The bytes of the model file (and the draft's): what --mlock locks."""
        return [f.buffer for f in (self.file, self.draft_file) if f is not None]

    # -- the engine ----------------------------------------------------------------------------------
    def open_engine(self, **options: Any) -> Engine:
        """Make this LLM's Engine with the given Engine options (max_seqs, kv_tokens, block_size,
        max_batch_tokens, max_queue, prefix_caching); the server calls this before its first request.
        Replaces an earlier engine (whose cached prefixes are dropped)."""
        if self._engine is not None:
            self._engine.shutdown(grace=0.0)
        opts: dict[str, Any] = dict(
            max_seqs=ENGINE_SEQS, kv_tokens=ENGINE_CONTEXTS * self.n_ctx, max_batch_tokens=PREFILL_CHUNK,
            spec=self.spec, draft_model=self.draft_model,
        )  # fmt: skip
        opts.update({k: v for k, v in options.items() if v is not None})
        kv_bytes = int(opts["kv_tokens"]) * self.model.kv_bytes_per_token()
        if self.draft_model is not None:  # the draft keeps a whole context per sequence (speculative.py)
            kv_bytes += self.n_ctx * int(opts["max_seqs"]) * self.draft_model.kv_bytes_per_token()
        # mapped weights still count (their pages are MemAvailable's until read); read-in ones are taken
        resident = {k: v if self.file.mapped else 0 for k, v in self._weights.items()}
        memory.require(
            f"{self.path.name} with a KV cache of {opts['kv_tokens']} positions",
            {**resident, "KV cache": kv_bytes},
            "use a smaller context (-c), KV budget (--kv-budget) or fewer parallel sequences (-np)",
        )
        self._engine = Engine(self.model, self.tokenizer, n_ctx=self.n_ctx, **opts)
        return self._engine

    @property
    def engine(self) -> Engine:
        """The Engine every generation goes through (made on first use with the defaults above)."""
        return self._engine if self._engine is not None else self.open_engine()

    # -- prompt cache files ---------------------------------------------------------------------------
    def save_prompt_cache(self, path: str | os.PathLike, prompt: str | Sequence[int] | list[dict]) -> int:
        """Write the K/V the prefix cache holds of `prompt` (text, token ids, or chat messages rendered as
        `chat_prompt` renders them) to a file (edgellm/slots.py's format; llama-cli's --prompt-cache,
        llama-server's slot save). Run the prompt first: any call with it, `max_tokens=0` too, leaves it
        in the cache. Returns the tokens written (0 if the cache holds none of them)."""
        ids = self._prompt_tokens(prompt)
        engine = self.engine
        n, k, v = self._on_engine(lambda: engine.kv.export(ids))
        slots.save(Path(path), self.fingerprint, engine.kv.cache, ids[:n], k, v)
        return n

    def load_prompt_cache(self, path: str | os.PathLike) -> int:
        """Read a file save_prompt_cache wrote (for this model file and KV cache type) into the prefix
        cache: a later prompt that begins with its tokens is served from it. Returns the tokens read;
        slots.SlotFileError says why a file does not fit, kvcache.OutOfBlocks that the cache is full."""
        engine = self.engine
        tokens, k, v, _ = slots.load(Path(path), self.fingerprint, engine.kv.cache, self.model.config.n_vocab)
        return self._on_engine(lambda: engine.kv.restore(tokens, k, v))

    @functools.cached_property
    def fingerprint(self) -> str:
        """slots.model_fingerprint of the model file (read once: prompt and slot files name their model)."""
        return slots.model_fingerprint(self.path)

    def _prompt_tokens(self, prompt: str | Sequence[int] | list[dict]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenize(prompt)
        if prompt and isinstance(prompt[0], dict):
            return self.chat_prompt(list(prompt))  # type: ignore[arg-type]
        return [int(t) for t in prompt]  # type: ignore[arg-type]

    def _on_engine(self, fn: Any) -> Any:
        """fn() on the thread that steps the engine (the model and backend are not thread-safe): its own
        thread once started, else this one."""
        engine = self._engine
        return engine.call(fn).result() if engine is not None and engine.running else fn()

    # -- embeddings ----------------------------------------------------------------------------------
    @property
    def pooling(self) -> str:
        """The pooling embed() uses by default: the file's pooling_type, else "last" (edgellm/embed.py)."""
        return embed.default_pooling(self.file.arch_key("pooling_type"))

    def embed_ids(self, ids: Sequence[int], pooling: str | None = None, normalize: int = 2) -> np.ndarray:
        """One input's embedding: (D,) pooled, or (N, D) with pooling "none"; `normalize` as llama.cpp's
        embd_normalize (2: unit length, -1: raw). Runs on the engine's thread when one steps it."""
        pooling = pooling or self.pooling
        if pooling not in embed.POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}: expected one of {', '.join(embed.POOLINGS)}")
        ids = list(ids)
        if not ids:
            raise ValueError("empty input: nothing to embed")
        if len(ids) > self.n_ctx:
            raise ContextOverflow(
                f"the input is {len(ids)} tokens but the context holds {self.n_ctx}", len(ids), self.n_ctx
            )
        n_vocab = self.model.config.n_vocab
        if not all(0 <= t < n_vocab for t in ids):
            raise ValueError(f"token ids must be in [0, {n_vocab})")
        tokens = np.asarray(ids, np.int64)
        hidden = self._on_engine(lambda: self.model.embeddings(tokens))
        return embed.normalize(embed.pool(hidden, pooling), normalize)

    def embed(
        self, inputs: str | Sequence[str], pooling: str | None = None, normalize: int = 2
    ) -> list[np.ndarray]:
        """Embeddings of texts (tokenized with BOS as the model adds it); see embed_ids."""
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        return [self.embed_ids(self.tokenize(t), pooling, normalize) for t in texts]

    # -- text <-> tokens ---------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int], special: bool = False) -> str:
        return self.tokenizer.decode(list(ids), special=special)

    def chat_prompt(
        self,
        messages: list[dict[str, Any]],
        special_in_content: bool = False,
        continue_final: bool = False,
        tools: list[dict] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Render messages with the chat template and tokenize (one BOS). Only the template's own text is
        parsed for special tokens: a message's content that spells one (`<|im_end|>`, `<|im_start|>system`)
        stays text, so it cannot close its turn and forge another (role injection). llama.cpp parses the
        whole rendered prompt; `special_in_content=True` does that, for callers who put control tokens
        in their messages on purpose. `continue_final`: the last message (the assistant's start of an
        answer) is continued rather than answered (assistant prefill). `tools` (OpenAI's function list)
        are passed to the template, which renders them if it knows how; `template_kwargs` are more of its
        variables (e.g. `enable_thinking`), as transformers' `apply_chat_template` takes them."""
        text = self.chat_text(messages, continue_final, tools, template_kwargs)
        tok = self.tokenizer
        risky = [] if special_in_content else [c for c in _contents(messages) if tok.has_special_text(c)]
        if not risky:  # the common case: the very ids llama.cpp makes
            return tok.encode(text, add_special=True, parse_special=True)
        # the template's text around each such content is parsed for special tokens; the content is not
        ids: list[int] = []
        cursor = 0
        for c in risky:
            at = text.find(c, cursor)
            if at < 0:
                raise ValueError(
                    "a message spells a special token and the chat template transforms the message, so it "
                    "cannot be kept as text; remove the special-token text from the message"
                )
            ids += tok.encode(text[cursor:at], add_special=cursor == 0, parse_special=True)
            ids += tok.encode(c, add_special=False, parse_special=False)
            cursor = at + len(c)
        return ids + tok.encode(text[cursor:], add_special=False, parse_special=True)

    def chat_text(
        self,
        messages: list[dict[str, Any]],
        continue_final: bool = False,
        tools: list[dict] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        generation_prompt: bool = True,
    ) -> str:
        """The rendered prompt text. With `continue_final` it ends right after the last message's content,
        its end-of-turn markers cut (as transformers' `continue_final_message` does). Without
        `generation_prompt`: the conversation alone, no assistant turn begun (llama-server's
        /apply-template with add_generation_prompt false)."""
        # like llama.cpp (common/chat.cpp): a template's own BOS is dropped when the tokenizer adds one
        strip, kw = self.tokenizer.add_bos, template_kwargs or {}
        if not continue_final:
            text = self.template.render(
                messages, tools=tools, add_generation_prompt=generation_prompt, strip_bos=strip, **kw
            )
            return _unthinking(text, kw) if generation_prompt else text
        last = messages[-1].get("content") if messages else None
        if not isinstance(last, str):
            raise ValueError("the message to continue must have text content")
        if not last.strip():  # nothing to continue: the answer's start is the generation prompt
            text = self.template.render(
                messages[:-1], tools=tools, add_generation_prompt=True, strip_bos=strip, **kw
            )
            return _unthinking(text, kw)
        text = self.template.render(messages, tools=tools, add_generation_prompt=False, strip_bos=strip, **kw)
        at = text.rfind(last.rstrip())
        if at < 0:
            raise ValueError("the chat template changes the last message, so it cannot be continued")
        return text[: at + len(last.rstrip())]

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
    def _requests(self, prompts, max_tokens, stop, raw_ids, sampling) -> list[GenRequest]:
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(
                f"max_tokens must be at least 1 (or None: until the context is full), got {max_tokens}"
            )
        sampling = dict(sampling)
        constraint = _constraint(sampling.pop("response_format", None), sampling.pop("grammar", None))
        compiled = self.engine.compile_grammar(constraint) if constraint is not None else None
        reqs = []
        for i, p in enumerate(prompts):
            ids = p if raw_ids else self.tokenize(p, add_special=True, parse_special=False)
            params = self.params(**sampling)
            if params.seed is not None and len(prompts) > 1:
                params = replace(params, seed=params.seed + i)  # distinct but reproducible streams
            reqs.append(GenRequest(list(ids), params, max_tokens, tuple(stop or ()), grammar=compiled))
        return reqs

    def _run(self, reqs: list[GenRequest]) -> Iterator[Chunk]:
        """Submit every request to the engine and yield their chunks as the engine produces them. The
        caller's thread steps the engine unless a server thread already runs it. Leaving early (break,
        Ctrl-C) cancels what is still running."""
        engine = self.engine
        for r in reqs:
            engine.check(r)  # all or nothing: a bad request fails before any runs
        t = self.last_timings = Timings()
        t0 = time.perf_counter()
        t_first: float | None = None
        streams: list[Stream] = [engine.submit(r) for r in reqs]
        threaded = engine.running
        try:
            while not all(st.done for st in streams):
                if not threaded:
                    engine.step()
                for i, st in enumerate(streams):
                    for ev in st.ready() if not threaded else _wait_one(st):
                        if ev.token is not None and t_first is None:
                            t_first = time.perf_counter()
                        if ev.usage is not None:
                            t.prompt_tokens += ev.usage.prompt_tokens - ev.usage.cached_tokens
                            t.cached_tokens += ev.usage.cached_tokens
                            t.generated_tokens += ev.usage.completion_tokens
                            t.draft_tokens += ev.usage.draft_tokens
                            t.draft_accepted += ev.usage.draft_accepted
                        if ev.finish_reason == "error":
                            raise RuntimeError(ev.error or "generation failed")
                        if ev.text or ev.token is not None or ev.finish_reason:
                            yield Chunk(i, ev.text, ev.token, ev.finish_reason)
        finally:
            live = [st for st in streams if not st.done]
            for st in live:
                st.cancel()
            if live and not threaded:
                engine.step()  # takes the cancellations in: their slots and blocks are free again
            end = time.perf_counter()
            t.prompt_s = (t_first or end) - t0
            t.generation_s = end - t_first if t_first is not None else 0.0

    def stream(
        self,
        prompt: str | list[int],
        *,
        max_tokens: int | None = 256,
        stop: Sequence[str] | None = None,
        **sampling: Any,
    ) -> Iterator[Chunk]:
        """Plain completion of one prompt (text or token ids), streamed as chunks. max_tokens=None:
        until end of generation or the context is full."""
        raw = not isinstance(prompt, str)
        yield from self._run(self._requests([prompt], max_tokens, stop, raw, sampling))

    def generate(
        self,
        prompt: str | list[str] | list[int],
        *,
        max_tokens: int | None = 256,
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
        max_tokens: int | None = 256,
        stop: Sequence[str] | None = None,
        tools: list[dict] | None = None,
        tool_choice: str | dict = "auto",
        parallel_tool_calls: bool = True,
        reasoning_format: str = "auto",
        enable_thinking: bool | None = None,
        reasoning_budget: int = -1,
        **sampling: Any,
    ) -> Completion:
        """One assistant turn for a conversation, through the model's chat template. The conversation's
        earlier turns are read from the engine's prefix cache: a turn costs its new tokens.

        `tools` (OpenAI's function list, with `tool_choice` and `parallel_tool_calls` as OpenAI's): the
        template shows them to the model, the calls it writes are held to their functions' schemas as
        `edgellm serve` holds them (tools.py; needs llguidance) and come back parsed in
        `Completion.tool_calls` (OpenAI's shape; finish_reason "tool_calls"), the text around them in
        `text`. A call's result goes back as a `tool` message after the assistant's `tool_calls`.
        A thinking model's `<think>` reasoning comes back apart in `Completion.reasoning` (reasoning.py;
        `reasoning_format="none"` leaves it in `text`), as the server's reasoning_content.
        `enable_thinking` (None: the template's default) tells a template that can think whether to (a
        `<think>` it opens regardless is closed when False, as llama.cpp's --reasoning off);
        `reasoning_budget` (-1: no limit) ends the reasoning after so many tokens, as llama.cpp's."""
        from edgellm import reasoning
        from edgellm import tools as tl

        apart = self._takes_reasoning(reasoning_format)
        reqs, req, _, inside = self._chat_turn(
            messages, tools, tool_choice, parallel_tool_calls, sampling, max_tokens, stop, enable_thinking,
            reasoning_budget,
        )  # fmt: skip
        out = self._collect(reqs)[0]
        if apart:
            thought, out.text = reasoning.split(out.text, inside)
            out.reasoning = thought or None
        if req is None or req.parsed is None:
            return out
        out.text, out.tool_calls = tl.split(out.text, req.parsed, single=not req.parallel)
        if out.tool_calls and out.finish_reason == "stop":
            out.finish_reason = "tool_calls"
        return out

    def chat_stream(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int | None = 256,
        stop: Sequence[str] | None = None,
        tools: list[dict] | None = None,
        tool_choice: str | dict = "auto",
        parallel_tool_calls: bool = True,
        reasoning_format: str = "auto",
        enable_thinking: bool | None = None,
        reasoning_budget: int = -1,
        **sampling: Any,
    ) -> Iterator[Chunk]:
        """chat's turn as it is generated. A thinking model's reasoning comes in chunks whose `reasoning`
        is set (their text empty); with `tools`, the text that may begin a call is held back and each call
        comes as a Chunk whose `tool_call` is set, once it is written (the last chunk's finish_reason
        "tool_calls"). `enable_thinking` and `reasoning_budget` as chat's."""
        from edgellm import reasoning
        from edgellm import tools as tl

        apart = self._takes_reasoning(reasoning_format)
        reqs, req, live, inside = self._chat_turn(
            messages, tools, tool_choice, parallel_tool_calls, sampling, max_tokens, stop, enable_thinking,
            reasoning_budget,
        )  # fmt: skip
        think = reasoning.ReasoningStream(inside) if apart else None
        calls = tl.CallStream(req.parsed, not req.parallel, live) if req is not None and req.parsed else None
        for c in self._run(reqs):
            parts = tl.stream_parts(think, calls, c.text) if c.text else []
            parts += tl.stream_parts(think, calls, None) if c.finish_reason else []
            out = [
                Chunk(0, p.text, None)
                if p.kind == "text"
                else Chunk(0, "", None, reasoning=p.text)
                if p.kind == "reasoning"
                else Chunk(0, "", None, tool_call=calls.calls[p.index])  # type: ignore[union-attr]
                for p in parts
                if p.kind in ("text", "reasoning", "ends")
            ] or [Chunk(0, "", None)]
            ended = calls is not None and calls.ended
            finish = "tool_calls" if c.finish_reason == "stop" and ended else c.finish_reason
            out[0] = replace(out[0], token=c.token)
            out[-1] = replace(out[-1], finish_reason=finish)
            yield from out

    @staticmethod
    def _takes_reasoning(fmt: str) -> bool:
        """reasoning_format checked: whether the reasoning is taken apart ("none": it stays in the text)."""
        from edgellm import reasoning

        if fmt not in reasoning.FORMATS:
            raise ValueError(f"reasoning_format must be auto, deepseek or none, not {fmt!r}")
        return fmt != "none"

    def _chat_turn(
        self,
        messages: list[dict],
        tools: list[dict] | None,
        choice: Any,
        parallel: bool,
        sampling: dict,
        max_tokens: int | None,
        stop: Sequence[str] | None,
        enable_thinking: bool | None,
        budget: int,
    ) -> tuple[list[GenRequest], Any, bool, bool]:
        """chat's and chat_stream's request: (its GenRequest, the tools.ToolRequest, whether the calls
        are held to their schemas, whether the answer starts inside a reasoning its prompt opened: not
        where a grammar shapes it from its first token)."""
        from edgellm import reasoning

        if not isinstance(budget, int) or budget < -1:
            raise ValueError(f"reasoning_budget must be -1 (no limit) or a number of tokens, not {budget!r}")
        shaped = _shaped(sampling, tools, choice)
        kw = {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}
        if tools:
            prompt, req, live = self._tools_prompt(messages, tools, choice, parallel, sampling, kw)
        else:
            prompt, req, live = self.chat_prompt(messages, template_kwargs=kw), None, False
        reqs = self._requests([prompt], max_tokens, stop, True, sampling)
        opened = self.opens_thought(prompt)
        if budget >= 0:
            reqs[0].reasoning_budget = reasoning.budget_spec(self.tokenizer, budget, opened)
        return reqs, req, live, opened and not shaped

    def opens_thought(self, prompt: list[int]) -> bool:
        """Whether a chat prompt's ids leave a `<think>` open (DeepSeek-R1's generation prompt): the answer
        then starts inside its reasoning (reasoning.py)."""
        from edgellm import reasoning

        return reasoning.opens_in_thought(self.detokenize(prompt[-8:], special=True))

    def _tools_prompt(
        self,
        messages: list[dict],
        tools: list[dict],
        choice: Any,
        parallel: bool,
        sampling: dict,
        template_kwargs: dict | None = None,
    ) -> tuple[list[int], Any, bool]:
        """A chat turn with tools: its prompt, the tools.ToolRequest (None: no tools after all) and whether
        the calls are held to their schemas (then they stream as written); sets sampling's grammar."""
        from edgellm import tools as tl
        from edgellm.openai_api import APIError

        try:
            req = tl.parse({"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel})
            shown = req is not None and req.active
            if shown:
                tl.require_shown(self.template.source)
            other = _constraint(sampling.pop("response_format", None), sampling.pop("grammar", None))
            if req is not None and req.forced and other is not None:
                raise ValueError("a forced tool call cannot be combined with response_format or grammar")
            sampling["grammar"] = tl.grammar(req, other) if req is not None else other
            prompt = self.chat_prompt(
                tl.template_messages(messages),
                tools=req.tools if shown else None,
                template_kwargs=template_kwargs,
            )
        except APIError as e:
            raise ValueError(f"{e.param}: {e.message}" if e.param else e.message) from None
        return prompt, req, sampling["grammar"] is not other

    def _collect(self, reqs: list[GenRequest]) -> list[Completion]:
        texts: list[list[str]] = [[] for _ in reqs]
        toks: list[list[int]] = [[] for _ in reqs]
        reasons = ["length"] * len(reqs)
        for c in self._run(reqs):
            texts[c.index].append(c.text)
            if c.token is not None:
                toks[c.index].append(c.token)
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
        t = self.last_timings
        return [
            Completion("".join(x), k, r, len(q.prompt_ids), t)
            for x, k, r, q in zip(texts, toks, reasons, reqs)
        ]

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits (N, V) for a token sequence, e.g. for perplexity or KL evaluation: the
        model's forward in chunks of PREFILL_CHUNK over a cache of its own (the engine's is untouched)."""
        ids = np.asarray(list(tokens), np.int64)
        if len(ids) == 0:
            raise ValueError("empty token sequence: nothing to score")
        if len(ids) > self.n_ctx:
            raise ContextOverflow(
                f"{len(ids)} tokens but the context holds {self.n_ctx} (raise -c/--ctx-size)"
            )
        kv = self.model.new_kv_cache(len(ids), 1)
        out = []
        for s in range(0, len(ids), PREFILL_CHUNK):
            part = ids[s : s + PREFILL_CHUNK]
            pos = np.arange(s, s + len(part), dtype=np.int64)
            out.append(self.model.forward(part, pos, np.zeros(len(part), np.int64), kv))
        return np.concatenate(out, axis=0)


def _shaped(sampling: dict, tools: list[dict] | None, choice: Any) -> bool:
    """Whether a grammar shapes a chat answer from its first token (a response_format or grammar, a
    forced tool call): then it does not start inside a reasoning the prompt opened."""
    forced = bool(tools) and choice not in ("auto", "none")
    return forced or sampling.get("grammar") is not None or sampling.get("response_format") is not None


def _wait_one(st: Stream) -> list:
    """The next event of a stream a server thread is feeding (blocking), as a list."""
    ev = next(iter(st), None)
    return [ev] if ev is not None else []
