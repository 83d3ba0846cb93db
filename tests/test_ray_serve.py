"""`edgellm serve --ray`: prefix-aware routing (routing.py, pure), the ingress's prompt keys, the CLI's
refusals, and a real Ray Serve application on loopback (2 replicas x 1 thread of SmolLM2): both replicas
get traffic, a shared prefix sticks to one replica and hits its cache, /metrics sums the replicas, a
replica killed mid-load loses no request that had not started, and Ray's processes end with the server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from edgellm.routing import PrefixTable, prefix_hashes

# ------------------------------------------------------------------------------------------ routing


def test_prefix_hashes_chain_the_blocks():
    a = list(range(100))
    b = list(range(40)) + [999] * 60
    ha, hb = prefix_hashes(a, 16), prefix_hashes(b, 16)
    assert len(ha) == 6 and len(hb) == 6  # full blocks only
    assert ha[:2] == hb[:2]  # the first 32 tokens agree
    assert ha[2] != hb[2] and ha[5] != hb[5]  # block 2 differs, and so does every later (chained) hash
    assert prefix_hashes(a[:15], 16) == []
    assert len(prefix_hashes(list(range(10_000)), 16, max_blocks=8)) == 8
    assert prefix_hashes(a, 16) == ha  # deterministic (no per-process hash seed)


def test_a_known_prefix_goes_to_its_replica_within_the_bound():
    t = PrefixTable()
    sys_a = prefix_hashes(list(range(64)), 16)
    t.record(sys_a, "r1")
    longer = prefix_hashes(list(range(64)) + [7] * 32, 16)  # the same system prompt, a longer chat
    assert t.owner(longer) == ("r1", 4)
    assert t.choose(longer, {"r1": 3, "r2": 0}, bound=4) == "r1"  # warm cache beats a little load
    assert t.choose(longer, {"r1": 5, "r2": 0}, bound=4) == "r2"  # beyond the bound: least loaded
    assert t.choose(longer, {"r2": 0, "r3": 1}, bound=4) == "r2"  # its owner is not a candidate


def test_new_prefixes_spread_over_equally_loaded_replicas():
    t = PrefixTable()
    loads = {"r1": 0, "r2": 0}
    seen = []
    for s in range(4):
        h = prefix_hashes([1000 * s + i for i in range(48)], 16)
        r = t.choose(h, loads, bound=4)
        t.record(h, r)
        seen.append(r)
    assert sorted(seen) == ["r1", "r1", "r2", "r2"]  # one at a time, yet alternating
    assert t.holds("r1") == t.holds("r2") == 2
    assert t.choose([], {"r1": 2, "r2": 1}, bound=4) == "r2"  # no key: least loaded
    with pytest.raises(ValueError):
        t.choose([], {}, bound=1)


def test_a_dead_replicas_prefixes_are_forgotten_and_the_table_is_bounded():
    t = PrefixTable(capacity=8)
    h = prefix_hashes(list(range(64)), 16)
    t.record(h, "r1")
    t.forget("r1")
    assert t.owner(h) == (None, 0) and t.holds("r1") == 0
    for s in range(10):
        t.record(prefix_hashes([s] * 32, 16), "r2")
    assert len(t) == 8 and t.holds("r2") == 8


def test_metrics_of_replicas_sum_and_the_hit_rate_is_recomputed():
    pytest.importorskip("ray.serve")
    from edgellm.ray_serve import aggregate

    m1 = {"requests_total": 3, "prefix_cache_hit_tokens_total": 30, "prefix_cache_lookup_tokens_total": 40,
          "prefix_cache_hit_rate": 0.75, "kv_block_size": 16}  # fmt: skip
    m2 = {"requests_total": 1, "prefix_cache_hit_tokens_total": 0, "prefix_cache_lookup_tokens_total": 60,
          "prefix_cache_hit_rate": 0.0, "kv_block_size": 16}  # fmt: skip
    m = aggregate([m1, m2])
    assert m["requests_total"] == 4 and m["kv_block_size"] == 16
    assert m["prefix_cache_hit_rate"] == pytest.approx(0.3)


def test_prompt_keys_follow_the_chat_template_and_ignore_what_they_cannot_read(smollm2_path):
    pytest.importorskip("ray.serve")
    from edgellm.llm import LLM
    from edgellm.ray_serve import PromptKeys

    keys = PromptKeys(str(smollm2_path), None, 16)
    system = "You are a careful assistant. " * 12
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "What is a prime? " * 8}]
    body = json.dumps({"messages": msgs}).encode()
    llm = LLM(smollm2_path, backend="reference")
    ids = llm.chat_prompt(msgs)
    assert keys.hashes("/v1/chat/completions", body) == prefix_hashes(ids, 16)  # the replica's own ids
    other = [msgs[0], {"role": "user", "content": "And a square? " * 8}]
    a = keys.hashes("/api/chat", json.dumps({"messages": other}).encode())
    b = keys.hashes("/v1/chat/completions", body)
    assert a[:4] == b[:4] and a != b  # the shared system prompt shares its blocks
    parts = [{"role": "system", "content": [{"type": "text", "text": system}]}, msgs[1]]
    assert keys.hashes("/v1/chat/completions", json.dumps({"messages": parts}).encode()) == b
    text = keys.hashes("/v1/completions", json.dumps({"prompt": system}).encode())
    assert text == prefix_hashes(llm.tokenize(system, parse_special=True), 16)
    assert keys.hashes("/completion", json.dumps({"prompt": list(range(40))}).encode()) == prefix_hashes(
        list(range(40)), 16
    )
    for bad in (b"{", b"[1, 2]", b'{"messages": "hi"}', b'{"messages": [1]}', b'{"prompt": 5}'):
        assert keys.hashes("/v1/chat/completions", bad) == []
        assert keys.hashes("/v1/completions", bad) == []
    assert keys.hashes("/tokenize", body) == []


def test_replica_counts_and_autoscaling_bounds_become_serve_options():
    pytest.importorskip("ray.serve")
    from edgellm.ray_serve import PrefixRouter, replica_options
    from edgellm.server import ServerConfig

    c = ServerConfig(model="m.gguf", parallel=4, queue_size=16)
    o = replica_options(c, 3, None, None, threads=2)
    assert o["num_replicas"] == 3 and "autoscaling_config" not in o
    assert o["ray_actor_options"] == {"num_cpus": 2} and o["max_ongoing_requests"] == 4
    assert o["max_queued_requests"] == 16
    assert o["request_router_config"].request_router_kwargs == {"bound": 1}
    cls = o["request_router_config"].request_router_class
    assert cls in (PrefixRouter, "edgellm.ray_serve.PrefixRouter")
    a = replica_options(c, 2, 1, 5, threads=1)["autoscaling_config"]
    assert a == {"min_replicas": 1, "max_replicas": 5, "initial_replicas": 2, "target_ongoing_requests": 2}
    a = replica_options(c, 2, 3, None, threads=1)["autoscaling_config"]
    assert (a["min_replicas"], a["max_replicas"], a["initial_replicas"]) == (3, 3, 3)
    a = replica_options(c, 8, None, 4, threads=1)["autoscaling_config"]
    assert (a["min_replicas"], a["max_replicas"], a["initial_replicas"]) == (1, 4, 4)
    # Ray Serve itself accepts them
    from ray import serve

    serve.deployment(lambda: None, **{**replica_options(c, 2, 1, 5, 1), "name": "x"})


# ------------------------------------------------------------------------------------------ the CLI


@pytest.mark.parametrize(
    "args, what",
    [
        (["--replicas", "3"], "--replicas needs --ray"),
        (["--min-replicas", "1"], "--min-replicas needs --ray"),
        (["--ray-address", "ray://h:10001"], "--ray-address needs --ray"),
        (["--ray", "--replicas", "0"], "--replicas must be positive"),
        (
            ["--ray", "--min-replicas", "3", "--max-replicas", "2"],
            "--min-replicas 3 is above --max-replicas 2",
        ),
    ],
)
def test_ray_options_are_checked_in_one_line(args, what):
    r = subprocess.run(
        [sys.executable, "-m", "edgellm", "serve", "smollm2-135m", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and what in r.stderr and "Traceback" not in r.stderr


def test_ray_without_ray_serve_says_what_to_install(monkeypatch):
    import builtins

    from edgellm.cli_serve import ServeError, ray_checks

    real = builtins.__import__

    def no_ray(name, *a, **k):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(f"No module named {name!r}", name=name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(ServeError, match=r"pip install 'edgellm\[ray\]'"):
        ray_checks(True, 2, None, None, None, 1)


# ------------------------------------------------------------------------------------------ on Ray

SYSTEMS = [
    "You are Edge, a patient tutor for children. Explain every idea with a small story about animals "
    "that live in a forest, use short sentences, and end with one question the child can answer.",
    "You are Quill, an exacting copy editor. Rewrite the user's text in plain formal English, keep its "
    "meaning, remove every cliche, and list at the end each change you made and why you made it.",
]


def _ray_pids() -> set[int]:
    """Processes of Ray (its GCS, raylet, agents, workers) on this machine."""
    out = set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
        except OSError:
            continue
        if b"ray::" in cmd or b"/ray/" in cmd:
            out.add(int(d))
    return out


def _replica_pids() -> set[int]:
    out = set()
    for pid in _ray_pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"ServeReplica:edgellm:EdgellmReplica" in f.read():
                    out.add(pid)
        except OSError:
            pass
    return out


@pytest.fixture(scope="module")
def ray_server(smollm2_path, tmp_path_factory):
    pytest.importorskip("ray.serve")
    pytest.importorskip("httpx")
    from test_server import Server

    before = _ray_pids()
    srv = Server(smollm2_path, tmp_path_factory.mktemp("ray") / "serve.log", "--ray", "--replicas", "2")
    try:
        _wait_replicas(srv, 2, 300)
        srv.started = _ray_pids() - before
        yield srv
    finally:
        srv.stop()


def _wait_replicas(srv, n: int, seconds: float) -> None:
    """Until /health counts n ready replicas (Serve's proxy answers in its own words before the app runs)."""
    import httpx

    end = time.monotonic() + seconds
    while True:
        assert srv.proc.poll() is None, f"server exited: {srv.read_log()}"
        try:
            r = httpx.get(srv.url + "/health", timeout=10)
            if r.headers.get("content-type", "").startswith("application/json"):
                if r.json().get("replicas_ready") == n:
                    return
        except httpx.TransportError:
            pass
        assert time.monotonic() < end, srv.read_log()
        time.sleep(0.5)


def _chat(url: str, system: str, question: str, max_tokens: int = 8, stream: bool = False, timeout=120):
    import httpx

    body = {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": max_tokens, "temperature": 0, "stream": stream,
    }  # fmt: skip
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout)


