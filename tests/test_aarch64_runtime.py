"""The native runtime on aarch64: scripts/aarch64_runtime_tests.sh builds an arm64 sysroot, cross-builds the
extension, and runs tests/test_native_backend.py under qemu-aarch64 as a Cortex-A72 (Pi 4: NEON, no
dotprod) and a Cortex-A76 (Pi 5: dotprod), checking which level each picks and allowing no skipped test.
It is the reduced, CI-sized version of scripts/aarch64_e2e.sh (the pip installs in an arm64 userland).

.ci/run installs the tools where it is root with apt-get, and fails if it cannot, so this skips only where
a developer lacks them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("debootstrap", "dpkg-deb", "aarch64-linux-gnu-gcc", "qemu-aarch64-static")


def test_the_native_runtime_tests_pass_on_cortex_a72_and_a76():
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(
            f"needs {', '.join(missing)} (apt-get install debootstrap gcc-aarch64-linux-gnu qemu-user-static)"
        )
    if os.geteuid() != 0:
        pytest.skip("debootstrap needs root")
    res = subprocess.run(
        ["bash", str(ROOT / "scripts" / "aarch64_runtime_tests.sh")],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "cortex-a72 (neon): passed" in res.stderr, res.stderr
    assert "cortex-a76 (neon+dotprod): passed" in res.stderr, res.stderr
