"""The continuous-batching engine on the real SmolLM2 (native, the default backend, and numba): batched and
chunked results equal single-stream ones, cancellation, isolation of a failing request, preemption,
prefix-cache reuse."""

from __future__ import annotations

import pytest

from edgellm.engine import Engine, GenRequest, QueueFull, RequestRejected
from edgellm.sampler import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module", params=["native", "numba"])
def llm(smollm2_path, request):
    import edgellm
    from edgellm.backends import BackendUnavailable

    try:
        return edgellm.LLM(smollm2_path, backend=request.param, n_ctx=256, threads=1)
    except BackendUnavailable as e:
        pytest.skip(str(e))


def _engine(llm, start: bool = True, **kw) -> Engine:
    opts = dict(n_ctx=256, max_seqs=4, block_size=4, max_batch_tokens=16)
    opts.update(kw)
    e = Engine(llm.model, llm.tokenizer, **opts)
    if start:
        e.start()
    return e


def _tokens(stream) -> tuple[list[int], str, str]:
    evs = list(stream)
    return [e.token for e in evs if e.token is not None], "".join(e.text for e in evs), evs[-1].finish_reason


def _alone(llm, prompt: str, params: SamplingParams, n: int) -> list[int]:
    return llm.generate(
        prompt, max_tokens=n, **{k: getattr(params, k) for k in ("temperature", "seed")}
    ).tokens


PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "def fib(n):",
    "In a shocking finding, scientists discovered a herd of unicorns living in a remote valley",
    "Hello, my name is",
]


def test_batched_chunked_prefill_gives_each_sequence_its_single_stream_tokens(llm):
    """Five sequences with their own params in 4 slots, prompts fed in chunks of <= 16 tokens mixed with
    other sequences' decode tokens: each gets exactly the tokens `LLM.generate` gives it alone."""
    params = [
        GREEDY,
        SamplingParams(temperature=0.9, seed=5),
        GREEDY,
        GREEDY,
        SamplingParams(temperature=0.7, seed=1),
    ]
    want = [_alone(llm, p, q, 8) for p, q in zip(PROMPTS, params)]
    eng = _engine(llm)
    try:
        streams = [eng.submit(GenRequest(llm.tokenize(p), q, 8)) for p, q in zip(PROMPTS, params)]
        got = [_tokens(s) for s in streams]
    finally:
        eng.shutdown()
    assert [g[0] for g in got] == want
    assert all(g[2] == "length" for g in got)
    # nothing leaked: every block still in use is one only the prefix cache holds (cached or a parked tail)
    assert eng.stats.finished["length"] == 5 and eng.kv.n_used() == eng.kv.prefix.n_evictable()


def test_shared_prefix_is_served_from_the_cache_with_the_same_tokens(llm):
    system = "You are a helpful assistant who answers in one short sentence. " * 3
    eng = _engine(llm)
    try:
        first = eng.submit(GenRequest(llm.tokenize(system + "What is 2+2?"), GREEDY, 6))
        a = list(first)
        second = eng.submit(GenRequest(llm.tokenize(system + "Name a color."), GREEDY, 6))
        b = list(second)
    finally:
        eng.shutdown()
    assert a[-1].usage.cached_tokens == 0
    n_system = len(llm.tokenize(system))
    assert b[-1].usage.cached_tokens >= n_system // 4 * 4 - 4  # whole blocks of the shared system prompt
    assert [e.token for e in b if e.token is not None] == _alone(llm, system + "Name a color.", GREEDY, 6)
    assert eng.kv.prefix.hit_rate > 0.3


def test_a_prompt_that_leaves_the_cache_inside_a_block_reuses_its_first_tokens(llm):
    """Token-granular reuse, as llama-server's: the same prompt again is served all but its last token,
    one that differs from a cached prompt inside a block up to the difference (that block's first
    tokens copied into a block of its own); both give the tokens they give without a prefix cache."""
    first = llm.tokenize(PROMPTS[3])
    cut = len(first) - 3 if (len(first) - 3) % 4 else len(first) - 2  # inside a block of 4
    other = first[:cut] + llm.tokenizer.encode(" and a dragon", add_special=False)
    eng = _engine(llm)
    try:
        runs = [list(eng.submit(GenRequest(list(p), GREEDY, 4))) for p in (first, first, other, other)]
    finally:
        eng.shutdown()
    plain = _engine(llm, prefix_caching=False)
    try:
        want = [_tokens(plain.submit(GenRequest(list(p), GREEDY, 4)))[0] for p in (first, other)]
    finally:
        plain.shutdown()
    assert [r[-1].usage.cached_tokens for r in runs] == [0, len(first) - 1, cut, len(other) - 1]
    assert [[e.token for e in r if e.token is not None] for r in runs] == [want[0]] * 2 + [want[1]] * 2
    assert eng.kv.n_used() == eng.kv.prefix.n_evictable()


