"""The native backend (C ops through cffi) against the reference backend: every op on random inputs, matmul
and get_rows of every weight type on random and real tensors, attention over a paged cache with a shuffled
block table; captured decode plans against the same ops run one by one (bit for bit), 1 against 2 and 3
threads (bit for bit); greedy tokens of SmolLM2 and gemma3 against llama.cpp's fixtures; and a clear
one-line reason when the extension is missing.

Tolerance for matmul: the same products of the same quantized numbers in another float32 summation order
(see tests/test_numba_backend.py): 1e-5 of each output's scale sum_k |w_k x_k|.
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from forward_checks import check_forced_steps, check_greedy, load_fixture, prefill
from gguf import GGMLQuantizationType as T
from plan_checks import BATCH_STEPS, eager_and_planned, tiny_model
from random_weights import (
    QUANTIZABLE,
    RANDOM_BYTES,
    assert_matmul_matches_oracle,
    random_weight,
)

from edgellm import quants
from edgellm.arch import load_model
from edgellm.backends import BackendUnavailable, get_backend
from edgellm.backends import native as native_mod
from edgellm.backends.base import RopeSpec
from edgellm.backends.reference import ReferenceBackend
from edgellm.gguf import ModelFile, QTensor

pytestmark = pytest.mark.skipif(native_mod.available() is not None, reason=str(native_mod.available()))


rng = np.random.default_rng(4321)


@pytest.fixture(scope="module")
def nb() -> native_mod.NativeBackend:
    return native_mod.NativeBackend(threads=2)


class threads:
    """Run a backend's ops on a pool of exactly n threads (more than the cores is fine for a test)."""

    def __init__(self, b: native_mod.NativeBackend, n: int):
        self.b, self.n = b, n

    def __enter__(self):
        self.saved = self.b._pool
        self.b._pool = native_mod.ffi.gc(native_mod.lib.ed_pool_new(self.n), native_mod.lib.ed_pool_free)
        return self.b

    def __exit__(self, *exc):
        self.b._pool = self.saved


# -- matmul and get_rows ---------------------------------------------------------------------------------
# matmul of every type on random rows: tests/test_backend_contract.py (every backend)


@pytest.mark.parametrize(
    "alias,names",
    [
        ("smollm2", ["blk.0.attn_q.weight", "blk.3.ffn_down.weight", "token_embd.weight"]),
        (
            "gemma3",
            ["blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.ffn_down.weight", "token_embd.weight"],
        ),
    ],
)
def test_matmul_and_get_rows_match_reference_on_real_tensors(nb, request, alias, names):
    mf = ModelFile(request.getfixturevalue(f"{alias}_path"))
    ref = ReferenceBackend()
    for name in names:
        qt = mf.tensors[name]
        data = qt.data[:512]  # the first rows are enough (gemma's embedding has 262k)
        qt = QTensor(name, qt.type, (qt.ne[0], data.shape[0]), qt.offset, data.nbytes, data)
        for n in (1, 7):
            assert_matmul_matches_oracle(nb, qt, (rng.standard_normal((n, qt.ne[0])) * 3).astype(np.float32))
        ids = np.array([0, qt.data.shape[0] - 1, 7, 7])
        assert np.array_equal(nb.get_rows(nb.bind(qt), ids), ref.get_rows(ref.bind(qt), ids))


@pytest.mark.parametrize("t", QUANTIZABLE + RANDOM_BYTES, ids=lambda t: t.name)
def test_get_rows_dequantizes_bit_exactly(nb, t):
    qt = random_weight(t, 9, 512, rng)
    ids = np.array([8, 0, 3, 3])
    assert np.array_equal(nb.get_rows(nb.bind(qt), ids), quants.dequantize(qt.data[ids], t, (4, 512)))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        nb.get_rows(nb.bind(qt), np.array([9]))


