"""What the CPU backends share: host numpy arrays, the paged host KV cache (paged_kv.py), and an explicit
fallback for the weights they have no kernel for.

A subclass declares the weight types its kernels run (`kernel_types`); `supports` answers from that, the
load report (arch.fallback_report) names the tensors that fall back and what they cost, and only those
tensors go to `self.fallback`: the reference backend's float32 matmul on a dequantized copy (fast BLAS,
not the exact oracle: a fallback is for speed, not for checking).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from edgellm.backends.base import WEIGHT_OPS, Backend
from edgellm.backends.paged_kv import CACHE_TYPES, KVCache
from edgellm.backends.reference import ReferenceBackend
from edgellm.gguf import QTensor


class HostBackend(Backend):
    """A backend whose arrays are host numpy arrays and whose KV cache is paged_kv.KVCache."""

    def __init__(self) -> None:
        self.fallback = ReferenceBackend(exact=False)
        self._covered: dict[str, frozenset[int]] = {}

    @abstractmethod
    def kernel_types(self, op: str) -> frozenset[int]:
        """ggml type ids (ints) whose weights `op` ("matmul" or "get_rows") runs with this backend's
        own kernels."""

    def supports(self, op: str, qtype: Any = None) -> bool:
        if op in WEIGHT_OPS:
            types = self._covered.get(op)
            if types is None:  # asked once per op: the load report asks for every tensor
                types = self._covered[op] = self.kernel_types(op)
            return qtype is not None and int(qtype) in types
        if op == "kv_cache":
            return qtype in CACHE_TYPES
        return True

    def vector(self, t: QTensor):
        return self.fallback.vector(t)

    def get_rows(self, w, ids):
        return self.fallback.get_rows(w, ids)

    def new_kv_cache(self, *args: Any, **kwargs: Any) -> KVCache:
        # Backend.new_kv_cache's arguments are paged_kv.KVCache's
        return KVCache(*args, **kwargs)
