"""Architecture registry: GGUF `general.architecture` -> model class, with a remap table for close kin."""

from __future__ import annotations

import logging
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
    """Build the model for `mf`'s architecture with its weights bound to `backend`; one warning line
    names the weights the backend has no kernel for (see fallback_report)."""
    backend.prepare(mf)
    model = model_class(mf.arch)(mf, backend)
    report = fallback_report(mf, backend)
    if report:
        logging.getLogger("edgellm").warning(report)
    return model


def matrices(mf: ModelFile) -> list[Any]:
    """The file's weight matrices (2-D and up: what matmul and get_rows read); 1-D tensors are norm
    scales and biases, which every backend takes as float32 vectors."""
    return [t for t in mf.tensors.values() if sum(d > 1 for d in t.shape) >= 2]


def uncovered(mf: ModelFile, backend: Backend) -> list[Any]:
    """Weight matrices of `mf` whose type `backend` has no matmul kernel for."""
    return [t for t in matrices(mf) if not backend.supports("matmul", t.type)]


def fallback_report(mf: ModelFile, backend: Backend) -> str | None:
    """One line naming the weights that fall back to a dequantized float32 copy on `backend` and the
    memory that costs, or None when every matrix runs on its kernels."""
    missing = uncovered(mf, backend)
    if not missing:
        return None
    by_type: dict[str, int] = {}
    for t in missing:
        by_type[t.type.name] = by_type.get(t.type.name, 0) + 1
    cost = sum(backend.fallback_cost(t) for t in missing)
    kinds = ", ".join(f"{n} x{k}" for n, k in sorted(by_type.items()))
    return (
        f"{backend.name}: {len(missing)} of {len(matrices(mf))} weight matrices ({kinds}) have no "
        f"{backend.name} kernel and run dequantized to float32 ({cost / 2**20:.0f} MiB more memory, "
        f"slower); e.g. {missing[0].name}"
    )
