"""`edgellm serve`: an HTTP server (FastAPI + uvicorn) over the continuous-batching Engine that speaks
OpenAI's API (/v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings, /v1/models),
llama-server's (/completion, /infill, /embedding, /tokenize, /detokenize, /apply-template, /props, /slots,
/health, /metrics) and Ollama's (/api/*), and serves a chat page at /. docs/serving.md lists every route
and field. Whole answers or streams (server-sent events; Ollama: NDJSON). Every error is OpenAI's error
JSON with its status: 400 bad parameters (naming the field), 401 bad key, 404, 405, 413 body too large,
429 queue full, 501 a route this server or model cannot serve, 503 loading or shutting down; bad input
never gets a 500. With an API key set, every route but /health and / needs it. SIGTERM stops new
requests, lets running streams finish for a grace period, then ends them with an error event.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from edgellm import anthropic_api as an
from edgellm import llama_api as la
from edgellm import modelinfo, reasoning, structured, tools
from edgellm import ollama_api as ol
from edgellm import openai_api as oa
from edgellm import responses_api as ra
from edgellm import slots as slot_files
from edgellm.engine import (
    ContextOverflow,
    Engine,
    EngineStats,
    Event,
    GenRequest,
    QueueFull,
    RequestRejected,
    ShuttingDown,
)
from edgellm.kvcache import OutOfBlocks
from edgellm.openai_api import APIError

log = logging.getLogger("edgellm.server")
access_log = logging.getLogger("edgellm.server.access")

MAX_BODY = 4 << 20  # bytes of one request body


@dataclass
class ServerConfig:
    model: str | None = None  # alias or path
    backend: str = "auto"
    threads: int | None = None
    n_ctx: int | None = None
    parallel: int = 4
    kv_budget: str | None = None  # "512MiB", "2GB" or a token count
    cache_type_k: str = "f16"  # -ctk / -ctv: how the KV cache stores K and V ("f16" or "q8_0")
    cache_type_v: str = "f16"
    batch_tokens: int = 256
    queue_size: int = 64
    block_size: int = 16
    prefix_cache: bool = True
    chat_template: str | None = None
    api_key: str | None = None
    shutdown_grace: float = 10.0
    max_body: int = MAX_BODY
    model_name: str | None = None  # the id /v1/models reports (default: the file's stem)
    aliases: tuple[str, ...] = ()  # --alias a,b,c: names the model also answers to (model_name: the first)
    tags: tuple[str, ...] = ()  # --tags: labels /v1/models lists
    log_format: str = "text"  # the access log: "text" or "json" (one object per line)
    header_timeout: float = 10.0  # seconds a connection has to send a request's headers
    special_in_messages: bool = False  # parse control tokens in message contents (llama-server does)
    cors_origins: tuple[str, ...] = ()  # origins a browser page may call from ("*": any)
    embeddings: bool = False  # serve /v1/embeddings, /embedding and /api/embed (llama-server's --embeddings)
    pooling: str | None = None  # embeddings' pooling (default: the file's, else "last")
    webui: bool = True  # the chat page at /
    slots: bool = True  # the read-only GET /slots (llama-server's --slots / --no-slots)
    spec: Any = None  # speculative.SpecConfig: prompt-lookup speculative decoding (--spec-type)
    use_mmap: bool = True  # --no-mmap: read the file into memory
    mlock: bool = False  # --mlock: lock the model's pages in RAM
    reasoning_format: str = "auto"  # chat: <think> reasoning apart (auto, deepseek) or in the text (none)
    sse_ping_interval: int = 30  # seconds a stream may stay silent before a ping (<= 0: never)
    enable_thinking: bool | None = None  # --reasoning on/off: chats' enable_thinking (None: the template's)
    reasoning_budget: int = -1  # --reasoning-budget: tokens of reasoning before its end is written (-1: none)
    reasoning_budget_message: str = ""  # --reasoning-budget-message: written before that end
    sampling: dict[str, Any] = field(default_factory=dict)  # --temp, --top-k, ...: requests' defaults
    n_predict: int = -1  # -n: tokens a request generates at most, and its default (-1: no limit)
    warmup: bool = True  # --warmup/--no-warmup: a short generation before the server says ready
    slot_save_path: str | None = None  # --slot-save-path: the directory slot save / restore use


@dataclass
class State:
    """What the routes share: the config, and once loaded, the LLM and its Engine."""

    config: ServerConfig
    llm: Any = None
    engine: Engine | None = None
    model_id: str = "edgellm"
    info: dict | None = None  # modelinfo.summarize of the served file, once Ollama's routes asked
    ollama_entry: dict | None = None
    load_error: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    responses: ra.Store = field(default_factory=ra.Store)  # /v1/responses kept for previous_response_id
    controls: dict[str, list] = field(default_factory=dict)  # running chats' streams by id: reasoning_control

    def ready(self) -> Engine:
        if self.engine is None:
            if self.load_error:
                raise APIError(503, f"the model failed to load: {self.load_error}", "unavailable_error")
            raise APIError(503, "Loading model", "unavailable_error", code="model_loading")
        if not self.engine.accepting:
            raise APIError(503, "the server is shutting down", "unavailable_error", code="shutting_down")
        return self.engine


_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1024, "m": 1e6, "mb": 1e6, "mib": 1 << 20}
_UNITS.update({"g": 1e9, "gb": 1e9, "gib": 1 << 30, "t": 1e12, "tb": 1e12, "tib": 1 << 40})


def parse_kv_budget(text: str, bytes_per_token: int) -> int:
    """`--kv-budget`: a size with a unit ("512MiB", "1.5GB") or a plain token count ("8192"), as tokens."""
    import re

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text or "")
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"--kv-budget {text!r}: expected a token count (8192) or a size (512MiB, 2GB)")
    value, unit = float(m.group(1)), m.group(2).lower()
    tokens = int(value) if unit == "" else int(value * _UNITS[unit]) // bytes_per_token
    if tokens <= 0:
        raise ValueError(f"--kv-budget {text!r} holds no tokens ({bytes_per_token} bytes per token)")
    return tokens


def load(state: State) -> None:
    """Load the model and start the engine (runs in a background thread while /health says 503)."""
    from edgellm.llm import LLM

    c = state.config
    try:
        llm = LLM(
            c.model, backend=c.backend, threads=c.threads, n_ctx=c.n_ctx, chat_template=c.chat_template,
            spec=c.spec, use_mmap=c.use_mmap, use_mlock=c.mlock, cache_type_k=c.cache_type_k,
            cache_type_v=c.cache_type_v,
        )  # fmt: skip
        kv_tokens = None
        if c.kv_budget:
            kv_tokens = parse_kv_budget(c.kv_budget, llm.model.kv_bytes_per_token())
        else:  # every slot can fill its context, within 256 MiB unless one context alone needs more
            cap = max(llm.n_ctx, (256 << 20) // llm.model.kv_bytes_per_token())
            kv_tokens = min(c.parallel * llm.n_ctx, cap)
        engine = llm.open_engine(  # the one engine of this LLM, run by its own thread here
            max_seqs=c.parallel,
            kv_tokens=kv_tokens,
            block_size=c.block_size,
            max_batch_tokens=c.batch_tokens,
            max_queue=c.queue_size,
            prefix_caching=c.prefix_cache,
        )
        if c.warmup:
            _warm_up(llm, engine)
        engine.start()
    except Exception as e:  # noqa: BLE001 - reported on /health and the log
        state.load_error = f"{type(e).__name__}: {e}"
        log.error("failed to load the model: %s", state.load_error)
        raise
    if c.sampling:  # the server's sampling flags over the file's defaults: what a request leaves out
        llm.default_params = llm.params(**c.sampling)
    state.llm = llm
    state.model_id = c.model_name or llm.path.stem
    state.engine = engine
    if c.chat_template:  # which template an override resolved to (a built-in, a file, inline Jinja): one line
        log.info("chat template: %s", llm.template.reason)
    log.info(
        "ready: %s on %s, ctx %d, %d slots, %d KV blocks of %d (K %s, V %s: %.1f MiB)",
        llm.path.name,
        llm.backend.name,
        llm.n_ctx,
        c.parallel,
        engine.kv.n_blocks,
        engine.kv.block_size,
        llm.model.cache_type_k,
        llm.model.cache_type_v,
        engine.kv.cache.nbytes / 2**20,
    )


WARMUP_TEXT = "Hello, how are you today?"


def _warm_up(llm: Any, engine: Engine) -> None:
    """llama-server's --warmup: a short prompt and two tokens through the engine (stepped by this thread,
    before its own starts) ahead of the first request, which would otherwise pay for the first touch of
    the kernels' scratch, the KV cache's first pages and the tokenizer's tables (SmolLM2 on a 2-vCPU
    Xeon: a first request through the engine 0.23-0.37 s, 0.03 s after a warm-up; through this server,
    `-t 2 -c 2048`, 0.098 s median, 0.065 s after). /metrics leaves it out; a model that cannot generate
    is only noted."""
    t0 = time.perf_counter()
    try:
        llm.generate(WARMUP_TEXT, max_tokens=2, temperature=0.0)
    except Exception as e:  # noqa: BLE001 - the server serves what it can
        log.warning("warm-up skipped: %s", e)
        return
    engine.stats = EngineStats()
    log.info("warmed up in %.2f s", time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------------- app


def _model_card(state: State) -> dict:
    """The served model as OpenAI's model object, with llama-server's `meta`."""
    state.ready()
    llm = state.llm
    meta = {"n_ctx": llm.n_ctx, "n_vocab": llm.model.config.n_vocab, "backend": llm.backend.name}
    return {
        "id": state.model_id,
        "aliases": list(state.config.aliases),  # llama-server's
        "tags": list(state.config.tags),
        "object": "model",
        "created": state.created,
        "owned_by": "edgellm",
        "meta": meta,
    }


LOCAL_ORIGIN = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?"


def create_app(state: State) -> FastAPI:
    app = FastAPI(title="edgellm", docs_url="/docs", redoc_url=None, openapi_url="/openapi.json")
    app.state.edgellm = state
    key = state.config.api_key

    app.add_middleware(_HeadAsGet)
    if key:
        app.add_middleware(_RequireKey, key=key)
    if state.config.cors_origins:  # outside the key check: a browser's preflight carries no key
        from starlette.middleware.cors import CORSMiddleware

        origins = [o for o in state.config.cors_origins if o != "localhost"]
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            # llama-server's "localhost": a page served from this machine, any scheme and port
            allow_origin_regex=LOCAL_ORIGIN if "localhost" in state.config.cors_origins else None,
            allow_methods=["GET", "HEAD", "POST", "DELETE", "OPTIONS"],
            allow_headers=["authorization", "x-api-key", "content-type"],
        )
    app.add_middleware(_AccessLog, fmt=state.config.log_format)  # added last: outermost, sees 401s too

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return _error(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        if e.status_code == 404:
            return _error(APIError(404, f"Not found: {request.method} {request.url.path}", code="not_found"))
        if e.status_code == 405:
            return _error(APIError(405, f"Method {request.method} not allowed on {request.url.path}"))
        return _error(APIError(e.status_code, str(e.detail)))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        log.exception("internal error on %s", request.url.path)
        return _error(APIError(500, f"internal error: {type(e).__name__}", "server_error"))

    if state.config.webui:

        @app.get("/", include_in_schema=False)
        async def webui():  # the chat page (edgellm/web/index.html): no key needed, it holds no data
            return Response(_webui_html(), media_type="text/html; charset=utf-8", headers=_WEBUI_HEADERS)

    else:

        @app.get("/", include_in_schema=False)
        async def running():  # as Ollama's root answers (its client checks a server with HEAD /)
            return PlainTextResponse("edgellm is running")

    @app.get("/health")
    @app.get("/v1/health")  # llama-server's alias
    async def health():
        if state.engine is None:
            e = APIError(
                503, "Loading model" if not state.load_error else state.load_error, "unavailable_error"
            )
            return JSONResponse({"status": "loading", **e.body()}, status_code=503)
        if not state.engine.accepting:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return {"status": "ok"}

    @app.get("/v1/models")
    @app.get("/models")  # llama-server's alias (an OpenAI client whose base_url has no /v1 asks here)
    async def models():
        return {"object": "list", "data": [_model_card(state)]}

    @app.get("/v1/models/{model_id:path}")  # OpenAI's retrieve (client.models.retrieve)
    @app.get("/models/{model_id:path}")
    async def model(model_id: str):
        card = _model_card(state)
        if not _names_model(state, model_id, case=True):
            msg = f"The model '{model_id}' does not exist (this server has '{state.model_id}')"
            raise APIError(404, msg, param="model", code="model_not_found")
        return card

    @app.post("/rerank")
    @app.post("/reranking")
    @app.post("/v1/rerank")
    @app.post("/v1/reranking")
    async def rerank():  # llama-server's, for reranker models (pooling "rank"): not a chat model's job
        msg = "reranking is not supported: edgellm serves chat and embedding models, not rerankers"
        raise APIError(501, msg, "not_supported_error")

    @app.get("/lora-adapters")
    async def lora_adapters():  # llama-server's: none are loaded (a request's `lora` is refused)
        state.ready()
        return []

    @app.post("/lora-adapters")
    async def set_lora_adapters(request: Request):
        state.ready()
        if await _json(request, state.config.max_body) != []:
            raise APIError(400, "LoRA adapters are not supported: none are loaded", param="lora")
        return {"success": True}

    @app.get("/metrics")
    async def metrics():  # (llama-server's header: when this process started, for counters' resets)
        headers = {"Process-Start-Time-Unix": str(state.created)}
        return PlainTextResponse(_prometheus(state), media_type="text/plain; version=0.0.4", headers=headers)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        state.ready()
        content, add, parse, pieces = oa.parse_tokenize(await _json(request, state.config.max_body))
        tok = state.llm.tokenizer
        ids = await run_in_threadpool(tok.encode, content, add, parse)
        if pieces:
            out = [
                {"id": i, "piece": tok.token_to_piece(i, special=True).decode("utf-8", "replace")}
                for i in ids
            ]
            return {"tokens": out}
        return {"tokens": ids}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        state.ready()
        toks = oa.parse_detokenize(
            await _json(request, state.config.max_body), state.llm.model.config.n_vocab
        )
        return {"content": state.llm.tokenizer.decode(toks)}

    # -- llama-server's native API (llama_api.py) ---------------------------------------------------
    @app.post("/completion")
    @app.post("/completions")  # llama-server maps both to its native completion (OpenAI's is /v1/...)
    async def native_completion(request: Request):
        return await _native(state, request)

    @app.post("/infill")  # fill-in-the-middle for editor plug-ins (llama.vim, llama.vscode)
    async def infill(request: Request):
        engine = state.ready()
        llm = state.llm
        body = await _json(request, state.config.max_body)
        p, q = la.parse_infill(body, _limits(state))
        try:
            prompt = la.infill_ids(
                llm.tokenizer, q["prefix"], q["suffix"], q["extra"], q["prompt"],
                n_batch=state.config.batch_tokens, n_predict=p.max_tokens or -1, n_ctx=llm.n_ctx,
            )  # fmt: skip
        except la.NoInfill as e:
            raise APIError(501, f"infill is not supported: {e}", "not_supported_error") from None
        return await _native_answer(state, request, engine, p, [prompt], _params(llm, p))

    @app.post("/apply-template")
    async def apply_template(request: Request):
        state.ready()
        body = await _json(request, state.config.max_body)
        # add_generation_prompt false alone: the conversation without an assistant turn begun (a chat
        # refuses it: it would answer as the last speaker)
        bare = isinstance(body, dict) and body.get("add_generation_prompt") is False
        bare = bare and not body.get("continue_final_message")
        if bare:
            body = {k: v for k, v in body.items() if k != "add_generation_prompt"}
        p = oa.parse_chat(body, _limits(state))
        llm = state.llm
        try:  # the prompt a chat with this body would read (its tools, its continued message...)
            msgs, fns = _chat_inputs(llm, p)
            kw = _template_kwargs(state.config, p.template_kwargs)
            text = llm.chat_text(msgs, p.continue_final, fns, kw, generation_prompt=not bare)
        except (ValueError, TypeError, RecursionError) as e:
            raise APIError(400, f"cannot render the chat template: {e}", param="messages") from None
        return {"prompt": text}

    @app.get("/props")
    async def props():
        state.ready()
        llm, c = state.llm, state.config
        tok = llm.tokenizer
        settings = la.generation_settings(llm.default_params, llm.n_ctx, oa.capped(None, c.n_predict), [])
        return {
            "default_generation_settings": {"n_ctx": llm.n_ctx, "params": settings},
            "total_slots": c.parallel,
            "model_path": str(llm.path),
            "model_alias": state.model_id,
            "chat_template": llm.template.source,
            "bos_token": tok.token_to_piece(tok.vocab.bos_id, special=True).decode("utf-8", "replace")
            if tok.vocab.bos_id is not None and tok.vocab.bos_id >= 0 else "",
            "eos_token": tok.token_to_piece(tok.vocab.eos_id, special=True).decode("utf-8", "replace")
            if tok.vocab.eos_id is not None and tok.vocab.eos_id >= 0 else "",
            "build_info": f"edgellm {_version()}",
            "modalities": {"vision": False, "audio": False},
        }  # fmt: skip

    @app.get("/slots")
    async def slots():
        engine = state.ready()
        if not state.config.slots:
            raise APIError(
                501, "the slots endpoint is off on this server (--no-slots)", "not_supported_error"
            )
        busy = {s.slot: s for s in list(engine.sched.running)}
        return [
            {"id": i, "n_ctx": state.llm.n_ctx, "is_processing": i in busy,
             "n_prompt_tokens": busy[i].n_prompt if i in busy else 0,
             "n_decoded": busy[i].n_generated if i in busy else 0}
            for i in range(state.config.parallel)
        ]  # fmt: skip

    @app.post("/slots/{slot_id}")
    async def slot_action(slot_id: str, request: Request, action: str = ""):
        """llama-server's ?action=save|restore|erase (slot_save_restore)."""
        engine = state.ready()
        c = state.config
        if not c.slot_save_path:
            raise APIError(501, "This server does not support slots action. Start it with `--slot-save-path`",
                           "not_supported_error")  # fmt: skip
        if not (slot_id.isascii() and slot_id.isdigit() and len(slot_id) < 7 and int(slot_id) < c.parallel):
            msg = f"Invalid slot ID {slot_id[:20]!r} (this server has slots 0 to {c.parallel - 1})"
            raise APIError(400, msg, "invalid_request_error", param="id_slot")
        slot = int(slot_id)
        if action == "erase":
            return {"id_slot": slot, "n_erased": await _on_engine(engine, lambda: _erase_slot(engine, slot))}
        if action not in ("save", "restore"):
            msg = f"Invalid action {action[:20]!r}: save, restore or erase"
            raise APIError(400, msg, "invalid_request_error", param="action")
        body = await _json(request, c.max_body)
        try:
            name = slot_files.check_filename((body or {}).get("filename") if isinstance(body, dict) else None)
        except ValueError as e:
            raise APIError(400, f"Invalid filename: {e}", "invalid_request_error", param="filename") from None
        path = Path(c.slot_save_path) / name
        t0 = time.perf_counter()
        fingerprint = await asyncio.to_thread(lambda: state.llm.fingerprint)
        cache = engine.kv.cache

        def answer(counts: dict) -> dict:
            ms = (time.perf_counter() - t0) * 1e3
            return {"id_slot": slot, "filename": name, **counts, "timings": {f"{action}_ms": ms}}

        if action == "save":
            n, k, v, tokens = await _on_engine(engine, lambda: _export_slot(engine, slot))
            try:
                nbytes = await asyncio.to_thread(slot_files.save, path, fingerprint, cache, tokens, k, v)
            except OSError as e:
                raise APIError(500, f"Unable to save slot: {e.strerror or e}", "server_error") from None
            return answer({"n_saved": n, "n_written": nbytes})
        try:
            tokens, k, v, nbytes = await asyncio.to_thread(
                slot_files.load, path, fingerprint, cache, state.llm.model.config.n_vocab
            )
        except FileNotFoundError:
            raise APIError(404, f"no slot file {name!r} in the save directory", "not_found_error",
                           param="filename") from None  # fmt: skip
        except (slot_files.SlotFileError, OSError) as e:
            msg = f"Unable to restore slot: {e.strerror if isinstance(e, OSError) and e.strerror else e}"
            raise APIError(400, msg, "invalid_request_error", param="filename") from None
        try:
            n = await _on_engine(engine, lambda: _restore_slot(engine, slot, tokens, k, v))
        except (OutOfBlocks, ValueError) as e:
            raise APIError(400, f"Unable to restore slot: {e}", "invalid_request_error") from None
        return answer({"n_restored": n, "n_read": nbytes})

    # -- Ollama's API (ollama_api.py) ------------------------------------------------------------------
    @app.get("/api/version")
    async def ollama_version():
        return {"version": ol.OLLAMA_VERSION}

    @app.get("/api/tags")
    async def ollama_tags():
        state.ready()
        return {"models": [_ollama_model(state)]}

    @app.get("/api/ps")
    async def ollama_ps():
        state.ready()
        entry = _ollama_model(state)
        return {"models": [{**entry, "expires_at": "2318-01-01T00:00:00Z", "size_vram": 0}]}

    @app.post("/api/show")
    async def ollama_show(request: Request):
        state.ready()
        body = await _json(request, state.config.max_body)
        _ollama_check_model(state, (body or {}).get("model") or (body or {}).get("name") or "")
        llm = state.llm
        entry = _ollama_model(state)
        info = state.info
        return {
            "modelfile": f"FROM {llm.path}\n",
            "parameters": "",
            "template": llm.template.source,
            "details": entry["details"],
            "model_info": {"general.architecture": info["architecture"],
                           "general.parameter_count": info["parameters"],
                           f"{info['architecture']}.context_length": info["context_length"]},
            "capabilities": _ollama_capabilities(state),
        }  # fmt: skip

    @app.post("/api/pull")
    async def ollama_pull(request: Request):
        state.ready()
        body = await _json(request, state.config.max_body)
        name = (body or {}).get("model") or (body or {}).get("name") or ""
        if not _ollama_matches(state, name):
            raise APIError(
                404,
                f"edgellm serves '{state.model_id}' and cannot download models (it is offline): use "
                "`edgellm pull` and restart the server with the model",
                code="model_not_found",
            )
        return {"status": "success"}

    async def ollama_manage():
        msg = ("model management (create, copy, delete, push, blobs) is not supported: this server serves "
               f"the one model it was started with ('{state.model_id}')")  # fmt: skip
        raise APIError(501, msg, "not_supported_error")

    for path, methods in (("/api/create", ["POST"]), ("/api/copy", ["POST"]), ("/api/delete", ["DELETE"]),
                          ("/api/push", ["POST"]), ("/api/blobs/{digest}", ["GET", "POST"])):  # fmt: skip
        app.add_api_route(path, ollama_manage, methods=methods, include_in_schema=False)

    @app.post("/api/generate")
    async def ollama_generate(request: Request):
        return await _ollama(state, request, chat=False)

    @app.post("/api/chat")
    async def ollama_chat(request: Request):
        return await _ollama(state, request, chat=True)

    # -- embeddings (edgellm/embed.py) ------------------------------------------------------------------
    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        llm = _embedder(state)
        body = await _json(request, state.config.max_body)
        items = oa.parse_embeddings(body, _limits(state))
        if (body.get("dimensions") or llm.model.config.n_embd) != llm.model.config.n_embd:
            raise oa.bad("dimensions", f"this model's embeddings have {llm.model.config.n_embd} dimensions")
        pooling = state.config.pooling or llm.pooling
        if pooling == "none":
            raise APIError(400, "pooling 'none' gives one vector per token, which OpenAI's API cannot "
                           "carry: use /embedding, or start the server with another --pooling")  # fmt: skip
        vectors, n = await _embed(state, request, items, pooling, 2)
        return oa.embeddings_body(vectors, state.model_id, n, body.get("encoding_format", "float"))

    @app.post("/embedding")  # llama-server's native shape: one entry per input, its vectors as a list
    @app.post("/embeddings")  # as llama-server maps it: the native shape (OpenAI's is /v1/embeddings)
    async def native_embedding(request: Request):
        llm = _embedder(state)
        body = await _json(request, state.config.max_body)
        items = oa.parse_embeddings(body, _limits(state), key="content")
        norm = oa._integer(body, "embd_normalize", -1, 1 << 16)
        pooling = state.config.pooling or llm.pooling
        vectors, _ = await _embed(state, request, items, pooling, 2 if norm is None else norm)
        return [
            {"index": i, "embedding": (v.tolist() if pooling == "none" else [v.tolist()])}
            for i, v in enumerate(vectors)
        ]

    @app.post("/api/embed")
    async def ollama_embed(request: Request):
        llm = _embedder(state)
        body = await _json(request, state.config.max_body)
        q = ol.parse_embed(body)
        _ollama_check_model(state, q["model"])
        t0 = time.perf_counter()
        pooling = state.config.pooling or llm.pooling
        pooling = "mean" if pooling == "none" else pooling
        items = [[t] for t in q["input"]]
        vectors, n = await _embed(state, request, items, pooling, 2, truncate=q["truncate"])
        return {"model": q["model"] or state.model_id, "embeddings": [v.tolist() for v in vectors],
                "total_duration": int((time.perf_counter() - t0) * 1e9), "load_duration": 0,
                "prompt_eval_count": n}  # fmt: skip

    @app.post("/api/embeddings")  # Ollama's older route: one prompt, one vector, not normalized
    async def ollama_embeddings(request: Request):
        llm = _embedder(state)
        body = await _json(request, state.config.max_body)
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            raise oa.bad("prompt", "must be a string")
        _ollama_check_model(state, body.get("model") or "")
        pooling = state.config.pooling or llm.pooling
        vectors, _ = await _embed(
            state, request, [[body["prompt"]]], "mean" if pooling == "none" else pooling, -1
        )
        return {"embedding": vectors[0].tolist()}

    # -- OpenAI's Responses API (responses_api.py) -----------------------------------------------------
    @app.post("/v1/responses")
    @app.post("/responses")
    async def responses(request: Request):
        return await _responses(state, request)

    @app.post("/v1/responses/input_tokens")  # OpenAI's (client.responses.input_tokens.count)
    @app.post("/responses/input_tokens")
    async def responses_input_tokens(request: Request):
        state.ready()
        _, _, _, ids = await _responses_prompt(state, await _json(request, state.config.max_body))
        return {"object": "response.input_tokens", "input_tokens": len(ids)}

    @app.get("/v1/responses/{rid}")
    async def get_response(rid: str):
        state.ready()
        return state.responses.get(rid)[0]

    @app.delete("/v1/responses/{rid}")
    async def delete_response(rid: str):  # client.responses.delete
        state.ready()
        state.responses.delete(rid)
        return {"id": rid, "object": "response", "deleted": True}

    @app.get("/v1/responses/{rid}/input_items")
    async def response_input_items(rid: str):
        state.ready()
        state.responses.get(rid)  # 404 for one not kept
        msg = "listing a response's input items is not supported: the conversation is kept as chat turns"
        raise APIError(501, msg, "not_supported_error")

    # -- Anthropic's Messages API (anthropic_api.py): its own error shape ----------------------------
    @app.post("/v1/messages")
    async def anthropic_messages(request: Request):
        try:
            return await _anthropic(state, request)
        except APIError as e:
            return JSONResponse(an.error_body(e), status_code=e.status)

    @app.post("/v1/messages/count_tokens")
    async def anthropic_count_tokens(request: Request):
        try:
            state.ready()
            llm = state.llm
            body = await _json(request, state.config.max_body)
            chat = an.to_openai(body, llm.n_ctx, count_only=True)
            p = oa.parse_chat(chat, _limits(state))
            [ids] = await run_in_threadpool(_prompt_ids, llm, p, True, state.config)
            return {"input_tokens": len(ids)}
        except APIError as e:
            return JSONResponse(an.error_body(e), status_code=e.status)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _generate(state, request, chat=False)

    @app.post("/v1/chat/completions/control")  # llama-server's: end a running chat's reasoning
    @app.post("/chat/completions/control")
    async def chat_control(request: Request):
        return await _control(state, request)

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")  # llama-server's alias; its /completions is its own native API
    async def chat_completions(request: Request):
        return await _generate(state, request, chat=True)

    @app.post("/v1/chat/completions/input_tokens")  # llama-server's: the prompt a chat request makes
    @app.post("/chat/completions/input_tokens")
    async def chat_input_tokens(request: Request):
        state.ready()
        llm = state.llm
        body = await _json(request, state.config.max_body)
        p = oa.parse_chat(body, _limits(state))
        [ids] = await run_in_threadpool(_prompt_ids, llm, p, True, state.config)
        return {"input_tokens": len(ids)}

    return app


