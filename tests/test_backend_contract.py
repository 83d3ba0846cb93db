"""One contract for every backend: each op's body runs on every backend registered here, against the exact
reference backend (the oracle), through the backend's own arrays (from_host / to_host), so a new backend
(a device one included) gets all of it by adding one entry to CONTRACT_BACKENDS.

Tolerances: matmuls within 1e-5 of the output's scale (sum |x| |w|): the fast kernels sum in float32 in
their own order, ~1e-7 of it; elementwise ops within a few float32 ulps (their exp/tanh are their own);
RMSNorm, RoPE, get_rows, add, scale and columns bit for bit (they are the same float32 operations).
"""

from __future__ import annotations

import numpy as np
import pytest
from forward_checks import KL_MAX, teacher_forced_kl
from gguf import GGMLQuantizationType as T
from random_weights import (
    ALL_TYPES,
    ORACLE,
    assert_matmul_matches_oracle,
    random_weight,
)
from test_arch_tiny import CASES, TOKENS, TOL, build
from toy_device import ToyDeviceBackend

from edgellm import quants
from edgellm.backends import BACKENDS, BackendUnavailable, get_backend
from edgellm.backends.base import RopeSpec
from edgellm.gguf import ModelFile, QTensor


def _registered(name: str):
    return lambda threads=None: get_backend(name, threads)


# name -> factory(threads=...): every registered backend, and the toy device (tests/toy_device.py)
CONTRACT_BACKENDS = {**{n: _registered(n) for n in BACKENDS}, "toy-device": ToyDeviceBackend}
_MADE: dict = {}


def _backend(name: str, threads: int | None = None):
    key = (name, threads)
    if key not in _MADE:
        try:
            _MADE[key] = CONTRACT_BACKENDS[name](threads=threads)
        except BackendUnavailable as e:
            _MADE[key] = e
    b = _MADE[key]
    if isinstance(b, BackendUnavailable):
        pytest.skip(str(b))
    return b


def _simulated(b) -> bool:
    """A backend whose kernels run in a simulator (cuda under numba-cuda's, where each GPU thread is a
    Python thread): the same checks, on smaller shapes."""
    return bool(getattr(b, "simulated", False))


@pytest.fixture(params=list(CONTRACT_BACKENDS))
def b(request):
    return _backend(request.param)


rng = np.random.default_rng(2024)


# -- weights -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 4, 37], ids=["decode", "batch", "prompt"])
@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_matmul_of_every_type_on_random_rows(b, t, n):
    assert b.supports("matmul", t), f"{b.name} has no {t.name} matmul kernel"  # every common type is covered
    m, k = (5, 256) if _simulated(b) else (41, 512)
    n = min(n, 11) if _simulated(b) else n  # still more than one group of tokens per weight row
    qt = random_weight(t, m, k, rng)
    x = (rng.standard_normal((n, k)) * rng.uniform(0.1, 10)).astype(np.float32)
    x[0, :64] *= 20  # an outlier block, as real activations have
    assert_matmul_matches_oracle(b, qt, x)


@pytest.mark.parametrize(
    "fixture,names",
    [
        ("smollm2_path", ["blk.0.attn_q.weight", "blk.5.ffn_down.weight", "token_embd.weight"]),
        (
            "gemma3_path",
            ["blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.2.ffn_down.weight", "token_embd.weight"],
        ),
    ],
)
def test_matmul_and_get_rows_on_real_rows(b, request, fixture, names):
    mf = ModelFile(request.getfixturevalue(fixture))
    for name in names:
        full = mf.tensors[name]
        data = full.data[: 8 if _simulated(b) else 256]
        qt = QTensor(name, full.type, (full.ne[0], data.shape[0]), full.offset, data.nbytes, data)
        x = rng.standard_normal((3, full.ne[0])).astype(np.float32)
        assert_matmul_matches_oracle(b, qt, x)
        ids = np.array([0, len(data) - 1, 7, 7, 100 % len(data)], np.int64)
        rows = b.to_host(b.get_rows(b.bind(qt), ids))
        np.testing.assert_array_equal(rows, quants.dequantize(data[ids], full.type, (len(ids), full.ne[0])))


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_get_rows_is_the_exact_dequantization(b, t):
    qt = random_weight(t, 9, 256, rng)
    ids = np.array([8, 0, 3, 3], np.int64)
    got = b.to_host(b.get_rows(b.bind(qt), ids))
    np.testing.assert_array_equal(got, quants.dequantize(qt.data[ids], t, (4, 256)))


# -- attention -----------------------------------------------------------------------------------------------
CACHE_TYPES = {
    "f16": ("f16", "f16"),
    "q8_0": ("q8_0", "q8_0"),
    "q8_0-K": ("q8_0", "f16"),
    "q8_0-V": ("f16", "q8_0"),
}


