"""CPU facts the CPU backends size their thread pools by."""

from __future__ import annotations

import os
from pathlib import Path


def physical_cores() -> int:
    """Physical cores this process may run on (SMT siblings counted once); falls back to logical CPUs."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
    cores = set()
    for c in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{c}/topology")
        try:
            cores.add(((topo / "physical_package_id").read_text(), (topo / "core_id").read_text()))
        except OSError:
            return len(cpus)
    return max(1, len(cores))