@pytest.mark.parametrize("t", [T.Q4_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q6_K, T.F16], ids=lambda t: t.name)
def test_matmul_gives_the_same_bits_on_1_2_and_3_threads(nb, t):
    w = nb.bind(random_weight(t, 300, 512, rng))
    for n in (1, 9, 40):
        x = rng.standard_normal((n, 512)).astype(np.float32)
        outs = []
        for k in (1, 2, 3):
            with threads(nb, k):
                outs.append(nb.matmul(w, x))
        assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


@pytest.mark.parametrize(
    "t",
    [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.F16, T.BF16, T.F32],
    ids=lambda t: t.name,
)
def test_a_rows_matmul_bits_do_not_depend_on_the_rows_beside_it(nb, t):
    """Decode (one row), batched decode and prompts (multi-row kernels, the AMX tile GEMM where the CPU has
    it) give every row the same bits, so a batch's composition never changes a sequence's tokens."""
    # 40 blocks of 32: two groups of 16 and a tail; the float types' rows end in a 16-element step and a
    # scalar tail
    k = 1301 if t in (T.F16, T.BF16, T.F32) else 1280
    w = nb.bind(random_weight(t, 41, k, rng))
    x = rng.standard_normal((37, k)).astype(np.float32)
    single = np.concatenate([nb.matmul(w, x[i : i + 1]) for i in range(len(x))])
    for n in (2, 4, 17, 37):
        assert np.array_equal(nb.matmul(w, x[:n]).view(np.uint32), single[:n].view(np.uint32)), n


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


@pytest.mark.skipif(
    platform.machine() != "x86_64" or not {"amx_tile", "amx_int8"} <= _cpu_flags(),
    reason="needs an x86-64 CPU with AMX (amx_int8); under qemu-user /proc/cpuinfo is the host's",
)
def test_amx_is_in_use_where_the_cpu_has_it_and_off_with_edgellm_amx_0():
    """Where the CPU has AMX the native level says so (then the batch test above runs the tile GEMM);
    EDGELLM_AMX=0 switches it off. The level is fixed per process: each case runs in its own."""
    code = "from edgellm.backends.native import NativeBackend; print(NativeBackend(threads=1).level)"
    levels = {}
    for amx in ("1", "0"):
        env = {**os.environ, "EDGELLM_AMX": amx}
        run = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        levels[amx] = run.stdout.strip()
    assert levels == {"1": "avx512+vnni+amx", "0": "avx512+vnni"}


