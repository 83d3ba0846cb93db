"""scripts/bench_vs_llamacpp.py's helpers that need no llama.cpp."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("bench_vs_llamacpp", ROOT / "scripts/bench_vs_llamacpp.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_variant_names_drop_only_a_quantization_suffix():
    stem = _script().model_stem
    assert stem(Path("SmolLM2-135M-Instruct.Q4_1.gguf")) == "SmolLM2-135M-Instruct"
    assert stem(Path("gemma-3-270m-it.Q4_K_M.gguf")) == "gemma-3-270m-it"
    assert stem(Path("m.BF16.gguf")) == "m" and stem(Path("m.iq4_nl.gguf")) == "m"
    # a dot in the model's own name stays (the variant used to be named Qwen2.5-Coder-0.F16.gguf)
    assert stem(Path("Qwen2.5-Coder-0.5B-Instruct.gguf")) == "Qwen2.5-Coder-0.5B-Instruct"
