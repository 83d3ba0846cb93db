"""`edgellm serve MODEL --ray`: many edgellm engines behind one endpoint, on Ray Serve (the `ray` extra).

Three parts, each a Ray Serve piece rather than a home-made cluster:

- `EdgellmReplica` (a deployment, N replicas): one whole edgellm server each (server.State, its Engine with
  its own KV and prefix cache, every route of server.create_app). A request reaches it as the HTTP
  request's parts; the replica runs its ASGI app in process and streams back the response start (status,
  headers, its name) and then the body as it is written, so streams stay streams.
- `EdgellmIngress` (one replica, no CPU): the HTTP entry behind Serve's proxy. It tokenizes the start of
  a generation request's prompt (the chat template for chat routes), hashes its first blocks
  (routing.prefix_hashes) and calls the replicas through a handle whose router is `PrefixRouter`. It
  answers /health (how many replicas are ready) and /metrics (every replica's, summed and labelled) itself.
- `PrefixRouter` (a Ray Serve RequestRouter, in the ingress's process): routing.PrefixTable over the live
  replicas, load as requests in flight from this router.

Faults: Ray restarts a replica that dies (health checks every 2 s). A request still queued in the router
is routed again by Ray; one the dead replica took but had not answered (no response start) is sent again,
to another replica; a response already streaming ends with an error event (SSE: `data: {"error":...}`,
NDJSON: `{"error": ...}`), never a hang. A replica takes at most `parallel` requests (its slots), so what
waits, waits in the router, where it can still go elsewhere.
"""

import asyncio
import json
import logging
import os
import signal
import threading
import time
from dataclasses import replace
from typing import Any

import ray
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.config import RequestRouterConfig
from ray.serve.exceptions import BackPressureError
from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from edgellm.openai_api import APIError
from edgellm.routing import BLOCK_TOKENS, MAX_BLOCKS, PrefixTable, prefix_hashes
from edgellm.server import _error, key_matches, prometheus_text

log = logging.getLogger("edgellm.ray")

APP = "edgellm"
NAMESPACE = "serve"  # Serve's replicas run in Ray's "serve" namespace: the registry lives there too
REPORT_S = 1.0  # how often a replica reports its metrics
STALE_S = 4.0  # a replica not heard from for this long is not counted (it died or hangs)
QUIET = {"log_level": "WARNING", "enable_access_log": False}  # Serve's own lines; edgellm logs its own
RETRIES = 3  # times a request whose replica died before answering is sent again
_LOST = (RayActorError, ActorDiedError, ActorUnavailableError)

CHAT_ROUTES = ("/v1/chat/completions", "/chat/completions", "/api/chat")
RESPONSES_ROUTES = ("/v1/responses", "/responses")
TEXT_ROUTES = ("/v1/completions", "/completion", "/completions", "/api/generate")


# ---------------------------------------------------------------------------------------------- routing


class PrefixRouter(RequestRouter):
    """Ray Serve request router: a request goes to the replica that served its longest prompt prefix
    (routing.PrefixTable), unless that replica has `bound` more requests in flight than the least loaded
    (a quarter of a replica's slots: a warm prefix saves one prefill, an idle replica on another machine
    doubles the decode speed).
    The chosen replica is the first rank; the others follow, least loaded first, so a full replica (all
    its slots taken) gives way to the next rather than making the request wait."""

    def initialize_state(self, bound: int = 4, capacity: int = 1 << 16, **_: Any) -> None:
        self.bound = int(bound)
        self.table = PrefixTable(capacity)
        self.inflight: dict[ReplicaID, int] = {}
        self.where: dict[str, ReplicaID] = {}  # internal request id -> its replica, until it completes

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        hashes = _prefix_of(pending_request)
        loads = {r.replica_id: self.inflight.get(r.replica_id, 0) for r in candidate_replicas}
        pick = self.table.choose(hashes, loads, self.bound)
        # owned from the choice on (on_request_routed confirms it): requests with new prefixes that are
        # routed at the same moment, all seeing the same loads, spread instead of piling on one replica
        self.table.record(hashes, pick)
        first = [r for r in candidate_replicas if r.replica_id == pick]
        rest = sorted(
            (r for r in candidate_replicas if r.replica_id != pick), key=lambda r: loads[r.replica_id]
        )
        return [first, rest] if rest else [first]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        self.table.record(_prefix_of(pending_request), replica_id)
        rid = pending_request.metadata.internal_request_id
        if rid not in self.where:
            self.where[rid] = replica_id
            self.inflight[replica_id] = self.inflight.get(replica_id, 0) + 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        r = self.where.pop(internal_request_id, None)
        if r is not None and self.inflight.get(r, 0) > 0:
            self.inflight[r] -= 1

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.table.forget(replica_id)
        self.inflight.pop(replica_id, None)