@pytest.mark.skipif(
    platform.machine() != "x86_64" or not {"amx_tile", "amx_int8"} <= _cpu_flags(),
    reason="needs an x86-64 CPU with AMX (amx_int8); under qemu-user /proc/cpuinfo is the host's",
)
def test_amx_tiles_over_the_files_blocks_give_decode_bits_with_edgellm_repack_0():
    """AMX machines repack (prompts on tiles read from the x16 layout: the batch test above); with
    EDGELLM_REPACK=0 they multiply prompts with the tile GEMM over the file's blocks instead, which must
    give every row the bits decode gives too. The table is built per process: the batch test reruns in one."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", __file__,
         "-k", "rows_matmul_bits_do_not_depend"],
        env={**os.environ, "EDGELLM_REPACK": "0"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0 and " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-3000:]


REPACKS = bool(native_mod.lib is not None and native_mod.lib.ed_repack_x16_supported(int(T.Q4_0)))


@pytest.mark.skipif(
    not REPACKS, reason="this CPU's kernels keep the file's layout (x16: AVX2, AVX-512 with VNNI, sdot)"
)
def test_matmul_weights_are_repacked_at_load_where_the_kernels_take_them(tmp_path):
    """Where the kernels take the x16 layout (AVX2, AVX-512 with VNNI, aarch64 with sdot) load_model gives
    Q4_0/Q8_0 matrices a repacked copy, plans replay it bit for bit (test_every_architecture_... too),
    and logits stay within the matmul tolerance of the reference backend."""
    model = tiny_model(tmp_path, "llama", native_mod.NativeBackend(threads=2))
    weights = [w for w in vars(model.layers[0]).values() if isinstance(w, native_mod.NativeWeight)]
    assert weights and all(w.x16 is not None and w.x16.ctypes.data % 64 == 0 for w in weights)
    eager_and_planned(model, BATCH_STEPS)
    ref = load_model(ModelFile(tmp_path / "llama.gguf"), ReferenceBackend())
    args = (np.array([3, 1, 4, 1, 5]), np.arange(5), np.zeros(5, np.int64))
    a, b = model.forward(*args, model.new_kv_cache(8, 1)), ref.forward(*args, ref.new_kv_cache(8, 1))
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * np.abs(b).max())


def test_a_tied_token_embedding_is_held_in_the_arena_and_an_untied_one_stays_in_the_file(tmp_path):
    """A tied token embedding (qwen2's tiny model) is the output matrix too: load copies it, bytes as the
    file has them, into the backend's arena (huge pages); get_rows and the logits then read the copy,
    within the matmul tolerance of the reference and planned bit for bit as eager. An untied one
    (llama's) only feeds get_rows and stays a view of the file."""
    model = tiny_model(tmp_path, "qwen2", native_mod.NativeBackend(threads=2))
    mf = ModelFile(tmp_path / "qwen2.gguf")
    assert model.output is model.tok_embd and "output.weight" not in mf.tensors
    emb = model.tok_embd
    assert emb.raw.ctypes.data != emb.qt.data.ctypes.data  # (qt.data: the file's bytes)
    assert emb.ptr == emb.raw.ctypes.data and np.array_equal(emb.raw, mf.tensors["token_embd.weight"].data)
    assert model.backend.repacked_bytes >= emb.raw.nbytes
    eager_and_planned(model, BATCH_STEPS)
    ref = load_model(mf, ReferenceBackend())
    args = (np.array([3, 1, 4, 1, 5]), np.arange(5), np.zeros(5, np.int64))
    a, b = model.forward(*args, model.new_kv_cache(8, 1)), ref.forward(*args, ref.new_kv_cache(8, 1))
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * np.abs(b).max())
    untied = tiny_model(tmp_path, "llama", native_mod.NativeBackend(threads=1))
    assert untied.output is not untied.tok_embd
    assert untied.tok_embd.raw.ctypes.data == untied.tok_embd.qt.data.ctypes.data


@pytest.mark.skipif(
    not REPACKS, reason="this CPU's kernels keep the file's layout (x16: AVX2, AVX-512 with VNNI, sdot)"
)
def test_edgellm_repack_off_keeps_the_files_layout(tmp_path):
    """EDGELLM_REPACK=0 (read when the kernel table is built, so in a fresh process) keeps every matrix in
    the file's layout; =1 repacks the same ones as the default."""
    model = tiny_model(tmp_path, "llama", native_mod.NativeBackend(threads=2))
    weights = [w for w in vars(model.layers[0]).values() if isinstance(w, native_mod.NativeWeight)]
    code = (
        "import sys; from edgellm.arch import load_model; from edgellm.gguf import ModelFile;"
        "from edgellm.backends.native import NativeBackend, NativeWeight;"
        "m = load_model(ModelFile(sys.argv[1]), NativeBackend(threads=1));"
        "print(sum(w.x16 is not None for w in vars(m.layers[0]).values() if isinstance(w, NativeWeight)))"
    )
    for flag, want in (("1", str(len(weights))), ("0", "0")):
        run = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "llama.gguf")],
            env={**os.environ, "EDGELLM_REPACK": flag}, capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert run.stdout.strip() == want, (flag, run.stdout, run.stderr)


def test_back_to_back_runs_of_small_and_large_ops_on_more_threads_than_cores(nb):
    """Runs alternate between ops the caller runs alone and ops spread over a 3-thread pool (workers
    joining late, lists reused two runs later): every result stays the 1-thread result."""
    w = nb.bind(random_weight(T.Q8_0, 256, 512, rng))
    xs = [rng.standard_normal((n, 512)).astype(np.float32) for n in (1, 33, 2, 17) * 25]
    want = [nb.matmul(w, x) for x in xs]  # the backend's own 2-thread pool
    with threads(nb, 1):
        assert all(np.array_equal(nb.matmul(w, x), y) for x, y in zip(xs, want))
    with threads(nb, 3):
        got = [(nb.matmul(w, x), nb.silu_mul(x, x)) for x in xs]
    assert all(np.array_equal(g, y) for (g, _), y in zip(got, want))
    assert all(np.array_equal(s, nb.silu_mul(x, x)) for (_, s), x in zip(got, xs))


