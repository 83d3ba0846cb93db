"""Block formats in edgellm.quants against gguf-py's gguf.quants (the oracle): bit-exact dequantization of
random and real blocks, bit-exact quantization where gguf-py quantizes, round-trip error bounds, layouts."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf import quants as oracle

from edgellm import quants
from edgellm.quants import UnknownQuantType, dequantize, quant_type, quantize, row_nbytes, supported_types

ALL = supported_types()
# gguf-py has no Q8_K class (it is an activation-only type); Q8_K is checked against ggml's loops below.
DEQUANT_ORACLE = [t for t in ALL if t != T.Q8_K]
# Types gguf-py 0.19 can quantize (gguf/quants.py: F32/F16 via astype, classes with quantize_blocks).
QUANT_ORACLE = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
QUANTIZABLE = [t for t in ALL if quant_type(t).quantize_blocks is not None]

# Byte offsets of the f16 scale fields in each block (ggml-common.h block_* structs).
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.IQ4_NL: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}


def ids(types):
    return [t.name for t in types]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def random_blocks(t: T, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """(n_blocks, type_size) random bytes whose float fields are finite, so NaN/Inf do not dominate."""
    q = quant_type(t)
    if t in (T.F32, T.F16, T.BF16):
        x = (rng.standard_normal(n_blocks) * 10).astype(np.float32)
        if t == T.F32:
            return x.view(np.uint8).reshape(n_blocks, 4)
        if t == T.F16:
            return x.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_blocks, 2)
    raw = rng.integers(0, 256, size=(n_blocks, q.type_size), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        scale = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
        raw[:, off : off + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    return raw


def test_layouts_match_gguf_py_sizes():
    for t in ALL:
        q = quant_type(t)
        assert q.type == t and q.name == t.name
        assert (q.block_size, q.type_size) == GGML_QUANT_SIZES[t]
        assert row_nbytes(t, 3 * q.block_size) == 3 * q.type_size
    assert quant_type(T.Q4_0).type_size == 18  # sizeof(block_q4_0), as candle asserts
    assert quant_type(T.Q4_K).type_size == 144 and quant_type(T.Q4_K).block_size == 256


def test_registry_covers_the_promised_types_and_accepts_plain_ints():
    names = [t.name for t in ALL]
    for name in ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]:
        assert name in names
    for name in ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ4_NL"]:
        assert name in names
    assert quant_type(12) is quant_type(T.Q4_K)


def test_vec_dot_types_follow_ggml_cpu_type_traits():
    pairs = {
        T.F32: T.F32,
        T.F16: T.F16,
        T.BF16: T.BF16,
        T.Q4_0: T.Q8_0,
        T.Q5_0: T.Q8_0,
        T.Q8_0: T.Q8_0,
        T.Q4_1: T.Q8_1,
        T.Q5_1: T.Q8_1,
        T.IQ4_NL: T.Q8_0,
        T.Q8_K: None,
    }
    for t in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K):
        pairs[t] = T.Q8_K
    assert {t: quant_type(t).vec_dot_type for t in pairs} == pairs


@pytest.mark.parametrize("t", DEQUANT_ORACLE, ids=ids(DEQUANT_ORACLE))
def test_dequant_matches_gguf_py_bit_exact(t):
    q = quant_type(t)
    raw = random_blocks(t, 512 if q.block_size == 32 else 128, np.random.default_rng(int(t)))
    mine = dequantize(raw, t, (raw.shape[0] // 4, 4 * q.block_size))
    ref = oracle.dequantize(raw, t).reshape(mine.shape)
    assert mine.dtype == np.float32
    assert np.isfinite(mine).all()
    assert same_bits(mine, ref)


@pytest.mark.parametrize("t", DEQUANT_ORACLE, ids=ids(DEQUANT_ORACLE))
def test_dequant_of_arbitrary_bytes_matches_gguf_py_including_nan_and_inf(t):
    q = quant_type(t)
    raw = np.random.default_rng(100 + int(t)).integers(0, 256, size=(256, q.type_size), dtype=np.uint8)
    mine = dequantize(raw, t, (256 * q.block_size,))
    with np.errstate(invalid="ignore", over="ignore"):
        ref = oracle.dequantize(raw, t).reshape(mine.shape)
    assert np.array_equal(mine, ref.astype(np.float32), equal_nan=True)


def test_q8_k_dequant_is_d_times_quants():
    # dequantize_row_q8_K in ggml-quants.c: y[j] = x.d * x.qs[j]; the int16 bsums do not take part
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=(3, 292), dtype=np.uint8)
    d = np.array([0.5, -1e-3, 3.25], dtype="<f4")
    raw[:, :4] = d.view(np.uint8).reshape(3, 4)
    qs = raw[:, 4:260].view(np.int8).astype(np.float32)
    assert same_bits(dequantize(raw, T.Q8_K, (3, 256)), d[:, None] * qs)


def quant_inputs(block_size: int) -> np.ndarray:
    """Normal data at three scales plus rows that hit the edge cases of the block quantizers."""
    rng = np.random.default_rng(block_size)
    n = 4 * max(block_size, 256)
    rows = [rng.standard_normal(n) * s for s in (1.0, 1e-3, 300.0)]
    rows.append(np.zeros(n))  # d == 0 -> id == 0
    rows.append(np.full(n, 0.75))  # max == min
    spike = np.zeros(n)
    spike[::37] = -2.5
    rows.append(spike)
    rows.append(np.tile([1.0, -1.0], n // 2))  # ties between +max and -max: first one wins
    rows.append(rng.integers(-16, 17, n) / 4.0)  # many values exactly on rounding boundaries
    rows.append(rng.standard_normal(n) * 1e-6)  # scales in the f16 subnormal range
    return np.stack(rows).astype(np.float32)


@pytest.mark.parametrize("t", QUANT_ORACLE, ids=ids(QUANT_ORACLE))
def test_quant_matches_gguf_py_bit_exact(t):
    x = quant_inputs(quant_type(t).block_size)
    mine = quantize(x, t)
    ref = np.ascontiguousarray(oracle.quantize(x, t)).view(np.uint8).reshape(mine.shape)
    assert mine.dtype == np.uint8
    assert mine.shape == (x.shape[0], row_nbytes(t, x.shape[1]))
    assert np.array_equal(mine, ref)


def q8_k_reference(x: np.ndarray) -> bytes:
    """quantize_row_q8_K_ref from ggml-org/llama.cpp ggml/src/ggml-quants.c, one block, scalar float32."""
    amax, mx = np.float32(0), np.float32(0)
    for v in x:
        if abs(v) > amax:
            amax, mx = abs(v), v
    if amax == 0:
        return bytes(292)
    iscale = np.float32(-127) / mx
    qs = [min(127, int(np.rint(np.float32(iscale * v)))) for v in x]
    bsums = [sum(qs[j : j + 16]) for j in range(0, 256, 16)]
    d = np.float32(1) / iscale
    return np.array([d], "<f4").tobytes() + np.array(qs, np.int8).tobytes() + np.array(bsums, "<i2").tobytes()


def test_q8_k_quant_matches_ggml_reference_loop():
    x = quant_inputs(256)[:, :512].reshape(-1, 256)
    mine = quantize(x, T.Q8_K)
    for row, block in zip(x, mine, strict=True):
        assert block.tobytes() == q8_k_reference(row)


# Relative RMS error on standard normal data: uniform rounding noise is step/sqrt(12), with step = 2*amax/15
# (Q4_0) down to amax/127 (Q8_0); bounds sit ~15% above what the reference reaches.
REL_RMSE_BOUND = {
    T.F32: 0.0,
    T.F16: 3e-4,
    T.BF16: 2e-3,
    T.Q4_0: 0.10,
    T.Q4_1: 0.09,
    T.Q5_0: 0.05,
    T.Q5_1: 0.045,
    T.Q8_0: 0.0065,
    T.Q8_K: 0.008,
}


@pytest.mark.parametrize("t", QUANTIZABLE, ids=ids(QUANTIZABLE))
def test_round_trip_error_within_per_type_bound(t):
    x = np.random.default_rng(3).standard_normal((64, 1024)).astype(np.float32)
    y = dequantize(quantize(x, t), t, x.shape)
    rel = np.sqrt(np.mean((x.astype(np.float64) - y) ** 2) / np.mean(x.astype(np.float64) ** 2))
    assert rel <= REL_RMSE_BOUND[t]
    # ggml tests/test-quantize-fns.cpp: data 0.1 + 2*cos(i), error sqrt(sum(diff^2)) / n
    # under MAX_QUANTIZATION_TOTAL_ERROR
    data = (0.1 + 2 * np.cos(np.arange(4096, dtype=np.float32))).astype(np.float32)
    out = dequantize(quantize(data, t), t, data.shape)
    assert np.sqrt(np.sum((data.astype(np.float64) - out) ** 2)) / data.size < 0.002


def test_dequantize_keeps_shape_and_accepts_raw_of_any_shape():
    raw = random_blocks(T.Q4_K, 6, np.random.default_rng(1))
    flat = dequantize(raw.reshape(-1), T.Q4_K, (3, 2, 256))
    assert flat.shape == (3, 2, 256)
    assert same_bits(flat, dequantize(raw, T.Q4_K, (6, 256)).reshape(3, 2, 256))


def test_dequantize_and_quantize_in_many_chunks_match_one_chunk(monkeypatch):
    rng = np.random.default_rng(2)
    raw = random_blocks(T.Q6_K, 40, rng)
    x = rng.standard_normal((10, 128)).astype(np.float32)
    whole_d, whole_q = dequantize(raw, T.Q6_K, (40, 256)), quantize(x, T.Q4_1)
    monkeypatch.setattr(quants, "_CHUNK_BYTES", 500)
    assert same_bits(dequantize(raw, T.Q6_K, (40, 256)), whole_d)
    assert np.array_equal(quantize(x, T.Q4_1), whole_q)


def test_unknown_type_raises_naming_it_and_listing_supported():
    with pytest.raises(UnknownQuantType, match=r"16 \(IQ2_XXS\)") as err:
        quant_type(T.IQ2_XXS)
    assert "Q4_K" in str(err.value) and "IQ4_NL" in str(err.value)
    assert isinstance(err.value, ValueError)
    with pytest.raises(UnknownQuantType, match="999"):
        quant_type(999)
    with pytest.raises(UnknownQuantType, match="IQ2_XXS"):
        dequantize(np.zeros(66, np.uint8), T.IQ2_XXS, (256,))


def test_row_nbytes_rejects_partial_blocks():
    assert row_nbytes(T.Q4_K, 512) == 288
    assert row_nbytes(T.F16, 7) == 14
    with pytest.raises(ValueError, match="Q4_K"):
        row_nbytes(T.Q4_K, 100)
    with pytest.raises(ValueError, match="Q4_0"):
        quantize(np.zeros((3, 100), np.float32), T.Q4_0)


def test_dequantize_rejects_wrong_byte_count():
    with pytest.raises(ValueError, match="needs 36 bytes, got 35"):
        dequantize(np.zeros(35, np.uint8), T.Q4_0, (2, 32))


def test_quantize_without_reference_quantizer_says_so():
    with pytest.raises(NotImplementedError, match="Q4_K"):
        quantize(np.zeros((1, 256), np.float32), T.Q4_K)


def test_real_model_tensors_dequant_match_gguf_py_bit_exact(real_model_paths):
    from edgellm.gguf import ModelFile

    for path in real_model_paths:
        mf = ModelFile(path)
        assert mf.tensors
        for t in mf.tensors.values():
            mine = dequantize(t.data, t.type, t.shape)
            ref = oracle.dequantize(t.data, t.type).reshape(t.shape)
            assert mine.shape == tuple(t.shape)
            assert same_bits(mine, ref), f"{path}: {t.name} ({t.type.name}, {t.shape})"
