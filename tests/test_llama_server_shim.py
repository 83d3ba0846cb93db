"""scripts/llama_server_shim.py: llama-server's flags, as llama.cpp's server tests pass them, become
`edgellm serve`'s."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _shim():
    spec = importlib.util.spec_from_file_location("llama_server_shim", ROOT / "scripts/llama_server_shim.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_flags_are_translated_and_the_context_is_split_between_slots():
    shim = _shim()
    argv = ["--port", "8080", "--temp", "0.8", "--seed", "42", "--ctx-size", "512", "--parallel", "2",
            "--n-predict", "64", "-fa", "on", "--jinja", "--hf-repo", "ggml-org/models"]  # fmt: skip
    args, dropped, given = shim.translate(argv)
    assert args == ["--port", "8080", "--temp", "0.8", "--seed", "42", "-c", "256", "--parallel", "2",
                    "-n", "64"]  # fmt: skip
    assert dropped == ["-fa on", "--jinja"] and given == {"--hf-repo": "ggml-org/models"}
    unified, _, _ = shim.translate(["--ctx-size", "256", "--parallel", "4", "--kv-unified"])
    assert unified == ["-c", "256", "--parallel", "4", "--kv-budget", "256"]  # each slot may use all of it