def test_a_request_for_no_tokens_reads_its_prompt_into_the_cache(llm):
    """max_tokens 0 (llama-server's n_predict 0, which its web UI sends to warm the cache for the next
    turn): no token, finish length, and the next request with that prefix finds it cached. So does one
    that ends with its first token, its prompt read in that same step (it was lost to the cache)."""
    system = "You are a helpful assistant who answers in one short sentence. " * 2
    n_shared = len(llm.tokenize(system)) // 4 * 4 - 4  # whole blocks, the last token's aside
    eng = _engine(llm, max_batch_tokens=64)  # each prompt in one step
    try:
        warm = list(eng.submit(GenRequest(llm.tokenize(system), GREEDY, 0)))
        after = list(eng.submit(GenRequest(llm.tokenize(system + "Name a color."), GREEDY, 3)))
        one = list(eng.submit(GenRequest(llm.tokenize("Hi! " + system), GREEDY, 1)))
        again = list(eng.submit(GenRequest(llm.tokenize("Hi! " + system + "Name a color."), GREEDY, 1)))
        with pytest.raises(RequestRejected, match="at least 0"):
            eng.submit(GenRequest(llm.tokenize(system), GREEDY, -1))
    finally:
        eng.shutdown()
    assert len(warm) == 1 and warm[0].finish_reason == "length" and warm[0].text == ""
    assert warm[0].usage.completion_tokens == 0 and warm[0].usage.cached_tokens == 0
    assert after[-1].usage.cached_tokens >= n_shared
    assert one[-1].usage.cached_tokens == 0 and again[-1].usage.cached_tokens >= n_shared
    assert [e.token for e in after if e.token is not None] == _alone(llm, system + "Name a color.", GREEDY, 3)


def test_a_reasoning_budget_writes_its_end_in_place_of_the_sampled_tokens(llm):
    """A prompt that opened the reasoning, a budget of 3: the 3 tokens greedy decoding gives, then the
    end tag's tokens whatever the model samples, then the model again from there."""
    from edgellm import reasoning

    enc = lambda t: tuple(llm.tokenizer.encode(t, add_special=False, parse_special=True))  # noqa: E731
    end = enc("</think>")
    spec = reasoning.BudgetSpec(enc("<think>"), (end,), end, 3, inside=True)
    prompt = "Once upon a time"
    eng = _engine(llm)
    try:
        got = _tokens(
            eng.submit(GenRequest(llm.tokenize(prompt), GREEDY, 3 + len(end) + 2, reasoning_budget=spec))
        )[0]
    finally:
        eng.shutdown()
    assert got[:3] == _alone(llm, prompt, GREEDY, 3) and tuple(got[3 : 3 + len(end)]) == end
    assert len(got) == 3 + len(end) + 2  # and the model goes on


def test_a_live_request_reports_its_prompt_as_it_is_read_and_its_progress_on_each_token(llm):
    """GenRequest.live (llama-server's return_progress and timings_per_token): an event as the prompt
    starts (its cached part), one per chunk computed (16 tokens a step here), the last with all of it read
    before the first token; each token's event counts the tokens so far. The tokens are those of a plain
    request, which has no such events."""
    system = "You are a helpful assistant who answers in one short sentence. " * 2
    prompt = system + "The capital of France is"
    ids = llm.tokenize(prompt)
    n = len(ids)
    eng = _engine(llm)
    try:
        plain = list(eng.submit(GenRequest(llm.tokenize(system + "Name a color."), GREEDY, 4)))
        live = list(eng.submit(GenRequest(ids, GREEDY, 4, live=True)))
    finally:
        eng.shutdown()
    assert all(e.progress is None for e in plain) and all(e.token is not None for e in plain[:-1])
    cached = live[-1].usage.cached_tokens
    assert cached >= 16 and cached % 4 == 0  # the shared system prompt's whole blocks
    reading = [e.progress for e in live if e.token is None and e.finish_reason is None]
    assert all(not e.text for e in live if e.token is None and e.finish_reason is None)
    assert [p.prompt_done for p in reading] == [cached, *range(cached + 16, n, 16), n]
    assert all(p.prompt_tokens == n and p.cached_tokens == cached for p in reading)
    assert all(p.completion_tokens == 0 and p.ttft_s is None for p in reading)
    assert [p.elapsed_s for p in reading] == sorted(p.elapsed_s for p in reading)
    first = next(i for i, e in enumerate(live) if e.token is not None)
    assert first == len(reading)  # every prompt event before the first token
    answered = [e.progress for e in live[first:]]
    assert [p.completion_tokens for p in answered] == [1, 2, 3, 4, 4]  # the last: the end (length)
    assert all(p.prompt_done == n and p.ttft_s is not None and p.ttft_s <= p.elapsed_s for p in answered)
    assert [e.token for e in live if e.token is not None] == _alone(llm, prompt, GREEDY, 4)


