"""Bad model metadata is refused at load, before any weight is bound, with one line naming the key:
through edgellm.arch.load_model, edgellm.LLM and `edgellm info`, on tiny GGUF files (tests/tiny_models.py)
whose metadata is overridden one key at a time."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from gguf import GGUFValueType as VT
from tiny_models import N_VOCAB, Spec, random_weights, write_gguf

from edgellm import LLM
from edgellm.arch import load_model, model_class
from edgellm.arch.llama import ConfigError
from edgellm.backends import get_backend
from edgellm.cli import main
from edgellm.gguf import ModelFile


def _gemma3_spec() -> Spec:
    extra = {}
    for i in range(2):
        extra[f"blk.{i}.post_attention_norm.weight"] = np.ones(64, np.float32)
        extra[f"blk.{i}.post_ffw_norm.weight"] = np.ones(64, np.float32)
    return Spec(arch="gemma3", key_length=32, qk_norm=True, tied=True, sliding_window=8, extra=extra)


SPECS = {
    "llama": lambda: Spec(arch="llama"),
    "mistral": lambda: Spec(arch="mistral"),
    "qwen2": lambda: Spec(arch="qwen2", qkv_bias=True),
    "qwen3": lambda: Spec(arch="qwen3", key_length=32, qk_norm=True, tied=True),
    "phi3": lambda: Spec(arch="phi3", fused_qkv=True, fused_gate_up=True, n_rot=12),
    "gemma3": _gemma3_spec,
}


def build(tmp_path, arch: str = "llama", metadata: dict | None = None, name: str = "m.gguf"):
    spec = SPECS[arch]()
    return write_gguf(tmp_path / name, spec, random_weights(spec), metadata=metadata)


EPS = "{a}.attention.layer_norm_rms_epsilon"  # "{a}" stands for the architecture name
T = "tokenizer.ggml."
# (case id, {key: value to write, None to drop it}, key named in the error, words in the error)
BAD = [
    ("head_count-zero", {"{a}.attention.head_count": 0}, "{a}.attention.head_count", "must be positive"),
    ("head_count-negative", {"{a}.attention.head_count": -4}, "{a}.attention.head_count", "positive"),
    ("head_count_kv-zero", {"{a}.attention.head_count_kv": 0}, "{a}.attention.head_count_kv", "positive"),
    ("head_count_kv-not-dividing", {"{a}.attention.head_count_kv": 3}, "{a}.attention.head_count_kv",
     "does not divide"),
    ("embedding-not-divisible-by-heads", {"{a}.attention.head_count": 6}, "{a}.attention.head_count",
     "does not divide {a}.embedding_length = 64"),
    ("key_length-zero", {"{a}.attention.key_length": 0}, "{a}.attention.key_length", "positive"),
    ("value_length-differs", {"{a}.attention.value_length": 8}, "{a}.attention.value_length", "differs"),
    ("feed_forward_length-zero", {"{a}.feed_forward_length": 0}, "{a}.feed_forward_length", "positive"),
    ("embedding_length-zero", {"{a}.embedding_length": 0}, "{a}.embedding_length", "positive"),
    ("embedding_length-negative", {"{a}.embedding_length": -64}, "{a}.embedding_length", "positive"),
    ("block_count-zero", {"{a}.block_count": 0}, "{a}.block_count", "positive"),
    ("block_count-beyond-tensors", {"{a}.block_count": 3}, "{a}.block_count",
     "no blk.2.* tensors (the file has blocks 0..1)"),
    ("block_count-absent", {"{a}.block_count": None}, "{a}.block_count", "missing metadata key"),
    ("context_length-zero", {"{a}.context_length": 0}, "{a}.context_length", "positive"),
    ("rms_eps-zero", {EPS: 0.0}, EPS, "positive"),
    ("rms_eps-negative", {EPS: -1e-5}, EPS, "positive"),
    ("rms_eps-nan", {EPS: math.nan}, EPS, "finite"),
    ("rms_eps-inf", {EPS: math.inf}, EPS, "finite"),
    ("freq_base-zero", {"{a}.rope.freq_base": 0.0}, "{a}.rope.freq_base", "positive"),
    ("freq_base-nan", {"{a}.rope.freq_base": math.nan}, "{a}.rope.freq_base", "finite"),
    ("freq_base-inf", {"{a}.rope.freq_base": math.inf}, "{a}.rope.freq_base", "finite"),
    ("rope_dims-odd", {"{a}.rope.dimension_count": 15}, "{a}.rope.dimension_count", "even"),
    ("rope_dims-zero", {"{a}.rope.dimension_count": 0}, "{a}.rope.dimension_count", "positive"),
    ("rope_dims-beyond-head", {"{a}.rope.dimension_count": 64}, "{a}.rope.dimension_count",
     "exceeds the head width 16"),
    ("rope_scaling-unknown", {"{a}.rope.scaling.type": "yarn"}, "{a}.rope.scaling.type", "not supported"),
    ("rope_scaling-factor-zero", {"{a}.rope.scaling.type": "linear", "{a}.rope.scaling.factor": 0.0},
     "{a}.rope.scaling.factor", "positive"),
    ("vocab_size-below-token-list", {"{a}.vocab_size": 100}, "{a}.vocab_size", f"the {N_VOCAB} tokens"),
    # a numeric key of the wrong type: named, not a TypeError/ValueError from int()
    ("block_count-string", {"{a}.block_count": "two"}, "{a}.block_count",
     "expected an integer, got type string"),
    ("embedding_length-float", {"{a}.embedding_length": 64.0}, "{a}.embedding_length", "got type float32"),
    ("head_count-bool", {"{a}.attention.head_count": True}, "{a}.attention.head_count", "got type bool"),
    ("head_count-array", {"{a}.attention.head_count": [4, 4]}, "{a}.attention.head_count",
     "got type array of int32"),
    ("rms_eps-string", {EPS: "1e-5"}, EPS, "expected a number, got type string"),
    # special token ids outside the vocabulary
    ("bos-out-of-vocab", {T + "bos_token_id": N_VOCAB}, T + "bos_token_id",
     f"outside the vocabulary of {N_VOCAB} tokens"),
    ("eos-out-of-vocab", {T + "eos_token_id": 100_000}, T + "eos_token_id", "outside the vocabulary"),
    ("eos-negative", {T + "eos_token_id": -1}, T + "eos_token_id", "outside the vocabulary"),
    ("pad-out-of-vocab", {T + "padding_token_id": 300}, T + "padding_token_id", "outside the vocabulary"),
    ("unk-out-of-vocab", {T + "unknown_token_id": 999}, T + "unknown_token_id", "outside the vocabulary"),
    ("eot-out-of-vocab", {T + "eot_token_id": 5000}, T + "eot_token_id", "outside the vocabulary"),
    ("fim-out-of-vocab", {T + "prefix_token_id": 5000}, T + "prefix_token_id", "outside the vocabulary"),
    ("eos-string", {T + "eos_token_id": "2"}, T + "eos_token_id", "expected an integer"),
    # token arrays of the wrong element type (checked on the array's type, no string parsed)
    ("scores-strings", {T + "scores": ["x"] * N_VOCAB}, T + "scores", "expected an array of floats"),
    ("scores-short", {T + "scores": [0.0] * 10}, T + "scores", f"fewer entries than the {N_VOCAB} tokens"),
    ("token_type-floats", {T + "token_type": [1.0] * N_VOCAB}, T + "token_type",
     "expected an array of integers"),
    ("token_type-short", {T + "token_type": [1] * 10}, T + "token_type", "fewer entries"),
    ("tokens-ints", {T + "tokens": [1] * N_VOCAB}, T + "tokens", "expected an array of strings"),
    ("tokens-string", {T + "tokens": "abc"}, T + "tokens", "expected an array of strings"),
    ("merges-ints", {T + "merges": [1, 2]}, T + "merges", "expected an array of strings"),
]  # fmt: skip


def _resolve(d: dict, arch: str) -> dict:
    return {k.replace("{a}", arch): v for k, v in d.items()}


def _check_message(msg: str, path, key: str, words: str) -> None:
    assert "\n" not in msg, msg
    assert key in msg and words in msg, msg
    if "missing metadata key" not in msg:
        assert msg.startswith(f"{path}: {key} = "), msg  # "<path>: <key> = <value>: <what is wrong>"


@pytest.mark.parametrize("case, metadata, key, words", BAD, ids=[c[0] for c in BAD])
def test_bad_llama_metadata_is_one_config_error_naming_the_key_everywhere(
    tmp_path, capsys, case, metadata, key, words
):
    key, words = key.replace("{a}", "llama"), words.replace("{a}", "llama")
    path = build(tmp_path, "llama", _resolve(metadata, "llama"))

    with pytest.raises(ConfigError) as e:
        load_model(ModelFile(path), get_backend("reference"))
    _check_message(str(e.value), path, key, words)

    with pytest.raises(ConfigError) as e:
        LLM(path, backend="reference")
    _check_message(str(e.value), path, key, words)

    rc = main(["info", str(path)])
    out, err = capsys.readouterr()
    assert rc == 1 and "architecture    llama" in out  # the summary still shows what the file says
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    _check_message(lines[0].removeprefix("error: "), path, key, words)

    rc = main(["info", str(path), "--json"])
    out, err = capsys.readouterr()
    assert rc == 1
    s = json.loads(out)
    assert s["architecture"] == "llama"
    _check_message(s["error"], path, key, words)


# a few of the checks on every architecture: each reads its config through the same helpers
PER_ARCH = [
    ("head_count-zero", {"{a}.attention.head_count": 0}, "{a}.attention.head_count"),
    ("head_count_kv-not-dividing", {"{a}.attention.head_count_kv": 3}, "{a}.attention.head_count_kv"),
    ("block_count-beyond-tensors", {"{a}.block_count": 5}, "{a}.block_count"),
    ("block_count-string", {"{a}.block_count": "2"}, "{a}.block_count"),
    ("ff-zero", {"{a}.feed_forward_length": 0}, "{a}.feed_forward_length"),
    ("ctx-negative", {"{a}.context_length": -1}, "{a}.context_length"),
    ("rms_eps-nan", {EPS: math.nan}, EPS),
    ("freq_base-negative", {"{a}.rope.freq_base": -1.0}, "{a}.rope.freq_base"),
    ("rope_dims-odd", {"{a}.rope.dimension_count": 7}, "{a}.rope.dimension_count"),
    ("eos-out-of-vocab", {T + "eos_token_id": N_VOCAB + 1}, T + "eos_token_id"),
    ("scores-strings", {T + "scores": ["x"] * N_VOCAB}, T + "scores"),
]


@pytest.mark.parametrize("arch", sorted(SPECS))
def test_every_architecture_refuses_bad_metadata_naming_the_key(tmp_path, capsys, arch):
    for i, (case, metadata, key) in enumerate(PER_ARCH):
        key = key.replace("{a}", arch)
        path = build(tmp_path, arch, _resolve(metadata, arch), name=f"{i}.gguf")
        with pytest.raises(ConfigError) as e:
            load_model(ModelFile(path), get_backend("reference"))
        _check_message(str(e.value), path, key, "")
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            LLM(path, backend="reference")
        assert main(["info", str(path)]) == 1, case
        assert key in capsys.readouterr().err, case


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_whole_head_rope_archs_name_the_rope_key_for_a_partial_rotation(tmp_path, arch):
    path = build(tmp_path, arch, {f"{arch}.rope.dimension_count": 8})
    with pytest.raises(
        ConfigError, match=rf"{arch}\.rope\.dimension_count = 8: {arch} rotates the whole head"
    ):
        load_model(ModelFile(path), get_backend("reference"))


def test_gemma3_negative_window_and_softcap_are_config_errors(tmp_path):
    path = build(tmp_path, "gemma3", {"gemma3.attention.sliding_window": -8}, name="w.gguf")
    with pytest.raises(ConfigError, match=r"gemma3\.attention\.sliding_window = -8: must be at least 0"):
        load_model(ModelFile(path), get_backend("reference"))
    path = build(tmp_path, "gemma3", {"gemma3.final_logit_softcapping": -30.0}, name="s.gguf")
    with pytest.raises(ConfigError, match=r"gemma3\.final_logit_softcapping = -30\.0: must not be negative"):
        load_model(ModelFile(path), get_backend("reference"))


def test_an_explicit_metadata_type_is_checked_too(tmp_path):
    # uint64 is an integer like any other; a float64 where an integer belongs is not
    ok = build(tmp_path, "llama", {"llama.block_count": (2, VT.UINT64)}, name="ok.gguf")
    assert load_model(ModelFile(ok), get_backend("reference")).config.n_layer == 2
    bad = build(tmp_path, "llama", {"llama.block_count": (2.0, VT.FLOAT64)}, name="bad.gguf")
    with pytest.raises(
        ConfigError, match=r"llama\.block_count = 2\.0: expected an integer, got type float64"
    ):
        load_model(ModelFile(bad), get_backend("reference"))


@pytest.mark.parametrize("arch", sorted(SPECS))
def test_config_is_read_from_metadata_and_tensor_names_only(tmp_path, arch):
    mf = ModelFile(build(tmp_path, arch))
    mf.tensors = dict.fromkeys(mf.tensors)  # names without data: touching a tensor would raise
    cfg = model_class(arch).config_from_gguf(mf)
    assert cfg.n_layer == 2 and cfg.n_vocab == N_VOCAB


@pytest.mark.parametrize("arch", sorted(SPECS))
def test_a_good_tiny_file_still_loads_and_info_succeeds(tmp_path, capsys, arch):
    path = build(tmp_path, arch)
    model = load_model(ModelFile(path), get_backend("reference"))
    assert model.config.n_layer == 2 and model.config.n_vocab == N_VOCAB
    llm = LLM(path, backend="reference")
    assert llm.logits(llm.tokenize("the")).shape[-1] == N_VOCAB
    assert main(["info", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and f"architecture    {arch}" in out
    assert main(["info", str(path), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert "error" not in s and s["layers"] == 2 and s["vocab_size"] == N_VOCAB


def test_info_still_describes_an_unsupported_architecture(tmp_path, capsys):
    path = write_gguf(
        tmp_path / "m.gguf", Spec(arch="mamba"), {"output_norm.weight": np.ones(64, np.float32)}
    )
    assert main(["info", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "architecture    mamba" in out and err == ""


def test_info_reports_a_tokenizer_that_run_would_refuse(tmp_path, capsys):
    path = build(tmp_path, "llama", {"tokenizer.ggml.model": "t5"})
    assert main(["info", str(path)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: unsupported tokenizer.ggml.model='t5'")
