"""What the CPU backends share: host numpy arrays, the paged host KV cache (paged_kv.py), and an explicit
fallback for the weights they have no kernel for.

A subclass declares the weight types its kernels run (`kernel_types`); `supports` answers from that, the
load report (arch.fallback_report) names the tensors that fall back and what they cost, and only those
tensors go to `self.fallback`: the reference backend's float32 matmul on a dequantized copy (fast BLAS,
not the exact oracle: a fallback is for speed, not for checking).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from edgellm.backends.base import WEIGHT_OPS, Backend
from edgellm.backends.paged_kv import KVCache
from edgellm.backends.reference import ReferenceBackend
from edgellm.gguf import QTensor


class HostBackend(Backend):
    """A backend whose arrays are host numpy arrays and whose KV cache is paged_kv.KVCache."""

    def __init__(self) -> None:
        self.fallback = ReferenceBackend(exact=False)

    @abstractmethod
    def kernel_types(self, op: str) -> frozenset[int]:
        """ggml type ids (ints) whose weights `op` ("matmul" or "get_rows") runs with this backend's
        own kernels."""

    def supports(self, op: str, qtype: Any = None) -> bool:
        if op in WEIGHT_OPS:
            return qtype is not None and int(qtype) in self.kernel_types(op)
        return True

    def vector(self, t: QTensor):
        return self.fallback.vector(t)

    def get_rows(self, w, ids):
        return self.fallback.get_rows(w, ids)

    def new_kv_cache(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        n_ctx: int,
        n_seqs: int,
        block_size: int | None = None,
        n_blocks: int | None = None,
        window_layers: Sequence[int] = (),
        window: int | None = None,
    ) -> KVCache:
        return KVCache(
            n_layers, n_kv_heads, head_dim, n_ctx, n_seqs, block_size, n_blocks, window_layers, window
        )