def _prefix_of(pending: PendingRequest | None) -> list[int]:
    if pending is None:
        return []
    p = pending.kwargs.get("prefix")
    return list(p) if isinstance(p, (list, tuple)) else []


class PromptKeys:
    """The ingress's view of a request's prompt: the model's tokenizer and chat template (no weights), so
    the prefix hashes are of the token ids the replica will see. Anything it cannot read (bad JSON, a
    template that fails) gets no key: the replica answers it, with its own error."""

    LIMIT = BLOCK_TOKENS * MAX_BLOCKS * 8  # characters tokenized: more than MAX_BLOCKS blocks' worth

    def __init__(self, path: str, chat_template: str | None, block: int):
        from edgellm.chat import ChatTemplate
        from edgellm.gguf import ModelFile
        from edgellm.tokenizer import Tokenizer

        f = ModelFile(path)
        self.tokenizer = Tokenizer.from_gguf(f)
        self.template = ChatTemplate.from_gguf(f, override=chat_template)
        self.block = block

    def hashes(self, path: str, body: bytes) -> list[int]:
        try:
            req = json.loads(body)
            if not isinstance(req, dict):
                return []
            ids = self._ids(path, req)
        except Exception:  # noqa: BLE001 - a request we cannot key is routed by load alone
            return []
        return prefix_hashes(ids, self.block) if ids else []

    def _ids(self, path: str, req: dict) -> list[int]:
        text: Any = None
        if path in CHAT_ROUTES:
            text = self._chat(req.get("messages"), req.get("tools"))
        elif path in RESPONSES_ROUTES:
            inp = req.get("input")
            msgs = [{"role": "user", "content": inp}] if isinstance(inp, str) else inp
            if isinstance(req.get("instructions"), str) and isinstance(msgs, list):
                msgs = [{"role": "system", "content": req["instructions"]}, *msgs]
            text = self._chat(msgs, req.get("tools"))
        elif path in TEXT_ROUTES:
            prompt = req.get("prompt")
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                return prompt
            if isinstance(prompt, list) and prompt:
                prompt = prompt[0]
            if isinstance(prompt, str) and isinstance(req.get("system"), str):  # Ollama's generate
                prompt = req["system"] + "\n" + prompt
            text = prompt
        if not isinstance(text, str) or not text:
            return []
        ids = self.tokenizer.encode(text[: self.LIMIT], add_special=True, parse_special=True)
        return ids[: -self.block] if len(text) > self.LIMIT else ids  # the cut's last block may differ

    def _chat(self, messages: Any, tools: Any) -> str | None:
        if not isinstance(messages, list):
            return None
        msgs = []
        for m in messages:
            if not isinstance(m, dict):
                return None
            c = m.get("content")
            if isinstance(c, list):  # content parts: their text
                c = "".join(
                    p.get("text", "") for p in c if isinstance(p, dict) and isinstance(p.get("text"), str)
                )
            msgs.append({**m, "content": c if c is not None else ""})
        strip = self.tokenizer.add_bos
        return self.template.render(msgs, tools=tools or None, add_generation_prompt=True, strip_bos=strip)


# ---------------------------------------------------------------------------------------------- registry


