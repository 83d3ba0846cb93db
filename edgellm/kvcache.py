"""Paged KV-cache bookkeeping: one pool of reference-counted blocks, a block table row per sequence, and a
prefix cache that lets sequences sharing a block-aligned token prefix share its blocks (and a prompt
that leaves a cached run inside a block reuse that block's first tokens: its own parked tail, or a copy).

The memory itself belongs to the backend (`Backend.new_kv_cache(..., block_size, n_blocks)`, a
base.KVCacheProtocol; the CPU layout is backends/paged_kv.py); this module only decides which block holds
what and writes the host block table the attention kernels read, telling the cache after each change.
Promises: a block's reference count never goes negative; a block is free exactly when nothing holds it;
the prefix cache evicts least-recently-used blocks that no sequence holds, leaves first, and only when an
allocation needs them.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def _common_run(toks: Sequence[int], rest: Sequence[int]) -> int:
    """The length of the run toks and rest begin with in common, short of rest's last token."""
    n = 0
    for a, b in zip(toks, rest[: len(rest) - 1]):
        if a != b:
            break
        n += 1
    return n


class OutOfBlocks(RuntimeError):
    """The pool has no free block and the prefix cache none to give back."""


def blocks_for(n_positions: int, block_size: int) -> int:
    return -(-n_positions // block_size)


class BlockPool:
    """Reference-counted block ids 0..n_blocks-1. `take` hands out a free block with one reference."""

    def __init__(self, n_blocks: int):
        if n_blocks <= 0:
            raise ValueError(f"a KV pool needs at least one block, got {n_blocks}")
        self.n_blocks = n_blocks
        self.refs = np.zeros(n_blocks, np.int32)
        self._free = list(range(n_blocks - 1, -1, -1))  # a stack: low ids first, so reuse stays warm

    @property
    def n_free(self) -> int:
        return len(self._free)

    def take(self) -> int:
        if not self._free:
            raise OutOfBlocks("no free KV block")
        b = self._free.pop()
        self.refs[b] = 1
        return b

    def share(self, b: int) -> None:
        if self.refs[b] <= 0:
            raise ValueError(f"block {b} is free: it cannot be shared")
        self.refs[b] += 1

    def release(self, b: int) -> int:
        """Drop one reference; the block is free again when none is left. Returns the references left."""
        if self.refs[b] <= 0:
            raise ValueError(f"block {b} released more often than it was taken")
        self.refs[b] -= 1
        if self.refs[b] == 0:
            self._free.append(b)
        return int(self.refs[b])


@dataclass(eq=False)
class _Node:
    """One full block of a cached prefix: its tokens, the block holding their K/V, and where it hangs."""

    key: tuple[int, ...]
    block: int
    parent: _Node | None
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)
    last_used: int = 0


