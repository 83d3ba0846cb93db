"""Huge-page memory for the weights (edgellm/hugepages.py): the arena the native backend repacks into,
and the --no-mmap copy of a file."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from tiny_models import Spec, random_weights, write_gguf

from edgellm.gguf import ModelFile
from edgellm.hugepages import HUGE_PAGE, HugeArena, thp_size


def _thp_off_for_this_process() -> bool:
    """prctl(PR_SET_THP_DISABLE), as some container runtimes set it (/proc/self/status: THP_enabled: 0)"""
    try:
        return "THP_enabled:\t0" in Path("/proc/self/status").read_text()
    except OSError:
        return False


# (qemu-user, which scripts/aarch64_runtime_tests.sh runs tests under with QEMU_CPU set, drops madvise)
ADVISED = (
    sys.platform == "linux"
    and "QEMU_CPU" not in os.environ
    and thp_size() == HUGE_PAGE
    and not _thp_off_for_this_process()
)


def _mapping_of(addr: int) -> dict[str, str]:
    """/proc/self/smaps' fields of the mapping holding addr"""
    fields: dict[str, str] = {}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            if inside:
                break
            inside = lo <= addr < hi
        elif inside:
            fields[head.rstrip(":")] = line.split(":", 1)[1].strip()
    return fields


def _check_advised(addr: int) -> None:
    """Where Linux has 2 MiB transparent huge pages (not `never`) and smaps tells: addr's mapping may
    have them."""
    if ADVISED and "[never]" not in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text():
        smaps = _mapping_of(addr)
        if "THPeligible" in smaps:
            assert smaps["THPeligible"] == "1", smaps


def test_repacked_weights_share_huge_page_slabs():
    """The arena packs tensors end to end (64-byte aligned, disjoint, writable) in slabs aligned to the
    huge page; one larger than a slab gets a slab of its own; on Linux with 2 MiB transparent huge pages
    the slab is advised for them (smaps: THPeligible)."""
    arena = HugeArena(slab_bytes=4 << 20)
    parts = [arena.take(n) for n in (1000, 3 << 20, 1 << 20, 5 << 20, 64)]
    for a, n in zip(parts, (1000, 3 << 20, 1 << 20, 5 << 20, 64)):
        assert a.dtype == np.uint8 and a.size == n and a.ctypes.data % 64 == 0 and a.flags.writeable
        a[:] = n % 251
    spans = sorted((a.ctypes.data, a.ctypes.data + a.size) for a in parts)
    assert all(hi <= lo for (_, hi), (lo, _) in zip(spans, spans[1:]))
    assert all(int(a[-1]) == n % 251 for a, n in zip(parts, (1000, 3 << 20, 1 << 20, 5 << 20, 64)))
    # 1000 and 3 MiB share the first slab; 1 MiB starts a second (1024 + 3 MiB + 1 MiB > 4 MiB)...
    assert parts[1].ctypes.data == parts[0].ctypes.data + 1024
    assert parts[0].ctypes.data % HUGE_PAGE == 0 and parts[2].ctypes.data % HUGE_PAGE == 0
    # ...5 MiB takes a slab of its own, and the 64 bytes go after it
    assert parts[3].ctypes.data % HUGE_PAGE == 0 and parts[4].ctypes.data == parts[3].ctypes.data + (5 << 20)
    _check_advised(parts[1].ctypes.data)


def test_a_file_read_without_mmap_is_one_read_only_copy_in_huge_pages(tmp_path):
    """--no-mmap reads the file into a buffer of its own (huge pages, where advised): the same bytes and
    tensors as the mapping, read-only."""
    spec = Spec(arch="llama")
    w = random_weights(spec)
    path = write_gguf(tmp_path / "m.gguf", spec, w, {n: T.Q8_0 for n in w if n.endswith("attn_q.weight")})
    mapped, read = ModelFile(path), ModelFile(path, use_mmap=False)
    assert not read.mapped and bytes(read.buffer) == path.read_bytes() and read.buffer.readonly
    assert mapped.tensors.keys() == read.tensors.keys()
    for name, t in mapped.tensors.items():
        assert np.array_equal(t.data, read.tensors[name].data) and not read.tensors[name].data.flags.writeable
    base = np.frombuffer(read.buffer, np.uint8)
    assert base.ctypes.data % HUGE_PAGE == 0
    _check_advised(base.ctypes.data)