@ray.remote(num_cpus=0)
class Registry:
    """Where replicas report, every REPORT_S, whether they are ready and their engine's metrics."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[float, bool, dict | None]] = {}

    def report(self, name: str, ready: bool, metrics: dict | None) -> None:
        self.seen[name] = (time.time(), ready, metrics)

    def forget(self, name: str) -> None:
        self.seen.pop(name, None)

    def snapshot(self, max_age: float = STALE_S) -> dict[str, tuple[bool, dict | None]]:
        now = time.time()
        return {n: (ready, m) for n, (t, ready, m) in self.seen.items() if now - t <= max_age}


def health_body(snapshot: dict, expected: int) -> tuple[int, dict]:
    """/health from the registry's snapshot: 200 while one replica or more is ready, else 503."""
    ready = sum(1 for ok, _ in snapshot.values() if ok)
    body = {"status": "ok" if ready else "loading", "replicas_ready": ready, "replicas": expected}
    return (200 if ready else 503), body


def aggregate(metrics: list[dict]) -> dict:
    """Engines' metrics() summed (the prefix hit rate recomputed from the sums; one block size)."""
    out: dict[str, Any] = {}
    for m in metrics:
        for k, v in m.items():
            out[k] = out.get(k, 0) + v
    if metrics:
        out["kv_block_size"] = metrics[0]["kv_block_size"]
        look = out.get("prefix_cache_lookup_tokens_total", 0)
        out["prefix_cache_hit_rate"] = out.get("prefix_cache_hit_tokens_total", 0) / look if look else 0.0
    return out


# ---------------------------------------------------------------------------------------------- replica


class EdgellmReplica:
    """One edgellm server (model, engine, every route) as a Ray Serve replica."""

    def __init__(self, config: Any, registry: str):
        from edgellm import server

        self.state = server.State(config)
        server.load(self.state)
        self.app = server.create_app(self.state)
        self.name = serve.get_replica_context().replica_id.unique_id
        self.registry = ray.get_actor(registry, namespace=NAMESPACE)
        self._stop = threading.Event()
        threading.Thread(target=self._report, name="edgellm-report", daemon=True).start()
        log.info("replica %s ready", self.name)

    def _report(self) -> None:
        while not self._stop.is_set():
            e = self.state.engine
            try:
                self.registry.report.remote(self.name, bool(e and e.accepting), e.metrics() if e else None)
            except Exception:  # noqa: BLE001 - the registry is gone: the application is being deleted
                return
            self._stop.wait(REPORT_S)

    def check_health(self) -> None:  # Ray Serve's health check
        e = self.state.engine
        if e is None or not e.running:
            raise RuntimeError("the engine is not running")

    async def handle(self, req: dict, prefix: list[int] | None = None):
        """Run one HTTP request through this replica's app; yields (status, headers, replica name), then
        the body in pieces as the app writes them."""
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "http",
            "method": req["method"], "path": req["path"], "raw_path": req["path"].encode(),
            "query_string": req["query"], "root_path": "", "headers": req["headers"],
            "client": req.get("client"), "server": req.get("server"),
        }  # fmt: skip
        out: asyncio.Queue = asyncio.Queue()
        gone = asyncio.Event()
        sent = False

        async def receive() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": req["body"], "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            await out.put(message)

        app = asyncio.ensure_future(self.app(scope, receive, send))
        try:
            while True:
                get = asyncio.ensure_future(out.get())
                done, _ = await asyncio.wait({get, app}, return_when=asyncio.FIRST_COMPLETED)
                if get not in done:
                    get.cancel()
                    if out.empty():
                        app.result()  # the app's own exception, if it failed
                        return
                    continue
                msg = get.result()
                if msg["type"] == "http.response.start":
                    heads = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in msg.get("headers", [])]
                    yield (msg["status"], heads, self.name)
                    continue
                if msg["type"] != "http.response.body":
                    continue
                chunk, more = msg.get("body", b""), msg.get("more_body", False)
                while more and not out.empty():  # what is already written goes as one piece
                    nxt = out.get_nowait()
                    chunk += nxt.get("body", b"")
                    more = nxt.get("more_body", False)
                if chunk:
                    yield chunk
                if not more:
                    return
        finally:  # the end, or the caller went away (Ray cancels this generator): the app sees a disconnect
            gone.set()
            if not app.done():
                app.cancel()

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
        state = getattr(self, "state", None)
        if state is not None and state.engine is not None:
            state.engine.shutdown(state.config.shutdown_grace, wait=True)
        reg = getattr(self, "registry", None)
        if reg is not None:
            try:
                reg.forget.remote(self.name)
            except Exception:  # noqa: BLE001
                pass


