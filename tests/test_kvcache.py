"""The paged KV cache: block-table attention on the CPU backends, the block allocator, the prefix cache."""

from __future__ import annotations

import numpy as np
import pytest

from edgellm.backends.reference import KVCache, ReferenceBackend

rng = np.random.default_rng(3)


def _backends():
    out = [ReferenceBackend()]
    try:
        from edgellm.backends.numba_cpu import NumbaBackend

        out.append(NumbaBackend(threads=1))
    except Exception:  # noqa: BLE001 - numba missing: the reference alone
        pass
    return out


@pytest.mark.parametrize("backend", _backends(), ids=lambda b: b.name)
@pytest.mark.parametrize("window", [None, 5])
def test_shuffled_block_table_attends_exactly_like_the_identity_table(backend, window):
    """Two sequences (a 13-token prompt, then a mixed step of decode + a second prompt) through a pool
    whose blocks are handed out in random order give bit-identical outputs to consecutive blocks."""
    hkv, dh, h, bs, n_ctx = 2, 16, 4, 4, 24
    ident = backend.new_kv_cache(2, hkv, dh, n_ctx, 2, block_size=bs)
    assert ident.block_table.tolist() == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    shuffled = backend.new_kv_cache(2, hkv, dh, n_ctx, 2, block_size=bs, n_blocks=17)
    assert (shuffled.block_table == -1).all() and shuffled.k.shape == (2, 17 * bs, hkv, dh)
    shuffled.block_table[:] = rng.permutation(17)[:12].reshape(2, 6)
    steps = [
        (np.zeros(13, np.int64), np.arange(13)),
        (np.array([0, 1, 1, 1, 1, 1, 1, 1]), np.array([13, 0, 1, 2, 3, 4, 5, 6])),
        (np.array([1, 0]), np.array([7, 14])),
    ]
    for seqs, pos in steps:
        n = len(seqs)
        q = rng.standard_normal((n, h, dh)).astype(np.float32)
        k, v = rng.standard_normal((2, n, hkv, dh)).astype(np.float32)
        for layer in (0, 1):
            a = backend.attention(q, k, v, ident, layer, seqs, pos, 0.25, window)
            b = backend.attention(q, k, v, shuffled, layer, seqs, pos, 0.25, window)
            assert np.array_equal(a, b)


def test_unmapped_block_and_overlong_position_are_clear_errors():
    b = ReferenceBackend()
    kv = b.new_kv_cache(1, 1, 4, 8, 2, block_size=4, n_blocks=3)
    kv.block_table[0] = [2, -1]
    q = k = v = np.ones((1, 1, 4), np.float32)
    b.attention(q, k, v, kv, 0, np.array([0]), np.array([3]), 1.0)
    with pytest.raises(ValueError, match="no KV block for position 4"):
        b.attention(q, k, v, kv, 0, np.array([0]), np.array([4]), 1.0)
    with pytest.raises(ValueError, match="outside the context of 8"):
        b.attention(q, k, v, kv, 0, np.array([0]), np.array([8]), 1.0)
    kv.block_table[1] = [-1, 1]  # position 5 is mapped, but attention would read the unmapped 0..3
    with pytest.raises(ValueError, match="no KV block"):
        b.attention(q, k, v, kv, 0, np.array([1]), np.array([5]), 1.0)
    assert isinstance(kv, KVCache)
