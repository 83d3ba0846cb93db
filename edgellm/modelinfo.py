"""What `edgellm info` and `edgellm list` report about a GGUF file: a plain dict, printable or JSON, and
whether the file would load."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from edgellm.gguf import ModelFile, StringArray, array_element_type


def summarize(mf: ModelFile) -> dict[str, Any]:
    """Architecture, sizes, quant mix and tokenizer facts of an opened model file."""
    arch = mf.arch
    mix: dict[str, dict[str, int]] = defaultdict(lambda: {"tensors": 0, "bytes": 0, "elements": 0})
    for t in mf.tensors.values():
        m = mix[t.type.name]
        m["tensors"] += 1
        m["bytes"] += t.nbytes
        m["elements"] += t.n_elements
    tokens = mf.get("tokenizer.ggml.tokens")
    return {
        "path": str(mf.path),
        "file_size": mf.file_size,
        "gguf_version": mf.version,
        "name": mf.get("general.name"),
        "architecture": arch,
        "parameters": sum(t.n_elements for t in mf.tensors.values()),
        "context_length": _plain(mf.arch_key("context_length")),
        "layers": _plain(mf.arch_key("block_count")),
        "embedding_length": _plain(mf.arch_key("embedding_length")),
        "feed_forward_length": _plain(mf.arch_key("feed_forward_length")),
        "head_count": _plain(mf.arch_key("attention.head_count")),
        "head_count_kv": _plain(mf.arch_key("attention.head_count_kv")),
        "rope_freq_base": _plain(mf.arch_key("rope.freq_base")),
        "file_type": mf.get("general.file_type"),
        "quant_mix": dict(sorted(mix.items(), key=lambda kv: -kv[1]["bytes"])),
        "tokenizer": mf.get("tokenizer.ggml.model"),
        "tokenizer_pre": mf.get("tokenizer.ggml.pre"),
        "vocab_size": len(tokens) if array_element_type(tokens) is not None else None,
        "chat_template": mf.get("tokenizer.chat_template") is not None,
        "tensor_count": len(mf.tensors),
    }


def load_problem(mf: ModelFile) -> str | None:
    """Why `mf` would not load, as one line, or None: the architecture's config checks and the tokenizer's,
    run as load does but without binding a weight. An architecture edgellm lacks is not reported here
    (the summary names it; `info` describes any GGUF)."""
    from edgellm.arch import UnsupportedArchitecture, model_class
    from edgellm.arch.config_checks import ConfigError
    from edgellm.tokenizer import Tokenizer, TokenizerError

    try:
        cls = model_class(mf.arch)
    except UnsupportedArchitecture:
        return None
    try:
        cls.config_from_gguf(mf)
        Tokenizer.from_gguf(mf)  # lazy: reads the tokenizer keys, parses no token
    except ConfigError as e:
        return str(e)
    except TokenizerError as e:
        return f"{mf.path}: {e}"
    return None


def tensor_table(mf: ModelFile) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "type": t.type.name, "shape": list(t.shape), "bytes": t.nbytes, "offset": t.offset}
        for t in mf.tensors.values()
    ]


def metadata_plain(mf: ModelFile, max_items: int = 8) -> dict[str, Any]:
    """Metadata made JSON-friendly; long arrays are shortened to their length and first items."""
    out = {}
    for k, v in mf.metadata.items():
        out[k] = _plain(v, max_items)
    return out


def _plain(v: Any, max_items: int | None = None) -> Any:
    if isinstance(v, StringArray):
        n = len(v)
        if max_items is None or n <= max_items:
            return v.tolist()
        return {"length": n, "first": [v[i] for i in range(max_items)]}
    if hasattr(v, "tolist"):
        lst = v.tolist()
        if max_items is not None and isinstance(lst, list) and len(lst) > max_items:
            return {"length": len(lst), "first": lst[:max_items]}
        return lst
    return v


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def human_count(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    return f"{n / 1e3:.1f}K"


def format_summary(s: dict[str, Any]) -> str:
    lines = [
        f"  path            {s['path']}",
        f"  name            {s['name']}",
        f"  architecture    {s['architecture']}",
        f"  parameters      {human_count(s['parameters'])}",
        f"  file size       {human_bytes(s['file_size'])} "
        f"(GGUF v{s['gguf_version']}, {s['tensor_count']} tensors)",
        f"  context length  {s['context_length']}",
        f"  layers          {s['layers']}",
        f"  embedding       {s['embedding_length']}",
        f"  feed forward    {s['feed_forward_length']}",
        f"  heads / kv      {s['head_count']} / {s['head_count_kv']}",
        f"  rope freq base  {s['rope_freq_base']}",
        f"  tokenizer       {s['tokenizer']} (pre {s['tokenizer_pre']}), vocab {s['vocab_size']}",
        f"  chat template   {'yes' if s['chat_template'] else 'no (a built-in one is used)'}",
        "  quant mix",
    ]
    for name, m in s["quant_mix"].items():
        lines.append(f"    {name:<6} {m['tensors']:4d} tensors  {human_bytes(m['bytes']):>10}")
    return "\n".join(lines)


def quant_mix_short(s: dict[str, Any]) -> str:
    return ", ".join(f"{k}×{v['tensors']}" for k, v in s["quant_mix"].items())