# ---------------------------------------------------------------------------------------------- ingress

ingress_app = FastAPI(title="edgellm (Ray Serve)", docs_url=None, redoc_url=None, openapi_url=None)


async def _rest(gen: Any, content_type: str):
    """The body after the response start; a replica lost mid-stream ends it with an error in the stream's
    own framing. The client going away cancels the replica's generator (and so its sequence)."""
    try:
        async for chunk in gen:
            yield chunk
    except _LOST:
        err = APIError(503, "the replica serving this stream died", "unavailable_error").body()
        if "text/event-stream" in content_type:
            yield f"data: {json.dumps(err)}\n\n".encode()
        elif "ndjson" in content_type:
            yield (json.dumps({"error": err["error"]["message"]}) + "\n").encode()
    finally:
        gen.cancel()


# serve.ingress copies the class with the module's names as they are here: what it uses is defined above
@serve.ingress(ingress_app)
class EdgellmIngress:
    def __init__(self, replicas: Any, config: Any, registry: str, expected: int):
        self.replicas = replicas.options(stream=True)
        self.config = config
        self.keys = PromptKeys(config.model, config.chat_template, config.block_size)
        self.registry = ray.get_actor(registry, namespace=NAMESPACE)
        self.expected = expected
        self.key = config.api_key.encode() if config.api_key else None

    async def _snapshot(self) -> dict:
        return await self.registry.snapshot.remote()

    @ingress_app.get("/health")
    async def health(self):
        status, body = health_body(await self._snapshot(), self.expected)
        return JSONResponse(body, status_code=status)

    @ingress_app.get("/metrics")
    async def metrics(self, request: Request):
        if self.key is not None and not key_matches(request.scope["headers"], self.key):
            return _error(APIError(401, "Invalid API key", code="invalid_api_key"))
        snap = await self._snapshot()
        loaded = [m for _, m in snap.values() if m is not None]
        ready = sum(1 for ok, _ in snap.values() if ok)
        text = "# HELP edgellm_replicas_ready Replicas whose engine accepts requests.\n"
        text += f"# TYPE edgellm_replicas_ready gauge\nedgellm_replicas_ready {ready}\n"
        text += prometheus_text(ready > 0, aggregate(loaded) if loaded else None)
        for name, (ok, m) in sorted(snap.items()):
            text += prometheus_text(ok, m, label=f'replica="{name}"', head=False)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @ingress_app.api_route(
        "/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]
    )
    async def forward(self, request: Request, path: str):
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > self.config.max_body:
            return _error(APIError(413, f"request body over {self.config.max_body} bytes"))
        body = await request.body()
        req = {
            "method": request.method, "path": request.url.path, "query": request.url.query.encode("latin-1"),
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()],
            "body": body, "client": tuple(request.client) if request.client else None,
            "server": None,
        }  # fmt: skip
        prefix = self.keys.hashes(req["path"], body) if request.method == "POST" else []
        for attempt in range(RETRIES + 1):
            gen = self.replicas.handle.remote(req, prefix=prefix)
            try:
                status, heads, name = await gen.__anext__()
                break
            except BackPressureError:
                return _error(
                    APIError(429, "every replica's queue is full", "rate_limit_error", code="queue_full")
                )
            except _LOST as e:
                log.warning(
                    "a replica died before answering %s (attempt %d): %s", req["path"], attempt + 1, e
                )
                continue
        else:
            return _error(APIError(503, "the replicas serving this request died", "unavailable_error"))
        heads = [(k, v) for k, v in heads if k.lower() not in ("transfer-encoding", "connection")]
        heads.append(("x-edgellm-replica", name))
        kind = next((v for k, v in heads if k.lower() == "content-type"), "")
        resp = StreamingResponse(_rest(gen, kind), status_code=status)
        resp.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in heads]
        return resp


# ---------------------------------------------------------------------------------------------- running


