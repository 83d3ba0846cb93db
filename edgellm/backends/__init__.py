"""Backend registry: `--backend auto|reference|...`. `auto` picks the fastest backend available here."""

from __future__ import annotations

import logging

from edgellm.backends.base import Backend, BackendUnavailable

# name -> "module:class"; the fast CPU and device backends register here as they land
BACKENDS = {
    "reference": "edgellm.backends.reference:ReferenceBackend",
    "numba": "edgellm.backends.numba_cpu:NumbaBackend",
    "native": "edgellm.backends.native:NativeBackend",
}
AUTO_ORDER = ["native", "numba", "reference"]
_SAID: set[str] = set()


def names() -> list[str]:
    return ["auto", *BACKENDS]


def get_backend(name: str = "auto", threads: int | None = None) -> Backend:
    """Instantiate a backend by name; an unavailable one raises BackendUnavailable saying why."""
    import importlib

    if name == "auto":
        reasons = []
        for n in AUTO_ORDER:
            try:
                backend = get_backend(n, threads)
            except BackendUnavailable as e:
                reasons.append(f"{n}: {e}")
                continue
            if reasons and reasons[0] not in _SAID:  # say once why a faster backend is not used
                _SAID.add(reasons[0])
                logging.getLogger(__name__).warning("using the %s backend (%s)", n, "; ".join(reasons))
            return backend
        raise BackendUnavailable("no backend is available: " + "; ".join(reasons))
    target = BACKENDS.get(name)
    if target is None:
        raise BackendUnavailable(f"unknown backend {name!r} (choose from: {', '.join(names())})")
    mod, cls = target.split(":")
    return getattr(importlib.import_module(mod), cls)(threads=threads)


__all__ = ["Backend", "BackendUnavailable", "get_backend", "names"]
