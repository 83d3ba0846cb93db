"""KV cache types (-ctk / -ctv, llama.cpp's names): f16 and q8_0 rows, their memory, and models run through
them on every CPU backend. The attention op itself is in the backend contract (test_backend_contract.py:
each backend against the reference, and the stored rows bit for bit)."""

from __future__ import annotations

import numpy as np
import pytest
from test_arch_tiny import ARCHS, TOKENS, TOL, available_backends, build, rel_err, run

from edgellm.arch.base import hadamard, kv_rotations
from edgellm.backends.paged_kv import KVCache, q8_0_decode, q8_0_encode, q8_0_values

rng = np.random.default_rng(11)


def test_q8_0_rows_are_ggml_blocks_within_half_a_step():
    x = rng.standard_normal((3, 2, 64)).astype(np.float32) * np.float32(5)
    x[0, 0, :32] = 0  # an all-zero block: scale 0, values 0
    raw = q8_0_encode(x)
    assert raw.shape == (3, 2, 68) and raw.dtype == np.uint8  # 2 blocks of 34 bytes per head
    d, q = q8_0_decode(raw)
    assert d[0, 0, 0] == 0 and not q[0, 0, 0].any()
    amax = np.abs(x.reshape(3, 2, 2, 32)).max(axis=-1)
    np.testing.assert_array_equal(d, (amax / np.float32(127)).astype(np.float16).astype(np.float32))
    assert np.abs(q).max() == 127  # the largest value of each block maps to +-127
    err = np.abs(q8_0_values(raw) - x).reshape(3, 2, 2, 32)
    # half a step, plus |q| <= 127 times the scale's f16 rounding (2^-11 relative)
    assert (err <= d[..., None] * (0.5 + 127 * 2.0**-11) + 1e-7).all()


def test_a_q8_0_cache_takes_34_of_64_bytes_per_value():
    f16 = KVCache(4, 2, 64, 128, 2)
    q8 = KVCache(4, 2, 64, 128, 2, type_k="q8_0", type_v="q8_0")
    mixed = KVCache(4, 2, 64, 128, 2, type_k="q8_0")
    assert q8.nbytes * 64 == f16.nbytes * 34  # 53% (llama.cpp: q8_0 K+V is 53% of f16)
    assert mixed.nbytes * 128 == f16.nbytes * (64 + 34)
    assert q8.k.shape == (4, 256, 2, 68) and q8.k.dtype == np.uint8


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(type_k="q4_0"), "K cache type 'q4_0' is not supported"),
        (dict(type_v="bf16"), "V cache type 'bf16' is not supported"),
    ],
)
def test_an_unknown_cache_type_is_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KVCache(1, 2, 64, 16, 1, **kwargs)


def test_q8_0_needs_heads_of_whole_blocks(tmp_path):
    model = build(tmp_path, ARCHS["qwen2"])[0]  # head width 16
    with pytest.raises(ValueError, match="multiple of 32 \\(not 16\\)"):
        model.set_cache_types("q8_0", "f16")
    model.set_cache_types("f16", "f16")


def test_a_backend_that_cannot_hold_a_type_is_named(tmp_path, monkeypatch):
    model = build(tmp_path, ARCHS["qwen3"])[0]
    monkeypatch.setattr(type(model.backend), "supports", lambda self, op, qtype=None: qtype != "q8_0")
    with pytest.raises(ValueError, match="the reference backend cannot hold a q8_0 V cache"):
        model.set_cache_types("f16", "q8_0")


def test_kv_bytes_per_token_counts_the_smaller_rows(tmp_path):
    model = build(tmp_path, ARCHS["qwen3"])[0]  # 2 layers, 2 KV heads of 32
    assert model.kv_bytes_per_token() == 2 * 2 * 2 * 2 * 32
    model.set_cache_types("q8_0", "q8_0")
    assert model.kv_bytes_per_token() == 2 * 2 * 2 * 34
    assert model.new_kv_cache(64, 1).nbytes == 64 * model.kv_bytes_per_token()


@pytest.mark.parametrize("head", [32, 64])  # 64: through the Walsh-Hadamard rotations (kv_rotations)
@pytest.mark.parametrize("backend", available_backends())
def test_a_model_over_a_q8_0_cache_is_the_references_on_every_backend(tmp_path, backend, head):
    """Prefill then decode steps (the decode path a backend may capture as a plan) over q8_0 K and V: the
    reference's logits with the same cache; and not the f16 cache's (the rows really are quantized)."""
    arch = dict(ARCHS["qwen3"], key_length=head)
    ref = build(tmp_path, arch)[0]
    model = build(tmp_path, arch, backend)[0]
    if not model.backend.supports("kv_cache", "q8_0"):
        with pytest.raises(ValueError, match="q8_0"):
            model.set_cache_types("q8_0", "q8_0")
        return
    ref.set_cache_types("q8_0", "q8_0")
    model.set_cache_types("q8_0", "q8_0")
    assert [r and r[0] for r in model.kv_rotation] == ([64, 64] if head == 64 else [None, None])
    f16 = build(tmp_path, arch)[0]
    outs = []
    for m in (ref, model, f16):
        kv = m.new_kv_cache(32, 1)
        logits = [run(m, TOKENS[:8], kv=kv)]
        one = np.zeros(1, np.int64)
        for i, t in enumerate(TOKENS[8:]):
            logits.append(m.decode_step(np.array([t]), np.array([8 + i]), one, kv).copy())
        outs.append(np.concatenate(logits))
    want, got, plain = outs
    assert rel_err(got, want) < TOL
    assert rel_err(plain, want) > 1e-5  # q8_0 moved the logits ...
    assert rel_err(plain, want) < 0.05  # ... by what 8-bit rows should