def imbalance(parallel: int) -> int:
    """How many more requests in flight than the least loaded replica a warm replica may carry."""
    return max(1, parallel // 4)


def replica_options(
    config: Any, replicas: int, min_replicas: int | None, max_replicas: int | None, threads: int
) -> dict[str, Any]:
    """The replicas' deployment options: `replicas` fixed, or with --min/--max-replicas Ray Serve's
    autoscaling between them (starting at `replicas` within the bounds, aiming at half the slots busy)."""
    opts: dict[str, Any] = dict(
        name="EdgellmReplica",
        ray_actor_options={"num_cpus": threads},
        max_ongoing_requests=config.parallel,
        max_queued_requests=config.queue_size or -1,
        logging_config=QUIET,
        health_check_period_s=2.0,
        health_check_timeout_s=30.0,
        graceful_shutdown_timeout_s=config.shutdown_grace,
        graceful_shutdown_wait_loop_s=0.5,
        request_router_config=RequestRouterConfig(
            request_router_class=PrefixRouter, request_router_kwargs={"bound": imbalance(config.parallel)}
        ),
    )
    if min_replicas is None and max_replicas is None:
        opts["num_replicas"] = replicas
        return opts
    lo = min_replicas if min_replicas is not None else 1
    hi = max_replicas if max_replicas is not None else max(lo, replicas)
    opts["autoscaling_config"] = {
        "min_replicas": lo,
        "max_replicas": hi,
        "initial_replicas": min(max(lo, replicas), hi),
        "target_ongoing_requests": max(1, config.parallel // 2),
    }
    return opts


def build(config: Any, opts: dict[str, Any], registry: str) -> Any:
    """The Serve application: the replicas' deployment and the ingress over it."""
    backend = serve.deployment(EdgellmReplica, **opts).bind(config, registry)
    ingress = serve.deployment(
        EdgellmIngress,
        name="EdgellmIngress",
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=4096,
        logging_config=QUIET,
    )
    expected = opts.get("num_replicas") or opts["autoscaling_config"]["initial_replicas"]
    return ingress.bind(backend, config, registry, expected)


def run(
    config: Any,
    host: str = "127.0.0.1",
    port: int = 8080,
    replicas: int = 2,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    address: str | None = None,
    on_ready: Any = None,
) -> int:
    """Serve `config`'s model on Ray Serve until SIGTERM/SIGINT; returns the exit code. Without `address`
    a local Ray instance is started and, at exit, stopped; with one, only this application is removed."""
    threads = config.threads or max(1, (os.cpu_count() or 1) // max(replicas, max_replicas or 1))
    config = replace(config, threads=threads)
    if address:
        ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING)
    else:
        os.environ.pop("RAY_ADDRESS", None)
        need = threads * max(replicas, max_replicas or 0, min_replicas or 0)
        ray.init(
            num_cpus=max(os.cpu_count() or 1, need), include_dashboard=False, namespace=NAMESPACE,
            logging_level=logging.WARNING,
        )  # fmt: skip
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    code = 0
    try:
        serve.start(http_options={"host": host, "port": port, "location": "HeadOnly"}, logging_config=QUIET)
        registry = f"edgellm-registry-{os.getpid()}"
        reg = Registry.options(name=registry, namespace=NAMESPACE).remote()
        ray.get(reg.snapshot.remote())
        app = build(config, replica_options(config, replicas, min_replicas, max_replicas, threads), registry)
        try:
            serve.run(app, name=APP, route_prefix="/", blocking=False)
        except RuntimeError as e:  # the replicas could not start (a bad model, too little memory...)
            log.error("the replicas failed to start: %s", str(e).strip().splitlines()[0])
            return 1
        if on_ready is not None:
            on_ready(threads)
        while not stop.wait(0.5):
            pass
        log.info("shutting down: letting running requests finish (up to %.1f s)", config.shutdown_grace)
    finally:
        try:
            serve.delete(APP)
            if not address:
                serve.shutdown()
        except Exception as e:  # noqa: BLE001 - still shut Ray down
            log.warning("could not remove the application cleanly: %s", e)
            code = 1
        ray.shutdown()
    return code


__all__ = [
    "EdgellmIngress",
    "EdgellmReplica",
    "PrefixRouter",
    "PromptKeys",
    "aggregate",
    "build",
    "replica_options",
    "run",
]
