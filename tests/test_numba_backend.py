"""The numba backend's quantized matmuls against the reference backend, on random and real weights; its
activation quantizers against ggml's; 1 vs N threads; its other ops against the reference's; SmolLM2's
greedy tokens against the reference backend's and llama.cpp's.

Tolerance: both backends compute the same products of the same quantized numbers (the reference with the
activations rounded as ggml rounds them, then a float32 BLAS product; numba with ggml's integer block sums
and float32 accumulation), so they differ only by float32 summation order. That error is at most a few
K * 2^-24 of the sum of |terms| (K <= 2048 here: ~1e-4 worst case, ~1e-6 typical); we allow 1e-5 of
each output's scale sum_k |w_k x_k| and measure ~1e-7.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from forward_checks import NEAR_TIE, check_forced_steps, check_greedy, greedy, load_fixture
from gguf import GGMLQuantizationType as T
from random_weights import (
    QUANTIZABLE,
    RANDOM_BYTES,
    assert_matmul_matches_oracle,
    qtensor,
    random_weight,
)

from edgellm import quants
from edgellm.backends import get_backend
from edgellm.backends import numba_kernels as K
from edgellm.backends.base import RopeSpec
from edgellm.backends.numba_cpu import PARALLEL_MIN_MACS, NumbaBackend
from edgellm.backends.numba_kernels import common, simd
from edgellm.backends.reference import ReferenceBackend, activation_roundtrip
from edgellm.gguf import ModelFile, QTensor

rng = np.random.default_rng(1234)


@pytest.fixture(scope="module")
def nb() -> NumbaBackend:
    b = NumbaBackend(threads=2)
    b.warmup()  # compiles every kernel family, or loads it from Numba's cache
    return b


@pytest.mark.parametrize("n", [1, 5], ids=["decode", "prompt"])  # 5 rows take the unpack-once path
@pytest.mark.parametrize("t", QUANTIZABLE + RANDOM_BYTES, ids=lambda t: t.name)
def test_matmul_matches_reference_on_random_weights(nb, t, n):
    qt = random_weight(t, 37, 512, rng)
    x = (rng.standard_normal((n, 512)) * rng.uniform(0.1, 10)).astype(np.float32)
    x[0, :64] *= 20  # an outlier block, as real activations have
    assert_matmul_matches_oracle(nb, qt, x)


def test_float_kernel_handles_rows_not_a_multiple_of_its_lanes(nb):
    qt = random_weight(T.F16, 9, 100, rng)
    assert_matmul_matches_oracle(nb, qt, rng.standard_normal((3, 100)).astype(np.float32))


@pytest.mark.parametrize(
    "alias,names",
    [
        ("smollm2", ["blk.0.attn_q.weight", "blk.3.ffn_down.weight", "token_embd.weight"]),
        ("gemma3", ["blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight"]),
        ("gemma3", ["blk.0.ffn_down.weight", "blk.5.ffn_down.weight"]),
    ],
)
def test_matmul_matches_reference_on_real_tensors(nb, request, alias, names):
    mf = ModelFile(request.getfixturevalue(f"{alias}_path"))
    for name in names:
        qt = mf.tensors[name]
        data = qt.data[:1024]  # the first rows are enough (the embedding has 262k)
        qt = QTensor(name, qt.type, (qt.ne[0], data.shape[0]), qt.offset, data.nbytes, data)
        for n in (1, 7):
            x = (rng.standard_normal((n, qt.ne[0])) * 3).astype(np.float32)
            assert_matmul_matches_oracle(nb, qt, x)


@pytest.mark.parametrize(
    "t", [T.Q4_1, T.Q5_0, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q6_K, T.F16], ids=lambda t: t.name
)
def test_one_and_two_threads_give_identical_bits(nb, t):
    qt = random_weight(t, 512, 512, rng)
    one, two = NumbaBackend(threads=1), nb
    for n in (1, 9):
        x = rng.standard_normal((n, 512)).astype(np.float32)
        assert 512 * 512 * n >= PARALLEL_MIN_MACS  # the 2-thread backend really splits the rows
        a, b = one.matmul(one.bind(qt), x), two.matmul(two.bind(qt), x)
        assert np.array_equal(a, b)
    family, kind = K.KINDS[t]  # and any split of the rows
    x = rng.standard_normal((3, 512)).astype(np.float32)
    outs = []
    for chunks in (1, 2, 5):
        out = np.empty((3, 512), np.float32)
        K.MATMULS[family](kind, nb.bind(qt).raw, x, out, chunks)
        outs.append(out)
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


@pytest.mark.parametrize("t", QUANTIZABLE[:5] + RANDOM_BYTES, ids=lambda t: t.name)
def test_decode_and_prompt_paths_give_identical_bits(nb, t):
    """Few rows take simd.py's vector block dots (legacy types eight blocks at a time, then one by one),
    many rows unpack each weight row once: same numbers. Legacy rows of 19 blocks: two groups of 8 and a
    tail of 3."""
    k = 512 if t in RANDOM_BYTES else 19 * 32
    qt = random_weight(t, 40, k, rng)
    w = nb.bind(qt)
    x = rng.standard_normal((K.legacy.UNPACK_MIN_ROWS + 2, k)).astype(np.float32)
    together = nb.matmul(w, x)
    alone = np.concatenate([nb.matmul(w, x[i : i + 1]) for i in range(len(x))])
    assert np.array_equal(together, alone)


def _ggml_q2_k_q3_k_dot(
    t: T, row: np.ndarray, q8: np.ndarray, d8: np.ndarray, bsums: np.ndarray
) -> np.float32:
    """ggml_vec_dot_q2_K_q8_K_generic / ggml_vec_dot_q3_K_q8_K_generic (ggml-org/llama.cpp
    ggml/src/ggml-cpu/quants.c) transcribed: exact integer sums, then their float32 steps in order."""
    f32, sumf, sums = np.float32, np.float32(0), np.zeros(8, np.float32)
    nbytes = quants.quant_type(t).type_size
    for i, blk in enumerate(row.reshape(-1, nbytes)):
        a = q8[256 * i : 256 * i + 256].astype(np.int64)
        if t == T.Q2_K:  # scales[16] qs[64] d dmin
            sc, qs = blk[:16].astype(np.int64), blk[16:80].astype(np.int64)
            q = np.concatenate([(qs[32 * c : 32 * c + 32] >> s) & 3 for c in range(2) for s in (0, 2, 4, 6)])
            isum = int(((sc & 15) * (a * q).reshape(16, 16).sum(1)).sum())
            summs = int((bsums[16 * i : 16 * i + 16].astype(np.int64) * (sc >> 4)).sum())
            d, dmin = blk[80:84].view("<f2").astype(f32)
            sumf = f32(sumf + (f32(d8[i] * d) * f32(isum) - f32(d8[i] * dmin) * f32(summs)))
            continue
        hm, qs = blk[:32].astype(np.int64), blk[32:96].astype(np.int64)  # hmask[32] qs[64] scales[12] d
        q = np.concatenate(
            [
                ((qs[32 * c : 32 * c + 32] >> 2 * s) & 3) - np.where(hm >> (4 * c + s) & 1, 0, 4)
                for c in range(2)
                for s in range(4)
            ]
        )
        aux = blk[96:108].copy().view("<u4").astype(np.int64)  # the kmask1/kmask2 shuffle of the scales
        k1, k2, tmp = 0x03030303, 0x0F0F0F0F, aux[2]
        auxs = [
            (aux[0] & k2) | (((tmp >> 0) & k1) << 4),
            (aux[1] & k2) | (((tmp >> 2) & k1) << 4),
            ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4),
            ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4),
        ]
        scales = np.array(auxs, "<u4").view(np.int8).astype(np.int64) - 32
        aux32 = ((a * q).reshape(16, 2, 8).sum(1) * scales[:, None]).sum(0)  # lane l: elements 8j + l
        d = f32(blk[108:110].view("<f2")[0]) * d8[i]
        sums = (sums + d * aux32.astype(f32)).astype(f32)
    for v in sums:
        sumf = f32(sumf + v)
    return sumf


@pytest.mark.parametrize("n", [1, 2, 5], ids=["decode", "decode2", "prompt"])
@pytest.mark.parametrize("t", [T.Q2_K, T.Q3_K], ids=lambda t: t.name)
def test_q2_k_and_q3_k_dots_are_ggmls_generic_bit_exact(nb, t, n):
    """Both paths (fused for few rows, unpack-once for many) give ggml's *_generic float32 results."""
    qt = random_weight(t, 6, 512, rng)
    x = (rng.standard_normal((n, 512)) * 3).astype(np.float32)
    x[0, :64] *= 20
    qa, da, bs = np.empty((n, 512), np.int8), np.empty((n, 2), np.float32), np.empty((n, 32), np.int32)
    common.quantize_q8_k(x, qa, da, bs)
    want = np.array([[_ggml_q2_k_q3_k_dot(t, row, qa[j], da[j], bs[j]) for row in qt.data] for j in range(n)])
    got = nb.matmul(nb.bind(qt), x)
    assert np.array_equal(got, want)


