"""Captured decode plans on every backend that captures them (native_plan.CapturedDecode: native, whose
plans replay in one C call, and numba, whose plans replay in one compiled call): a replay gives the eager
forward's bits on every architecture, checks its inputs first, and a forward a plan cannot replay is
refused once and runs eagerly."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
from forward_checks import load_fixture, prefill
from gguf import GGMLQuantizationType as T
from plan_checks import BATCH_STEPS, TINY, eager_and_planned, tiny_model
from random_weights import random_weight
from tiny_models import N_VOCAB

from edgellm.backends import BackendUnavailable, get_backend, native_plan

rng = np.random.default_rng(7)


@pytest.fixture(scope="module", params=["native", "numba"])
def backend(request):
    try:
        return get_backend(request.param, threads=2)
    except BackendUnavailable as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("arch", TINY)
def test_every_architecture_captures_and_its_plan_equals_eager(tmp_path, backend, arch):
    model = tiny_model(tmp_path, arch, backend)
    eager_and_planned(model, BATCH_STEPS)


@pytest.mark.parametrize("types", [("q8_0", "q8_0"), ("q8_0", "f16"), ("f16", "q8_0")])
def test_a_plan_over_a_q8_0_kv_cache_equals_eager(tmp_path, backend, types):
    model = tiny_model(tmp_path, "qwen3", backend)  # heads of 32: q8_0 blocks
    model.set_cache_types(*types)
    kv_a, kv_b = model.new_kv_cache(32, 3), model.new_kv_cache(32, 3)
    for tokens, pos, seqs in BATCH_STEPS:
        args = (np.array(tokens), np.array(pos), np.array(seqs))
        assert np.array_equal(model.forward(*args, kv_a), model.decode_step(*args, kv_b))
    assert np.array_equal(kv_a.k, kv_b.k) and np.array_equal(kv_a.v, kv_b.v)
    assert backend.captured(model, kv_b, 3) is not None


def test_a_sliding_window_model_replays_over_ring_caches(tmp_path, backend):
    model = tiny_model(tmp_path, "llama", backend)
    # a window of 3 (llama.cpp's llama graph ignores the GGUF key; mistral-style configs set it)
    model.config = dataclasses.replace(model.config, sliding_window=3)
    kv_a, kv_b = model.new_kv_cache(1024, 2), model.new_kv_cache(1024, 2)  # past the ring's size
    assert kv_b.ring_layers
    for i in range(8):  # past the window
        args = (np.array([5 + i, 9 + i]), np.array([i, i]), np.array([0, 1]))
        assert np.array_equal(model.forward(*args, kv_a), model.decode_step(*args, kv_b))
    assert backend.captured(model, kv_b, 2) is not None
    kv_b.window_chunk = 1  # a ring of window + 0 positions: two tokens of one sequence would overwrite
    with pytest.raises(ValueError, match="2 tokens of one sequence"):
        model.decode_step(np.array([3, 4]), np.array([8, 9]), np.array([0, 0]), kv_b)


def test_plans_are_kept_for_the_most_recent_batch_sizes_only(tmp_path, backend):
    model = tiny_model(tmp_path, "llama", backend)
    kv = model.new_kv_cache(8, native_plan.MAX_PLANS + 2)
    for batch in range(1, native_plan.MAX_PLANS + 3):  # one capture per batch size
        args = (np.arange(batch), np.zeros(batch, np.int64), np.arange(batch), kv)
        model.decode_step(*args)
    plans = [key for key in backend._plans if key[:2] == (id(kv), id(model))]
    assert len(plans) == native_plan.MAX_PLANS
    assert backend.captured(model, kv, 1) is None
    assert backend.captured(model, kv, native_plan.MAX_PLANS + 2) is not None
    np.testing.assert_array_equal(model.decode_step(*args), model.forward(*args))  # replay == eager


def test_a_replayed_step_checks_its_tokens_and_cache_slots_first(tmp_path, backend):
    model = tiny_model(tmp_path, "llama", backend)
    kv = model.new_kv_cache(16, 2)

    def step(tok: int, pos: int, seq: int) -> np.ndarray:
        return model.decode_step(np.array([tok]), np.array([pos]), np.array([seq]), kv)

    step(5, 0, 0)  # captured
    step(6, 1, 0)  # replayed
    with pytest.raises(ValueError, match="outside the vocabulary"):
        step(N_VOCAB, 2, 0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        step(-1, 2, 0)
    with pytest.raises(ValueError, match="outside the context"):
        step(7, 16, 0)
    with pytest.raises(ValueError, match="outside the context"):
        step(7, -1, 0)
    with pytest.raises(ValueError, match="sequence id"):
        step(7, 2, 2)
    kv.block_table[1, 0] = -1
    with pytest.raises(ValueError, match="no KV block"):
        step(7, 2, 1)
    assert backend.captured(model, kv, 1) is not None
    step(7, 2, 0)  # and the refused steps left the plan and the cache as an eager run leaves them
    kv2 = model.new_kv_cache(16, 2)
    for tok, pos in ((5, 0), (6, 1), (7, 2)):
        model.forward(np.array([tok]), np.array([pos]), np.zeros(1, np.int64), kv2)
    np.testing.assert_array_equal(
        step(8, 3, 0), model.forward(np.array([8]), np.array([3]), np.zeros(1, np.int64), kv2)
    )


class _NumpyInTheMiddle:
    """A model whose forward does numpy arithmetic between backend ops: a replay would skip it."""

    def __init__(self, b, emb):
        self.backend, self.emb = b, emb

    def forward(self, tokens, positions, seq_ids, kv, logits_rows=None):
        x = self.backend.get_rows(self.emb, tokens)
        return self.backend.scale(x * 2, 0.5)


def test_a_forward_with_numpy_arithmetic_is_refused_once_and_runs_eagerly(backend, caplog):
    m = _NumpyInTheMiddle(backend, backend.bind(random_weight(T.Q8_0, 10, 64, rng)))
    kv = backend.new_kv_cache(1, 1, 8, 8, 1)
    with caplog.at_level(logging.WARNING):
        for i in range(3):
            out = backend.decode_step(m, np.array([i]), np.array([i]), np.zeros(1, np.int64), kv)
            assert np.array_equal(out, m.forward(np.array([i]), None, None, None))
    refusals = [r for r in caplog.records if "op by op" in r.getMessage()]
    assert len(refusals) == 1 and "computed outside the backend's ops" in refusals[0].getMessage()


class _NoLookup:
    """A model whose forward reads bound weights only, with no embedding lookup."""

    def __init__(self, b):
        self.backend = b
        self.w = b.bind(random_weight(T.Q8_0, 10, 64, rng))
        self.v = b.vector(random_weight(T.F32, 1, 64, rng))

    def forward(self, tokens, positions, seq_ids, kv, logits_rows=None):
        return self.backend.matmul(self.w, self.backend.rms_norm(self.v.reshape(1, -1), None, 1e-5))


def test_a_forward_without_the_embedding_lookup_replays_or_is_refused_by_name(backend, caplog):
    """native's plans replay any captured op list; numba's run the lookup in numpy before the compiled
    rest, so a forward that does not begin with one is refused at capture (named), not failed at the
    plan, and runs eagerly."""
    m = _NoLookup(backend)
    kv = backend.new_kv_cache(1, 1, 8, 8, 1)
    with caplog.at_level(logging.WARNING):
        for i in range(3):
            out = backend.decode_step(m, np.array([i]), np.array([i]), np.zeros(1, np.int64), kv)
            assert np.array_equal(out, m.forward(None, None, None, None))
    refusals = [r.getMessage() for r in caplog.records if "op by op" in r.getMessage()]
    if backend.name == "numba":
        assert len(refusals) == 1 and "does not begin with the embedding lookup" in refusals[0]
    else:
        assert not refusals and backend.captured(m, kv, 1) is not None


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_real_models_replay_their_eager_bits_with_1_thread_and_2(request, name):
    """SmolLM2 (llama, Q4_1/Q8_0) and gemma3 (Q4_K/Q6_K/Q8_0, GeGLU, softcap-free, sliding window) on
    numba: plans captured, equal to eager, and the same bits on 1 thread as on 2."""
    import edgellm

    path = request.getfixturevalue("smollm2_path" if name.startswith("smollm2") else "gemma3_path")
    llm = edgellm.LLM(path, backend="numba", n_ctx=128, threads=2)
    model = llm.model
    eager_and_planned(model, BATCH_STEPS[:3])
    prompt = load_fixture(name)["greedy"][0]["prompt_ids"][:24]
    outs = []
    for k in (1, 2):
        model.backend.threads = k
        kv = model.new_kv_cache(64, 1)
        first = prefill(model, prompt, kv)
        args = (np.array([int(first.argmax())]), np.array([len(prompt)]), np.zeros(1, np.int64), kv)
        model.decode_step(*args)  # captured (a plan per thread count: a new cache)
        args = (np.array([7]), np.array([len(prompt) + 1]), *args[2:])
        outs.append(model.decode_step(*args).copy())  # replayed
    model.backend.threads = 2
    np.testing.assert_array_equal(outs[0], outs[1])