def test_the_walsh_hadamard_matrix_is_llamacpps():
    """Sylvester's order, entries +-f32(1 / sqrtf(n)) with the sign (-1)^popcount(i & j) (ggml_gen_hadamard),
    symmetric and orthonormal (its own inverse); a size that is not a power of two is refused."""
    for n in (1, 2, 64, 256):
        h = hadamard(n)
        i, j = np.indices((n, n))
        sign = np.where(np.vectorize(lambda v: bin(v).count("1") % 2)(i & j) == 1, -1, 1)
        assert h.dtype == np.float32 and (h == sign * np.float32(1.0 / np.sqrt(np.float32(n)))).all()
        assert (h == h.T).all()
        assert np.abs(h.astype(np.float64) @ h - np.eye(n)).max() < 1e-6
    with pytest.raises(ValueError, match="power of two, not 48"):
        hadamard(48)


@pytest.mark.parametrize(
    ("types", "head", "want"),
    [
        (("f16", "f16"), 64, (0, 0)),
        (("q8_0", "q8_0"), 64, (64, 64)),
        (("q8_0", "q8_0"), 128, (128, 64)),  # K: the largest power of two dividing the head; V: 64
        (("q8_0", "f16"), 256, (256, 0)),
        (("f16", "q8_0"), 256, (0, 64)),
        (("q8_0", "q8_0"), 192, (64, 64)),
        (("q8_0", "q8_0"), 96, (0, 0)),  # not a multiple of 64: llama.cpp rotates neither
    ],
)
def test_quantized_caches_rotate_as_llamacpps(types, head, want, monkeypatch):
    assert kv_rotations(*types, head) == want
    monkeypatch.setenv("EDGELLM_KV_ROTATION", "0")
    assert kv_rotations(*types, head) == (0, 0)


def test_the_rotations_keep_the_attention_and_move_it_nearer_f16(tmp_path, monkeypatch):
    """Heads of 64 over a q8_0 cache: q and k rotated alike and the output rotated back give the f16 cache's
    logits to within what 8-bit rows move them, nearer than the same cache without the rotations; K alone
    rotated, or V, keeps them too."""
    arch = dict(ARCHS["qwen3"], key_length=64)
    plain = build(tmp_path, arch)[0]
    want = run(plain, TOKENS)
    errs = {}
    runs = [("1", ("q8_0", "q8_0")), ("0", ("q8_0", "q8_0")), ("1", ("q8_0", "f16")), ("1", ("f16", "q8_0"))]
    for rotate, types in runs:
        monkeypatch.setenv("EDGELLM_KV_ROTATION", rotate)
        model = build(tmp_path, arch)[0]
        model.set_cache_types(*types)
        errs[rotate, types] = rel_err(run(model, TOKENS), want)
    assert all(0 < e < 0.02 for e in errs.values()), errs
    assert errs["1", ("q8_0", "q8_0")] < errs["0", ("q8_0", "q8_0")], errs  # 0.0038 < 0.0040 here


def test_the_llm_api_and_its_engine_use_the_cache_types(tmp_path):
    """LLM(cache_type_k=, cache_type_v=): the engine's cache holds q8_0 rows, and greedy text is the
    model's own greedy continuation over such a cache; a bad type is one ValueError naming it."""
    import edgellm

    build(tmp_path, ARCHS["qwen3"])
    path = next(tmp_path.glob("*.gguf"))
    llm = edgellm.LLM(path, backend="reference", n_ctx=64, cache_type_k="q8_0", cache_type_v="q8_0")
    ids = llm.tokenize("the inner here")
    out = llm.generate(ids, max_tokens=6, temperature=0)
    cache = llm._engine.kv.cache
    assert (cache.type_k, cache.type_v) == ("q8_0", "q8_0") and cache.k.dtype == np.uint8
    expected = list(ids)
    for _ in out.tokens:
        kv = llm.model.new_kv_cache(64, 1)
        expected.append(int(np.argmax(run(llm.model, expected, kv=kv)[-1])))
    assert out.tokens == expected[len(ids) :]
    with pytest.raises(ValueError, match="K cache type 'q4_0'"):
        edgellm.LLM(path, backend="reference", cache_type_k="q4_0")