def test_q8_0_and_q8_1_activations_are_ggmls(nb):  # nb: compile the kernels the backend's way first
    """quantize_row_q8_0/q8_1 (x86: d = amax/127 as f16, x * 127/amax rounded to even; s = f16(d*sum q))."""
    x = (rng.standard_normal((4, 256)) * 5).astype(np.float32)
    x[1, :32] = 0  # an all-zero block
    x[2, 32:64] = np.arange(32) + 0.5  # halves: ties go to even
    qa, da, sa = np.empty((4, 256), np.int8), np.empty((4, 8), np.float32), np.empty((4, 8), np.float32)
    common.quantize_q8_0(x, qa, da, sa, True)
    deq = (qa.reshape(4, 8, 32) * da[..., None]).reshape(4, 256)
    assert np.array_equal(deq, activation_roundtrip(x, T.Q8_0))
    d32 = (np.abs(x.reshape(4, 8, 32)).max(-1) / np.float32(127)).astype(np.float32)
    want_s = (d32 * qa.reshape(4, 8, 32).sum(-1).astype(np.float32)).astype(np.float16).astype(np.float32)
    assert np.array_equal(sa, want_s)


def test_q8_k_activations_are_ggmls(nb):
    """quantize_row_q8_K_ref: d = 1/(-127/max), nearest_int (half to even), bsums of 16: bit-exact with
    edgellm.quants (itself bit-exact with gguf-py)."""
    x = (rng.standard_normal((3, 512)) * 3).astype(np.float32)
    x[1, :256] = 0
    qa, da, bs = np.empty((3, 512), np.int8), np.empty((3, 2), np.float32), np.empty((3, 32), np.int32)
    common.quantize_q8_k(x, qa, da, bs)
    want = quants.quantize(x, T.Q8_K).reshape(3, 2, 292)
    assert np.array_equal(da, want[..., :4].copy().view("<f4")[..., 0])
    assert np.array_equal(qa.reshape(3, 2, 256), want[..., 4:260].view(np.int8))
    assert np.array_equal(bs.reshape(3, 2, 16), want[..., 260:].copy().view("<i2"))


