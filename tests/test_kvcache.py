"""The paged KV cache: block-table attention on the CPU backends, the block allocator, the prefix cache."""

from __future__ import annotations

import numpy as np
import pytest

from edgellm.backends.reference import KVCache, ReferenceBackend
from edgellm.kvcache import BlockPool, OutOfBlocks, PagedKV

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


# ---------------------------------------------------------------------------------------------- allocator


def test_block_pool_counts_references_and_refuses_to_go_negative():
    pool = BlockPool(3)
    a, b = pool.take(), pool.take()
    assert (a, b) == (0, 1) and pool.n_free == 1
    pool.share(a)
    assert pool.release(a) == 1 and pool.n_free == 1
    assert pool.release(a) == 0 and pool.n_free == 2
    with pytest.raises(ValueError, match="released more often"):
        pool.release(a)
    with pytest.raises(ValueError, match="is free"):
        pool.share(a)
    pool.take(), pool.take()
    with pytest.raises(OutOfBlocks):
        pool.take()
    assert (pool.refs >= 0).all()


def _paged(n_blocks: int, n_seqs: int = 3, n_ctx: int = 32, bs: int = 4, prefix: bool = True) -> PagedKV:
    return PagedKV(KVCache(1, 1, 2, n_ctx, n_seqs, block_size=bs, n_blocks=n_blocks), prefix)


def test_sequences_sharing_a_prefix_share_its_blocks_and_free_only_their_own():
    kv = _paged(16)
    a = list(range(1, 11))  # 10 tokens: blocks [1..4] [5..8] full, [9, 10] partial
    s0, hit = kv.open(a)
    assert hit == 0 and kv.cache.block_table[s0].tolist()[:1] == [-1]
    kv.ensure(s0, 10)
    kv.commit(s0, a, 10)
    assert kv.prefix.n_blocks == 2
    b = a[:8] + [99, 98, 97]
    s1, hit = kv.open(b)
    assert hit == 8 and kv.seq_blocks(s1) == kv.seq_blocks(s0)[:2]
    assert kv.pool.refs[kv.seq_blocks(s0)[0]] == 3  # two sequences and the cache
    kv.ensure(s1, 11)
    assert kv.seq_blocks(s1)[2] != kv.seq_blocks(s0)[2]
    # a prompt that is exactly the cached blocks still computes its last token: the second block's first
    # three positions are copied into a block of its own (the cached one stays as it is, for others)
    cached = kv.seq_blocks(s0)[1]
    rows = slice(cached * 4, cached * 4 + 4)
    kv.cache.k[0, rows] = kv.cache.v[0, rows] = np.arange(8, dtype=np.float16).reshape(4, 1, 2) + 1
    s2, hit = kv.open(a[:8])
    assert hit == 7
    mine = kv.seq_blocks(s2)[1]
    assert kv.seq_blocks(s2)[0] == kv.seq_blocks(s0)[0] and mine not in kv.seq_blocks(s0)
    assert kv.pool.refs[mine] == 1 and kv.pool.refs[cached] == 3  # s0, s1, the cache: s2 holds a copy
    for store in (kv.cache.k, kv.cache.v):
        np.testing.assert_array_equal(
            store[0, mine * 4 : mine * 4 + 3], store[0, cached * 4 : cached * 4 + 3]
        )
        assert not store[0, mine * 4 + 3].any()  # the fourth position is s2's to compute
    kv.close(s0)
    kv.close(s1)
    kv.close(s2)
    assert kv.n_used() == 2 and kv.prefix.n_evictable() == 2 and (kv.pool.refs >= 0).all()
    assert (kv.cache.block_table == -1).all()