def test_memory_pressure_preempts_and_recomputes_without_changing_tokens(llm):
    """A pool of 8 blocks of 4 for three ~15-token sequences: some are preempted and recompute later."""
    want = [_alone(llm, p, GREEDY, 10) for p in PROMPTS[:3]]
    eng = _engine(llm, kv_tokens=32, prefix_caching=False, max_seqs=3)
    try:
        streams = [eng.submit(GenRequest(llm.tokenize(p), GREEDY, 10)) for p in PROMPTS[:3]]
        got = [_tokens(s)[0] for s in streams]
    finally:
        eng.shutdown()
    assert got == want
    assert eng.stats.preempted > 0 and eng.kv.pool.n_free == eng.kv.n_blocks


def test_cancel_stops_a_sequence_at_the_next_step_and_a_failing_sampler_fails_alone(llm):
    ban_all = {t: float("-inf") for t in range(llm.model.config.n_vocab)}
    eng = _engine(llm, start=False)
    long = eng.submit(GenRequest(llm.tokenize(PROMPTS[0]), GREEDY, 200))
    bad = eng.submit(
        GenRequest(llm.tokenize(PROMPTS[1]), SamplingParams(temperature=0, logit_bias=ban_all), 5)
    )
    ok = eng.submit(GenRequest(llm.tokenize(PROMPTS[2]), GREEDY, 5))
    for _ in range(3):
        eng.step()
    before = [e for e in long.ready() if e.token is not None]
    long.cancel()
    eng.step()
    after = long.ready()
    assert before and [e.finish_reason for e in after] == ["cancelled"]  # no token after the cancel
    assert after[0].usage.completion_tokens == len(before)
    ok_events = ok.ready()
    while not ok.done:
        eng.step()
        ok_events += ok.ready()
    bad_evs = list(bad)
    assert bad_evs[-1].finish_reason == "error" and "no token to sample" in bad_evs[-1].error
    assert bad_evs[-1].status == 400
    ok_toks = [e.token for e in ok_events if e.token is not None]
    assert ok_toks == _alone(llm, PROMPTS[2], GREEDY, 5) and ok_events[-1].finish_reason == "length"
    assert eng.kv.pool.n_free + eng.kv.prefix.n_evictable() == eng.kv.n_blocks  # all sequences freed


def test_stop_strings_and_eog_end_a_sequence(llm):
    eng = _engine(llm)
    try:
        toks, text, reason = _tokens(
            eng.submit(GenRequest(llm.tokenize("def fib(n):"), GREEDY, 30, ("return",)))
        )
    finally:
        eng.shutdown()
    assert reason == "stop" and "return" not in text and text.startswith("\n")


def test_requests_that_can_never_run_are_rejected_and_a_full_queue_refuses(llm):
    eng = Engine(llm.model, llm.tokenizer, n_ctx=64, max_seqs=1, block_size=4, kv_tokens=32, max_queue=1)
    with pytest.raises(RequestRejected, match="context holds 64"):
        eng.submit(GenRequest(list(range(1, 80)), GREEDY, 4))
    with pytest.raises(RequestRejected, match="KV memory holds 32"):
        eng.submit(GenRequest(list(range(1, 40)), GREEDY, 4))
    with pytest.raises(RequestRejected, match="outside the vocabulary"):
        eng.submit(GenRequest([1, 10**9], GREEDY, 4))
    eng.submit(GenRequest([1, 2], GREEDY, 4))  # not started: they wait in the queue
    eng.submit(GenRequest([1, 2], GREEDY, 4))
    with pytest.raises(QueueFull):
        eng.submit(GenRequest([1, 2], GREEDY, 4))
    eng.shutdown(grace=60, wait=False)
    assert not eng.step()  # waiting requests fail with "shutting down"; nothing is left to run
    assert eng.stats.finished["error"] == 2