def test_f16_conversions_are_bit_exact(nb):
    h = np.arange(65536, dtype=np.uint16)
    x = h.view(np.float16).astype(np.float32)
    finite = np.isfinite(x)
    got = np.empty((1, finite.sum()), np.float32)
    common.round_rows_f16(x[finite][None], got)  # every f16 value round-trips
    assert np.array_equal(got[0], x[finite])
    y = (rng.standard_normal((1, 100_000)) * np.exp(rng.uniform(-20, 12, 100_000))).astype(np.float32)
    got = np.empty_like(y)
    common.round_rows_f16(y, got)
    with np.errstate(over="ignore"):
        assert np.array_equal(got, y.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("conversion", ["_f16_to_f32", "_f16_vec_to_f32"])
def test_vector_ir_f16_conversion_is_numpys_for_every_bit_pattern(conversion):
    """simd.py's f16 -> f32 (eight lanes at a time) against numpy, all 65536 patterns: every number bit
    for bit (what the decode loops' scale lookups gave), NaN for NaN. _f16_to_f32 is the portable integer
    and float steps; _f16_vec_to_f32 what the kernels use (vcvtph2ps on x86)."""
    from llvmlite import ir
    from numba import njit, types
    from numba.extending import intrinsic

    @intrinsic
    def convert8(typingctx, h, o, out):
        def codegen(context, builder, sig, args):
            hp = simd._data(context, builder, sig.args[0], args[0], args[1])
            v = builder.load(builder.bitcast(hp, ir.VectorType(ir.IntType(16), 8).as_pointer()), align=2)
            f = getattr(simd, conversion)(builder, v)
            op = simd._data(context, builder, sig.args[2], args[2], args[1])
            builder.store(f, builder.bitcast(op, f.type.as_pointer()), align=4)
            return context.get_dummy_value()

        return types.void(h, o, out), codegen

    @njit
    def convert(h, out):
        for o in range(0, h.shape[0], 8):
            convert8(h, o, out)

    h = np.arange(65536, dtype=np.uint16)
    got = np.empty(65536, np.float32)
    convert(h, got)
    expect = h.view(np.float16).astype(np.float32)
    nan = np.isnan(expect)  # (ggml's conversion quiets signalling NaNs; numpy keeps their bits)
    assert np.array_equal(got[~nan].view(np.uint32), expect[~nan].view(np.uint32))
    assert np.isnan(got[nan]).all()


LEGACY = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
_PORTABLE_RUN = """
import sys, numpy as np
from edgellm.backends import numba_kernels as K
from edgellm.backends.numba_kernels import simd
assert simd.X86 == "", simd.X86
data = np.load(sys.argv[1])
outs = {}
for name in data.files:
    if name[:2] in ("w_", "k_"):
        w, x = data[name], data["x" if name[0] == "w" else "xk"]
        w.flags.writeable = False
        out = np.empty((x.shape[0], w.shape[0]), np.float32)
        (K.matmul_legacy if name[0] == "w" else K.matmul_kquant)(int(name.split("_")[1]), w, x, out, 1)
        outs[name] = out
np.savez(sys.argv[2], **outs)
"""


@pytest.mark.skipif(not simd.X86, reason="this CPU runs the portable vector IR already")
def test_x86_block_dots_give_the_portable_irs_bits(tmp_path):
    """simd.py's x86 dots (vpdpbusd or vpmaddubsw + vpmaddwd, unsigned quants with their offset taken off
    as an activation sum, Q8_0's sign trick, Q4_K's and Q6_K's bytes reordered into their lanes;
    vcvtph2ps) against its portable IR, run in a fresh process (EDGELLM_NUMBA_SIMD=generic, its own Numba
    cache): the same bits on the decode path, every legacy type, Q4_K and Q6_K, quantized normals (every
    quant value; Q8_0's down to -128 set by hand) and random K-quant blocks against activations whose
    blocks reach +-127; 37 rows (the two-row loop and its last row alone), 19 legacy blocks (two groups of
    8 and three alone)."""
    import subprocess
    import sys

    k, m = 19 * 32, 37
    x = (rng.standard_normal((3, k)) * 4).astype(np.float32)
    arrays = {"x": x}
    for t in LEGACY:
        w = np.array(random_weight(t, m, k, rng).data)
        if t == T.Q8_0:
            w[:, [2 + 34 * b + j for b in range(19) for j in (0, 5)]] = 0x80  # quants of -128
        arrays[f"w_{K.KINDS[t][1]}"] = w
    arrays["xk"] = (rng.standard_normal((3, 512)) * 4).astype(np.float32)
    for t in (T.Q4_K, T.Q6_K):
        arrays[f"k_{K.KINDS[t][1]}"] = np.array(random_weight(t, m, 512, rng).data)
    np.savez(tmp_path / "in.npz", **arrays)
    env = {**os.environ, "EDGELLM_NUMBA_SIMD": "generic", "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    subprocess.run(
        [sys.executable, "-c", _PORTABLE_RUN, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
        env=env,
        check=True,
        timeout=600,
    )
    portable = np.load(tmp_path / "out.npz")
    for name, w in arrays.items():
        if name[:2] in ("w_", "k_"):
            xs, matmul = (x, K.matmul_legacy) if name[0] == "w" else (arrays["xk"], K.matmul_kquant)
            for n in (1, 3):
                out = np.empty((n, m), np.float32)
                w.flags.writeable = False
                matmul(int(name.split("_")[1]), w, xs[:n], out, 2)
                assert np.array_equal(out, portable[name][:n]), name


def test_weights_stay_quantized_views_of_the_file(nb, smollm2_path):
    qt = ModelFile(smollm2_path).tensors["blk.0.ffn_up.weight"]
    w = nb.bind(qt)
    assert np.shares_memory(w.raw, qt.data) and w.raw.dtype == np.uint8
    nb.matmul(w, np.ones((1, qt.ne[0]), np.float32))
    assert w._f32 is None  # no float32 copy was made


@pytest.mark.parametrize("t", [T.Q2_K, T.Q3_K, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_k_quant_matmul_and_get_rows_make_no_float32_copy(nb, t):
    qt = random_weight(t, 8, 512, rng)
    w = nb.bind(qt)
    assert w.family == "kquant"  # a numba kernel, not the dequantized fallback
    nb.matmul(w, np.ones((3, 512), np.float32))
    ids = np.array([5, 0, 5])
    want = quants.dequantize(qt.data[ids], t, (3, 512))
    assert np.array_equal(nb.get_rows(w, ids), want)  # the rows asked for, dequantized alone
    assert w._f32 is None


def test_types_without_a_kernel_use_the_reference_product(nb, monkeypatch):
    monkeypatch.delitem(K.KINDS, T.Q3_K)  # every type edgellm reads has a kernel: pretend Q3_K has none
    q = quants.quant_type(T.Q3_K)
    blocks = rng.integers(0, 256, (4, q.type_size), dtype=np.uint8)
    blocks[:, -2:] = np.array([1e-3], "<f2").view(np.uint8)
    qt = qtensor(blocks, T.Q3_K, 256)
    w = nb.bind(qt)
    assert w.family is None and w.raw is None  # no numba kernel bound
    assert_matmul_matches_oracle(nb, qt, rng.standard_normal((2, 256)).astype(np.float32))


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_K, T.F16], ids=lambda t: t.name)
def test_kernels_release_the_gil(nb, t):
    """One long matmul on a worker thread while the main thread keeps stepping: holding the GIL, the op
    would stop Python for all of its time; the kernels are nogil, so Python runs on during the op (the
    server's event loop during a step)."""
    import threading
    import time

    w = nb.bind(random_weight(t, 1024, 2048, rng))
    x = rng.standard_normal((16, 2048)).astype(np.float32)
    nb.matmul(w, x)  # compiled (or loaded) before timing
    op_s = 0.0
    while op_s < 0.3 and len(x) < 8192:  # rows enough for a call of >= 0.3 s
        x = np.concatenate([x, x])
        t0 = time.perf_counter()
        nb.matmul(w, x)
        op_s = time.perf_counter() - t0
    window: list[float] = []

    def work():
        t = time.perf_counter()
        nb.matmul(w, x)
        window.extend([t, time.perf_counter()])

    th = threading.Thread(target=work)
    seen, i = [], 0
    th.start()
    while th.is_alive():
        i += 1
        if i % 64 == 0:
            seen.append(time.perf_counter())
    th.join()
    a, b = window
    mid = [s for s in seen if a + 0.2 * (b - a) < s < b - 0.2 * (b - a)]  # Python ran during the op
    assert op_s >= 0.3 and len(mid) > 100, (op_s, len(mid), len(seen))


def test_registered_and_respects_threads():
    b = get_backend("numba", threads=1)
    assert isinstance(b, NumbaBackend) and b.threads == 1


@pytest.fixture(scope="module")
def smollm2_pair(smollm2_path):
    import edgellm

    return (
        edgellm.LLM(smollm2_path, backend="numba", n_ctx=256),
        edgellm.LLM(smollm2_path, backend="reference", n_ctx=256),
    )


@pytest.mark.parametrize("i", [0, 1])
def test_smollm2_greedy_tokens_match_the_reference_backend(smollm2_pair, i):
    fast, ref = smollm2_pair
    case = load_fixture("smollm2-135m")["greedy"][i]
    case = dict(case, ids=case["ids"][:24], margins=case["margins"][:24])
    check_greedy(fast, case)  # against llama.cpp, up to its first near-tie
    ours, our_margins = greedy(fast, case["prompt_ids"], 24)
    theirs, their_margins = greedy(ref, case["prompt_ids"], 24)
    for j, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            assert min(our_margins[j], their_margins[j]) < NEAR_TIE, (
                f"token {j}: numba {a} vs reference {b}, "
                f"margins {our_margins[j]:.3f} / {their_margins[j]:.3f}"
            )
            break


# -- the other ops: the reference's float32 operations, compiled ----------------------------------------
def test_rms_norm_rope_and_gelu_are_bit_identical_to_the_reference(nb):
    ref = ReferenceBackend()
    x = rng.standard_normal((5, 576)).astype(np.float32)
    w = rng.standard_normal(576).astype(np.float32)
    assert np.array_equal(nb.rms_norm(x, w, 1e-5), ref.rms_norm(x, w, 1e-5))
    assert np.array_equal(nb.rms_norm(x, None, 1e-6), ref.rms_norm(x, None, 1e-6))
    q = rng.standard_normal((7, 4, 64)).astype(np.float32)
    pos = np.array([0, 3, 100, 1000, 5, 6, 7])
    factors = np.linspace(1, 4, 16).astype(np.float32)
    for spec in (
        RopeSpec(64, 10000.0),
        RopeSpec(64, 1e6, neox=True),
        RopeSpec(32, 10000.0, freq_scale=0.5, freq_factors=factors),
    ):
        assert np.array_equal(nb.rope(q, pos, spec), ref.rope(q, pos, spec))
    g = (rng.standard_normal((3, 256)) * 4).astype(np.float32)
    g[0, :4] = [-20, -10, 10, 12]
    u = rng.standard_normal((3, 256)).astype(np.float32)
    assert np.array_equal(nb.gelu_mul(g, u), ref.gelu_mul(g, u))
    silu = nb.silu_mul(g, u)  # libm's exp here, numpy's SIMD exp there: the last bit may differ
    np.testing.assert_allclose(silu, ref.silu_mul(g, u), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("window,softcap", [(None, None), (3, None), (None, 30.0)])
def test_attention_and_kv_cache_match_the_reference(nb, window, softcap):
    """A 6-token prompt of sequence 1, then a batch of sequence 1's next token and sequence 0's first."""
    ref = ReferenceBackend()
    kvs = [b.new_kv_cache(2, 2, 64, 16, 2) for b in (nb, ref)]
    steps = [(np.ones(6, np.int64), np.arange(6)), (np.array([1, 0]), np.array([6, 0]))]
    for seqs, pos in steps:
        n = len(seqs)
        q = rng.standard_normal((n, 6, 64)).astype(np.float32)
        k, v = rng.standard_normal((2, n, 2, 64)).astype(np.float32)
        a, b = (
            be.attention(q, k, v, kv, 1, seqs, pos, 0.125, window, softcap) for be, kv in zip((nb, ref), kvs)
        )
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # summation order only
    assert np.array_equal(kvs[0].k, kvs[1].k) and np.array_equal(kvs[0].v, kvs[1].v)
    with pytest.raises(ValueError, match="outside the context"):
        nb.attention(q, k, v, kvs[0], 0, np.zeros(2, np.int64), np.array([15, 16]), 1.0)


def test_gemma3_greedy_and_teacher_forced_steps_match_llama_cpp(gemma3_path):
    """gemma3 (Q4_K, Q5_0, Q6_K, Q8_0; GeGLU, sliding window, neox RoPE) on numba against llama.cpp's own
    tokens (the reference backend needs a 670 MB float32 copy of its embedding, so it is not run here)."""
    import edgellm

    llm = edgellm.LLM(gemma3_path, backend="numba", n_ctx=256)
    case = load_fixture("gemma3-270m")["greedy"][0]
    check_greedy(llm, dict(case, ids=case["ids"][:16], margins=case["margins"][:16]))
    n, notes = check_forced_steps(llm, case)
    assert n <= len(case["ids"]) // 10, notes


def test_qwen2_greedy_and_teacher_forced_steps_match_llama_cpp(qwen_coder_path):
    """qwen2 (Qwen2.5-Coder-0.5B: QKV bias, tied head, Q5_0/Q8_0/Q6_K/Q4_K) on numba against llama.cpp:
    one fixture prompt's greedy tokens up to the first near-tie, and its forced steps."""
    import edgellm

    llm = edgellm.LLM(qwen_coder_path, backend="numba", n_ctx=256)
    case = load_fixture("qwen2.5-coder-0.5b")["greedy"][2]
    check_greedy(llm, dict(case, ids=case["ids"][:16], margins=case["margins"][:16]))
    n, notes = check_forced_steps(llm, case)
    assert n <= len(case["ids"]) // 10, notes


def test_kernel_cache_is_dropped_when_any_kernel_source_changes(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 1\n")
    cache = tmp_path / "__pycache__"
    K._drop_stale_cache(tmp_path)  # first run: stamps
    (cache / "a.f-1.py311.nbi").write_bytes(b"")
    (cache / "b.g-1.py311.nbc").write_bytes(b"")
    K._drop_stale_cache(tmp_path)  # unchanged sources: kept
    assert len(list(cache.glob("*.nb?"))) == 2
    (tmp_path / "b.py").write_text("y = 2\n")  # a callee edited: every cached function may hold it
    K._drop_stale_cache(tmp_path)
    assert not list(cache.glob("*.nb?"))
    (cache / "a.f-1.py311.nbi").write_bytes(b"")
    K._drop_stale_cache(tmp_path, code_path="generic")  # the same sources compiled for another code path
    assert not list(cache.glob("*.nb?"))


def test_kernel_cache_stamp_lives_in_the_cache_numba_uses(tmp_path):
    """With NUMBA_CACHE_DIR (or a read-only package) Numba caches elsewhere: the stamp goes there, so a
    run on another path (another code path, another cache dir) leaves the package's own cache alone."""
    cache = K._cache_dir()
    assert cache is not None and (cache / "kernels.sha256").is_file()
    (tmp_path / "a.py").write_text("x = 1\n")
    own, other = tmp_path / "__pycache__", tmp_path / "elsewhere" / "numba_kernels_0123"
    K._drop_stale_cache(tmp_path)
    (own / "a.f-1.py311.nbi").write_bytes(b"")
    K._drop_stale_cache(tmp_path, code_path="generic", cache=other)  # another cache: stamped there
    assert (other / "kernels.sha256").is_file()
    assert list(own.glob("*.nbi"))  # the package's cache kept
    K._drop_stale_cache(tmp_path)
    assert list(own.glob("*.nbi"))  # and still current for the default code path


def test_kernels_count_as_cached_only_with_the_matmuls_and_the_plans_replay(tmp_path, monkeypatch):
    """LLM says "compiling the numba kernels" unless both the matmul kernels and the decode plans'
    replay are in the folder Numba caches the package in (its __pycache__, or one under NUMBA_CACHE_DIR,
    or a user-wide one: K._CACHE)."""
    cache = tmp_path / "numba_kernels_0123"
    monkeypatch.setattr(K, "_CACHE", cache)
    assert not NumbaBackend.kernels_cached()
    cache.mkdir()
    (cache / "__init__.matmul_legacy-124.py311.nbi").touch()
    assert not NumbaBackend.kernels_cached()
    (cache / "plan._replay-135.py311.nbi").touch()
    assert NumbaBackend.kernels_cached()
    monkeypatch.setattr(K, "_CACHE", None)  # caching off
    assert not NumbaBackend.kernels_cached()
