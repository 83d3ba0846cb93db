"""The continuous-batching scheduler (edgellm/scheduler.py) driven with fake outputs, no model: what each
step's plan runs, preemption, FIFO admission, the shared-prefix wait, pool exhaustion, cancellation. Plus
the Engine over a fake model, stepped by hand, to pin the seam between plan, runner and apply."""

from __future__ import annotations

import numpy as np
import pytest

from edgellm.backends.paged_kv import KVCache
from edgellm.engine import Engine, GenRequest, RequestRejected
from edgellm.kvcache import PagedKV
from edgellm.sampler import SamplingParams
from edgellm.scheduler import Admitted, Finish, Scheduler, SeqState


def _sched(n_blocks: int, *, n_seqs: int = 4, prefix: bool = False, budget: int = 64) -> Scheduler:
    """A scheduler over a real (tiny, numpy) paged cache of blocks of 4 positions."""
    cache = KVCache(1, 1, 1, n_ctx=64, n_seqs=n_seqs, block_size=4, n_blocks=n_blocks)
    return Scheduler(PagedKV(cache, prefix), budget)


def _seq(sched: Scheduler, tokens) -> SeqState:
    s = SeqState(list(tokens))
    sched.add(s)
    return s


def _apply(sched: Scheduler, plan) -> None:
    """A fake runner's output applied as the Engine does: the plan's endings end, every sequence whose fed
    tokens reach its end samples one token (1000 + its length), then the scheduler advances and commits."""
    for f in plan.finished:
        sched.finish(f.seq)
    for s, k in plan.run:
        if s.n_computed + k == len(s.tokens):
            s.tokens.append(1000 + len(s.tokens))
            s.n_generated += 1
    sched.update_from_output(plan, {s for s, _ in plan.run})


def _step(sched: Scheduler):
    plan = sched.schedule()
    _apply(sched, plan)
    return plan


def test_the_plan_lists_decoders_then_prompt_chunks_then_admissions_within_the_token_budget():
    sched = _sched(16, budget=8)
    a, b, c = _seq(sched, range(1, 7)), _seq(sched, range(10, 15)), _seq(sched, range(20, 23))
    plan = _step(sched)
    assert plan.run == [(a, 6), (b, 2)] and plan.n_tokens == 8  # b's prompt is chunked, c waits
    assert plan.admitted == [Admitted(a, 0, False), Admitted(b, 0, False)]
    assert plan.preempted == [] and plan.finished == [] and list(sched.waiting) == [c]
    assert (a.n_computed, len(a.tokens), b.n_computed) == (6, 7, 2)  # a sampled a token, b did not
    assert [len(sched.kv.seq_blocks(s.slot)) for s in (a, b)] == [2, 1]
    plan = _step(sched)
    assert plan.run == [(a, 1), (b, 3), (c, 3)] and plan.admitted == [Admitted(c, 0, False)]
    assert sched.running == [a, b, c] and not sched.waiting


def test_memory_pressure_preempts_the_most_recently_admitted_other_sequence_which_recomputes_later():
    sched = _sched(5, n_seqs=3)  # 5 blocks of 4: three 4-token prompts, then each needs a second block
    a, b, c = _seq(sched, [1, 2, 3, 4]), _seq(sched, [5, 6, 7, 8]), _seq(sched, [9, 10, 11, 12])
    first = _step(sched)
    assert first.run == [(a, 4), (b, 4), (c, 4)]
    plan = _step(sched)  # a and b take the last two blocks; c's reserve preempts b, not a
    assert plan.preempted == [b] and plan.run == [(a, 1), (c, 1)]
    assert list(sched.waiting) == [b] and (b.slot, b.n_computed) == (-1, 0) and b.tokens == [5, 6, 7, 8, 1004]
    assert plan.admitted == []  # b needs 2 blocks; 1 is free, and each runner keeps one of headroom
    sched.finish(a)  # a ends: its 2 blocks come back
    plan = sched.schedule()
    assert plan.run == [(c, 1), (b, 5)] and plan.admitted == [Admitted(b, 0, True)]
    _apply(sched, plan)
    assert b.n_computed == 5 and b.tokens == [5, 6, 7, 8, 1004, 1005]
    # the engine counts a prompt on its first admission only: 3 prompts of 4, b's recompute not again
    counted = [x.seq.n_prompt for p in (first, plan) for x in p.admitted if not x.readmitted]
    assert sum(counted) == 12


