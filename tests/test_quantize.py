"""edgellm quantize against llama.cpp: every quantizer's bytes equal ggml's, every file llama-quantize's.

Fixtures: tests/fixtures/quantize/ggml.json (scripts/make_quant_fixtures.py: ggml_quantize_chunk on
tests/quant_cases.py's rows) and llama_quantize.json (scripts/make_llama_quantize_fixtures.py: the
files `llama-quantize --allow-requantize` writes from the real models, with each tensor's digest).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import quant_cases
from gguf import GGMLQuantizationType as T

from edgellm import quant_rules as rules
from edgellm import quantize as q
from edgellm import store
from edgellm.gguf import ModelFile

FIXTURES = Path(__file__).parent / "fixtures" / "quantize"
GGML = json.loads((FIXTURES / "ggml.json").read_text())
LLAMA_QUANTIZE = json.loads((FIXTURES / "llama_quantize.json").read_text())


def _row_digests(b: np.ndarray) -> list[str]:
    return [hashlib.sha256(r.tobytes()).hexdigest()[:16] for r in b]


@pytest.mark.parametrize(("type_name", "with_imatrix"), quant_cases.CASES)
def test_quantizer_bytes_equal_ggml_quantize_chunk(type_name, with_imatrix):
    x, w = quant_cases.weights(), quant_cases.importance()
    got = _row_digests(q.quantize_rows(T[type_name], x, w if with_imatrix else None, threads=2))
    want = GGML[type_name]["imatrix" if with_imatrix else "plain"]
    bad = [i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b]
    assert not bad, f"{type_name} rows {bad} differ from ggml (tests/quant_cases.py says what each row is)"


def _assert_same_file_as_llama_quantize(out: Path, alias: str, file_type: str) -> None:
    want = LLAMA_QUANTIZE[alias][file_type]
    if store.sha256_file(out) == want["sha256"]:
        return
    with ModelFile(out) as m:  # say which tensors differ
        got = {n: f"{t.type.name}:{hashlib.sha256(t.data).hexdigest()[:16]}" for n, t in m.tensors.items()}
    bad = [n for n in want["tensors"] if got.get(n) != want["tensors"][n]]
    assert not bad, f"tensors differ from llama-quantize's: {bad[:8]} (of {len(bad)})"
    pytest.fail("every tensor equals llama-quantize's, the file does not (metadata or layout)")


# IQ4_NL's search is slow in llama.cpp too (20 s for this model on 2 threads): its rows are in ggml.json
SMOLLM2_TYPES = [
    *("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M"),
    *("Q5_K_S", "Q5_K_M", "Q6_K", "F16", "BF16"),
    pytest.param("IQ4_NL", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("file_type", SMOLLM2_TYPES)
def test_smollm2_file_equals_llama_quantize(smollm2_path, tmp_path, file_type):
    out = tmp_path / "out.gguf"
    q.quantize_model(smollm2_path, out, file_type, allow_requantize=True, threads=2)
    _assert_same_file_as_llama_quantize(out, "smollm2-135m", file_type)


@pytest.mark.parametrize(
    "file_type",
    [
        pytest.param(t, marks=pytest.mark.slow)
        for t in ("Q4_0", "Q8_0", "Q5_1", "Q6_K", "Q3_K_M", "Q2_K", "IQ4_NL")
    ]
    + ["Q4_K_M"],
)
def test_qwen_coder_file_equals_llama_quantize(qwen_coder_path, tmp_path, file_type):
    out = tmp_path / "out.gguf"
    q.quantize_model(qwen_coder_path, out, file_type, allow_requantize=True, threads=2)
    _assert_same_file_as_llama_quantize(out, "qwen2.5-coder-0.5b", file_type)


def test_quantized_file_loads_and_generates(smollm2_path, tmp_path):
    from edgellm.llm import LLM

    out = tmp_path / "q8.gguf"
    q.quantize_model(smollm2_path, out, "Q8_0", allow_requantize=True, threads=2)
    llm = LLM(str(out))
    text = llm.generate("The capital of France is", max_tokens=6, temperature=0).text
    assert "Paris" in text


# ---- refusals: each one before anything is written


def test_requantizing_needs_allow_requantize(smollm2_path, tmp_path):
    with pytest.raises(q.QuantizeError, match="already Q4_1: requantizing is disabled"):
        q.quantize_model(smollm2_path, tmp_path / "out.gguf", "Q4_0")
    assert list(tmp_path.iterdir()) == []


def test_unknown_file_type_is_refused_by_name(smollm2_path, tmp_path):
    with pytest.raises(q.QuantizeError, match="unknown file type 'IQ2_XXS'.*Q4_K_M"):
        q.quantize_model(smollm2_path, tmp_path / "out.gguf", "IQ2_XXS", allow_requantize=True)


def test_output_may_not_be_the_input(smollm2_path, tmp_path):
    src = tmp_path / "m.gguf"
    os.symlink(smollm2_path, src)
    with pytest.raises(q.QuantizeError, match="output file is the input"):
        q.quantize_model(src, src, "Q8_0", allow_requantize=True)


def test_too_little_disk_space_is_refused_with_the_numbers(smollm2_path, tmp_path, monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 2**20, 2**20))
    with pytest.raises(
        q.QuantizeError, match=r"not enough disk space .* needs 1\d\d\.\d MiB, 1\.0 MiB are free"
    ):
        q.quantize_model(smollm2_path, tmp_path / "out.gguf", "Q8_0", allow_requantize=True)
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_run_leaves_no_file(smollm2_path, tmp_path, monkeypatch):
    calls = []
    real = q.quantize_rows

    def interrupt_on_the_third(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(q, "quantize_rows", interrupt_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        q.quantize_model(smollm2_path, tmp_path / "out.gguf", "Q8_0", allow_requantize=True)
    assert list(tmp_path.iterdir()) == []


def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path):
    import gguf

    w = gguf.GGUFWriter(tmp_path / "nan.gguf", "llama")
    w.add_block_count(1)
    x = np.ones((4, 64), np.float32)
    x[2, 5] = np.nan
    w.add_tensor("blk.0.ffn_up.weight", x)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file()
    w.close()
    with pytest.raises(q.QuantizeError, match=r"blk\.0\.ffn_up\.weight holds NaN"):
        q.quantize_model(tmp_path / "nan.gguf", tmp_path / "out.gguf", "Q8_0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nan.gguf"]


def test_imatrix_of_the_wrong_length_is_refused(smollm2_path, tmp_path):
    bad = {"blk.0.ffn_down.weight": np.ones(100, np.float32)}
    with pytest.raises(
        q.QuantizeError, match="imatrix has 100 values for tensor blk.0.ffn_down.weight, which needs 1536"
    ):
        q.quantize_model(smollm2_path, tmp_path / "out.gguf", "Q4_K_M", allow_requantize=True, imatrix=bad)


# ---- the per-tensor rules on a model shape no fixture has (llama-quant.cpp, read by hand)


def _plan(names_shapes, file_type, **shape):
    model = rules.ModelShape(**{"arch": "llama", "n_layer": 8, "n_head": 32, "n_head_kv": 8, **shape})
    tensors = [(n, ne, T.F16) for n, ne in sorted(names_shapes, key=lambda x: rules.tensor_order_key(x[0]))]
    return rules.plan_types(tensors, rules.FILE_TYPES[file_type], model, rules.Options())


def test_q4_k_m_gives_attn_v_and_ffn_down_six_bits_in_the_use_more_bits_layers():
    layers = [
        (f"blk.{i}.{k}.weight", (4096, 4096)) for i in range(8) for k in ("attn_v", "ffn_down", "attn_q")
    ]
    types, fallbacks = _plan(
        layers + [("output.weight", (4096, 32000)), ("token_embd.weight", (4096, 32000))], "Q4_K_M"
    )
    # use_more_bits(i, 8): i < 1, i >= 7, or (i - 1) % 3 == 2 -> layers 0, 3, 6, 7
    for i in range(8):
        six = i in (0, 3, 6, 7)
        assert types[f"blk.{i}.attn_v.weight"] == (T.Q6_K if six else T.Q4_K)
        assert types[f"blk.{i}.ffn_down.weight"] == (T.Q6_K if six else T.Q4_K)
        assert types[f"blk.{i}.attn_q.weight"] == T.Q4_K
    assert types["output.weight"] == T.Q6_K and types["token_embd.weight"] == T.Q4_K
    assert fallbacks == []


def test_rows_a_block_does_not_divide_fall_back_to_a_smaller_block_then_f16():
    types, fallbacks = _plan(
        [("blk.0.ffn_up.weight", (576, 64)), ("blk.0.ffn_gate.weight", (100, 64))], "Q6_K"
    )
    assert types == {"blk.0.ffn_gate.weight": T.F16, "blk.0.ffn_up.weight": T.Q8_0}
    assert sorted(fallbacks) == ["blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"]


def test_norms_biases_and_vectors_are_never_quantized():
    names = [
        ("blk.0.attn_norm.weight", (4096,)),
        ("blk.0.attn_q.bias", (4096,)),
        ("blk.0.ffn_norm.weight", (4096, 2)),
    ]
    types, _ = _plan(names, "Q4_0")
    assert set(types.values()) == {T.F16}


@pytest.mark.parametrize("file_type", ["Q4_0", "Q4_K_M", pytest.param("IQ4_NL", marks=pytest.mark.slow)])
@pytest.mark.parametrize("imatrix_file", ["smollm2.imatrix.gguf", "smollm2.imatrix.dat"])
def test_imatrix_weighted_file_equals_llama_quantize(smollm2_path, tmp_path, file_type, imatrix_file):
    """llama-imatrix's file (both formats), given to llama-quantize --imatrix and to edgellm: same tensors."""
    from edgellm.imatrix import load_imatrix

    out = tmp_path / "out.gguf"
    weights = load_imatrix(FIXTURES / imatrix_file).entries
    q.quantize_model(smollm2_path, out, file_type, allow_requantize=True, imatrix=weights, threads=2)
    want = json.loads((FIXTURES / f"smollm2_imatrix_{file_type}.json").read_text())
    with ModelFile(out) as m:
        got = {
            n: {"type": t.type.name, "sha256": hashlib.sha256(t.data).hexdigest()}
            for n, t in m.tensors.items()
        }
    bad = [n for n in want if got.get(n) != want[n]]
    assert not bad, f"tensors differ from llama-quantize --imatrix's: {bad[:8]} (of {len(bad)})"