# -- the other ops -----------------------------------------------------------------------------------------
def test_norm_rope_glu_and_elementwise_ops_match_the_reference(nb):
    ref = ReferenceBackend()
    x = rng.standard_normal((5, 576)).astype(np.float32)
    w = rng.standard_normal(576).astype(np.float32)
    assert np.array_equal(nb.rms_norm(x, w, 1e-5), ref.rms_norm(x, w, 1e-5))
    assert np.array_equal(nb.rms_norm(x, None, 1e-6), ref.rms_norm(x, None, 1e-6))
    heads = rng.standard_normal((5, 3, 64)).astype(np.float32)  # per-head norm (Gemma's, Qwen3's q/k norm)
    assert np.array_equal(nb.rms_norm(heads, w[:64], 1e-6), ref.rms_norm(heads, w[:64], 1e-6))
    q = rng.standard_normal((7, 4, 64)).astype(np.float32)
    pos = np.array([0, 3, 100, 1000, 5, 6, 7])
    factors = np.linspace(1, 4, 16).astype(np.float32)
    for spec in (
        RopeSpec(64, 10000.0),
        RopeSpec(64, 1e6, neox=True),
        RopeSpec(32, 10000.0, freq_scale=0.5, freq_factors=factors),
        RopeSpec(24, 10000.0, neox=True),  # partial rotary (Phi-4-mini)
    ):
        assert np.array_equal(nb.rope(q, pos, spec), ref.rope(q, pos, spec))
    g = (rng.standard_normal((3, 256)) * 4).astype(np.float32)
    g[0, :4] = [-20, -10, 10, 12]
    u = rng.standard_normal((3, 256)).astype(np.float32)
    assert np.array_equal(nb.gelu_mul(g, u), ref.gelu_mul(g, u))
    # libm's expf/tanhf here, numpy's SIMD routines there: the last bit may differ
    np.testing.assert_allclose(nb.silu_mul(g, u), ref.silu_mul(g, u), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(nb.softcap(g * 10, 30.0), ref.softcap(g * 10, 30.0), rtol=1e-6, atol=1e-6)
    assert np.array_equal(nb.add(g, u), g + u)
    assert np.array_equal(nb.add(g, u[0]), g + u[0])  # a bias row
    assert np.array_equal(nb.scale(g, 0.125), ref.scale(g, 0.125))
    assert np.array_equal(nb.columns(g, 10, 100), g[:, 10:100])


KV_TYPES = {"f16": {}, "q8_0": dict(type_k="q8_0", type_v="q8_0"), "q8_0-K": dict(type_k="q8_0")}


def _attention_pair(nb, window, softcap, block_size=None, n_blocks=None, types=None):
    """Native and reference caches (of KV cache types `types`), and a function running one attention step
    on both."""
    ref = ReferenceBackend()
    types = types or {}
    kvs = [b.new_kv_cache(2, 2, 64, 16, 2, block_size, n_blocks, **types) for b in (nb, ref)]

    def step(seqs, pos):
        n = len(seqs)
        q = rng.standard_normal((n, 6, 64)).astype(np.float32)
        k, v = rng.standard_normal((2, n, 2, 64)).astype(np.float32)
        seqs, pos = np.asarray(seqs), np.asarray(pos)
        return [
            b.attention(q, k, v, kv, 1, seqs, pos, 0.125, window, softcap) for b, kv in zip((nb, ref), kvs)
        ]

    return kvs, step


@pytest.mark.parametrize("types", KV_TYPES)
@pytest.mark.parametrize("window,softcap", [(None, None), (3, None), (None, 30.0)])
def test_attention_and_kv_cache_match_the_reference(nb, window, softcap, types):
    """A 6-token prompt of sequence 1, then a batch of sequence 1's next token and sequence 0's first."""
    kvs, step = _attention_pair(nb, window, softcap, types=KV_TYPES[types])
    for seqs, pos in [([1] * 6, range(6)), ([1, 0], [6, 0])]:
        a, b = step(seqs, list(pos))
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # summation order only
    assert np.array_equal(kvs[0].k, kvs[1].k) and np.array_equal(kvs[0].v, kvs[1].v)
    with pytest.raises(ValueError, match="outside the context"):
        step([0, 0], [15, 16])


@pytest.mark.parametrize("types", KV_TYPES)
def test_attention_through_a_shuffled_block_table_matches_the_reference(nb, types):
    kvs, step = _attention_pair(nb, 5, None, block_size=4, n_blocks=8, types=KV_TYPES[types])
    table = rng.permutation(8).astype(np.int32).reshape(2, 4)  # each sequence's blocks scattered in the pool
    for kv in kvs:
        kv.block_table[:] = table
    for seqs, pos in [([1] * 7, range(7)), ([0] * 3, range(3)), ([1, 0], [7, 3]), ([0, 1], [4, 8])]:
        a, b = step(seqs, list(pos))
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert np.array_equal(kvs[0].k, kvs[1].k) and np.array_equal(kvs[0].v, kvs[1].v)
    kvs[0].block_table[0, 3] = -1
    with pytest.raises(ValueError, match="no KV block"):
        step([0, 0], [12, 13])


@pytest.mark.parametrize("types", KV_TYPES)
def test_attention_gives_the_same_bits_on_1_and_3_threads(nb, types):
    outs = []
    for k in (1, 3):
        with threads(nb, k):
            kv = nb.new_kv_cache(1, 2, 64, 32, 3, **KV_TYPES[types])
            r = np.random.default_rng(7)
            for seqs, pos in [([2] * 9, range(9)), ([0, 2, 1], [0, 9, 0])]:
                q = r.standard_normal((len(seqs), 6, 64)).astype(np.float32)
                k_, v = r.standard_normal((2, len(seqs), 2, 64)).astype(np.float32)
                out = nb.attention(q, k_, v, kv, 0, np.array(seqs), np.array(list(pos)), 0.125, 4, 20.0)
            outs.append(out)
    assert np.array_equal(outs[0], outs[1])


@pytest.mark.parametrize("window,softcap", [(None, None), (5, None), (40, 30.0)])
@pytest.mark.parametrize("shape", ["one sequence", "two sequences"])
@pytest.mark.parametrize("types", KV_TYPES)
def test_prompt_tiles_give_the_bits_of_one_token_at_a_time(nb, window, softcap, shape, types):
    """A long prompt attends in tiles of up to 16 tokens (each key converted once per tile): the same bits
    as feeding the tokens one by one, where tiles do not apply; a batch holding two sequences, and the
    last partial tile, included; over f16 and q8_0 caches."""
    n = 70
    seqs = [0] * n if shape == "one sequence" else [0] * 37 + [1] * (n - 37)
    pos = list(range(n)) if shape == "one sequence" else list(range(37)) + list(range(n - 37))
    r = np.random.default_rng(11)
    q = r.standard_normal((n, 6, 64)).astype(np.float32)
    k, v = r.standard_normal((2, n, 2, 64)).astype(np.float32)
    args = (0.125, window, softcap)
    whole_kv, one_kv = (nb.new_kv_cache(2, 2, 64, 96, 2, 8, 24, **KV_TYPES[types]) for _ in range(2))
    for kv in (whole_kv, one_kv):
        kv.block_table[:] = np.random.default_rng(3).permutation(24).astype(np.int32).reshape(2, 12)
    whole = nb.attention(q, k, v, whole_kv, 1, np.array(seqs), np.array(pos), *args)
    one = np.concatenate(
        [
            nb.attention(
                q[i : i + 1],
                k[i : i + 1],
                v[i : i + 1],
                one_kv,
                1,
                np.array(seqs[i : i + 1]),
                np.array(pos[i : i + 1]),
                *args,
            )
            for i in range(n)
        ]
    )
    assert np.array_equal(whole, one)
    ref = ReferenceBackend()
    ref_kv = ref.new_kv_cache(2, 2, 64, 96, 2, 8, 24, **KV_TYPES[types])
    ref_kv.block_table[:] = whole_kv.block_table
    expect = ref.attention(q, k, v, ref_kv, 1, np.array(seqs), np.array(pos), *args)
    # a score differing in its last bit (summation order) can round its weight to the neighbouring f16:
    # 2^-11 of a weight, times a value of a few units
    np.testing.assert_allclose(whole, expect, rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("window,softcap", [(None, None), (280, None), (None, 30.0)])
@pytest.mark.parametrize(
    "heads,types",  # a q8_0 cache holds heads of whole 32-element blocks: 72 is f16 only
    [(h, t) for h in [(3, 3, 64), (1, 4, 256), (2, 7, 72)] for t in ["f16", "q8_0", "q8_0-K", "q8_0-V"]
     if t == "f16" or h[2] % 32 == 0],
)  # fmt: skip
def test_deep_decode_splits_its_keys_over_threads_bit_for_bit(nb, window, softcap, heads, types):
    """A decode step hundreds of keys deep has fewer (token, kv head) pairs than threads: its keys are scored
    in blocks, each row softmaxed, the values weighed per column block, on every thread; the bits are those
    of one thread attending pair by pair. One token of one sequence, then a step of two sequences of
    different depths (one too shallow to split alone). Over f16 and q8_0 caches, K and V of either kind."""
    hkv, group, dh = heads
    kv_types = {**KV_TYPES, "q8_0-V": dict(type_v="q8_0")}[types]
    deep, shallow = 300, 20
    r = np.random.default_rng(17)
    q = r.standard_normal((deep + shallow + 3, hkv * group, dh)).astype(np.float32)
    k, v = r.standard_normal((2, deep + shallow + 3, hkv, dh)).astype(np.float32)
    steps = [  # (sequence, positions) in order; the last two are the decode steps compared
        ([0] * deep, range(deep)),
        ([1] * shallow, range(shallow)),
        ([0], [deep]),
        ([0, 1], [deep + 1, shallow]),
    ]
    outs, split_chunks = {}, {}
    for n_threads in (1, 2, 3):
        with threads(nb, n_threads):
            kv = nb.new_kv_cache(1, hkv, dh, 512, 2, 16, 64, **kv_types)
            kv.block_table[:] = np.random.default_rng(3).permutation(64).astype(np.int32).reshape(2, 32)
            seen = []

            def spy(seen=seen, n_threads=n_threads, **fields):
                # phase 2 (the rows' softmax) has chunks only where the keys are split
                seen.append(
                    native_mod.lib.ed_op_chunk_count(native_mod.ffi.new("ed_op *", fields), 2, n_threads)
                )
                native_mod.NativeBackend._exec(nb, **fields)

            nb._exec = spy
            try:
                row = 0
                for seqs, pos in steps:
                    sl = slice(row, row + len(seqs))
                    out = nb.attention(q[sl], k[sl], v[sl], kv, 0, np.array(seqs), np.array(list(pos)), 0.125,
                                       window, softcap)  # fmt: skip
                    outs.setdefault(n_threads, []).append(out)
                    row += len(seqs)
            finally:
                del nb._exec
            split_chunks[n_threads] = seen[2:]
    assert split_chunks[1] == [0, 0]  # one thread attends pair by pair
    assert all(c > 0 for c in split_chunks[2] + split_chunks[3]), split_chunks
    for n_threads in (2, 3):
        for a, b in zip(outs[1], outs[n_threads]):
            assert np.array_equal(a, b)


_LEVEL_ATTENTION = """
import hashlib, sys
import numpy as np
from edgellm.backends.native import NativeBackend
h = hashlib.sha256()
q8 = dict(type_k="q8_0", type_v="q8_0")
for hkv, group, dh, types in [(3, 3, 64, {}), (2, 7, 72, {}), (1, 4, 256, {}), (3, 3, 64, q8),
                              (1, 4, 256, dict(type_v="q8_0")), (1, 5, 40, {}), (2, 6, 24, {})]:
    r = np.random.default_rng(29)
    q = r.standard_normal((303, hkv * group, dh)).astype(np.float32)
    k, v = r.standard_normal((2, 303, hkv, dh)).astype(np.float32)
    for n_threads in (1, 2):
        nb = NativeBackend(threads=n_threads)
        kv = nb.new_kv_cache(1, hkv, dh, 512, 2, 16, 64, **types)
        kv.block_table[:] = np.arange(64, dtype=np.int32).reshape(2, 32)
        for sl, seqs, pos in [(slice(0, 300), [0] * 300, range(300)), (slice(300, 301), [0], [300]),
                              (slice(301, 303), [0, 1], [301, 0])]:
            out = nb.attention(q[sl], k[sl], v[sl], kv, 0, np.array(seqs), np.array(list(pos)), 0.125)
            h.update(np.ascontiguousarray(out).tobytes())
print(NativeBackend(threads=1).level.split("+")[0], h.hexdigest())
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the x86 levels' attention loops")
def test_attention_gives_the_same_bits_at_every_x86_level():
    """Attention's inner loops (portable C, AVX + F16C, AVX-512VL) do the same float operations in the same
    order: a 300-token prompt, a decode step deep enough to split its keys over 2 threads and a two-sequence
    step give the same bits at each level this CPU runs (EDGELLM_NATIVE_LEVEL picks a lower one), over f16
    and q8_0 caches, for groups of query heads that take each of the AVX level's score tiles (4 x 2, 3 x 2,
    2 x 4 and 1 x 8 heads x keys)."""
    digests = {}
    for level in ("scalar", "avx2", "avx512"):
        env = {**os.environ, "EDGELLM_NATIVE_LEVEL": level}
        code = [sys.executable, "-c", _LEVEL_ATTENTION]
        run = subprocess.run(code, env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        got, digest = run.stdout.split()
        digests[got] = digest  # a level the CPU lacks falls back to its best: the same key again
    assert "scalar" in digests and len(set(digests.values())) == 1, digests


# -- captured plans (the tests every capturing backend runs are in test_decode_plans.py) -------------
@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    import edgellm

    return edgellm.LLM(smollm2_path, backend="native", n_ctx=256, threads=2)


def test_smollm2_greedy_tokens_match_llama_cpp(smollm2):
    for case in load_fixture("smollm2-135m")["greedy"][:2]:
        check_greedy(smollm2, dict(case, ids=case["ids"][:32], margins=case["margins"][:32]))


def test_smollm2_plan_equals_eager_and_1_thread_equals_2(smollm2):
    model = smollm2.model
    eager_and_planned(model, BATCH_STEPS[:3])
    prompt = load_fixture("smollm2-135m")["greedy"][0]["prompt_ids"]
    outs = []
    for k in (1, 2):
        with threads(model.backend, k):
            kv = model.new_kv_cache(64, 1)
            first = prefill(model, prompt, kv)
            step = model.decode_step(
                np.array([int(first.argmax())]), np.array([len(prompt)]), np.zeros(1, np.int64), kv
            )
            outs.append((first, step))
    assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])


def test_gemma3_greedy_and_teacher_forced_steps_match_llama_cpp(gemma3_path):
    import edgellm

    llm = edgellm.LLM(gemma3_path, backend="native", n_ctx=256)
    case = load_fixture("gemma3-270m")["greedy"][0]
    check_greedy(llm, dict(case, ids=case["ids"][:16], margins=case["margins"][:16]))
    n, notes = check_forced_steps(llm, case)
    assert n <= len(case["ids"]) // 10, notes
    kv = llm.model.new_kv_cache(16, 1)
    llm.model.decode_step(np.array([2]), np.array([0]), np.zeros(1, np.int64), kv)
    assert llm.model.backend.captured(llm.model, kv, 1) is not None  # softcap, GeGLU, sliding window


def test_qwen2_greedy_and_teacher_forced_steps_match_llama_cpp(qwen_coder_path):
    """Qwen2.5-Coder-0.5B (qwen2: QKV bias, Q5_0/Q8_0/Q6_K/Q4_K) on the native backend: every fixture
    prompt's greedy tokens up to the first near-tie, and the forced steps of one."""
    import edgellm

    llm = edgellm.LLM(qwen_coder_path, backend="native", n_ctx=256, threads=2)
    cases = load_fixture("qwen2.5-coder-0.5b")["greedy"]
    for case in cases:
        check_greedy(llm, dict(case, ids=case["ids"][:32], margins=case["margins"][:32]))
    n, notes = check_forced_steps(llm, cases[2])
    assert n <= len(cases[2]["ids"]) // 10, notes


def test_a_forked_child_runs_the_ops_on_its_own_thread(nb):
    """The pool's workers stay in the parent: a child process must not wait for them."""
    import os

    x = rng.standard_normal((64, 4096)).astype(np.float32)  # large enough to use every thread
    want = nb.silu_mul(x, x)
    pid = os.fork()
    if pid == 0:
        os._exit(0 if np.array_equal(nb.silu_mul(x, x), want) else 1)
    assert os.WEXITSTATUS(os.waitpid(pid, 0)[1]) == 0


# -- availability --------------------------------------------------------------------------------------------
def test_a_missing_extension_is_one_clear_line_and_auto_falls_back_saying_why(monkeypatch, caplog):
    import edgellm.backends as backends

    monkeypatch.setattr(backends, "AUTO_ORDER", ["native", "reference"])
    monkeypatch.setattr(native_mod, "lib", None)
    monkeypatch.setattr(native_mod, "_IMPORT_ERROR", "the C extension edgellm._native is not built (test)")
    with pytest.raises(BackendUnavailable) as e:
        get_backend("native")
    assert "edgellm._native is not built" in str(e.value) and "\n" not in str(e.value)
    with caplog.at_level(logging.WARNING):
        assert get_backend("auto").name == "reference"
    assert any("edgellm._native is not built" in r.getMessage() for r in caplog.records)


def test_registered_and_threads_never_exceed_the_cores():
    from edgellm.backends.cpu import physical_cores

    b = get_backend("native", threads=1000)
    assert isinstance(b, native_mod.NativeBackend) and b.threads == physical_cores()
    assert get_backend("native", threads=1).threads == 1


@pytest.mark.slow
def test_qwen2_after_a_4k_token_prompt_gives_llama_cpps_next_token_distribution(qwen_coder_path):
    """The long context (Qwen2.5 trains at 32k): after 4,096 tokens of the license texts, the next-token
    distribution matches llama.cpp's (scripts/make_long_context_fixture.py): the same top token and a
    small KL over llama.cpp's top 64 (the rest folded into one bin). Slow: a 4k prefill."""
    import json

    import edgellm

    fx = json.loads(
        (Path(__file__).parent / "fixtures" / "forward" / "qwen2.5-coder-0.5b-long.json").read_text()
    )
    llm = edgellm.LLM(qwen_coder_path, backend="native", n_ctx=4200, threads=2)
    m, ids = llm.model, np.asarray(fx["ids"], np.int64)
    kv = m.new_kv_cache(len(ids), 1)
    for s in range(0, len(ids), 512):
        part = ids[s : s + 512]
        x = m.forward(part, np.arange(s, s + len(part)), np.zeros(len(part), np.int64), kv,
                      logits_rows=np.array([len(part) - 1]))[0]  # fmt: skip
    x = x.astype(np.float64)
    lp = x - x.max() - np.log(np.exp(x - x.max()).sum())
    top, want = np.asarray(fx["top_ids"]), np.exp(np.asarray(fx["top_logprobs"]))
    got = np.exp(lp[top])
    p = np.append(want, max(0.0, 1 - want.sum()))
    q = np.append(got, max(1e-12, 1 - got.sum()))
    kl = float(np.sum(p * (np.log(np.maximum(p, 1e-12)) - np.log(np.maximum(q, 1e-12)))))
    assert int(np.argmax(lp)) == int(top[0]) and kl < 0.01, (int(np.argmax(lp)), int(top[0]), kl)
