"""Backend registry: `--backend auto|reference|...`. `auto` picks the fastest backend available here."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from edgellm.backends.base import Backend, BackendUnavailable

# name -> "module:class"; the fast CPU and device backends register here as they land
BACKENDS = {
    "reference": "edgellm.backends.reference:ReferenceBackend",
    "numba": "edgellm.backends.numba_cpu:NumbaBackend",
    "native": "edgellm.backends.native:NativeBackend",
    "vulkan": "edgellm.backends.webgpu:VulkanBackend",
    "metal": "edgellm.backends.webgpu:MetalBackend",
    "cuda": "edgellm.backends.cuda:CudaBackend",
}
AUTO_ORDER = ["cuda", "metal", "vulkan", "native", "numba", "reference"]
# device backends `auto` takes only on a real GPU (webgpu.auto_refusal): never on a software driver such as
# lavapipe, which is slower than the CPU backends; why one is not taken is not worth a warning
DEVICE_BACKENDS = ("cuda", "metal", "vulkan")
_SAID: set[str] = set()


def _type_name(t: int) -> str:
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(t).name
    except ValueError:
        return str(t)


def _auto_refusal(name: str) -> str | None:
    """Why `auto` skips a device backend (no real device of that kind here), or None."""
    if name == "cuda":
        from edgellm.backends.cuda import auto_refusal

        return auto_refusal()
    from edgellm.backends.webgpu import auto_refusal as webgpu_refusal

    return webgpu_refusal(name)


def names() -> list[str]:
    return ["auto", *BACKENDS]


def get_backend(name: str = "auto", threads: int | None = None, weight_types: Iterable = ()) -> Backend:
    """Instantiate a backend by name; an unavailable one raises BackendUnavailable saying why.

    `auto` takes the first available backend of AUTO_ORDER whose kernels cover every type in
    `weight_types` (the file's matrix types), else the first available one (whose load report then
    names what falls back)."""
    import importlib

    if name == "auto":
        reasons: list[str] = []
        chosen, first = None, None  # the first fast backend that covers the file; the first that runs
        types = sorted({int(t) for t in weight_types})
        for n in AUTO_ORDER:
            if n in DEVICE_BACKENDS and _auto_refusal(n) is not None:
                continue
            try:
                backend = get_backend(n, threads)
            except BackendUnavailable as e:
                reasons.append(f"{n}: {e}")
                continue
            if n == AUTO_ORDER[-1]:  # the slow oracle: only when no fast backend runs here at all
                chosen = first or backend
                break
            missing = [t for t in types if not backend.supports("matmul", t)]
            if not missing:
                chosen = backend
                break
            first = first or backend
            reasons.append(f"{n}: no kernel for {', '.join(_type_name(t) for t in missing)}")
        backend = chosen or first
        if backend is None:
            raise BackendUnavailable("no backend is available: " + "; ".join(reasons))
        if reasons and reasons[0] not in _SAID:  # say once why a faster backend is not used
            _SAID.add(reasons[0])
            logging.getLogger(__name__).warning("using the %s backend (%s)", backend.name, "; ".join(reasons))
        return backend
    target = BACKENDS.get(name)
    if target is None:
        raise BackendUnavailable(f"unknown backend {name!r} (choose from: {', '.join(names())})")
    mod, cls = target.split(":")
    return getattr(importlib.import_module(mod), cls)(threads=threads)


__all__ = ["Backend", "BackendUnavailable", "get_backend", "names"]
