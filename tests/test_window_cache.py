"""Sliding-window layers on a ring: a cache that holds only window + one chunk of positions per sequence
attends exactly like the full cache, on every backend (through its own arrays and cache), and on the real
Gemma 3 model."""

from __future__ import annotations

import numpy as np
import pytest

from edgellm.backends import BACKENDS, BackendUnavailable, get_backend
from edgellm.backends.reference import KVCache

rng = np.random.default_rng(11)


def _backends():
    out = []
    for name in BACKENDS:
        try:
            out.append(get_backend(name, threads=1))
        except BackendUnavailable as e:
            out.append(pytest.param(None, marks=pytest.mark.skip(reason=f"{name}: {e}")))
    return out


@pytest.mark.parametrize("backend", _backends(), ids=lambda b: getattr(b, "name", "?"))
def test_ring_layers_attend_exactly_like_the_full_cache(backend):
    """Two sequences, 40 positions each in chunks of up to 4 and single steps, window 5: layer 1 keeps a
    ring of ceil((5 + 4 - 1) / 4) = 2 blocks per sequence, layer 0 the full context."""
    hkv, dh, h, bs, n_ctx, window, chunk = 2, 16, 4, 4, 64, 5, 4
    full = backend.new_kv_cache(2, hkv, dh, n_ctx, 2, block_size=bs)
    ring = backend.new_kv_cache(
        2, hkv, dh, n_ctx, 2, block_size=bs, window_layers=[1], window=window, window_chunk=chunk
    )
    assert ring.ring_layers == [1] and ring.ring_blocks == 2
    if isinstance(ring, KVCache) and ring.k.size:  # the host layout (a device keeps K, V elsewhere)
        assert ring.k.shape[0] == 1 and ring.k_ring.shape == (1, 2 * 2 * bs, hkv, dh)
    assert ring.nbytes < 0.6 * full.nbytes
    pos = [0, 0]
    while min(pos) < 40:
        seqs, positions = [], []
        for s in (0, 1):
            n = int(rng.integers(1, chunk + 1))
            seqs += [s] * n
            positions += list(range(pos[s], pos[s] + n))
            pos[s] += n
        seqs, positions = np.array(seqs), np.array(positions)
        n = len(seqs)
        q = rng.standard_normal((n, h, dh)).astype(np.float32)
        k, v = rng.standard_normal((2, n, hkv, dh)).astype(np.float32)
        for layer in (0, 1):
            w = window if layer == 1 else None
            args = [backend.from_host(x) for x in (q, k, v)]
            a = backend.to_host(backend.attention(*args, full, layer, seqs, positions, 0.25, w))
            b = backend.to_host(backend.attention(*args, ring, layer, seqs, positions, 0.25, w))
            assert np.array_equal(a, b), f"layer {layer} at positions {positions.tolist()}"


def test_a_forward_longer_than_the_ring_allows_is_refused():
    b = get_backend("reference")
    kv = KVCache(1, 1, 4, 64, 1, block_size=4, window_layers=[0], window=4, window_chunk=4)
    q = k = v = np.ones((5, 1, 4), np.float32)
    with pytest.raises(ValueError, match="at most 4"):
        b.attention(q, k, v, kv, 0, np.zeros(5, np.int64), np.arange(5), 1.0, 4)


def test_gemma3_keeps_a_window_sized_ring_and_matches_the_full_cache(gemma3_path):
    """gemma3-270m at 2048 positions: 15 of 18 layers are local (window 512) and keep 1024 positions;
    700 tokens in 512-token chunks then single steps give the full cache's logits bit for bit."""
    import edgellm

    try:
        llm = edgellm.LLM(gemma3_path, backend="native", threads=1, n_ctx=2048)
    except BackendUnavailable:
        llm = edgellm.LLM(gemma3_path, backend="numba", threads=1, n_ctx=2048)
    m = llm.model
    ring, full = m.new_kv_cache(2048, 1), m.new_kv_cache(2048, 1, window_rings=False)
    assert len(ring.ring_layers) == 15 and ring.ring_blocks * ring.block_size == 1024
    assert full.nbytes / ring.nbytes > 1.7  # 18 * 2048 / (3 * 2048 + 15 * 1024)
    ids = np.random.default_rng(0).integers(10, 50000, 700)
    for kv in (ring, full):
        for start in (0, 512):
            part = ids[start : min(start + 512, 690)]
            pos = np.arange(start, start + len(part))
            kv_logits = m.forward(part, pos, np.zeros(len(part), np.int64), kv)
        steps = [m.forward(ids[i : i + 1], np.array([i]), np.zeros(1, np.int64), kv) for i in range(690, 700)]
        kv.result = np.concatenate([kv_logits[-1:], *steps])
    assert np.array_equal(ring.result, full.result)