def test_the_same_run_computed_twice_is_deduplicated_on_commit():
    kv = _paged(16)
    toks = list(range(1, 9))
    s0, _ = kv.open(toks)
    s1, _ = kv.open(toks)  # admitted together: neither finds the other's blocks yet
    for s in (s0, s1):
        kv.ensure(s, 8)
    kv.commit(s0, toks, 8)
    kv.commit(s1, toks, 8)
    assert kv.seq_blocks(s1) == kv.seq_blocks(s0)
    assert kv.cache.block_table[s1, :2].tolist() == kv.seq_blocks(s0)
    assert kv.pool.n_free == 16 - 2
    kv.close(s0)
    kv.close(s1)
    assert kv.pool.n_free == 14 and kv.prefix.clear() == 2 and kv.pool.n_free == 16


def test_eviction_under_pressure_frees_least_recently_used_leaves_first():
    kv = _paged(6, n_ctx=16)
    old = list(range(1, 10))  # 9 tokens: 2 full blocks cached
    new = [9, 9, 9, 9, 0]  # 1 full block cached, later
    for toks in (old, new):
        s, _ = kv.open(toks)
        kv.ensure(s, len(toks))
        kv.commit(s, toks, len(toks))
        kv.close(s)
    assert kv.prefix.n_blocks == 3 and kv.pool.n_free == 3
    x, _ = kv.open([7] * 16)
    kv.ensure(x, 16)  # 4 blocks: one is evicted, the least recently used leaf (old's second block)
    assert kv.prefix.evicted == 1
    assert len(kv.prefix.match(old, 2)) == 1 and len(kv.prefix.match(new, 1)) == 1
    y, _ = kv.open([8] * 8)
    kv.ensure(y, 8)  # 2 more: both cached blocks go (old's first is a leaf now)
    assert kv.prefix.n_blocks == 0 and kv.pool.n_free == 0
    z, _ = kv.open([6] * 4)
    with pytest.raises(OutOfBlocks):
        kv.ensure(z, 4)
    for s in (x, y, z):
        kv.close(s)
    assert kv.pool.n_free == 6 and (kv.pool.refs == 0).all()


def test_blocks_a_sequence_holds_are_never_evicted():
    kv = _paged(8)
    toks = list(range(1, 10))
    s0, _ = kv.open(toks)
    kv.ensure(s0, 9)
    kv.commit(s0, toks, 9)
    assert kv.prefix.evict(10) == 0 and kv.prefix.n_blocks == 2
    s1, hit = kv.open(toks)
    kv.close(s0)
    assert hit == 8 and kv.prefix.evict(10) == 0  # s1 still reads them
    kv.close(s1)
    assert kv.prefix.evict(10) == 2 and kv.pool.n_free == 8 and (kv.pool.refs == 0).all()


def test_prefix_caching_off_shares_nothing():
    kv = _paged(8, prefix=False)
    toks = list(range(1, 10))
    s0, _ = kv.open(toks)
    kv.ensure(s0, 9)
    kv.commit(s0, toks, 9)
    s1, hit = kv.open(toks)
    assert hit == 0 and kv.n_available() == 5


