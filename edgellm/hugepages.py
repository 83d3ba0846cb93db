"""Memory in transparent huge pages for what decode streams every token: the weights.

Linux's transparent huge pages are commonly `madvise` only, so memory gets them only where it is advised
MADV_HUGEPAGE (numpy advises its own buffers of 4 MiB or more, but only the aligned 2 MiB runs inside
one can be huge pages). In 4 KiB pages, a stream through the weights pays a TLB miss every page: a C read
loop over 1 GiB on an AVX-512 Xeon (2 threads) measured 25 GB/s in 4 KiB pages and 29 GB/s in huge pages.

The cost is at load, where a huge page is first touched: it is free memory in a 2 MiB run, which a
virtual machine's host may not have backed yet (Firecracker with free page reporting: the kernel's
time goes to clear_page while the host faults each page in). There, loading Qwen2.5-Coder-1.5B took
1.6-3.9 s against 0.6 s; on a machine of its own the first touch costs the page's zeroing, as any page.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

HUGE_PAGE = 2 << 20  # x86-64's and arm64's (4 KiB base pages) transparent huge page


def thp_size() -> int:
    """The kernel's transparent huge page size (0: unknown, or none)"""
    try:
        return int(Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return 0


def huge_buffer(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 array of nbytes starting on a huge page, in an anonymous private mapping
    advised MADV_HUGEPAGE where the kernel's huge pages are HUGE_PAGE (a kernel of 16 or 64 KiB pages
    has 32 or 512 MiB ones: mostly slack), else plain memory (64-byte aligned). The mapping reserves
    address space only: pages are taken as they are first written."""
    size = -(-max(nbytes, 1) // HUGE_PAGE) * HUGE_PAGE
    try:  # the slack before the first aligned page is never touched
        mm = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError, AttributeError):  # (no anonymous mappings here: plain memory)
        buf = np.empty(nbytes + 64, np.uint8)
        return buf[-buf.ctypes.data % 64 :][:nbytes]
    whole = np.frombuffer(mm, np.uint8)  # (the array keeps the mapping alive)
    out = whole[-whole.ctypes.data % HUGE_PAGE :][:size]
    if hasattr(mmap, "MADV_HUGEPAGE") and thp_size() == HUGE_PAGE:
        try:
            mm.madvise(mmap.MADV_HUGEPAGE, out.ctypes.data - whole.ctypes.data, size)
        except OSError:  # (a kernel without transparent huge pages: 4 KiB pages)
            pass
    return out[:nbytes]


class HugeArena:
    """Tensors packed end to end (64-byte aligned) in huge_buffer slabs of at least slab_bytes, so small
    tensors share huge pages (the q, k, v, o projections of a 1.5B model, 0.2-2.6 MiB each, got none as
    numpy buffers of their own: 30% of its weights). A slab's pages are taken as tensors fill it, the
    last one partly: at most one huge page's slack per slab."""

    def __init__(self, slab_bytes: int = 256 << 20):
        self.slab_bytes = slab_bytes
        self._slab: np.ndarray | None = None
        self._used = 0

    def take(self, nbytes: int) -> np.ndarray:
        """A 64-byte aligned, uninitialised uint8 array of nbytes."""
        need = (nbytes + 63) & ~63
        if self._slab is None or self._used + need > self._slab.size:
            size = -(-max(need, self.slab_bytes) // HUGE_PAGE) * HUGE_PAGE  # (all of its last page)
            self._slab, self._used = huge_buffer(size), 0
        out = self._slab[self._used : self._used + nbytes]
        self._used += need
        return out