@pytest.mark.parametrize("cache", CACHE_TYPES)
@pytest.mark.parametrize(
    "window,softcap", [(None, None), (5, None), (None, 20.0)], ids=["full", "window", "softcap"]
)
def test_attention_through_a_shuffled_block_table(b, window, softcap, cache):
    """Two sequences whose blocks are scattered over the pool, prefilled in one forward then decoded one
    step, grouped-query heads (4 over 2): the oracle's outputs, and the next step reads what was written.
    For each KV cache type (-ctk / -ctv); a backend that cannot hold one refuses it by name."""
    n_kv, dh, bs = 2, 64, 4
    types = dict(zip(("type_k", "type_v"), CACHE_TYPES[cache]))
    for kind in set(types.values()):
        if not b.supports("kv_cache", kind):
            with pytest.raises(ValueError, match=kind):
                b.new_kv_cache(1, n_kv, dh, 32, 2, block_size=bs, n_blocks=16, **types)
            return
    caches = []
    for backend in (ORACLE, b):
        kv = backend.new_kv_cache(1, n_kv, dh, 32, 2, block_size=bs, n_blocks=16, **types)
        kv.block_table[:] = -1
        kv.block_table[0, :4] = [9, 2, 14, 5]
        kv.block_table[1, :3] = [0, 11, 7]
        kv.table_written()
        caches.append(kv)
    seqs = np.array([0] * 13 + [1] * 9, np.int64)
    pos = np.concatenate([np.arange(13), np.arange(9)]).astype(np.int64)
    outs = []
    for backend, kv in zip((ORACLE, b), caches):
        r = np.random.default_rng(7)
        q, k, v = (r.standard_normal((22, h, dh)).astype(np.float32) for h in (4, n_kv, n_kv))
        first = backend.attention(*_up(backend, b, q, k, v), kv, 0, seqs, pos, 0.125, window, softcap)
        q, k, v = (r.standard_normal((2, h, dh)).astype(np.float32) for h in (4, n_kv, n_kv))
        at = (np.array([0, 1]), np.array([13, 9]))
        step = backend.attention(*_up(backend, b, q, k, v), kv, 0, *at, 0.125, window, softcap)
        outs.append([b.to_host(first), b.to_host(step)] if backend is b else [first, step])
    for got, want in zip(outs[1], outs[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if isinstance(getattr(caches[1], "k", None), np.ndarray) and caches[1].k.size:  # a host cache
        for mine, oracle in ((caches[1].k, caches[0].k), (caches[1].v, caches[0].v)):
            np.testing.assert_array_equal(mine.view(np.uint8), oracle.view(np.uint8))  # the same rows stored


@pytest.mark.parametrize("cache", CACHE_TYPES)
def test_positions_copied_between_blocks_are_read_as_written(b, cache):
    """copy_positions (the prefix cache's reuse of a block's first tokens): sequence 0 writes 6
    positions, the first 2 of its second block are copied into block 1, and sequence 1 (its first block
    shared, then block 1) attends at position 6 exactly as sequence 0 does with the same new row."""
    n_kv, dh, bs = 2, 64, 4
    types = dict(zip(("type_k", "type_v"), CACHE_TYPES[cache]))
    if not all(b.supports("kv_cache", kind) for kind in types.values()):
        pytest.skip(f"{b.name} holds no {cache} cache")
    kv = b.new_kv_cache(2, n_kv, dh, 32, 2, block_size=bs, n_blocks=8, **types)
    kv.block_table[:] = -1
    kv.block_table[0, :2] = [3, 6]
    kv.table_written()
    r = np.random.default_rng(11)
    q, k, v = (r.standard_normal((6, h, dh)).astype(np.float32) for h in (4, n_kv, n_kv))
    for layer in (0, 1):
        b.attention(*_up(b, b, q, k, v), kv, layer, np.zeros(6, np.int64), np.arange(6), 0.125)
    kv.copy_positions(6, 1, 2)
    kv.block_table[1, :2] = [3, 1]
    kv.table_written()
    q, k, v = (
        np.repeat(r.standard_normal((1, h, dh)).astype(np.float32), 2, axis=0) for h in (4, n_kv, n_kv)
    )
    at = (np.array([0, 1]), np.array([6, 6]))
    for layer in (0, 1):
        out = b.to_host(b.attention(*_up(b, b, q, k, v), kv, layer, *at, 0.125))
        np.testing.assert_array_equal(out[1], out[0])
    with pytest.raises(ValueError, match="cannot copy"):
        kv.copy_positions(1, 1, 2)
    with pytest.raises(ValueError, match="cannot copy 5 positions"):
        kv.copy_positions(6, 2, 5)


@pytest.mark.parametrize("cache", CACHE_TYPES)
def test_a_block_read_to_the_host_and_written_back_holds_the_same_rows(b, cache):
    """read_block / write_block (a slot saved to a file and restored): the rows attention stored, as
    the oracle stores them; written into another block (of another cache), read there as written."""
    n_kv, dh, bs = 2, 64, 4
    types = dict(zip(("type_k", "type_v"), CACHE_TYPES[cache]))
    if not all(b.supports("kv_cache", kind) for kind in types.values()):
        pytest.skip(f"{b.name} holds no {cache} cache")
    r = np.random.default_rng(5)
    q, k, v = (r.standard_normal((4, h, dh)).astype(np.float32) for h in (4, n_kv, n_kv))
    blocks = []
    for backend in (ORACLE, b):
        kv = backend.new_kv_cache(2, n_kv, dh, 32, 2, block_size=bs, n_blocks=8, **types)
        kv.block_table[:] = -1
        kv.block_table[0, 0] = 5
        kv.table_written()
        for layer in (0, 1):
            backend.attention(
                *_up(backend, b, q, k, v), kv, layer, np.zeros(4, np.int64), np.arange(4), 0.125
            )
        blocks.append(kv.read_block(5))
    (ok, ov), (bk, bv) = blocks
    assert bk.shape == ok.shape and bv.shape == ov.shape
    np.testing.assert_array_equal(bk.view(np.uint8), ok.view(np.uint8))
    np.testing.assert_array_equal(bv.view(np.uint8), ov.view(np.uint8))
    other = b.new_kv_cache(2, n_kv, dh, 32, 2, block_size=bs, n_blocks=8, **types)
    other.write_block(2, bk, bv)
    back = other.read_block(2)
    np.testing.assert_array_equal(back[0].view(np.uint8), bk.view(np.uint8))
    np.testing.assert_array_equal(back[1].view(np.uint8), bv.view(np.uint8))
    with pytest.raises(ValueError, match="of a block is"):
        other.write_block(2, bk[:1], bv)
    with pytest.raises(ValueError, match="outside the pool"):
        other.read_block(8)


def _up(backend, b, *arrays):
    return [backend.from_host(a) for a in arrays] if backend is b else list(arrays)


def test_attention_refuses_a_position_in_an_unmapped_block(b):
    kv = b.new_kv_cache(1, 2, 64, 32, 1, block_size=4, n_blocks=4)
    kv.block_table[:] = -1
    kv.block_table[0, :1] = [3]
    kv.table_written()
    q, k, v = (b.from_host(np.ones((1, h, 64), np.float32)) for h in (2, 2, 2))
    with pytest.raises(ValueError, match="no KV block"):
        b.attention(q, k, v, kv, 0, np.array([0]), np.array([6]), 0.125)


# -- the other ops -------------------------------------------------------------------------------------------
ROPES = {
    "normal": RopeSpec(64, 10000.0),
    "neox": RopeSpec(64, 1e6, neox=True),
    "partial-neox": RopeSpec(48, 10000.0, neox=True),
    "linear-scaled": RopeSpec(64, 10000.0, freq_scale=0.25),
    "freq-factors": RopeSpec(64, 500000.0, freq_factors=np.linspace(1, 8, 32).astype(np.float32)),
}


@pytest.mark.parametrize("rope", ROPES)
def test_rope_variants_are_the_oracles_bits(b, rope):
    x = rng.standard_normal((5, 3, 64)).astype(np.float32)
    pos = np.array([0, 1, 17, 900, 4095], np.int64)
    np.testing.assert_array_equal(
        b.to_host(b.rope(b.from_host(x), pos, ROPES[rope])), ORACLE.rope(x, pos, ROPES[rope])
    )


def test_norms_and_elementwise_ops(b):
    x = (rng.standard_normal((6, 256)) * 3).astype(np.float32)
    w = rng.standard_normal(256).astype(np.float32)
    g, u = rng.standard_normal((2, 6, 256)).astype(np.float32) * 4
    X, W, G, U = (b.from_host(a) for a in (x, w, g, u))
    eq = np.testing.assert_array_equal
    eq(b.to_host(b.rms_norm(X, W, 1e-5)), ORACLE.rms_norm(x, w, 1e-5))
    eq(b.to_host(b.rms_norm(X, None, 1e-6)), ORACLE.rms_norm(x, None, 1e-6))
    heads = x.reshape(6, 4, 64)
    eq(
        b.to_host(b.rms_norm(b.from_host(heads), b.from_host(w[:64]), 1e-6)),
        ORACLE.rms_norm(heads, w[:64], 1e-6),
    )
    np.testing.assert_allclose(b.to_host(b.silu_mul(G, U)), ORACLE.silu_mul(g, u), rtol=1e-6, atol=1e-7)
    eq(b.to_host(b.gelu_mul(G, U)), ORACLE.gelu_mul(g, u))  # ggml's f16 table: the same lookups
    np.testing.assert_allclose(
        b.to_host(b.softcap(b.scale(G, 10.0), 30.0)),
        ORACLE.softcap(g * np.float32(10), 30.0),
        rtol=1e-6,
        atol=1e-6,
    )
    eq(b.to_host(b.add(G, U)), g + u)
    eq(b.to_host(b.add(G, b.from_host(u[0]))), g + u[0])  # a bias row
    eq(b.to_host(b.scale(G, 0.125)), g * np.float32(0.125))
    eq(b.to_host(b.columns(G, 10, 100)), g[:, 10:100])
    eq(b.to_host(b.take_rows(G, np.array([5, 0]))), g[[5, 0]])


# -- whole models --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(CONTRACT_BACKENDS))
def test_the_same_bits_on_1_2_and_3_threads(tmp_path, name):
    """Work is split by output rows, never by the summation: any thread count gives the same logits."""
    outs = []
    # a simulated device (each GPU thread a Python thread: ~10 s a forward here) ignores threads: two runs
    counts = (1, 2) if _simulated(_backend(name)) else (1, 2, 3)
    for t in counts:
        _backend(name, t)  # skips if unavailable
        model, *_ = build(tmp_path, dict(CASES["qwen2"]), backend="reference")
        from edgellm.arch import load_model

        m = load_model(ModelFile(next(tmp_path.glob("*.gguf"))), CONTRACT_BACKENDS[name](threads=t))
        outs.append(
            m.forward(
                np.asarray(TOKENS),
                np.arange(len(TOKENS)),
                np.zeros(len(TOKENS), np.int64),
                m.new_kv_cache(32, 1),
            )
        )
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("name", ["native", "numba"])
@pytest.mark.parametrize("alias", ["smollm2-135m", "gemma3-270m"])
def test_teacher_forced_kl_against_llama_cpp_on_the_fast_backends(request, name, alias):
    import edgellm

    _backend(name)
    path = request.getfixturevalue({"smollm2-135m": "smollm2_path", "gemma3-270m": "gemma3_path"}[alias])
    llm = edgellm.LLM(path, backend=name, n_ctx=1024)
    kl, confident, agree = teacher_forced_kl(llm, alias, n_tokens=160)
    assert kl <= KL_MAX and agree > 0.9, f"{name} {alias}: mean KL {kl:.5f}, top-1 agreement {agree:.3f}"


# -- coverage is declared ------------------------------------------------------------------------------------
def test_a_weight_without_a_kernel_is_named_at_load_with_its_memory_cost(tmp_path, caplog, monkeypatch):
    from edgellm.arch import fallback_report, load_model
    from edgellm.backends.native import NativeBackend

    nb = _backend("native")
    model, spec, *_ = build(tmp_path, dict(CASES["qwen2"]), backend="reference")
    mf = ModelFile(next(tmp_path.glob("*.gguf")))
    assert fallback_report(mf, nb) is None  # F32 everywhere: covered
    monkeypatch.setattr(NativeBackend, "kernel_types", lambda self, op: frozenset())
    nb = NativeBackend(threads=1)  # a backend asks kernel_types once: a new one sees the patch
    report = fallback_report(mf, nb)
    n_matrices = 2 + 7 * spec.n_layer  # embedding, output, q/k/v/o/gate/up/down per layer
    assert report.startswith(f"native: {n_matrices} of {n_matrices} weight matrices (F32 x{n_matrices})")
    mib = sum(int(np.prod(t.shape)) * 4 for t in mf.tensors.values() if t.shape.count(1) < len(t.shape) - 1)
    assert f"({mib / 2**20:.0f} MiB more memory" in report
    with caplog.at_level("WARNING", logger="edgellm"):
        m = load_model(mf, nb)
    assert report in caplog.text
    ref = load_model(mf, ORACLE)
    args = (np.asarray(TOKENS), np.arange(len(TOKENS)), np.zeros(len(TOKENS), np.int64))
    got, want = m.forward(*args, m.new_kv_cache(32, 1)), ref.forward(*args, ref.new_kv_cache(32, 1))
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL * np.abs(want).max())  # the fallback ran


def test_auto_prefers_a_fast_backend_that_covers_the_file(monkeypatch):
    from edgellm.backends.native import NativeBackend

    _backend("native"), _backend("numba")
    assert get_backend("auto", weight_types=[T.Q3_K]).name == "native"
    monkeypatch.setattr(NativeBackend, "kernel_types", lambda self, op: frozenset({int(T.Q4_K)}))
    assert get_backend("auto", weight_types=[T.Q4_K]).name == "native"
    assert get_backend("auto", weight_types=[T.Q4_K, T.Q3_K]).name == "numba"