_WEBUI_HEADERS = {  # the page runs only its own inline script and talks only to this server
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def _webui_html() -> bytes:
    from importlib.resources import files

    return files("edgellm").joinpath("web/index.html").read_bytes()


def key_matches(headers: list[tuple[bytes, bytes]], key: bytes) -> bool:
    """Whether an ASGI request's headers carry `key` as `Authorization: Bearer KEY` or `X-Api-Key: KEY`
    (constant-time)."""
    h = dict(headers)
    given = h.get(b"authorization", b"")
    token = given[7:] if given[:7].lower() == b"bearer " else h.get(b"x-api-key", b"")
    return hmac.compare_digest(token, key)


class _HeadAsGet:
    """ASGI middleware: HEAD answered as GET, without the body (Starlette's plain routes do this, FastAPI's
    do not): Ollama's client checks that a server is up with `HEAD /`, uptime checkers HEAD /health."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: dict) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body"):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


class _RequireKey:
    """ASGI middleware: every route but /health and / (the chat page, which asks for the key) needs
    `Authorization: Bearer KEY` or `X-Api-Key: KEY` (constant-time check).
    Plain ASGI rather than FastAPI's http middleware, which buffers streamed responses through a task."""

    def __init__(self, app: Any, key: str):
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope.get("path") not in ("/health", "/v1/health", "/"):
            if not key_matches(scope.get("headers") or [], self.key):
                e = APIError(
                    401,
                    "Invalid API key: send it as 'Authorization: Bearer KEY' or 'X-Api-Key: KEY'",
                    code="invalid_api_key",
                )
                await _error(e)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _AccessLog:
    """ASGI middleware: one line per request once its response has ended (streams too): method, path,
    status, tokens (prompt + generated, where a generation ran) and seconds; as JSON with --log-format
    json. Plain ASGI, so streamed responses are not buffered."""

    def __init__(self, app: Any, fmt: str = "text"):
        self.app = app
        self.json = fmt == "json"

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [0]

        async def watch(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.line(scope, status[0], time.perf_counter() - t0)

        try:
            await self.app(scope, receive, watch)
        except BaseException:
            if not status[0]:
                self.line(scope, 500, time.perf_counter() - t0)
            raise

    def line(self, scope: dict, status: int, seconds: float) -> None:
        usage = (scope.get("state") or {}).get("edgellm_usage")
        client = scope.get("client") or ("-", 0)
        rec = {"method": scope.get("method"), "path": scope.get("path"), "status": status}
        if usage is not None:
            rec.update(prompt_tokens=usage[0], completion_tokens=usage[1])
        rec.update(seconds=round(seconds, 4), client=f"{client[0]}:{client[1]}")
        if self.json:
            access_log.info(json.dumps(rec))
        else:
            tokens = f" {usage[0]}+{usage[1]} tokens" if usage is not None else ""
            access_log.info(f"{rec['method']} {rec['path']} {status}{tokens} {seconds:.3f}s {rec['client']}")


def http_protocol(header_timeout: float) -> type:
    """uvicorn's h11 protocol with a header deadline: a connection must deliver a request's headers within
    `header_timeout` seconds of connecting (or of its previous response) or is closed (uvicorn has no
    such deadline: a client trickling header lines held its connection forever).

    A client that sends a request and then half-closes (shutdown(SHUT_WR)) gets no answer, on purpose:
    TCP cannot tell that EOF from a client that has gone, and EOF is how the server learns to cancel a
    generation nobody waits for (a whole answer writes nothing until the end). Keeping such
    connections open would keep every abandoned request generating to its max_tokens."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class DeadlineH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(header_timeout, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # a request is in: its handler's own limits apply from here

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return DeadlineH11Protocol


def _error(e: APIError) -> JSONResponse:
    headers = {"Retry-After": "1"} if e.status in (429, 503) else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


async def _json(request: Request, limit: int) -> Any:
    """The request body as JSON, read at most `limit` bytes (413 beyond)."""
    size = request.headers.get("content-length")
    if size is not None and (not size.isdigit() or int(size) > limit):
        raise APIError(413, f"request body too large (limit {limit} bytes)", code="body_too_large")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise APIError(413, f"request body too large (limit {limit} bytes)", code="body_too_large")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, RecursionError) as e:
        raise APIError(400, f"the body is not valid JSON: {str(e)[:200]}", code="invalid_json") from None


# ---------------------------------------------------------------------------------------------- generation


async def _generate(state: State, request: Request, chat: bool):
    engine = state.ready()
    llm = state.llm
    limits = _limits(state)
    body = await _json(request, state.config.max_body)
    p = oa.parse_chat(body, limits) if chat else oa.parse_completion(body, limits)
    prompts = await run_in_threadpool(_prompt_ids, llm, p, chat, state.config)
    prompts = [_truncated(p, ids) for ids in prompts]
    params = _params(llm, p)
    constraint = tools.grammar(p.tools, p.grammar) if chat and p.tools is not None else p.grammar
    grammar = await _compile(engine, constraint, p.grammar_field if constraint is p.grammar else "tools")
    budget = _budget(state, p, prompts[0]) if chat else None
    reqs = []
    for i, ids in enumerate(prompts):
        for j in range(p.n):
            q = params
            if q.seed is not None and (len(prompts) > 1 or p.n > 1):
                q = replace(q, seed=(q.seed + i * p.n + j) % (1 << 64))  # distinct, reproducible choices
            reqs.append(GenRequest(ids, q, p.max_tokens, tuple(p.stop), p.logprobs, grammar, p.speculative,
                                   live=_live(p), reasoning_budget=budget, slot=p.id_slot,
                                   prompt_logprobs=None if chat else oa.scored_prompt(p),
                                   min_tokens=p.min_tokens, n_indent=p.n_indent,
                                   t_max_predict_ms=p.t_max_predict_ms))  # fmt: skip
    streams = _submit(engine, reqs)
    tok = llm.tokenizer
    shaper = oa.Shaper(
        chat=chat,
        model=state.model_id,
        fingerprint=f"edgellm-{_version()}-{llm.backend.name}",
        piece=(lambda t: tok.token_to_piece(t, special=True)) if p.logprobs is not None else None,
        tool_names=p.tools.parsed if chat and p.tools is not None else None,
        one_call=p.tools is not None and not p.tools.parallel,
        live_calls=constraint is not p.grammar,  # the tools' grammar holds the calls
    )
    if not chat and (p.echo or p.prompt_logprobs is not None):  # choice i * n + j is prompt i's
        whole = p.truncate_prompt_tokens is None  # else the text of the tokens kept
        texts = [x if isinstance(x, str) and whole else tok.decode(ids) for x, ids in zip(p.prompts, prompts)]
        shaper.echo = {i * p.n + j: (texts[i], ids) for i, ids in enumerate(prompts) for j in range(p.n)}
        shaper.echo_text = p.echo
        shaper.scored = oa.scored_prompt(p) is not None
        if p.prompt_logprobs is not None:
            shaper.prompt_piece = lambda t: tok.token_to_piece(t, special=True)
    think = _thinks(state, llm, p, prompts[0]) if chat else None
    shaper.reasoning, shaper.inside = think is not None, bool(think)
    usage = request.state.edgellm_usage = [0, 0, 0]  # prompt, completion, cached: the access log reads it
    controlled = chat and p.reasoning_control  # its reasoning may be ended by id (_control)
    if controlled:
        state.controls[shaper.id] = streams
    if p.stream:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        sse = _sse(streams, shaper, p.include_usage, usage, p.timings_per_token, p.return_progress)
        if controlled:
            sse = _released(state, shaper.id, sse)
        return StreamingResponse(_pinged(state, p, sse), media_type="text/event-stream", headers=headers)
    try:
        return await _whole(request, streams, shaper, usage)
    finally:
        state.controls.pop(shaper.id, None)


def _budget(state: State, p: oa.GenerationParams, ids: list[int]) -> reasoning.BudgetSpec | None:
    """A chat's reasoning budget (llama-server's reasoning_budget_tokens, else the server's
    --reasoning-budget), or None where it has none and may not be ended on request either."""
    n = p.reasoning_budget if p.reasoning_budget is not None else state.config.reasoning_budget
    if n < 0 and not p.reasoning_control:
        return None
    msg = p.reasoning_budget_message
    msg = state.config.reasoning_budget_message if msg is None else msg
    return reasoning.budget_spec(state.llm.tokenizer, n, state.llm.opens_thought(ids), msg)


async def _released(state: State, cid: str, source: AsyncIterator[str]) -> AsyncIterator[str]:
    """`source`, its completion id forgotten by the reasoning control once it ends."""
    try:
        async for x in source:
            yield x
    finally:
        state.controls.pop(cid, None)
        await source.aclose()  # type: ignore[attr-defined]


async def _control(state: State, request: Request) -> dict[str, Any]:
    """llama-server's POST /v1/chat/completions/control: {action: reasoning_end, id: a running chat
    completion's id (its request armed reasoning_control)}: its reasoning ends now."""
    engine = state.ready()
    body = await _json(request, state.config.max_body)
    cid = body.get("id") if isinstance(body, dict) else None
    if not isinstance(cid, str) or not cid:
        raise oa.bad("id", "missing completion id")
    if body.get("action") != "reasoning_end":
        raise oa.bad("action", "unknown control action (reasoning_end is)")
    streams = state.controls.get(cid)
    if streams is None:
        return {"success": False, "message": "no active completion for this id"}
    for st in streams:
        await asyncio.wrap_future(engine.end_reasoning(st))
    return {"success": True}


def _live(p: oa.GenerationParams) -> bool:
    """Whether the engine should say how far the request has got (Event.progress): llama-server's
    timings_per_token, and return_progress (streamed answers only, as llama-server's)."""
    return p.stream and (p.timings_per_token or p.return_progress)


SSE_PING = ": ping\n\n"  # an SSE comment: every client's parser skips it


def _pinged(
    state: State, p: oa.GenerationParams | None, source: AsyncIterator[str], ping: str = SSE_PING
) -> AsyncIterator[str]:
    """`source`'s items, and `ping` whenever it has been silent for the request's sse_ping_interval
    seconds (llama-server's field; by default the server's --sse-ping-interval, 30; <= 0: never): a
    client or proxy that gives up on a silent connection (Node's fetch after 300 s) keeps it while a long
    prompt is read or the request waits its turn. Closing this closes `source`."""
    asked = p.sse_ping_interval if p is not None else None
    interval = asked if asked is not None else state.config.sse_ping_interval
    return source if interval <= 0 else _with_pings(source, float(interval), ping)


async def _with_pings(source: AsyncIterator[str], interval: float, ping: str) -> AsyncIterator[str]:
    """One task reads `source` into a queue; a watchdog puts `ping` there whenever nothing has come for
    `interval` seconds. Items pass at a queue's cost: no timer or task per item (the token loop's)."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()
    end = object()
    last = loop.time()

    async def pump() -> None:
        nonlocal last
        try:
            async for x in source:
                last = loop.time()
                q.put_nowait((x, None))
        except Exception as e:  # noqa: BLE001 - the reader raises it
            q.put_nowait((end, e))
            return
        q.put_nowait((end, None))

    async def watch() -> None:
        nonlocal last
        while True:
            await asyncio.sleep(max(0.0, last + interval - loop.time()))
            if loop.time() - last >= interval:
                last = loop.time()
                q.put_nowait((ping, None))

    tasks = [asyncio.ensure_future(pump()), asyncio.ensure_future(watch())]
    try:
        while True:
            x, err = await q.get()
            if x is end:
                if err is not None:
                    raise err
                return
            yield x
    finally:  # the end, or the client went away: the source is closed (its own clean-up runs)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await source.aclose()  # type: ignore[attr-defined]


def _progress_only(ev: Event) -> bool:
    """An event that only says how far the prompt has been read (GenRequest.live)."""
    return ev.progress is not None and ev.token is None and not ev.text and ev.finish_reason is None


async def _compile(engine: Engine, grammar: Any, field: str) -> str | None:
    """A request's constraint compiled for the model (off the event loop: the first one builds the
    vocabulary's index, about a second on 150k tokens); a bad one is a 400 naming its field."""
    if grammar is None:
        return None
    try:
        return await run_in_threadpool(engine.compile_grammar, grammar)
    except structured.GrammarError as e:
        raise oa.bad(field, str(e), code="invalid_grammar") from None


async def _on_engine(engine: Engine, fn: Callable[[], Any]) -> Any:
    """fn's result, run on the engine's thread between two steps (Engine.call)."""
    return await asyncio.wrap_future(engine.call(fn))


def _export_slot(engine: Engine, slot: int) -> tuple[int, Any, Any, list[int]]:
    """(n, K, V, tokens): what the prefix cache still holds of the slot's last conversation (engine
    thread)."""
    tokens = engine.slot_tokens.get(slot, [])
    n, k, v = engine.kv.export(tokens)
    return n, k, v, tokens[:n]


def _restore_slot(engine: Engine, slot: int, tokens: list[int], k: Any, v: Any) -> int:
    n = engine.kv.restore(tokens, k, v)
    engine.slot_tokens[slot] = list(tokens)
    return n


def _erase_slot(engine: Engine, slot: int) -> int:
    """Forget the slot's last conversation and drop its cached K/V that no other needs; the tokens it
    held (llama-server's n_erased)."""
    tokens = engine.slot_tokens.pop(slot, [])
    engine.kv.forget(tokens)
    return len(tokens)


def _limits(state: State) -> oa.Limits:
    """What a request may ask of the loaded model and this server (its -n included)."""
    llm = state.llm
    return oa.Limits(llm.n_ctx, llm.model.config.n_vocab, state.config.n_predict, state.config.parallel)


def _truncated(p: oa.GenerationParams, ids: list[int]) -> list[int]:
    """vLLM's truncate_prompt_tokens: the prompt's last so many tokens."""
    return ids if p.truncate_prompt_tokens is None else ids[-p.truncate_prompt_tokens :]


def bad_word_ids(tok: Any, words: list[str]) -> list[list[int]]:
    """vLLM's bad_words as token sequences (vllm/logits_process.py): each word's tokens, and those of the
    word after a space where that is another first token of the same length (the word inside a text)."""
    out: list[list[int]] = []
    for word in words:
        plain = tok.encode(word.lstrip(), add_special=False)
        out.append(plain)
        spaced = tok.encode(" " + word.lstrip(), add_special=False)
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(spaced)
    return out


def _params(llm: Any, p: oa.GenerationParams) -> Any:
    """The request's SamplingParams: the model's defaults, the request's fields, and for ignore_eos a
    ban on every end-of-generation token (llama-server's way)."""
    sampling = dict(p.sampling)
    bias = sampling.get("logit_bias") or {}
    if any(isinstance(k, str) for k in bias):  # llama-server's text keys: every token of the text
        ids: dict[int, float] = {}
        tok = llm.tokenizer
        for k, v in bias.items():
            keys = [k] if isinstance(k, int) else tok.encode(k, add_special=False, parse_special=False)
            ids.update(dict.fromkeys(keys, v))
        sampling["logit_bias"] = ids
    if p.bad_words:
        sampling["banned_sequences"] = bad_word_ids(llm.tokenizer, p.bad_words)
    if p.ignore_eos:
        sampling["logit_bias"] = {
            **(sampling.get("logit_bias") or {}),
            **{t: float("-inf") for t in llm.tokenizer.eog_ids},
        }
    try:
        return llm.params(**sampling)
    except (ValueError, TypeError) as e:
        raise oa.bad("", str(e)) from None


class _Timings:
    """llama-server's `timings` for a request's sequences, from their final usage."""

    def __init__(self) -> None:
        self.prompt_n = self.cache_n = self.gen_n = self.draft_n = self.draft_accepted = 0
        self.prompt_s = self.gen_s = 0.0

    def add(self, u: Any) -> None:
        self.draft_n += u.draft_tokens
        self.draft_accepted += u.draft_accepted
        self.prompt_n += u.prompt_tokens - u.cached_tokens
        self.cache_n += u.cached_tokens
        self.gen_n += u.completion_tokens
        self.prompt_s = max(self.prompt_s, u.prompt_s)  # (choices read their prompts side by side)
        self.gen_s = max(self.gen_s, u.generation_s)

    def body(self) -> dict[str, float]:
        t = la.timings(self.prompt_n, self.prompt_s, self.gen_n, self.gen_s, self.cache_n)
        if self.draft_n:  # llama-server's names for speculative decoding's figures
            t.update(draft_n=self.draft_n, draft_n_accepted=self.draft_accepted)
        return t


async def _responses_prompt(
    state: State, body: Any
) -> tuple[oa.GenerationParams, dict, list[dict], list[int]]:
    """A Responses request read: its parameters, the fields it echoes, the conversation it continues
    (previous_response_id's turns, then its input) and the prompt's token ids."""
    llm = state.llm
    p, msgs, echo = ra.parse(body, _limits(state))
    history = state.responses.get(echo["previous_response_id"])[1] if echo["previous_response_id"] else []
    system = [{"role": "system", "content": echo["instructions"]}] if echo["instructions"] else []
    convo = [*history, *msgs]  # instructions are not carried over to the next turn (as OpenAI's)
    p.prompts = [[*system, *convo]]
    [ids] = await run_in_threadpool(_prompt_ids, llm, p, True, state.config)
    return p, echo, convo, ids


async def _responses(state: State, request: Request):
    """POST /v1/responses: a turn through the chat template, whole or as the Responses API's named
    server-sent events; a stored response's conversation continues with previous_response_id. With
    function tools the model's calls come back as function_call items (streamed: in the order written,
    the arguments as they come)."""
    engine = state.ready()
    llm = state.llm
    p, echo, convo, ids = await _responses_prompt(state, await _json(request, state.config.max_body))
    constraint = tools.grammar(p.tools, p.grammar) if p.tools is not None else p.grammar
    grammar = await _compile(engine, constraint, p.grammar_field if constraint is p.grammar else "tools")
    ids = _truncated(p, ids)
    req = GenRequest(ids, _params(llm, p), p.max_tokens, tuple(p.stop), None, grammar, live=_live(p),
                     reasoning_budget=_budget(state, p, ids), min_tokens=p.min_tokens)  # fmt: skip
    streams = _submit(engine, [req])
    rid, mid, created = oa.new_id("resp", "_"), oa.new_id("msg", "_"), ra.now()
    usage = request.state.edgellm_usage = [0, 0, 0]
    names = p.tools.parsed if p.tools is not None else None  # parse the model's calls
    single = p.tools is not None and not p.tools.parallel
    inside = _thinks(state, llm, p, ids)  # None: the reasoning is left in the text

    def finished(
        text: str,
        finish: str,
        calls: list[dict],
        output: list[dict] | None = None,
        thought: str | None = None,
    ) -> dict:
        u = tuple(usage)
        r = ra.response(rid, mid, state.model_id, created, echo, text, finish, u, calls, output, thought)  # type: ignore[arg-type]
        if echo["store"]:
            said: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
            if calls:
                said["tool_calls"] = calls
            if thought:
                said["reasoning_content"] = thought
            state.responses.put(r, [*convo, said])
        return r

    if not p.stream:
        if (evs := await _events_of(request, streams, usage)) is None:
            return Response(status_code=499)  # the client went away
        raw = "".join(ev.text for ev in evs)
        thought, said = reasoning.split(raw, inside) if inside is not None else (None, raw)
        text, calls = tools.split(said, names, single) if names else (said, [])
        return finished(text, evs[-1].finish_reason or "stop", calls, thought=thought or None)

    async def events() -> AsyncIterator[str]:
        seq = 0

        def event(kind: str, **data: Any) -> str:
            nonlocal seq
            seq += 1
            return (
                f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': seq - 1, **data})}\n\n"
            )

        started = ra.response(rid, mid, state.model_id, created, echo, None, None)
        live = constraint is not p.grammar  # the tools' grammar holds the calls: stream them as written
        calls = tools.CallStream(names, single, live) if names else None
        think = reasoning.ReasoningStream(inside) if inside is not None else None
        # items as the model writes them; without tools the answer always has a message item
        out = ra.Items(mid, calls.calls if calls is not None else None, message=calls is None)
        try:
            yield event("response.created", response=started)
            yield event("response.in_progress", response=started)
            finish = "stop"
            timings = _Timings()
            async for ev in _one_stream(streams, usage):
                if ev.usage is not None:
                    timings.add(ev.usage)
                if _progress_only(ev):  # llama-server's return_progress: an in_progress event that says it
                    if p.return_progress:
                        extra = {"prompt_progress": la.prompt_progress(ev.progress)}
                        if p.timings_per_token:
                            extra["timings"] = la.live_timings(ev.progress)
                        yield event("response.in_progress", response=started, **extra)
                    continue
                evs = [e for part in tools.stream_parts(think, calls, ev.text) for e in out.feed(part)]
                if p.timings_per_token and evs and ev.progress is not None:  # on the last, as llama-server's
                    evs[-1] = (evs[-1][0], {**evs[-1][1], "timings": la.live_timings(ev.progress)})
                for kind, data in evs:
                    yield event(kind, **data)
                finish = ev.finish_reason or finish
            parts = tools.stream_parts(think, calls, None)
            for kind, data in [e for part in parts for e in out.feed(part)] + out.close():
                yield event(kind, **data)
            ended = calls.calls[: calls.ended] if calls is not None else []
            thought = next((i["content"][0]["text"] for i in out.items if i["type"] == "reasoning"), None)
            r = finished("".join(out.shown), finish, ended, output=out.items, thought=thought)
            kind = "response.completed" if r["status"] == "completed" else "response.incomplete"
            yield event(kind, response=r, timings=timings.body())  # llama-server's timings, on the last
        except APIError as e:
            yield event("error", code=e.code, message=e.message, param=e.param)
        finally:
            _cancel_all(streams)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(_pinged(state, p, events()), media_type="text/event-stream", headers=headers)


async def _anthropic(state: State, request: Request):
    """POST /v1/messages: the request as a chat turn (anthropic_api.to_openai), the answer as a Message,
    whole or as Anthropic's stream events; the model's tool calls as tool_use blocks (streamed: in the
    order written, the input as it comes)."""
    engine = state.ready()
    llm = state.llm
    body = await _json(request, state.config.max_body)
    p = oa.parse_chat(an.to_openai(body, llm.n_ctx), _limits(state))
    [ids] = await run_in_threadpool(_prompt_ids, llm, p, True, state.config)
    ids = _truncated(p, ids)
    constraint = tools.grammar(p.tools, p.grammar) if p.tools is not None else p.grammar
    grammar = await _compile(engine, constraint, p.grammar_field if constraint is p.grammar else "tools")
    budget = _budget(state, p, ids)  # Anthropic's thinking budget_tokens, or the server's
    params = _params(llm, p)
    req = GenRequest(ids, params, p.max_tokens, tuple(p.stop), None, grammar, reasoning_budget=budget,
                     min_tokens=p.min_tokens)  # fmt: skip
    streams = _submit(engine, [req])
    mid = oa.new_id("msg", "_")
    usage = request.state.edgellm_usage = [0, 0, 0]
    names = p.tools.parsed if p.tools is not None else None  # parse the model's calls
    single = p.tools is not None and not p.tools.parallel
    eog = llm.tokenizer.eog_ids
    inside = _thinks(state, llm, p, ids)  # None: the reasoning is left in the text

    def stop_sequence(finish: str, text: str, tokens: list[int]) -> str | None:
        """The stop sequence that ended the answer (its text is cut where the sequence began)."""
        stops = [s for s in p.stop if s]
        if finish != "stop" or not stops or not tokens or tokens[-1] in eog:
            return None
        tail = llm.detokenize(tokens)[len(text) :]
        return next((s for s in stops if tail.startswith(s)), stops[0])

    if not p.stream:
        if (evs := await _events_of(request, streams, usage)) is None:
            return Response(status_code=499)  # the client went away
        tokens = [ev.token for ev in evs if ev.token is not None]
        finish, raw = evs[-1].finish_reason or "stop", "".join(ev.text for ev in evs)
        thought, said = reasoning.split(raw, inside) if inside is not None else (None, raw)
        text, calls = tools.split(said, names, single) if names else (said, [])
        content = [{"type": "thinking", "thinking": thought, "signature": ""}] if thought else []
        content += ([{"type": "text", "text": text}] if text or not calls else []) + [
            an.tool_use_block(c) for c in calls
        ]
        seq = stop_sequence(finish, raw, tokens)
        return an.message(mid, state.model_id, content, an.stop_reason(finish, calls, seq), seq, tuple(usage))  # type: ignore[arg-type]

    def event(kind: str, **data: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"

    async def events() -> AsyncIterator[str]:
        live = constraint is not p.grammar  # the tools' grammar holds the calls: stream them as written
        calls = tools.CallStream(names, single, live) if names else None
        out = an.Blocks(calls.calls if calls is not None else None)
        think = reasoning.ReasoningStream(inside) if inside is not None else None
        try:
            start = an.message(mid, state.model_id, [], None, None, (len(ids), 0, 0))
            yield event("message_start", message=start)
            yield event("ping")
            tokens, finish, raw = [], "stop", []
            async for ev in _one_stream(streams, usage):
                tokens += [ev.token] if ev.token is not None else []
                raw.append(ev.text)
                for kind, data in [
                    e for part in tools.stream_parts(think, calls, ev.text) for e in out.feed(part)
                ]:
                    yield event(kind, **data)
                finish = ev.finish_reason or finish
            parts = tools.stream_parts(think, calls, None)
            for kind, data in [e for part in parts for e in out.feed(part)] + out.close():
                yield event(kind, **data)
            ended = calls.calls[: calls.ended] if calls is not None else []
            seq = stop_sequence(finish, "".join(raw), tokens) if not ended else None
            reason = an.stop_reason(finish, ended, seq)
            yield event("message_delta", delta={"stop_reason": reason, "stop_sequence": seq},
                        usage={"output_tokens": usage[1]})  # fmt: skip
            yield event("message_stop")
        except APIError as e:
            yield event("error", error=an.error_body(e)["error"])
        finally:
            _cancel_all(streams)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    pinged = _pinged(state, p, events(), ping=an.PING)  # Anthropic's own ping event
    return StreamingResponse(pinged, media_type="text/event-stream", headers=headers)


def _thinks(state: State, llm: Any, p: oa.GenerationParams, ids: list[int]) -> bool | None:
    """Whether a chat answer's reasoning is taken apart (reasoning.py): None where the request's
    reasoning_format (or the server's) is none, else whether the answer starts inside it: the prompt
    opened it, and no grammar shapes the answer from its first token (structured output, a forced tool
    call: the answer is what the grammar says; `auto` tools leave the text free until a call)."""
    if (p.reasoning_format or state.config.reasoning_format) == "none":
        return None
    shaped = p.grammar is not None or (p.tools is not None and bool(p.tools.forced))
    return not shaped and llm.opens_thought(ids)


def _embedder(state: State) -> Any:
    state.ready()
    if not state.config.embeddings:
        raise APIError(
            501,
            "embeddings are off on this server: start it with --embeddings",
            "not_supported_error",
            code="embeddings_disabled",
        )
    return state.llm


async def _embed(
    state: State, request: Request, items: list, pooling: str, norm: int, truncate: bool = False
) -> tuple[list, int]:
    """Each input's embedding (texts tokenized with BOS), computed on the engine's thread between steps;
    (vectors, input tokens in all)."""
    llm = state.llm
    vectors, n = [], 0
    for it in items:
        ids = la.prompt_ids(llm.tokenizer, it)  # llama-server's mixed prompts: BOS once
        if truncate:  # Ollama's truncate: keep the first n_ctx tokens
            ids = ids[: llm.n_ctx]
        try:
            vectors.append(await run_in_threadpool(llm.embed_ids, ids, pooling, norm))
        except ContextOverflow as e:
            err = APIError(400, str(e), code="context_length_exceeded")
            err.extra = {"n_prompt_tokens": e.n_prompt_tokens, "n_ctx": e.n_ctx}
            raise err from None
        except ShuttingDown as e:
            raise APIError(503, str(e), "unavailable_error", code="shutting_down") from None
        except ValueError as e:
            raise oa.bad("input", str(e)) from None
        n += len(ids)
    request.state.edgellm_usage = [n, 0, 0]
    return vectors, n


def _version() -> str:
    from edgellm import __version__

    return __version__


async def _native(state: State, request: Request):
    """POST /completion: llama-server's native completion, whole or as SSE `data:` chunks."""
    engine = state.ready()
    llm = state.llm
    body = await _json(request, state.config.max_body)
    p, pieces = la.parse_completion(body, _limits(state))
    try:
        prompts = await run_in_threadpool(lambda: [la.prompt_ids(llm.tokenizer, x) for x in pieces])
    except (ValueError, TypeError) as e:
        raise oa.bad("prompt", str(e)) from None
    prompts = [_truncated(p, ids) for ids in prompts]
    params = _params(llm, p)
    return await _native_answer(state, request, engine, p, prompts, params)


class _NativeSeq:
    """One prompt's answer on the native routes, as its events arrive."""

    def __init__(self, n_prompt: int) -> None:
        self.n_prompt = n_prompt
        self.texts: list[str] = []
        self.tokens: list[int] = []
        self.lps: list[tuple[int, Any]] = []
        self.reason = "stop"
        self.usage: Any = None
        self.timings = _Timings()

    def add(self, ev: Event) -> None:
        self.texts.append(ev.text)
        if ev.token is not None:
            self.tokens.append(ev.token)
            if ev.logprob is not None:
                self.lps.append((ev.token, ev.logprob))
        if ev.usage is not None:
            self.usage = ev.usage
            self.timings.add(ev.usage)
        self.reason = ev.finish_reason or self.reason


async def _native_answer(
    state: State, request: Request, engine: Engine, p: Any, prompts: list[list[int]], params: Any
):
    """A native completion's answer (`/completion`: one for each prompt, or n_cmpl each, as llama-server's;
    `/infill`): whole (one object; a list of them for several) or as SSE `data:` chunks, each saying its
    answer's `index` (prompt i's j-th at i * n_cmpl + j)."""
    llm = state.llm
    grammar = await _compile(engine, p.grammar, p.grammar_field)
    stop = tuple(p.stop)

    def seeded(j: int) -> Any:  # n_cmpl's answers to a prompt: distinct, reproducible; prompts share one seed
        return (
            params if j == 0 or params.seed is None else replace(params, seed=(params.seed + j) % (1 << 64))
        )

    choices = [(ids, seeded(j)) for ids in prompts for j in range(p.n)]
    reqs = [
        GenRequest(ids, q, p.max_tokens, stop, p.logprobs, grammar, p.speculative, _live(p),
                   post_sampling=p.post_sampling_probs, slot=p.id_slot, min_tokens=p.min_tokens,
                   n_indent=p.n_indent, t_max_predict_ms=p.t_max_predict_ms)
        for ids, q in choices
    ]  # fmt: skip
    streams = _submit(engine, reqs)
    usage = request.state.edgellm_usage = [0, 0, 0]
    seqs = [_NativeSeq(len(ids)) for ids, _ in choices]
    eog = llm.tokenizer.eog_ids
    piece = lambda t: llm.tokenizer.token_to_piece(t, special=True)  # noqa: E731

    slot = max(p.id_slot, 0)  # the slot named (the engine's own is not tracked per answer: 0)

    def probs(items: list) -> dict:
        if not p.logprobs:
            return {}
        return {"completion_probabilities": la.probabilities(items, piece, p.post_sampling_probs)}

    def final(i: int, text: str, lps: list, tokens: list[int]) -> dict:
        s, u = seqs[i], seqs[i].usage  # (the finish event carries the usage)
        st = la.stop_type(s.reason, s.tokens[-1] if s.tokens else None, eog, p.stop)
        body = {
            "index": i, "content": text, "tokens": tokens, "id_slot": slot, "stop": True,
            "model": state.model_id, "tokens_predicted": u.completion_tokens,
            "tokens_evaluated": u.prompt_tokens, "tokens_cached": u.cached_tokens,
            "generation_settings": {**la.generation_settings(choices[i][1], llm.n_ctx, p.max_tokens, p.stop),
                                    "stream": p.stream},
            "prompt": llm.tokenizer.decode(choices[i][0]), "has_new_line": "\n" in "".join(s.texts),
            "truncated": s.reason == "length" and u.prompt_tokens + u.completion_tokens >= llm.n_ctx,
            "stop_type": st,
            "stopping_word": "" if st != "word" else next((w for w in p.stop if w), ""),
            "timings": s.timings.body(),
            **probs(lps),
        }  # fmt: skip
        return la.pick_fields(body, p.response_fields) if p.response_fields else body

    async def events() -> AsyncIterator[tuple[int, Event]]:
        async for i, ev in _merged(streams):
            if ev.finish_reason == "error":
                raise APIError(ev.status, ev.error or "generation failed")
            seqs[i].add(ev)
            if ev.usage is not None:  # the access log's prompt, completion and cached tokens
                u = ev.usage
                usage[:] = [
                    a + b for a, b in zip(usage, (u.prompt_tokens, u.completion_tokens, u.cached_tokens))
                ]
            yield i, ev

    if p.stream:

        async def sse() -> AsyncIterator[str]:
            try:
                async for i, ev in events():
                    lps = [(ev.token, ev.logprob)] if ev.logprob is not None else []
                    if ev.finish_reason is not None:
                        yield _sse_line(final(i, ev.text, lps, []))
                        continue
                    n = (len(seqs[i].tokens), seqs[i].n_prompt)  # predicted, evaluated
                    chunk = {"index": i, "content": ev.text, "tokens": [], "stop": False, "id_slot": slot,
                             "tokens_predicted": n[0], "tokens_evaluated": n[1]}  # fmt: skip
                    if _progress_only(ev):  # llama-server's return_progress
                        if not p.return_progress:
                            continue
                        chunk["prompt_progress"] = la.prompt_progress(ev.progress)
                    elif ev.text or ev.token is not None:
                        chunk.update(tokens=[ev.token] if ev.token is not None else [], **probs(lps))
                    else:
                        continue
                    if p.timings_per_token and ev.progress is not None:
                        chunk["timings"] = la.live_timings(ev.progress)
                    yield _sse_line(chunk)
            except APIError as e:
                yield _sse_line(e.body())
            finally:
                _cancel_all(streams)

        headers = {"Cache-Control": "no-cache"}
        return StreamingResponse(_pinged(state, p, sse()), media_type="text/event-stream", headers=headers)

    async def drain() -> None:
        async for _ in events():
            pass

    if not await _until_gone(request, drain(), streams):
        return Response(status_code=499)  # the client went away
    out = [final(i, "".join(s.texts), s.lps, s.tokens) for i, s in enumerate(seqs)]
    return out[0] if len(out) == 1 else out


async def _one_stream(streams: list, usage: list[int]) -> AsyncIterator[Event]:
    """The events of a single-sequence request (native and Ollama routes): an error event raised as an
    APIError, the final usage copied into `usage` (prompt, completion, cached; the access log reads it)."""
    async for _, ev in _merged(streams):
        if ev.finish_reason == "error":
            raise APIError(ev.status, ev.error or "generation failed")
        if ev.usage is not None:
            usage[:] = [ev.usage.prompt_tokens, ev.usage.completion_tokens, ev.usage.cached_tokens]
        yield ev


async def _until_gone(request: Request, work: Any, streams: list) -> bool:
    """Await `work` (a whole answer being collected) unless the client disconnects first: then it is
    cancelled and False returned. The request's sequences are cancelled when it ends either way (their
    slots are free at the engine's next step)."""
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=0.5)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                return False
        task.result()
        return True
    finally:
        _cancel_all(streams)


async def _events_of(request: Request, streams: list, usage: list[int]) -> list[Event] | None:
    """A single-sequence request's events, whole (the routes' answers that are not streamed), the last
    its finish; None when the client went away first."""
    got: list[Event] = []

    async def collect() -> None:
        async for ev in _one_stream(streams, usage):
            got.append(ev)

    return got if await _until_gone(request, collect(), streams) else None


def _ollama_model(state: State) -> dict:
    """The served model as /api/tags, /api/ps and /api/show describe it (made once)."""
    if state.ollama_entry is None:
        state.ollama_entry = _ollama_entry(state)
    return state.ollama_entry


def _ollama_capabilities(state: State) -> list[str]:
    """What /api/show says the served model can do, as Ollama names it (apps check `tools` before they
    send tools): tools where its template renders them, insert where it has fill-in-the-middle tokens,
    thinking where its template thinks (<think> or </think>, as DeepSeek-R1's drops old reasoning at it;
    enable_thinking), embedding with --embeddings."""
    llm = state.llm
    source = llm.template.source or ""
    v = llm.tokenizer.vocab
    caps = ["completion"]
    caps += ["tools"] if tools.renders_tools(source) else []
    caps += ["insert"] if all(v.special_id(r) is not None for r in ("fim_pre", "fim_suf", "fim_mid")) else []
    thinks = any(mark in source for mark in (reasoning.OPEN, reasoning.CLOSE, "enable_thinking"))
    caps += ["thinking"] if thinks else []
    return caps + (["embedding"] if state.config.embeddings else [])


def _ollama_entry(state: State) -> dict:
    llm = state.llm
    info = state.info = modelinfo.summarize(llm.file)
    quant = next(iter(info["quant_mix"]), "?")
    arch = info["architecture"]
    details = {
        "parent_model": "", "format": "gguf", "family": arch, "families": [arch],
        "parameter_size": modelinfo.human_count(info["parameters"]), "quantization_level": quant,
    }  # fmt: skip
    # a stable id of the file (Ollama's is the blob's sha256; hashing 1 GB per listing is not worth it)
    digest = hashlib.sha256(
        f"{llm.path}:{info['file_size']}:{llm.path.stat().st_mtime_ns}".encode()
    ).hexdigest()
    return ol.model_entry(f"{state.model_id}:latest", info["file_size"], digest, details, state.created)


def _names_model(state: State, name: str, case: bool = False) -> bool:
    """Whether `name` (":latest" allowed) is the served model's id or one of its --alias names."""
    fold = (lambda x: x) if case else str.lower
    return fold(name).removesuffix(":latest") in {fold(x) for x in (state.model_id, *state.config.aliases)}


def _ollama_matches(state: State, name: str) -> bool:
    return name.lower().removesuffix(":latest") == "" or _names_model(state, name)


def _ollama_check_model(state: State, name: Any) -> None:
    if not isinstance(name, str) or not _ollama_matches(state, name):
        raise ol.not_found(str(name), state.model_id)


async def _ollama(state: State, request: Request, chat: bool):
    """POST /api/generate and /api/chat: one sequence, NDJSON pieces then the final counts."""
    engine = state.ready()
    llm = state.llm
    body = await _json(request, state.config.max_body)
    n_vocab = llm.model.config.n_vocab
    q = ol.parse_chat(body, llm.n_ctx) if chat else ol.parse_generate(body, llm.n_ctx, n_vocab)
    q["max_tokens"] = oa.capped(q["max_tokens"], state.config.n_predict)
    _ollama_check_model(state, q["model"])
    name = f"{state.model_id}:latest"
    if not chat and not q["prompt"]:  # Ollama: an empty prompt loads the model and answers done
        return {"model": name, "created_at": ol.now(), "response": "", "done": True, "done_reason": "load"}

    treq = q.get("tools")
    names = treq.parsed if treq is not None else None  # parse tool calls from the answer
    if names:
        tools.require_shown(llm.template.source)

    kwargs = {"enable_thinking": q["think"]} if q["think"] is not None else {}  # Qwen3's switch
    kwargs = _template_kwargs(state.config, kwargs)

    def ids() -> list[int]:
        if chat:
            special = state.config.special_in_messages
            return llm.chat_prompt(
                q["messages"],
                special_in_content=special,
                tools=treq.tools if names else None,
                template_kwargs=kwargs,
            )
        if q["suffix"]:  # an insertion: the model's fill-in-the-middle prompt
            return la.infill_ids(llm.tokenizer, q["prompt"], q["suffix"], n_ctx=llm.n_ctx)
        if q["raw"]:
            return llm.tokenize(q["prompt"])
        msgs = ([{"role": "system", "content": q["system"]}] if q["system"] else []) + [
            {"role": "user", "content": q["prompt"]}
        ]
        return llm.chat_prompt(
            msgs, special_in_content=state.config.special_in_messages, template_kwargs=kwargs
        )

    def continued(new: list[int]) -> list[int]:
        """Ollama's `context` then the prompt (its BOS dropped: the context began with one)."""
        earlier = q.get("context") or []
        if not earlier:
            return new
        bos = llm.tokenizer.vocab.bos_id
        return earlier + (new[1:] if new and llm.tokenizer.vocab.add_bos and new[0] == bos else new)

    try:
        prompt = continued(await run_in_threadpool(ids))
        params = llm.params(**q["sampling"])
    except la.NoInfill as e:  # Ollama's words for a model that cannot fill in the middle
        raise APIError(400, f"{name} does not support insert: {e}", param="suffix") from None
    except (ValueError, TypeError, RecursionError) as e:
        raise APIError(400, f"cannot build the prompt: {e}", param="messages" if chat else "prompt") from None
    constraint = tools.grammar(treq, q["format"]) if names else q["format"]
    grammar = await _compile(engine, constraint, "format" if constraint is q["format"] else "tools")
    t0 = time.perf_counter()
    c = state.config  # the server's --reasoning-budget: every chat's
    budget = None
    if chat and c.reasoning_budget >= 0:
        inside = llm.opens_thought(prompt)
        budget = reasoning.budget_spec(llm.tokenizer, c.reasoning_budget, inside, c.reasoning_budget_message)
    req = GenRequest(
        prompt, params, q["max_tokens"], tuple(q["stop"]), None, grammar, reasoning_budget=budget
    )
    streams = _submit(engine, [req])
    usage = request.state.edgellm_usage = [0, 0, 0]

    # think: the reasoning apart, as Ollama's `thinking` (None: left in the text)
    shaped = q["format"] is not None  # the answer is the format's from its first token
    opened = not shaped and llm.opens_thought(prompt)
    inside = opened if q["think"] else None

    def piece(text: str, calls: list[dict] | None = None, thought: str | None = None) -> dict:
        if chat:
            msg = {"role": "assistant", "content": text}
            if thought:
                msg["thinking"] = thought
            if calls:
                msg["tool_calls"] = ol.answer_tool_calls(calls)
            return {"model": name, "created_at": ol.now(), "message": msg, "done": False}
        out = {"model": name, "created_at": ol.now(), "response": text, "done": False}
        return {**out, "thinking": thought} if thought else out

    def events() -> AsyncIterator[Event]:
        return _one_stream(streams, usage)

    def last(reason: str, ttft: float | None, text: str, tokens: list[int]) -> dict:
        out = {**piece(text), **ol.final_fields(usage, t0, ttft, reason)}
        if not chat and not q["raw"]:  # Ollama's: what a next /api/generate sends back as `context`
            out["context"] = prompt + tokens
        return out

    if q["stream"]:

        async def ndjson() -> AsyncIterator[str]:
            reason, ttft = "stop", None
            live = constraint is not q["format"]  # the tools' grammar holds the calls
            calls = tools.CallStream(names, live=live) if names else None
            think = reasoning.ReasoningStream(inside) if inside is not None else None

            def lines(parts: list[tools.Part]) -> list[str]:  # each call whole once written, as Ollama's
                out = []
                for part in parts:
                    if part.kind in ("text", "reasoning"):
                        out.append(piece(part.text) if part.kind == "text" else piece("", thought=part.text))
                    elif part.kind == "ends":
                        assert calls is not None
                        out.append(piece("", [calls.calls[part.index]]))
                return [json.dumps(x) + "\n" for x in out]

            said: list[int] = []
            try:
                async for ev in events():
                    if ev.token is not None:
                        said.append(ev.token)
                    if ev.finish_reason is not None:
                        reason, ttft = ev.finish_reason, ev.usage.ttft_s if ev.usage else None
                    for line in lines(tools.stream_parts(think, calls, ev.text)) if ev.text else []:
                        yield line
                for line in lines(tools.stream_parts(think, calls, None)):
                    yield line
                yield json.dumps(last(reason, ttft, "", said)) + "\n"
            except APIError as e:
                yield json.dumps({"error": e.message}) + "\n"
            finally:
                _cancel_all(streams)

        return StreamingResponse(ndjson(), media_type="application/x-ndjson")
    if (evs := await _events_of(request, streams, usage)) is None:
        return Response(status_code=499)  # the client went away
    end = evs[-1]
    reason, ttft = end.finish_reason or "stop", end.usage.ttft_s if end.usage else None
    raw = "".join(ev.text for ev in evs)
    thought, said = reasoning.split(raw, inside) if inside is not None else (None, raw)
    text, calls = tools.split(said, names) if names else (said, [])
    answer = last(reason, ttft, text, [ev.token for ev in evs if ev.token is not None])
    if calls:
        answer["message"]["tool_calls"] = ol.answer_tool_calls(calls)
    if thought:
        (answer["message"] if chat else answer)["thinking"] = thought
    return answer


def _submit(engine: Engine, reqs: list[GenRequest]) -> list:
    """Every request into the engine, or none: its refusals as HTTP errors."""
    loop = asyncio.get_running_loop()
    streams = []
    try:
        for r in reqs:
            streams.append(engine.submit(r, loop))
    except RequestRejected as e:
        _cancel_all(streams)
        err = APIError(400, str(e), code="context_length_exceeded" if "context" in str(e) else None)
        if isinstance(e, ContextOverflow):  # as llama-server's exceed_context_size_error
            err.extra = {"n_prompt_tokens": e.n_prompt_tokens, "n_ctx": e.n_ctx}
        raise err from None
    except QueueFull as e:
        _cancel_all(streams)
        raise APIError(429, str(e), "rate_limit_error", code="queue_full") from None
    except ShuttingDown as e:
        _cancel_all(streams)
        raise APIError(503, str(e), "unavailable_error", code="shutting_down") from None
    except ValueError as e:  # sampling params the engine's final check refused
        _cancel_all(streams)
        raise oa.bad("", str(e)) from None
    return streams


def _prompt_ids(
    llm: Any, p: oa.GenerationParams, chat: bool, config: ServerConfig | None = None
) -> list[list[int]]:
    """Token ids of every prompt (chat: rendered with the model's template); 400 if one cannot be."""
    config = config or ServerConfig()
    try:
        if chat:
            msgs, fns = _chat_inputs(llm, p)
            ids = llm.chat_prompt(
                msgs,
                special_in_content=config.special_in_messages,
                continue_final=p.continue_final,
                tools=fns,
                template_kwargs=_template_kwargs(config, p.template_kwargs),
            )
            return [ids]
        if p.suffix:  # an insertion: the model's fill-in-the-middle prompt
            return [la.infill_ids(llm.tokenizer, x, p.suffix, n_ctx=llm.n_ctx) for x in p.prompts]
        return [llm.tokenize(x) if isinstance(x, str) else list(x) for x in p.prompts]
    except la.NoInfill as e:
        raise oa.bad("suffix", f"insertion is not supported: {e}", code="unsupported_parameter") from None
    except (ValueError, TypeError, RecursionError) as e:  # ChatTemplateError and TokenizerError included
        raise APIError(400, f"cannot build the prompt: {e}", param="messages" if chat else "prompt") from None


def _chat_inputs(llm: Any, p: oa.GenerationParams) -> tuple[list[dict], list[dict] | None]:
    """The messages and tools a chat request gives its template (the tools where it renders them)."""
    msgs, fns = p.prompts[0], None
    if p.tools is not None and p.tools.active:
        tools.require_shown(llm.template.source)
        msgs, fns = tools.template_messages(msgs), p.tools.tools
    return msgs, fns


def _template_kwargs(config: ServerConfig, kw: dict[str, Any]) -> dict[str, Any]:
    """A request's template variables, with the server's --reasoning (llama-server's: enable_thinking for
    every chat whose request does not set it)."""
    if config.enable_thinking is None or "enable_thinking" in kw:
        return kw
    return {"enable_thinking": config.enable_thinking, **kw}


def _cancel_all(streams: list) -> None:
    for s in streams:
        s.cancel()


async def _merged(streams: list) -> AsyncIterator[tuple[int, Event]]:
    """Events of several streams as they come, tagged with the stream's index."""
    if len(streams) == 1:
        async for ev in streams[0]:
            yield 0, ev
        return
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, s) -> None:
        async for ev in s:
            await q.put((i, ev))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            i, ev = await q.get()
            if ev.finish_reason is not None:
                left -= 1
            yield i, ev
    finally:
        for t in tasks:
            t.cancel()


