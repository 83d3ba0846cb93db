"""The reference backend's ops on hand-made inputs: masks, RoPE layouts, norms, activation rounding."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edgellm import quants
from edgellm.backends import get_backend, names
from edgellm.backends.base import BackendUnavailable, RopeSpec
from edgellm.backends.reference import ReferenceBackend, activation_roundtrip

rng = np.random.default_rng(0)


def naive_attention(q, keys, vals, scale):
    s = keys @ q * scale
    p = np.exp(s - s.max())
    return (p / p.sum()) @ vals


def test_attention_is_causal_grouped_and_windowed():
    b = ReferenceBackend()
    n, h, hkv, dh, window = 9, 4, 2, 8, 3
    kv = b.new_kv_cache(1, hkv, dh, 16, 1)
    q = rng.standard_normal((n, h, dh)).astype(np.float32)
    k = rng.standard_normal((n, hkv, dh)).astype(np.float16).astype(np.float32)
    v = rng.standard_normal((n, hkv, dh)).astype(np.float16).astype(np.float32)
    pos = np.arange(n)
    out = b.attention(q, k, v, kv, 0, np.zeros(n, np.int64), pos, 0.5, window=window)
    for i in range(n):
        lo = max(0, i - window + 1)
        for head in range(h):
            g = head // (h // hkv)
            qi = q[i, head].astype(np.float16).astype(np.float32)
            want = naive_attention(qi, k[lo : i + 1, g], v[lo : i + 1, g], 0.5)
            np.testing.assert_allclose(out[i, head], want, rtol=2e-3, atol=2e-3)


def test_decode_step_sees_the_prefilled_cache():
    b = ReferenceBackend()
    kv = b.new_kv_cache(1, 1, 4, 8, 2)
    k = rng.standard_normal((5, 1, 4)).astype(np.float32)
    v = rng.standard_normal((5, 1, 4)).astype(np.float32)
    q = rng.standard_normal((5, 1, 4)).astype(np.float32)
    full = b.attention(q, k, v, kv, 0, np.ones(5, np.int64), np.arange(5), 1.0)
    kv2 = b.new_kv_cache(1, 1, 4, 8, 2)
    b.attention(q[:4], k[:4], v[:4], kv2, 0, np.ones(4, np.int64), np.arange(4), 1.0)
    last = b.attention(q[4:], k[4:], v[4:], kv2, 0, np.ones(1, np.int64), np.array([4]), 1.0)
    np.testing.assert_allclose(last[0], full[4], rtol=1e-6)


def test_rope_normal_rotates_adjacent_pairs_and_neox_rotates_halves():
    b = ReferenceBackend()
    x = np.zeros((1, 1, 4), np.float32)
    x[0, 0, 0] = 1.0  # first element of the first pair
    spec = RopeSpec(n_dims=4, freq_base=10000.0)
    y = b.rope(x, np.array([1]), spec)
    np.testing.assert_allclose(y[0, 0], [np.cos(1), np.sin(1), 0, 0], rtol=1e-6, atol=1e-7)
    y = b.rope(x, np.array([1]), RopeSpec(n_dims=4, freq_base=10000.0, neox=True))
    np.testing.assert_allclose(y[0, 0], [np.cos(1), 0, np.sin(1), 0], rtol=1e-6, atol=1e-7)
    assert np.array_equal(b.rope(x, np.array([0]), spec), x)  # position 0 is the identity


def test_rms_norm_matches_the_formula():
    b = ReferenceBackend()
    x = rng.standard_normal((3, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(b.rms_norm(x, w, 1e-5), want, rtol=1e-5)


def test_gelu_is_ggmls_f16_table():
    b = ReferenceBackend()
    x = np.array([-20.0, -1.0, 0.0, 0.5, 3.0, 12.0], np.float32)
    g = b.gelu_mul(x, np.ones_like(x))
    exact = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(g, exact, rtol=2e-3, atol=1e-3)
    assert g[0] == 0 and g[-1] == 12.0


def test_q8_0_activation_rounding_matches_the_q8_0_format():
    x = rng.standard_normal((2, 64)).astype(np.float32) * 3
    via_format = quants.dequantize(quants.quantize(x, T.Q8_0), T.Q8_0, x.shape)
    # rint (ggml-cpu's SIMD) and roundf (the reference format) differ only on exact halves
    np.testing.assert_allclose(activation_roundtrip(x, T.Q4_0), via_format, rtol=0, atol=1e-6)
    assert np.array_equal(activation_roundtrip(x, T.F32), x)


def test_bf16_activation_rounding_rounds_to_nearest_even():
    x = np.array([1.0, 1.00390625, 1.01171875], np.float32)  # exact; a tie rounded down to even; one up
    assert activation_roundtrip(x[None], T.BF16)[0].tolist() == [1.0, 1.0, 1.015625]
    r = activation_roundtrip(rng.standard_normal((1, 64)).astype(np.float32), T.BF16)
    assert (r.view(np.uint32) & 0xFFFF == 0).all()


def test_q8_k_activation_rounding_keeps_256_blocks_within_half_a_step():
    x = rng.standard_normal((1, 512)).astype(np.float32)
    y = activation_roundtrip(x, T.Q4_K)
    step = np.abs(x.reshape(2, 256)).max(1, keepdims=True) / 127
    assert (np.abs((y - x).reshape(2, 256)) <= step / 2 + 1e-7).all()


def test_backend_registry_names_and_errors():
    assert "reference" in names() and "auto" in names()
    from edgellm.backends import AUTO_ORDER, DEVICE_BACKENDS
    from edgellm.backends.webgpu import auto_refusal

    # the first of AUTO_ORDER that runs here, a device backend only on a real GPU
    takes = [n for n in AUTO_ORDER if n not in DEVICE_BACKENDS or auto_refusal(n) is None]
    assert get_backend("auto").name == takes[0]
    with pytest.raises(BackendUnavailable, match="unknown backend 'warp'"):
        get_backend("warp")