def test_a_sequence_outgrowing_the_whole_pool_ends_with_length(llm):
    eng = _engine(llm, start=False, kv_tokens=16, max_seqs=1)
    prompt = llm.tokenize(PROMPTS[0])
    s = eng.submit(GenRequest(prompt, GREEDY, 40))
    evs = []
    while not s.done:
        eng.step()
        evs += s.ready()
    # 16 positions of K/V: the prompt's, then one per generated token but the last (never fed back)
    assert evs[-1].finish_reason == "length" and evs[-1].usage.completion_tokens == 16 - len(prompt) + 1
    assert eng.kv.pool.n_free + eng.kv.prefix.n_evictable() == 4


def test_the_llm_api_steps_its_engine_or_waits_on_a_server_thread_running_it(llm):
    """LLM calls step the LLM's own engine from the caller's thread; while a thread runs it (serve), they
    wait on its streams instead, with the same tokens. Leaving a stream early cancels the request."""
    alone = llm.generate(PROMPTS[1], max_tokens=6, temperature=0).tokens
    cancelled = llm.engine.stats.finished["cancelled"]
    for c in llm.stream(PROMPTS[3], max_tokens=50, temperature=0):
        if c.token is not None:
            break  # the request is cancelled and its slot and blocks freed
    assert not llm.engine.sched.running and not llm.engine.sched.waiting
    assert llm.engine.stats.finished["cancelled"] == cancelled + 1
    eng = llm.open_engine(max_seqs=2)
    eng.start()
    try:
        assert eng.running
        assert llm.generate(PROMPTS[1], max_tokens=6, temperature=0).tokens == alone
        chunks = list(llm.stream(PROMPTS[0], max_tokens=4, temperature=0))
        assert chunks[-1].finish_reason == "length" and sum(c.token is not None for c in chunks) == 4
    finally:
        eng.shutdown()
        llm.open_engine()  # a stepped engine again for the other tests


def test_prompt_logprobs_score_every_prompt_token_even_when_its_prefix_is_cached(llm):
    """GenRequest.prompt_logprobs: each prompt token's log-probability given those before it, the top k
    and its rank equal a log-softmax over LLM.logits (the prompt's teacher-forced logits), across
    prefill chunks of 16 and in a batch with another sequence; a cached prefix does not skip any; they
    arrive before the first token."""
    import numpy as np

    from edgellm.perplexity import log_softmax

    prompt = llm.tokenize(PROMPTS[3] + " and the unicorns spoke perfect English.")
    ref = log_softmax(llm.logits(prompt))
    eng = _engine(llm)
    try:
        _tokens(eng.submit(GenRequest(prompt, GREEDY, 2)))  # the prompt's blocks go to the prefix cache
        other = eng.submit(GenRequest(llm.tokenize(PROMPTS[0]), GREEDY, 6))
        evs = list(eng.submit(GenRequest(prompt, GREEDY, 2, prompt_logprobs=3)))
        _tokens(other)
    finally:
        eng.shutdown()
    scored = [i for i, e in enumerate(evs) if e.prompt_logprobs is not None]
    assert len(scored) == 1 and scored[0] < next(i for i, e in enumerate(evs) if e.token is not None)
    lps = evs[scored[0]].prompt_logprobs
    assert len(lps) == len(prompt) > 20 and lps[0] is None
    assert evs[-1].usage.cached_tokens == 0
    for i in range(1, len(prompt)):
        row = ref[i - 1]
        assert lps[i].logprob == pytest.approx(row[prompt[i]], abs=2e-3)
        assert [t for t, _ in lps[i].top] == np.argsort(-row, kind="stable")[:3].tolist()
        v = row[prompt[i]]  # rank: 1 + the tokens likelier (near-ties either way: the logits differ slightly)
        assert 1 + np.count_nonzero(row > v + 1e-3) <= lps[i].rank <= 1 + np.count_nonzero(row > v - 1e-3)