def _sse_line(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _sse(
    streams: list,
    shaper: oa.Shaper,
    include_usage: bool,
    usage: list[int],
    per_token: bool = False,
    progress: bool = False,
) -> AsyncIterator[str]:
    """Server-sent events for a streamed request; cancels the sequences if the client goes away. A token
    whose text the stop matcher holds back brings its log-probability with the next chunk that has text;
    the last chunk (the usage chunk, if asked for) carries llama-server's `timings`. As llama-server's:
    with `per_token` each chunk carries the timings so far; with `progress` a chunk reports each part of
    the prompt read (`prompt_progress`, the first when the prompt starts, the last when it is all read)."""
    timings = _Timings()
    pending: dict[int, list] = {}  # log-probabilities not yet sent, per choice
    splitters = (
        {
            i: tools.CallStream(shaper.tool_names, shaper.one_call, shaper.live_calls)
            for i in range(len(streams))
        }
        if shaper.tool_names
        else {}
    )
    thinkers = (
        {i: reasoning.ReasoningStream(shaper.inside) for i in range(len(streams))} if shaper.reasoning else {}
    )
    try:
        if shaper.chat:
            for i in range(len(streams)):
                yield _sse_line(shaper.chunk(i, None, None, first=True))  # content null, as llama-server
        if not shaper.scored:  # an echo without scores goes first; a scored one as its scores come
            for i in shaper.echo:
                yield _sse_line(shaper.prompt_chunk(i, None))
        failed = None
        left = len(streams)
        async for i, ev in _merged(streams):
            if ev.finish_reason == "error":
                failed = failed or ev
                continue
            if ev.prompt_logprobs is not None:
                if i in shaper.echo:
                    yield _sse_line(shaper.prompt_chunk(i, ev.prompt_logprobs))
                continue
            if _progress_only(ev):
                if progress:  # a role chunk, as llama-server's, that says how far the prompt is read
                    c = shaper.chunk(i, None, None, first=True) if shaper.chat else shaper.chunk(i, "", None)
                    c["prompt_progress"] = la.prompt_progress(ev.progress)
                    if per_token:
                        c["timings"] = la.live_timings(ev.progress)
                    yield _sse_line(c)
                continue
            if ev.logprob is not None and ev.token is not None:
                pending.setdefault(i, []).append((ev.token, ev.logprob))
            if ev.usage is not None:
                timings.add(ev.usage)
            reason = ev.finish_reason
            # the reasoning apart (reasoning_content deltas), tool calls as deltas, text that may begin
            # either held back
            think, calls = thinkers.get(i), splitters.get(i)
            parts = tools.stream_parts(think, calls, ev.text) if ev.text else []
            if reason is not None:
                parts += tools.stream_parts(think, calls, None)
                reason = "tool_calls" if calls is not None and calls.ended and reason == "stop" else reason
            out: list[dict] = []  # this event's chunks
            for part in parts:
                if part.kind == "reasoning":
                    out.append(shaper.chunk(i, None, None, logprobs=pending.pop(i, None), thought=part.text))
                elif part.kind == "text":
                    out.append(shaper.chunk(i, part.text, None, logprobs=pending.pop(i, None)))
                elif part.kind != "ends":
                    call = splitters[i].calls[part.index]
                    out.append(
                        shaper.call_chunk(i, part.index, call, part.text if part.kind == "args" else None)
                    )
            if reason is not None and pending.get(i):
                out.append(shaper.chunk(i, "", None, logprobs=pending.pop(i)))
            if per_token and out and ev.progress is not None:
                out[-1]["timings"] = la.live_timings(ev.progress)
            for c in out:
                yield _sse_line(c)
            if reason is not None:
                left -= 1
                last = shaper.chunk(i, None if shaper.chat else "", reason)
                if not left and not include_usage:  # else on the usage chunk: the last, as llama-server's
                    last["timings"] = timings.body()
                yield _sse_line(last)
            if ev.usage is not None:
                usage[0] += ev.usage.prompt_tokens
                usage[1] += ev.usage.completion_tokens
                usage[2] += ev.usage.cached_tokens
        if failed is not None:
            kind = {400: "invalid_request_error", 503: "unavailable_error"}.get(failed.status, "server_error")
            yield _sse_line(APIError(failed.status, failed.error or "error", kind).body())
        elif include_usage:
            yield _sse_line({**shaper.usage_chunk(oa.usage_body(*usage)), "timings": timings.body()})
        yield "data: [DONE]\n\n"
    finally:  # normal end, or the client went away (the generator is closed / cancelled)
        _cancel_all(streams)


async def _whole(request: Request, streams: list, shaper: oa.Shaper, usage: list[int]) -> Any:
    """Collect every choice; cancel them if the client disconnects while waiting."""
    texts = [[] for _ in streams]
    logprobs: list[list] = [[] for _ in streams]
    prompt_lps: list[Any] = [None] * len(streams)  # GenRequest.prompt_logprobs, per choice
    finishes = ["length"] * len(streams)
    failed: Event | None = None
    timings = _Timings()

    async def collect() -> None:
        nonlocal failed
        async for i, ev in _merged(streams):
            texts[i].append(ev.text)
            if ev.prompt_logprobs is not None:
                prompt_lps[i] = ev.prompt_logprobs
            if ev.logprob is not None and ev.token is not None:
                logprobs[i].append((ev.token, ev.logprob))
            if ev.finish_reason == "error":
                failed = failed or ev
            elif ev.finish_reason is not None:
                finishes[i] = ev.finish_reason
            if ev.usage is not None:
                timings.add(ev.usage)
                usage[0] += ev.usage.prompt_tokens
                usage[1] += ev.usage.completion_tokens
                usage[2] += ev.usage.cached_tokens

    if not await _until_gone(request, collect(), streams):
        return Response(status_code=499)
    if failed is not None:
        kind = {400: "invalid_request_error", 503: "unavailable_error"}.get(failed.status, "server_error")
        raise APIError(failed.status, failed.error or "generation failed", kind)
    body = shaper.whole(
        ["".join(t) for t in texts],
        finishes,
        oa.usage_body(*usage),
        logprobs if shaper.piece else None,
        prompt_lps,
    )
    return {**body, "timings": timings.body()}


# ---------------------------------------------------------------------------------------------- metrics


_METRICS = [  # (engine key, prometheus name, type, help)
    ("requests_total", "requests_total", "counter", "Generation requests accepted (one per choice)."),
    ("requests_finished_stop", "requests_finished_stop_total", "counter", "Sequences ended by EOG/stop."),
    ("requests_finished_length", "requests_finished_length_total", "counter", "Sequences ended by length."),
    ("requests_cancelled", "requests_cancelled_total", "counter", "Sequences cancelled (client gone)."),
    ("requests_failed", "requests_failed_total", "counter", "Sequences that failed."),
    ("prompt_tokens_total", "prompt_tokens_total", "counter", "Prompt tokens of admitted requests."),
    ("prompt_tokens_computed_total", "prompt_tokens_computed_total", "counter", "Prompt tokens computed."),
    ("generation_tokens_total", "generation_tokens_total", "counter", "Tokens generated."),
    ("preemptions_total", "preemptions_total", "counter", "Sequences preempted for KV memory."),
    ("draft_tokens_total", "draft_tokens_total", "counter", "Speculative tokens guessed and checked."),
    ("draft_accepted_total", "draft_accepted_total", "counter", "Speculative tokens kept."),
    ("steps_total", "steps_total", "counter", "Engine steps (forward passes)."),
    ("drafts_total", "drafts_total", "counter", "Speculative guesses made (of one or more tokens)."),
    ("prompt_seconds_total", "prompt_seconds_total", "counter", "Finished requests' prompt reading."),
    ("generation_seconds_total", "generation_seconds_total", "counter", "Finished requests' generation."),
    ("queue_length", "queue_length", "gauge", "Requests waiting for a slot or memory."),
    ("running", "running_sequences", "gauge", "Sequences in the running batch."),
    ("kv_blocks_total", "kv_blocks_total", "gauge", "KV cache blocks in the pool."),
    ("kv_blocks_used", "kv_blocks_used", "gauge", "KV cache blocks held by sequences or the prefix cache."),
    ("prefix_cache_blocks", "prefix_cache_blocks", "gauge", "Blocks in the prefix cache."),
    ("prefix_cache_hit_tokens_total", "prefix_cache_hit_tokens_total", "counter", "Prompt tokens served."),
    ("prefix_cache_lookup_tokens_total", "prefix_cache_lookup_tokens_total", "counter", "Tokens looked up."),
    ("prefix_cache_hit_rate", "prefix_cache_hit_rate", "gauge", "Hit tokens / looked-up tokens."),
    ("prompt_tokens_per_second", "prompt_tokens_per_second", "gauge", "Prompt throughput, last 10 s."),
    ("generation_tokens_per_second", "generation_tokens_per_second", "gauge", "Generation tok/s, last 10 s."),
]


# llama-server's names (tools/server/server.cpp handle_metrics), from the same engine figures, for
# dashboards built on them: (name, type, help, value from the engine's metrics)
_LLAMACPP_METRICS = [
    ("prompt_tokens_total", "counter", "Number of prompt tokens processed.", "prompt_tokens_computed_total"),
    ("prompt_tokens_cached_total", "counter", "Number of prompt tokens served by the cache.",
     "prefix_cache_hit_tokens_total"),
    ("prompt_seconds_total", "counter", "Prompt process time.", "prompt_seconds_total"),
    ("tokens_predicted_total", "counter", "Number of generation tokens.", "generation_tokens_total"),
    ("tokens_predicted_seconds_total", "counter", "Predict process time.", "generation_seconds_total"),
    ("n_tokens_max", "counter", "Largest observed n_tokens.", "n_tokens_max"),
    ("spec_decode_num_draft_tokens_total", "counter", "Speculative tokens guessed.", "draft_tokens_total"),
    ("spec_decode_num_accepted_tokens_total", "counter", "Speculative tokens accepted.",
     "draft_accepted_total"),
    ("spec_decode_num_drafts_total", "counter", "Speculative guesses made.", "drafts_total"),
    ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", "prompt_tokens_per_second"),
    ("predicted_tokens_seconds", "gauge", "Generation throughput, tokens/s.", "generation_tokens_per_second"),
    ("kv_cache_usage_ratio", "gauge", "KV-cache usage. 1 means 100 percent usage.", "kv_usage"),
    ("kv_cache_tokens", "gauge", "KV-cache tokens.", "kv_tokens"),
    ("requests_processing", "gauge", "Number of requests processing.", "running"),
    ("requests_deferred", "gauge", "Number of requests deferred.", "queue_length"),
    ("n_decode_total", "counter", "Total number of llama_decode() calls.", "steps_total"),
    ("n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call.",
     "busy_rows_per_step"),
]  # fmt: skip


def _prometheus(state: State) -> str:
    ready = state.engine is not None and state.engine.accepting
    return prometheus_text(ready, state.engine.metrics() if state.engine is not None else None)


def prometheus_text(ready: bool, m: dict | None, label: str = "", head: bool = True) -> str:
    """/metrics from an engine's metrics() (None: not loaded): edgellm's names and llama-server's. A
    `label` (`replica="r1"`) goes on every sample; `head=False` leaves out the HELP/TYPE lines (a second
    series of metrics already introduced)."""
    lab = "{" + label + "}" if label else ""
    lines: list[str] = []

    def one(name: str, kind: str, text: str, v: Any) -> None:
        if head:
            lines.extend([f"# HELP {name} {text}", f"# TYPE {name} {kind}"])
        lines.append(f"{name}{lab} {v:.10g}" if isinstance(v, float) else f"{name}{lab} {v}")

    one("edgellm_ready", "gauge", "Whether the model is loaded and the server accepts requests.", int(ready))
    if m is not None:
        m = dict(m)
        for key, name, kind, text in _METRICS:
            one(f"edgellm_{name}", kind, text, m[key])
        m["kv_usage"] = m["kv_blocks_used"] / m["kv_blocks_total"] if m["kv_blocks_total"] else 0.0
        m["kv_tokens"] = m["kv_blocks_used"] * m["kv_block_size"]
        for name, kind, text, key in _LLAMACPP_METRICS:
            one(f"llamacpp:{name}", kind, text, m[key])
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- running


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def hosts_of(host: str) -> list[str]:
    """--host as the addresses to bind: one, or several comma-separated (llama-server's "127.0.0.1,::1";
    an IPv6 address bare or in brackets)."""
    return [h.strip().removeprefix("[").removesuffix("]") for h in host.split(",") if h.strip()]


def url_of(host: str, port: int) -> str:
    """The address a client would use for one bound host (IPv6 in brackets)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(
    config: ServerConfig,
    host: str = "127.0.0.1",
    port: int = 8080,
    on_ready: Callable | None = None,
    on_listening: Callable | None = None,
) -> int:
    """Run the server until SIGTERM/SIGINT; returns the exit code (1 if the model failed to load)."""
    import uvicorn

    state = State(config)
    app = create_app(state)

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:  # SIGTERM/SIGINT
            if state.engine is not None and state.engine.accepting:
                log.info("shutting down: finishing running streams (up to %.1f s)", config.shutdown_grace)
                state.engine.shutdown(config.shutdown_grace, wait=False)
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM:  # a graceful stop is a success: do not re-raise it after shutdown
                captured = getattr(self, "_captured_signals", None)
                if isinstance(captured, list) and signal.SIGTERM in captured:
                    captured.remove(signal.SIGTERM)

    socks: list[socket.socket] = []
    for h in hosts_of(host):  # bound before anything is announced: a busy port is one line, not a traceback
        try:
            socks.append(socket.create_server((h, port), family=_family(h), reuse_port=False))
        except OSError as e:
            log.error("cannot listen on %s: %s", url_of(h, port).removeprefix("http://"), e.strerror or e)
            for sk in socks:
                sk.close()
            return 1
    uv = uvicorn.Config(
        app,
        host=hosts_of(host)[0],
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=int(config.shutdown_grace) + 5,
        timeout_keep_alive=5,  # seconds an idle keep-alive connection stays open
        h11_max_incomplete_event_size=16 * 1024,  # request line + headers: 16 KiB at most
        http=http_protocol(config.header_timeout),
        lifespan="off",
    )
    server = _Server(uv)
    failed = threading.Event()
    if on_listening is not None:
        on_listening()

    def _load() -> None:
        try:
            load(state)
            if on_ready is not None:
                on_ready(state)
        except Exception:  # noqa: BLE001 - logged by load(); the server exits with an error
            failed.set()
            server.should_exit = True

    threading.Thread(target=_load, name="edgellm-load", daemon=True).start()
    server.run(sockets=socks)
    if state.engine is not None:
        state.engine.shutdown(0.0, wait=True)
    return 1 if failed.is_set() else 0