def test_update_from_output_advances_only_what_ran_and_counts_the_prompt_positions_computed():
    sched = _sched(8)
    a, b = _seq(sched, range(1, 11)), _seq(sched, range(20, 25))
    plan = sched.schedule()
    a.tokens.append(7)
    assert sched.update_from_output(plan, {a}) == 10  # b's forward failed: b is not advanced
    assert (a.n_computed, b.n_computed) == (10, 0)
    plan = sched.schedule()
    assert plan.run == [(a, 1), (b, 5)] and sched.update_from_output(plan, {a, b}) == 5  # a's was generated


def test_a_waiting_request_that_does_not_fit_blocks_the_ones_behind_it():
    sched = _sched(6, n_seqs=3)
    a = _seq(sched, range(1, 13))  # 3 blocks
    b = _seq(sched, range(20, 32))  # 3 blocks: 3 are free but one is headroom for a
    c = _seq(sched, [40, 41, 42, 43])  # 1 block would fit, but it must not overtake b
    assert _step(sched).admitted == [Admitted(a, 0, False)] and list(sched.waiting) == [b, c]
    for _ in range(2):  # a grows to 4 blocks: still no room for b, and c stays behind it
        assert _step(sched).admitted == [] and list(sched.waiting) == [b, c]
    sched.finish(a)
    plan = sched.schedule()
    assert plan.run == [(b, 12), (c, 4)] and [x.seq for x in plan.admitted] == [b, c]


def test_a_request_sharing_uncached_blocks_with_a_prompt_being_computed_waits_then_reads_them():
    sched = _sched(16, prefix=True)
    shared = list(range(1, 9))  # two full blocks
    a = _seq(sched, shared + [50, 51, 52, 53])
    b = _seq(sched, shared + [60, 61, 62, 63])
    c = _seq(sched, [70, 71, 72])  # shares nothing: passes b, which waits for a's blocks
    plan = _step(sched)
    assert plan.run == [(a, 12), (c, 3)] and list(sched.waiting) == [b]
    assert sched.kv.prefix.n_blocks == 3  # a's three full blocks were committed
    plan = _step(sched)
    assert plan.run == [(a, 1), (c, 1), (b, 4)] and plan.admitted == [Admitted(b, 8, False)]
    assert b.n_cached == 8 and sched.kv.seq_blocks(b.slot)[:2] == sched.kv.seq_blocks(a.slot)[:2]
    assert sched.kv.prefix.hit_tokens == 8


def test_a_sequence_alone_outgrowing_the_pool_is_ended_by_the_plan_and_freed_when_it_is_applied():
    sched = _sched(4, n_seqs=2, prefix=True)  # 16 positions in all
    a = _seq(sched, range(1, 11))
    b = _seq(sched, range(20, 28))  # 2 blocks: waits while a grows
    for _ in range(7):  # the prompt, then positions 10..15
        assert _step(sched).run[0].seq is a
    assert (a.n_computed, a.n_generated) == (16, 7)
    lookups = sched.kv.prefix.lookup_tokens
    plan = sched.schedule()  # position 16 needs a fifth block: nobody else to preempt
    assert plan.finished == [Finish(a, "length")] and plan.run == [] and plan.admitted == []
    assert a not in sched.running and a.slot >= 0 and sched.kv.n_available() == 0  # planning freed nothing
    assert list(sched.waiting) == [b] and sched.kv.prefix.lookup_tokens == lookups  # b was not tried
    _apply(sched, plan)
    assert a.slot == -1 and sched.kv.n_available() == 4  # a's 4 blocks, now held by the prefix cache only
    plan = sched.schedule()
    assert plan.run == [(b, 8)] and plan.admitted == [Admitted(b, 0, False)]