def _metrics(url: str) -> dict[str, float]:
    import httpx

    out = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def test_shared_prefixes_stick_to_a_replica_and_both_replicas_serve(ray_server):
    url = ray_server.url
    got: dict[int, set[str]] = {0: set(), 1: set()}
    for q in ("What is rain?", "Why do owls hoot?", "What is snow?"):
        for s in (0, 1):
            r = _chat(url, SYSTEMS[s], q)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"]
            got[s].add(r.headers["x-edgellm-replica"])
    assert len(got[0]) == 1 and len(got[1]) == 1, got  # each system prompt kept its replica
    assert got[0] != got[1], got  # and the two went to different replicas
    end = time.monotonic() + 10  # replicas report every REPORT_S: the last request shows a moment later
    while (m := _metrics(url)).get("edgellm_requests_total", 0) < 6 and time.monotonic() < end:
        time.sleep(0.3)
    assert m["edgellm_replicas_ready"] == 2
    names = {k.split('"')[1] for k in m if 'replica="' in k}
    assert names == got[0] | got[1]
    total = sum(m[f'edgellm_requests_total{{replica="{n}"}}'] for n in names)
    assert m["edgellm_requests_total"] == total >= 6
    for n in names:  # the 2nd and 3rd chat of each prompt reused 2+ blocks of its ~45-token system prompt
        assert m[f'edgellm_prefix_cache_hit_tokens_total{{replica="{n}"}}'] >= 2 * 32