class PrefixCache:
    """A trie over block-aligned token runs: the path from the root to a node spells a prefix whose last
    block_size tokens' K/V live in the node's block (as in vLLM's automatic prefix caching and SGLang's
    radix cache, at block granularity). The cache holds one reference on every block in it, so a block
    that only the cache holds (reference count 1) may be evicted. A sequence holding a node's block also
    holds all of the node's ancestors (it matched or inserted the whole path), so such blocks form whole
    subtrees and are evicted leaves first, least recently used first."""

    def __init__(self, pool: BlockPool, block_size: int):
        self.pool = pool
        self.block_size = block_size
        self.root = _Node((), -1, None)
        self.n_blocks = 0  # blocks in the trie
        self._in_trie = np.zeros(pool.n_blocks, bool)
        self._clock = itertools.count(1)
        self.lookup_tokens = 0  # prompt tokens looked up
        self.hit_tokens = 0  # of which served from the cache
        self.evicted = 0
        # a finished sequence's last, partial block, parked under the node of its last full block (the
        # root: None): its tokens, block and last use. The cache holds the sequence's reference; the next
        # sequence that continues those tokens takes the block over and writes on in it (token-granular
        # reuse of a conversation's own tail, free because nobody else holds the block)
        self._tails: dict[_Node | None, tuple[tuple[int, ...], int, int]] = {}

    def _key(self, tokens: Sequence[int], i: int) -> tuple[int, ...]:
        return tuple(tokens[i * self.block_size : (i + 1) * self.block_size])

    def match(self, tokens: Sequence[int], max_blocks: int) -> list[_Node]:
        """The longest cached path spelling tokens' first full blocks (at most max_blocks), without side
        effects."""
        path, node = [], self.root
        for i in range(min(max_blocks, len(tokens) // self.block_size)):
            node = node.children.get(self._key(tokens, i))
            if node is None:
                break
            path.append(node)
        return path

    def acquire(self, path: list[_Node], n_tokens: int) -> list[int]:
        """Take a reference on every block of a matched path for a new sequence; count the lookup."""
        tick = next(self._clock)
        for n in path:
            self.pool.share(n.block)
            n.last_used = tick
        self.lookup_tokens += n_tokens
        self.hit_tokens += len(path) * self.block_size
        return [n.block for n in path]

    def insert(self, parent: _Node | None, key: tuple[int, ...], block: int) -> _Node:
        """Register a sequence's freshly computed full block under parent (None: the root). If the same
        run is already cached (another sequence computed it at the same time), the cached node is returned
        and the caller should hold that node's block instead of its own."""
        parent = parent or self.root
        node = parent.children.get(key)
        if node is None:
            node = _Node(key, block, parent)
            parent.children[key] = node
            self.pool.share(block)
            self._in_trie[block] = True
            self.n_blocks += 1
        node.last_used = next(self._clock)
        return node

    def park_tail(self, node: _Node | None, tokens: Sequence[int], block: int) -> None:
        """Keep a finished sequence's partial last block (holding `tokens`, after the path ending at
        `node`) for a continuation; the caller hands its reference on the block to the cache."""
        old = self._tails.pop(node, None)
        if old is not None:
            self.pool.release(old[1])
        self._tails[node] = (tuple(tokens), block, next(self._clock))

    def tail_run(self, node: _Node | None, rest: Sequence[int]) -> int:
        """How many tokens of `rest` the tail parked after `node` could serve: the run they begin with
        in common, leaving at least one token of `rest` to compute."""
        tail = self._tails.get(node)
        return 0 if tail is None else _common_run(tail[0], rest)

    def take_tail(self, node: _Node | None, n: int) -> int:
        """The block of the tail parked after `node`, to serve its first n tokens; the cache's reference
        on it goes to the caller, who writes on in it after them (the positions after those hold the old
        sequence's K/V until overwritten; attention never reads past a sequence's length)."""
        _, block, _ = self._tails.pop(node)
        self.hit_tokens += n
        return block

    def nearest_child(self, node: _Node | None, rest: Sequence[int]) -> tuple[_Node | None, int]:
        """The cached block after `node` whose tokens begin as `rest` does for the most tokens, and how
        many (leaving at least one of `rest` to compute): a prompt that leaves a cached prefix inside a
        block can still reuse that block's first tokens, by copy (PagedKV.open)."""
        best, n_best = None, 0
        for child in (node or self.root).children.values():
            n = _common_run(child.key, rest)
            if n > n_best:
                best, n_best = child, n
        return best, n_best

    def nearest_run(self, node: _Node | None, rest: Sequence[int]) -> tuple[_Node | None, int, int]:
        """(child, block, n): where the longest run that `rest` begins with (short of its last token) is
        held after `node`: the parked tail (child None; it wins a tie, being taken over rather than
        copied) or a cached block (its node). n is 0 where neither holds any."""
        child, n = self.nearest_child(node, rest)
        n_tail = self.tail_run(node, rest)
        if n_tail and n_tail >= n:
            return None, self._tails[node][1], n_tail
        return child, (child.block if child is not None else -1), n

    def count_copy(self, node: _Node, n: int) -> None:
        """n tokens were served by a copy of node's block: count them, and the block as used now."""
        node.last_used = next(self._clock)
        self.hit_tokens += n

    def tail_of(self, node: _Node | None) -> tuple[tuple[int, ...], int] | None:
        """(tokens, block) of the tail parked after `node`, if any."""
        tail = self._tails.get(node)
        return None if tail is None else (tail[0], tail[1])

    def drop_tail(self, node: _Node | None) -> int:
        """Free the tail parked after `node`; the positions it held (0 if none)."""
        tail = self._tails.pop(node, None)
        if tail is None:
            return 0
        self.pool.release(tail[1])
        return len(tail[0])

    def drop(self, node: _Node) -> None:
        """Take an idle leaf out of the trie and free its block."""
        assert not node.children and self.idle(node) and node.parent is not None
        del node.parent.children[node.key]
        self._in_trie[node.block] = False
        self.n_blocks -= 1
        self.pool.release(node.block)

    def n_evictable(self) -> int:
        """Blocks only the cache holds (all of them can be freed, parked tails and trie leaves first)."""
        return int(np.count_nonzero(self._in_trie & (self.pool.refs == 1))) + len(self._tails)

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def evict(self, n_wanted: int) -> int:
        """Free up to n_wanted blocks that only the cache holds: parked tails, then least recently used
        trie leaves (a leaf's parked tail goes with it)."""
        freed = 0
        for node, (_, block, _) in sorted(self._tails.items(), key=lambda kv: kv[1][2]):
            if freed >= n_wanted:
                return freed
            del self._tails[node]
            self.pool.release(block)
            freed += 1
        heap = [(n.last_used, id(n), n) for n in self._nodes() if not n.children and self.idle(n)]
        heapq.heapify(heap)
        while heap and freed < n_wanted:
            _, _, n = heapq.heappop(heap)
            parent = n.parent
            self.drop(n)
            self.evicted += 1
            freed += 1
            if parent is not self.root and not parent.children and self.idle(parent):
                heapq.heappush(heap, (parent.last_used, id(parent), parent))
        return freed

    def idle(self, n: _Node) -> bool:
        return self.pool.refs[n.block] == 1

    def clear(self) -> int:
        """Evict everything that no sequence holds."""
        return self.evict(self.n_blocks + len(self._tails))

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0


@dataclass
class _SeqBlocks:
    blocks: list[int]  # block of each run of block_size positions, in order
    node: _Node | None  # deepest prefix-cache node on this sequence's path (None: the root)
    n_cached: int  # full blocks already in the prefix cache (matched or inserted)


class PagedKV:
    """The engine's view of a backend KV cache built with n_blocks: sequence slots (block table rows),
    block allocation on demand, and the prefix cache. Not thread-safe: one engine thread drives it."""

    def __init__(self, cache: Any, prefix_caching: bool = True):
        self.cache = cache
        self.block_size = int(cache.block_size)
        self.n_ctx = int(cache.n_ctx)
        self.pool = BlockPool(int(cache.n_blocks))
        self.prefix = PrefixCache(self.pool, self.block_size) if prefix_caching else None
        self.cache.block_table[:] = -1
        self._written()
        self._free_slots = list(range(cache.n_seqs - 1, -1, -1))
        self._seqs: dict[int, _SeqBlocks] = {}

    # -- capacity --------------------------------------------------------------------------------------
    @property
    def n_blocks(self) -> int:
        return self.pool.n_blocks

    @property
    def n_free_slots(self) -> int:
        return len(self._free_slots)

    def n_available(self) -> int:
        """Blocks an allocation could get: free ones plus those only the prefix cache holds."""
        return self.pool.n_free + (self.prefix.n_evictable() if self.prefix else 0)

    def n_used(self) -> int:
        """Blocks held by a sequence or the prefix cache."""
        return self.pool.n_blocks - self.pool.n_free

    def blocks_for(self, n_positions: int) -> int:
        return blocks_for(n_positions, self.block_size)

    def cached_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of `tokens` the prefix cache could serve now (whole blocks, always
        leaving at least the last token to compute)."""
        if self.prefix is None:
            return 0
        return len(self.prefix.match(tokens, (len(tokens) - 1) // self.block_size)) * self.block_size

    # -- sequences -------------------------------------------------------------------------------------
    def open(self, tokens: Sequence[int], reuse: bool = True) -> tuple[int, int]:
        """Give a new sequence a slot and the cached blocks of its longest cached prefix (never all of
        tokens: the last token must be computed for its logits; none if not `reuse`). Returns (slot,
        positions served)."""
        if not self._free_slots:
            raise OutOfBlocks("no free sequence slot")
        slot = self._free_slots.pop()
        path: list[_Node] = []
        blocks: list[int] = []
        served = 0
        if self.prefix is not None and reuse:
            path = self.prefix.match(tokens, (len(tokens) - 1) // self.block_size)
            blocks = self.prefix.acquire(path, len(tokens))
            served = len(blocks) * self.block_size
            block, n = self._partial_block(path[-1] if path else None, tokens[served:])
            if n:
                blocks.append(block)
                served += n
        self._seqs[slot] = _SeqBlocks(blocks, path[-1] if path else None, len(path))
        row = self.cache.block_table[slot]
        row[:] = -1
        row[: len(blocks)] = blocks
        self._written()
        return slot, served

    def _partial_block(self, node: _Node | None, rest: Sequence[int]) -> tuple[int, int]:
        """(block, positions served) for the block after a matched path, where `rest` (the tokens after
        it) begins as a cached run does (llama-server reuses its cache token by token: a repeated prompt
        is served all but its last token): a parked tail, taken over (nobody else holds it), or the first
        tokens of a cached block that others may hold, copied into a fresh block. (-1, 0): neither."""
        assert self.prefix is not None
        child, _, n_copy = self.prefix.nearest_run(node, rest)
        if n_copy == 0:
            return -1, 0
        if child is None:  # this conversation's own tail: write on in its block
            return self.prefix.take_tail(node, n_copy), n_copy
        self.pool.share(child.block)  # held through the eviction below
        try:
            if self.pool.n_free == 0:
                self.prefix.evict(1)
            if self.pool.n_free == 0:
                return -1, 0
            block = self.pool.take()
            self.cache.copy_positions(child.block, block, n_copy)
        finally:
            self.pool.release(child.block)
        self.prefix.count_copy(child, n_copy)
        return block, n_copy

    def ensure(self, slot: int, n_positions: int) -> None:
        """Map blocks for positions 0..n_positions-1 of a sequence, evicting from the prefix cache if the
        pool is dry. Raises OutOfBlocks (having mapped what it could) if memory is short."""
        if n_positions > self.n_ctx:
            raise ValueError(f"position {n_positions - 1} is outside the context of {self.n_ctx}")
        s = self._seqs[slot]
        need = self.blocks_for(n_positions) - len(s.blocks)
        if need <= 0:
            return
        if self.pool.n_free < need and self.prefix is not None:
            self.prefix.evict(need - self.pool.n_free)
        row = self.cache.block_table[slot]
        try:
            for _ in range(need):
                b = self.pool.take()  # raises OutOfBlocks
                row[len(s.blocks)] = b
                s.blocks.append(b)
        finally:
            self._written()

    def commit(self, slot: int, tokens: Sequence[int], n_computed: int) -> None:
        """Offer the sequence's full blocks among its first n_computed positions (whose K/V are now
        written) to the prefix cache. Where another sequence cached the same run first, switch to its
        block so that sequences sharing a prefix share its memory."""
        if self.prefix is None:
            return
        s = self._seqs[slot]
        row = self.cache.block_table[slot]
        for i in range(s.n_cached, n_computed // self.block_size):
            node = self.prefix.insert(s.node, self.prefix._key(tokens, i), s.blocks[i])
            if node.block != s.blocks[i]:
                self.pool.share(node.block)
                self.pool.release(s.blocks[i])
                s.blocks[i] = node.block
                row[i] = node.block
                self._written()
            s.node = node
            s.n_cached = i + 1

    def close(self, slot: int, tokens: Sequence[int] | None = None, n_computed: int = 0) -> None:
        """Release a sequence's blocks (cached ones stay in the prefix cache) and free its slot. Given
        its tokens and how many of them have their K/V written, its full blocks are cached first and a
        partial last block that only it holds is parked for a continuation (PrefixCache.take_tail)."""
        keep = -1
        if self.prefix is not None and tokens is not None and n_computed > 0:
            self.commit(slot, tokens, n_computed)
            s = self._seqs[slot]
            start = s.n_cached * self.block_size
            if (
                s.n_cached == n_computed // self.block_size
                and start < n_computed
                and len(s.blocks) > s.n_cached
            ):
                b = s.blocks[s.n_cached]
                if self.pool.refs[b] == 1:
                    self.prefix.park_tail(s.node, tokens[start:n_computed], b)
                    keep = s.n_cached
        s = self._seqs.pop(slot)
        for i, b in enumerate(s.blocks):
            if i != keep:  # the parked tail's reference went to the prefix cache
                self.pool.release(b)
        self.cache.block_table[slot] = -1
        self._written()
        self._free_slots.append(slot)

    # -- saved prefixes (llama-server's slot save / restore / erase) ----------------------------------
    def cached_run(self, tokens: Sequence[int]) -> tuple[list[int], int]:
        """(blocks, n): the blocks holding K/V of the first n tokens of `tokens` that the prefix cache
        holds now (full blocks, then the longest common run of a parked tail or a cached block after
        them), without side effects."""
        if self.prefix is None:
            return [], 0
        path = self.prefix.match(tokens, len(tokens) // self.block_size)
        blocks, n = [p.block for p in path], len(path) * self.block_size
        # the whole of tokens may be served here: a sentinel stands for the token left to compute
        _, last, run = self.prefix.nearest_run(path[-1] if path else None, [*tokens[n:], -1])
        if run:
            blocks.append(last)
            n += run
        return blocks, n

    def export(self, tokens: Sequence[int]) -> tuple[int, np.ndarray, np.ndarray]:
        """(n, K, V): K and V of the first n tokens of `tokens` that the prefix cache holds, as
        (layers, n, n_kv_heads, row) host arrays (the cache's read_block)."""
        blocks, n = self.cached_run(tokens)
        if not blocks:
            kinds, shapes = (self.cache.type_k, self.cache.type_v), self.cache.block_shapes()
            k, v = (np.zeros((s[0], 0, *s[2:]), np.float16 if t == "f16" else np.uint8)
                    for s, t in zip(shapes, kinds))  # fmt: skip
            return 0, k, v
        read = [self.cache.read_block(b) for b in blocks]
        k, v = (np.concatenate([r[j] for r in read], axis=1)[:, :n] for j in (0, 1))
        return n, k, v

    def restore(self, tokens: Sequence[int], k: np.ndarray, v: np.ndarray) -> int:
        """Put K and V of `tokens` (export's arrays) into the prefix cache: full blocks into the trie
        (runs already cached are kept as they are), a partial last block parked as a finished
        sequence's tail, so that the next prompt beginning with these tokens is served from them. All
        or nothing: OutOfBlocks if the pool cannot hold them beside what sequences hold now, ValueError
        if they are more than a sequence's context. Returns the positions restored (len(tokens))."""
        if self.prefix is None:
            raise ValueError("the prefix cache is off: nothing can be restored into it")
        bs, n = self.block_size, len(tokens)
        if n > self.n_ctx:  # llama-server's "restored prompt does not fit in the slot context"
            raise ValueError(f"{n} positions do not fit in the context of {self.n_ctx}")
        path = self.prefix.match(tokens, n // bs)  # the runs already cached
        held = [p.block for p in path]
        for b in held:  # held through the evictions below, and so are the blocks written
            self.pool.share(b)
        try:
            need = self.blocks_for(n) - len(path)
            if need > self.n_available():
                raise OutOfBlocks(f"{n} positions need {need} more KV blocks, {self.n_available()} are free")
            node = path[-1] if path else None
            k_shape, v_shape = self.cache.block_shapes()
            for i in range(len(path), self.blocks_for(n)):
                a, z = i * bs, min(n, (i + 1) * bs)
                if self.pool.n_free == 0:
                    self.prefix.evict(1)
                block = self.pool.take()
                kb, vb = np.zeros(k_shape, k.dtype), np.zeros(v_shape, v.dtype)
                kb[:, : z - a], vb[:, : z - a] = k[:, a:z], v[:, a:z]
                self.cache.write_block(block, kb, vb)
                if z - a == bs:
                    node = self.prefix.insert(node, tuple(tokens[a:z]), block)
                    held.append(block)
                else:  # the last, partial block: the cache takes this reference
                    self.prefix.park_tail(node, tokens[a:z], block)
        finally:
            for b in held:
                self.pool.release(b)
        return n

    def forget(self, tokens: Sequence[int]) -> int:
        """Drop what the prefix cache holds of `tokens` that nothing else needs: the parked tail after
        their cached path, then the path's blocks from the deepest up while no sequence holds one and
        no other cached run continues it. Returns the positions dropped."""
        if self.prefix is None:
            return 0
        path = self.prefix.match(tokens, len(tokens) // self.block_size)
        dropped = self.prefix.drop_tail(path[-1] if path else None)
        for node in reversed(path):
            if node.children or not self.prefix.idle(node) or self.prefix.tail_of(node) is not None:
                break
            self.prefix.drop(node)
            dropped += self.block_size
        return dropped

    def _written(self) -> None:
        """This class is the only writer of the cache's block table: tell the cache after each change
        (KVCacheProtocol.table_written), so a device copies the table before its next forward."""
        self.cache.table_written()

    def seq_blocks(self, slot: int) -> list[int]:
        return list(self._seqs[slot].blocks)
