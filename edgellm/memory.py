"""Memory on small boards: whether a model and its KV cache fit, checked before they are loaded, and
--mlock.

A model that does not fit is refused up front with the numbers, as ollama does ("model requires more
system memory (X) than is available (Y)"), instead of being killed by the OOM killer mid-answer. What is
available is the kernel's MemAvailable (free memory plus the page cache it can drop, which includes a
model file already cached), capped by the memory cgroup's limit less what the cgroup holds beyond its
droppable cache: a systemd unit's MemoryMax or a container's limit (cgroup v2 memory.max, v1
memory.limit_in_bytes). The weights count in full whether mapped or read (a mapped model larger than RAM
is not killed but re-reads the file for every token). EDGELLM_NO_MEMORY_CHECK=1 skips the check.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

NO_CHECK_ENV = "EDGELLM_NO_MEMORY_CHECK"
_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2^63 - 1


class NotEnoughMemory(RuntimeError):
    """The model (and its KV cache) need more memory than this machine or its cgroup has available."""


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def _read_kv(path: Path) -> dict[str, int]:
    """`key value` or `Key: value kB` lines as integers (bytes where the file says kB)."""
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1]) * (1024 if parts[2:3] == ["kB"] else 1)
    return out


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _cgroup_headroom(proc: Path, sys_cgroup: Path) -> int | None:
    """What this process's memory cgroups (and their parents) still allow: min over those with a limit
    of limit - (usage - inactive file cache); None where none has a limit or none is readable."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    rooms: list[int] = []
    for line in lines:
        hier, controllers, rel = (line.split(":", 2) + ["", ""])[:3]
        if hier == "0" and controllers == "":  # cgroup v2: one unified tree
            base = sys_cgroup
            files = ("memory.max", "memory.current", "memory.stat", "inactive_file")
        elif "memory" in controllers.split(","):  # cgroup v1: the memory controller's own tree
            base = sys_cgroup / "memory"
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat", "total_inactive_file")
        else:
            continue
        d = base / rel.strip("/")
        while True:  # the process's cgroup and each parent up to the mount's root
            limit, usage = _read_int(d / files[0]), _read_int(d / files[1])
            if limit is not None and usage is not None and limit < _UNLIMITED:
                try:
                    inactive = _read_kv(d / files[2]).get(files[3], 0)
                except OSError:
                    inactive = 0
                rooms.append(max(0, limit - max(0, usage - inactive)))
            if d == base or base not in d.parents:
                break
            d = d.parent
    return min(rooms, default=None)


def available(
    proc: str | os.PathLike = "/proc", sys_cgroup: str | os.PathLike = "/sys/fs/cgroup"
) -> tuple[int, str] | None:
    """(bytes this process may still take, where that figure comes from), or None where it cannot tell
    (no /proc/meminfo: macOS, Windows)."""
    proc, sys_cgroup = Path(proc), Path(sys_cgroup)
    try:
        mem = _read_kv(proc / "meminfo")
    except OSError:
        return None
    if "MemAvailable" not in mem:
        return None
    room, source = mem["MemAvailable"], "MemAvailable in /proc/meminfo"
    cg = _cgroup_headroom(proc, sys_cgroup)
    if cg is not None and cg < room:
        room, source = cg, "what this process's memory cgroup (MemoryMax / the container's limit) leaves"
    return room, source


def require(what: str, parts: dict[str, int], hint: str) -> None:
    """Raise NotEnoughMemory unless the sum of `parts` (name -> bytes) fits in what is available."""
    if os.environ.get(NO_CHECK_ENV, "") not in ("", "0"):
        return
    got = available()
    need = sum(parts.values())
    if got is None or need <= got[0]:
        return
    breakdown = " + ".join(f"{name} {gib(n)}" for name, n in parts.items() if n)
    raise NotEnoughMemory(
        f"{what} needs {gib(need)} of memory ({breakdown}) but {gib(got[0])} is available ({got[1]}); "
        f"{hint} (or set {NO_CHECK_ENV}=1 to load it anyway)"
    )


def lock(buffers: list) -> str | None:
    """mlock each buffer (the model's mapping: its pages are read in now and never swapped or dropped, as
    llama.cpp's --mlock); None when locked, else the warning llama.cpp prints."""
    name = ctypes.util.find_library("c") if os.name == "posix" else None
    if name is None:
        return "--mlock is not supported on this platform"
    libc = ctypes.CDLL(name, use_errno=True)
    libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    done = 0
    for buf in buffers:
        view = memoryview(buf)
        n = view.nbytes
        if n == 0:
            continue
        if libc.mlock(ctypes.c_void_p(_address(view)), ctypes.c_size_t(n)) != 0:
            why = os.strerror(ctypes.get_errno())
            return (
                f"failed to mlock {n}-byte buffer (after previously locking {done} bytes): {why}; "
                "try increasing RLIMIT_MEMLOCK ('ulimit -l' as root, LimitMEMLOCK= in a systemd unit)"
            )
        done += n
    return None


def _address(view: memoryview) -> int:
    import numpy as np  # a read-only mapping has no ctypes address of its own; numpy gives its pointer

    return int(np.frombuffer(view, np.uint8).ctypes.data)