def test_without_the_c_extension_numpy_dequantizes_to_the_same_file(smollm2_path, tmp_path, monkeypatch):
    """Where no C compiler built edgellm._native, quants.dequantize reads the input: the same bits."""
    monkeypatch.setattr(q, "_native", None)
    out = tmp_path / "out.gguf"
    q.quantize_model(smollm2_path, out, "Q4_K_M", allow_requantize=True, threads=2)
    _assert_same_file_as_llama_quantize(out, "smollm2-135m", "Q4_K_M")


def test_cli_quantize_writes_llama_quantizes_file_and_refuses_by_name(smollm2_path, tmp_path, capsys):
    from edgellm.cli import main

    out = tmp_path / "q4_0.gguf"
    assert main(["quantize", str(smollm2_path), str(out), "Q4_0", "2", "--allow-requantize"]) == 0
    _assert_same_file_as_llama_quantize(out, "smollm2-135m", "Q4_0")
    assert main(["quantize", str(smollm2_path), str(tmp_path / "x.gguf"), "Q4_0"]) == 1
    assert "requantizing is disabled (pass --allow-requantize" in capsys.readouterr().err
    assert (
        main(["quantize", str(smollm2_path), str(tmp_path / "x.gguf"), "Q4_0", "--output-tensor-type", "Q7"])
        == 2
    )
    assert "unknown tensor type 'Q7'" in capsys.readouterr().err
    assert main(["quantize", str(smollm2_path), str(tmp_path / "x.gguf"), "Q4_K_M", "--dry-run"]) == 0
    listing = capsys.readouterr().out
    assert "blk.0.attn_v.weight" in listing and "-> Q8_0" in listing and "-> Q6_K" in listing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q4_0.gguf"]
