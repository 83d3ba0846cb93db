"""Architecture registry: GGUF `general.architecture` -> model class, with a remap table for close kin."""

from __future__ import annotations

from typing import Any

from edgellm.backends.base import Backend
from edgellm.gguf import ModelFile

# arch name in the GGUF -> module:class (imported on demand, so one arch's import cost is not paid by all)
ARCHITECTURES = {
    "llama": "edgellm.arch.llama:LlamaModel",
    "gemma3": "edgellm.arch.gemma3:Gemma3Model",
    "qwen2": "edgellm.arch.qwen2:Qwen2Model",
    "qwen3": "edgellm.arch.qwen3:Qwen3Model",
    "phi3": "edgellm.arch.phi3:Phi3Model",
}
REMAP = {"mistral": "llama"}  # same graph, different name in the file


class UnsupportedArchitecture(ValueError):
    pass


def supported() -> list[str]:
    return sorted([*ARCHITECTURES, *REMAP])


def model_class(arch: str) -> Any:
    target = ARCHITECTURES.get(REMAP.get(arch, arch))
    if target is None:
        raise UnsupportedArchitecture(
            f"architecture {arch!r} is not supported (supported: {', '.join(supported())})"
        )
    import importlib

    mod, cls = target.split(":")
    return getattr(importlib.import_module(mod), cls)


def load_model(mf: ModelFile, backend: Backend) -> Any:
    """Build the model for `mf`'s architecture with its weights bound to `backend`."""
    return model_class(mf.arch)(mf, backend)