def test_cancelling_a_waiting_and_a_running_sequence_frees_their_blocks_and_the_others_go_on():
    sched = _sched(6, n_seqs=3)
    a = _seq(sched, range(1, 9))  # 2 blocks
    b = _seq(sched, range(20, 36))  # 4 blocks: waits
    c = _seq(sched, [40, 41, 42, 43])  # behind b
    assert _step(sched).run == [(a, 8)]
    sched.finish(b)  # cancelled while waiting: it held nothing
    assert list(sched.waiting) == [c] and b.slot == -1 and sched.kv.n_used() == 2
    plan = _step(sched)
    assert plan.run == [(a, 1), (c, 4)] and sched.kv.n_used() == 4
    sched.finish(a)  # cancelled while running: its 3 blocks come back
    assert sched.running == [c] and a.slot == -1 and sched.kv.n_used() == 1
    assert sched.kv.pool.n_free == 5 and sched.kv.n_free_slots == 2
    plan = _step(sched)
    assert plan.run == [(c, 1)] and c.tokens == [40, 41, 42, 43, 1004, 1005]


# -- the Engine over a fake model ---------------------------------------------------------------------------
V = 32


class _Model:
    """Logits peak at (last fed token + 1) % V; records which entry point each forward used."""

    class config:
        n_vocab = V

    def __init__(self):
        self.calls: list[tuple[str, list[int]]] = []

    def new_kv_cache(self, n_ctx, n_seqs, block_size, n_blocks, window_rings=True):
        return KVCache(1, 1, 1, n_ctx, n_seqs, block_size, n_blocks)

    def _logits(self, toks):
        return np.eye(V, dtype=np.float32)[(np.asarray(toks) + 1) % V]

    def forward(self, toks, pos, ids, cache, logits_rows):
        cache.slots(ids, pos)  # every fed position has a block
        self.calls.append(("forward", toks.tolist()))
        return self._logits(toks[logits_rows])

    def decode_step(self, toks, pos, ids, cache):
        self.calls.append(("decode_step", toks.tolist()))
        return self._logits(toks)

    def decode_greedy(self, toks, pos, ids, cache):
        self.calls.append(("decode_greedy", toks.tolist()))
        return np.argmax(self._logits(toks), axis=1)


class _Detokenizer:
    def push(self, tok: int) -> str:
        return f"<{tok}>"

    def flush(self) -> str:
        return ""


class _Tokenizer:
    eog_ids = frozenset({0})

    def stream(self) -> _Detokenizer:
        return _Detokenizer()


def test_an_engine_stepped_by_hand_runs_plans_through_the_fast_greedy_decode_path():
    model = _Model()
    eng = Engine(model, _Tokenizer(), n_ctx=64, max_seqs=2, block_size=4, kv_tokens=32, max_batch_tokens=8)
    with pytest.raises(RequestRejected, match="KV memory holds 32"):
        eng.check(GenRequest(list(range(1, 33))))  # 32 prompt tokens + 1 need a ninth block
    assert eng.step() and model.calls == []  # nothing to do: no forward
    greedy = eng.submit(GenRequest([5, 6, 7], SamplingParams(temperature=0.0), max_tokens=3))
    sampled = eng.submit(GenRequest([9, 10], SamplingParams(temperature=0.0, repeat_penalty=1.1), 2))
    events: dict = {greedy: [], sampled: []}
    while not (greedy.done and sampled.done):
        eng.step()
        for st, evs in events.items():
            evs += st.ready()
    assert ["".join(e.text for e in events[st]) for st in (greedy, sampled)] == ["<8><9><10>", "<11><12>"]
    assert model.calls == [
        ("forward", [5, 6, 7, 9, 10]),  # both prompts in one batch
        ("decode_step", [8, 11]),  # a penalised row needs logits
        ("decode_greedy", [9]),  # only plain greedy rows left: ids only
    ]
    assert eng.stats.finished["length"] == 2 and eng.stats.steps == 3 and eng.stats.prompt_tokens == 5
    # [5, 6, 7, 8] stays cached, and each sequence's partial tail is parked for a continuation, with the
    # position its last step computed: [9] (fed as it ended) and [9, 10, 11]
    assert eng.kv.prefix.n_blocks == 1 and eng.kv.n_used() == eng.kv.prefix.n_evictable() == 3