def test_streams_and_other_routes_pass_through(ray_server):
    import httpx

    url = ray_server.url
    r = _chat(url, SYSTEMS[0], "Count to three.", max_tokens=6, stream=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"]
    r = httpx.post(url + "/api/generate", json={"model": "x", "prompt": "Hi", "stream": False}, timeout=60)
    assert r.status_code in (200, 404) and "x-edgellm-replica" in r.headers
    r = httpx.get(url + "/v1/models", timeout=30)
    assert r.status_code == 200 and r.json()["data"][0]["id"]
    r = httpx.post(url + "/v1/chat/completions", json={"messages": "nope"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["message"]  # the replica's own error
    assert httpx.get(url + "/no/such/route", timeout=30).status_code == 404


def test_a_killed_replica_loses_no_request_that_had_not_started(ray_server):
    url = ray_server.url
    victims = sorted(_replica_pids())
    assert len(victims) == 2
    results: list = []
    streams: list = []

    def whole(i: int) -> None:
        results.append(_chat(url, SYSTEMS[i % 2], f"Tell me about the number {i}.", max_tokens=48))

    def stream(i: int) -> None:
        streams.append(_chat(url, SYSTEMS[i % 2], f"Describe colour {i}.", max_tokens=48, stream=True))

    with ThreadPoolExecutor(10) as pool:
        futs = [pool.submit(whole, i) for i in range(8)] + [pool.submit(stream, i) for i in range(2)]
        time.sleep(1.5)  # requests routed, some running, some waiting in the router
        os.kill(victims[0], signal.SIGKILL)
        for f in futs:
            f.result(timeout=240)  # none hangs
    assert len(results) == 8 and all(r.status_code == 200 for r in results), [r.text for r in results]
    assert all(r.json()["choices"][0]["message"]["content"] for r in results)
    for r in streams:  # a stream either finished or ended with an error event, never silently
        last = [ln for ln in r.text.splitlines() if ln.startswith("data: ")][-1]
        assert last == "data: [DONE]" or '"error"' in last, r.text[-500:]
    # Ray restarts the replica. Until its controller notices the death, /health may still count the dead
    # replica as ready, so wait for the new process first, then for /health
    end = time.monotonic() + 180
    while len(pids := _replica_pids()) != 2 or victims[0] in pids:
        assert time.monotonic() < end, f"{pids}, killed {victims[0]}: {ray_server.read_log()[-2000:]}"
        time.sleep(0.5)
    _wait_replicas(ray_server, 2, 180)


def test_the_servers_ray_processes_end_with_it(ray_server):
    started = ray_server.started
    assert started, "no Ray process was started"
    ray_server.stop()
    assert ray_server.proc.returncode == 0, ray_server.read_log()
    end = time.monotonic() + 60
    while started & _ray_pids():
        assert time.monotonic() < end, f"left running: {started & _ray_pids()}"
        time.sleep(0.5)


def test_health_counts_ready_replicas_only():
    pytest.importorskip("ray.serve")
    from edgellm.ray_serve import health_body

    assert health_body({"a": (True, None), "b": (False, None)}, 2) == (
        200, {"status": "ok", "replicas_ready": 1, "replicas": 2},
    )  # fmt: skip
    assert health_body({}, 2)[0] == 503 and health_body({"a": (False, None)}, 2)[0] == 503


class _Dying:
    """A replica's response generator that yields its pieces, then loses its replica."""

    def __init__(self, pieces):
        self.pieces = list(pieces)
        self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        from ray.exceptions import ActorDiedError

        if self.pieces:
            return self.pieces.pop(0)
        raise ActorDiedError()

    def cancel(self):
        self.cancelled = True


@pytest.mark.parametrize(
    "kind, tail",
    [
        (
            "text/event-stream; charset=utf-8",
            'data: {"error": {"message": "the replica serving this stream died"',
        ),
        ("application/x-ndjson", '{"error": "the replica serving this stream died"}'),
        ("application/json", None),
    ],
)
def test_a_stream_whose_replica_dies_ends_with_an_error_in_its_own_framing(kind, tail):
    pytest.importorskip("ray.serve")
    import asyncio

    from edgellm.ray_serve import _rest

    gen = _Dying([b"data: 1\n\n", b"data: 2\n\n"])

    async def collect():
        return [c async for c in _rest(gen, kind)]

    out = asyncio.run(asyncio.wait_for(collect(), 10))
    assert out[:2] == [b"data: 1\n\n", b"data: 2\n\n"] and gen.cancelled
    if tail is None:
        assert len(out) == 2  # a whole answer cut short: the client sees a short body, not a forged one
    else:
        assert out[2].decode().startswith(tail)
