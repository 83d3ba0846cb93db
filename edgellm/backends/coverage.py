"""Which weight types each backend runs with its own kernels: the table the README prints (a test checks
the README against it), from `Backend.supports`, so it cannot drift from what the code does."""

from __future__ import annotations

import importlib

from edgellm import quants
from edgellm.backends import BACKENDS, BackendUnavailable, get_backend

# types a model's matrices come in (Q8_K is only an activation type); README order
WEIGHT_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL",
                "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]  # fmt: skip


def coverage(names: list[str] | None = None) -> dict[str, dict[str, bool | None]]:
    """{backend: {type: runs natively}}; None for a backend that cannot run on this machine."""
    out: dict[str, dict[str, bool | None]] = {}
    by_name = {q.name: q.type for q in map(quants.quant_type, quants.supported_types())}
    for n in names or list(BACKENDS):
        try:
            b = get_backend(n)
        except BackendUnavailable:
            # a device backend declares its kernels' types without a device (WebGPUBackend.weight_types)
            mod, cls = BACKENDS[n].split(":")
            static = getattr(getattr(importlib.import_module(mod), cls), "weight_types", None)
            out[n] = {t: None if static is None else int(by_name[t]) in static for t in WEIGHT_TYPES}
            continue
        out[n] = {t: b.supports("matmul", by_name[t]) for t in WEIGHT_TYPES}
    return out


def capability_table(names: list[str] | None = None) -> str:
    """A markdown table: one row per weight type, one column per backend (yes / fallback / '?')."""
    cov = coverage(names)
    cols = list(cov)
    lines = ["| type | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for t in WEIGHT_TYPES:
        cells = ["?" if cov[c][t] is None else ("yes" if cov[c][t] else "fallback") for c in cols]
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(capability_table())
