"""Prefix-aware routing for many engine replicas behind one endpoint (`edgellm serve --ray`): which replica
is most likely to hold a request's prompt prefix in its prefix cache.

A prompt's key is the chain of hashes of its first token blocks (block i's hash covers blocks 0..i, as the
engine's prefix cache keys its blocks), so two prompts that share their first k blocks share their first k
hashes. The table remembers which replica last served each hash; a request goes to the replica that holds
its longest known prefix, unless that replica carries `bound` more requests than the least loaded one
(then the least loaded takes it, and is remembered for the prefix from then on). A prefix nobody holds
goes to the least loaded replica; among equally loaded ones, to the one that holds the fewest prefixes
(conversations' first blocks), then by rendezvous hashing of the first block, so new system prompts or
chats spread over the replicas even when they arrive one at a time.

Pure Python, no Ray: `edgellm.ray_serve` wraps it in a Ray Serve request router.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence

BLOCK_TOKENS = 16  # the engine's default KV block (ServerConfig.block_size)
MAX_BLOCKS = 32  # prefix blocks hashed per request: 512 tokens cover a system prompt and a first turn


def prefix_hashes(ids: Sequence[int], block: int = BLOCK_TOKENS, max_blocks: int = MAX_BLOCKS) -> list[int]:
    """Chained 64-bit hashes of the full `block`-token blocks at the start of `ids` (at most `max_blocks`)."""
    if block <= 0:
        raise ValueError("block must be positive")
    out: list[int] = []
    h = hashlib.blake2b(digest_size=8)
    for b in range(min(len(ids) // block, max_blocks)):
        for t in ids[b * block : (b + 1) * block]:
            h.update(int(t).to_bytes(4, "little", signed=True))
        out.append(int.from_bytes(h.copy().digest(), "little"))
    return out


def _score(replica: Hashable, key: int) -> bytes:
    return hashlib.blake2b(f"{key}:{replica}".encode(), digest_size=8).digest()


class PrefixTable:
    """Prefix hash -> the replica that last served it, least recently used first out beyond `capacity`."""

    def __init__(self, capacity: int = 1 << 16):
        self.capacity = capacity
        self._owner: OrderedDict[int, Hashable] = OrderedDict()
        self._roots: OrderedDict[int, Hashable] = OrderedDict()  # first-block hash -> its replica
        self._held: dict[Hashable, int] = {}  # replica -> how many first blocks it holds

    def __len__(self) -> int:
        return len(self._owner)

    def owner(self, hashes: Sequence[int]) -> tuple[Hashable | None, int]:
        """The replica holding the longest known prefix of `hashes`, and how many blocks it holds."""
        for n in range(len(hashes), 0, -1):
            r = self._owner.get(hashes[n - 1])
            if r is not None:
                return r, n
        return None, 0

    def choose(self, hashes: Sequence[int], loads: Mapping[Hashable, int], bound: int) -> Hashable:
        """The replica for a request with these prefix hashes, given each candidate's load (requests in
        flight). Raises ValueError without candidates."""
        if not loads:
            raise ValueError("no replica to route to")
        least = min(loads.values())
        owner, _ = self.owner(hashes)
        if owner in loads and loads[owner] - least <= bound:
            return owner
        idle = [r for r, n in loads.items() if n == least]
        fewest = min(self._held.get(r, 0) for r in idle)
        idle = [r for r in idle if self._held.get(r, 0) == fewest]
        if len(idle) == 1:
            return idle[0]
        key = hashes[0] if hashes else 0
        return max(idle, key=lambda r: _score(r, key))

    def record(self, hashes: Sequence[int], replica: Hashable) -> None:
        for h in hashes:
            self._owner[h] = replica
            self._owner.move_to_end(h)
        if hashes:
            old = self._roots.pop(hashes[0], None)
            if old is not None:
                self._held[old] -= 1
            self._roots[hashes[0]] = replica
            self._held[replica] = self._held.get(replica, 0) + 1
        while len(self._owner) > self.capacity:
            self._owner.popitem(last=False)
        while len(self._roots) > self.capacity:
            _, r = self._roots.popitem(last=False)
            self._held[r] -= 1

    def holds(self, replica: Hashable) -> int:
        """How many prefixes (first blocks) `replica` is the owner of."""
        return self._held.get(replica, 0)

    def forget(self, replica: Hashable) -> None:
        """A replica is gone (its cache with it): its prefixes go to whoever serves them next."""
        for h in [h for h, r in self._owner.items() if r == replica]:
            del self._owner[h]
        for h in [h for h, r in self._roots.items() if r == replica]:
            del self._roots[h]
        self._held.pop(replica, None)


__all__ = ["BLOCK_TOKENS", "MAX_BLOCKS", "PrefixTable", "prefix_hashes"]