def test_a_finished_sequences_partial_tail_is_reused_by_its_continuation():
    """Token-granular reuse of a conversation's own tail: a sequence closed with its tokens parks its
    partial last block; the next sequence that continues those tokens takes the block and is served up
    to the last written position (not only to the last full block)."""
    kv = _paged(16)  # blocks of 4
    turn1 = list(range(1, 11))  # 10 tokens written: 2 full blocks + [9, 10]
    s0, _ = kv.open(turn1)
    kv.ensure(s0, 11)
    kv.commit(s0, turn1, 10)
    tail_block = kv.seq_blocks(s0)[2]
    kv.close(s0, turn1 + [11], n_computed=10)  # token 11 was sampled but never fed
    assert kv.pool.refs[tail_block] == 1 and kv.n_used() == 3  # 2 in the trie + the parked tail
    assert kv.prefix.n_evictable() == 3
    turn2 = turn1 + [11, 12, 13]
    s1, served = kv.open(turn2)
    assert served == 10 and kv.seq_blocks(s1) == [*kv.seq_blocks(s1)[:2], tail_block]
    assert kv.cache.block_table[s1, :3].tolist() == kv.seq_blocks(s1)
    kv.ensure(s1, len(turn2))  # the tail block is the sequence's own: it writes on in it
    assert kv.seq_blocks(s1)[2] == tail_block and kv.pool.refs[tail_block] == 1
    kv.close(s1)
    # a continuation that diverges inside the tail is served up to the divergence, and writes on there
    kv2 = _paged(16)
    s0, _ = kv2.open(turn1)
    kv2.ensure(s0, 10)
    tail_block = kv2.seq_blocks(s0)[2]
    kv2.close(s0, turn1, n_computed=10)
    s1, served = kv2.open(turn1[:9] + [77, 78])
    assert served == 9 and kv2.seq_blocks(s1)[2] == tail_block
    # the tail is taken at most once
    s2, served = kv2.open(turn1)
    assert served == 8
    # a prompt diverging at the tail's first token gets the full blocks only; the tail stays parked
    kv3 = _paged(16)
    s0, _ = kv3.open(turn1)
    kv3.ensure(s0, 10)
    kv3.close(s0, turn1, n_computed=10)
    s1, served = kv3.open(turn1[:8] + [77, 78])
    assert served == 8 and kv3.prefix.n_evictable() == 1  # the parked tail
    kv3.close(s1)
    # a repeated prompt is served all but its last token (llama-server's 76 of 77 cached)
    s2, served = kv3.open(turn1)
    assert served == 9 and kv3.pool.refs[kv3.seq_blocks(s2)[2]] == 1


def test_parked_tails_are_evicted_first_and_every_reference_comes_back():
    kv = _paged(6)
    a = list(range(1, 7))  # 1 full block + [5, 6]
    s0, _ = kv.open(a)
    kv.ensure(s0, 6)
    kv.close(s0, a, n_computed=6)
    assert kv.pool.n_free == 4 and kv.prefix.n_evictable() == 2
    assert kv.prefix.evict(1) == 1 and kv.pool.n_free == 5  # the tail went first
    s1, served = kv.open(a + [7])
    assert served == 4  # the full block is still cached; the tail is gone
    kv.close(s1)
    assert kv.prefix.clear() == 1 and kv.pool.n_free == 6 and (kv.pool.refs == 0).all()


def test_a_partial_block_comes_from_the_parked_tail_or_a_copy_whichever_serves_more():
    """After a matched path, the block that holds where the prompt leaves the cache: the conversation's
    own parked tail when it serves as many tokens as any cached block would (no copy), else a copy of
    the cached block that serves the most; the copy's source is held while a block is freed for it."""
    kv = _paged(16)
    full = list(range(1, 9))  # two full blocks, cached
    s0, _ = kv.open(full + [50])
    kv.ensure(s0, 9)
    kv.close(s0, full + [50], n_computed=8)
    short = [1, 2, 3, 4, 5, 6]  # a tail [5, 6] parked after the first block
    s1, _ = kv.open(short + [60])
    kv.ensure(s1, 7)
    tail = kv.seq_blocks(s1)[1]
    kv.close(s1, short + [60], n_computed=6)
    second = kv.prefix.match(full, 2)[1].block
    s2, served = kv.open([1, 2, 3, 4, 5, 6, 7, 70])  # the cached block serves 3, the tail 2: a copy
    assert served == 7 and kv.seq_blocks(s2)[1] not in (tail, second)
    assert kv.prefix.tail_run(kv.prefix.match(full, 1)[0], [5, 6, 9]) == 2  # the tail is still parked
    s3, served = kv.open([1, 2, 3, 4, 5, 6, 9, 9])  # both serve 2: the tail, taken over
    assert served == 6 and kv.seq_blocks(s3)[1] == tail and kv.pool.refs[tail] == 1
    for s in (s2, s3):
        kv.close(s)
    assert kv.prefix.clear() == 2 and (kv.pool.refs == 0).all()

    dry = _paged(2)  # both blocks cached, none free, and the only idle leaf is the copy's source
    s0, _ = dry.open(full)
    dry.ensure(s0, 8)
    dry.close(s0, full, n_computed=8)
    s1, served = dry.open([1, 2, 3, 4, 5, 6, 99])
    assert served == 4 and dry.pool.n_free == 0 and dry.prefix.n_blocks == 2  # no copy; nothing evicted
    dry.close(s1)
    assert dry.prefix.clear() == 2 and (dry.pool.refs == 0).all()


def _written(kv: PagedKV, toks: list[int], n_computed: int) -> None:
    """A sequence of toks whose first n_computed positions hold K = V = their token id, then closed."""
    s, _ = kv.open(toks)
    kv.ensure(s, len(toks))
    for p, b in enumerate(kv.seq_blocks(s)):
        rows = slice(b * 4, b * 4 + 4)
        kv.cache.k[0, rows] = kv.cache.v[0, rows] = np.array(toks[p * 4 : p * 4 + 4] + [0] * 4)[
            :4, None, None
        ]
    kv.close(s, toks, n_computed=n_computed)


def test_a_prefix_exported_restores_into_another_cache_and_is_served_from_there():
    """Slot save / restore: export reads the cached run of a conversation (full blocks and its parked
    tail), restore puts it into another pool's prefix cache, and a prompt continuing it is served from
    the restored rows; forget drops what nothing else needs; every reference comes back."""
    toks = list(range(1, 11))
    kv = _paged(16)
    _written(kv, toks + [11], n_computed=10)  # 2 full blocks + the tail [9, 10]
    n, k, v = kv.export(toks + [11, 12])
    assert n == 10 and k.shape == v.shape == (1, 10, 1, 2)
    assert k[0, :, 0, 0].tolist() == toks and kv.export([5, 6])[0] == 0
    n6, k6, _ = kv.export(toks[:6])  # a prompt that ends inside a cached block (the answer went on in it)
    assert n6 == 6 and k6[0, :, 0, 0].tolist() == toks[:6]
    fresh = _paged(16)
    assert fresh.restore(toks, k, v) == 10 and fresh.prefix.n_blocks == 2
    assert fresh.restore(toks[:6], k[:, :6], v[:, :6]) == 6  # the first block is cached: kept
    assert fresh.prefix.n_blocks == 2 and fresh.n_used() == 4  # 2 blocks, the tails [9, 10] and [5, 6]
    s, served = fresh.open(toks + [11, 12])
    assert served == 10
    got = np.concatenate([fresh.cache.k[0, b * 4 : b * 4 + 4, 0, 0] for b in fresh.seq_blocks(s)])
    assert got[:10].tolist() == toks
    fresh.close(s)
    # the sequence took the tail [9, 10] over (and dropped it); the first block has the tail [5, 6] after it
    assert fresh.forget(toks + [11]) == 4
    assert fresh.prefix.n_blocks == 1 and fresh.forget(toks[:6]) == 6 and fresh.prefix.n_blocks == 0
    assert (fresh.pool.refs == 0).all() and fresh.open(toks)[1] == 0

    small = _paged(2)
    with pytest.raises(OutOfBlocks, match="need 3 more KV blocks, 2 are free"):
        small.restore(toks, k, v)
    with pytest.raises(ValueError, match="10 positions do not fit in the context of 8"):
        _paged(16, n_ctx=8).restore(toks, k, v)
    assert (small.pool.refs == 0).all() and small.prefix.n_blocks == 0


def test_forgetting_a_conversation_keeps_the_prefix_others_continue():
    kv = _paged(16)
    a, b = list(range(1, 10)), [1, 2, 3, 4, 50, 51, 52, 53, 54]
    _written(kv, a, n_computed=9)
    _written(kv, b, n_computed=9)
    assert kv.prefix.n_blocks == 3
    held, _ = kv.open(b[:8] + [60])  # a running sequence holds b's blocks
    assert kv.forget(a) == 5 and kv.prefix.n_blocks == 2  # a's tail and its own block, not [1..4]
    assert kv.forget(b) == 1 and kv.prefix.n_blocks == 2  # its tail only: its blocks are in use
    kv.close(held)
    assert kv.forget(b) == 8 and kv.prefix.n_blocks == 0 and (kv.pool.refs == 0).all()
