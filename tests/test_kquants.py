"""edgellm.kquants.quantize_rows against llama.cpp: each row's bytes equal ggml_quantize_chunk's.

The digests come from tests/fixtures/quantize/ggml.json (scripts/make_quant_fixtures.py runs ggml on
tests/quant_cases.py's rows), so llama.cpp is not needed here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import quant_cases
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from edgellm.kquants import SUPPORTED, quantize_rows

GGML = json.loads((Path(__file__).parent / "fixtures" / "quantize" / "ggml.json").read_text())
# what each row of quant_cases.weights() is, for failure messages
ROWS = {
    1: "all zero",
    2: "constant",
    3: "tiny",
    4: "all positive",
    5: "all negative",
    6: "zero block",
    7: "large",
}
# IQ4_XS is not in quant_cases.TYPES (so not in ggml.json): its digests, made the same way (ggml_quantize
# of scripts/make_quant_fixtures.py with llama.cpp's libggml-base.so, llama-cpp-python 0.3.36's vendor tree)
IQ4_XS = {
    "plain": "f33d0950adbc8966 b2f53f1655f92b74 ddaf6d5a510b8004 af7dfa14ac0cdc00 a4c2db90b2870d26 "
    "91052d81c5bf0b48 afb52aac05a65585 5f1a5be62fc726ef fa37c8058a5307b1 8fd142446a9a9cb2 f16ceec703b18f30 "
    "7c64661d9eedf464",
    "imatrix": "e02de76562b7a240 b2f53f1655f92b74 9dd81d263a2a4f6a 5e678ee065c3e7de ec62a653753a54b5 "
    "70d32bdbd65f839b ab91561c19a2c144 a8544d4cf873ea82 c7b0c6a85d41cc69 7d692f4085a9f6da 7f663376db6c6c5b "
    "abdd97c9c797e9d9",
}
EXPECTED = {(t, k): v for t, d in GGML.items() if t in SUPPORTED for k, v in d.items()}
EXPECTED.update({("IQ4_XS", k): v.split() for k, v in IQ4_XS.items()})
CASES = sorted(EXPECTED)


def _digests(q: np.ndarray) -> list[str]:
    return [hashlib.sha256(row.tobytes()).hexdigest()[:16] for row in q]


def test_every_supported_type_is_pinned_by_ggml_digests():
    assert {t for t, _ in CASES} == SUPPORTED - {"F32"}  # F32 is a plain copy


@pytest.mark.parametrize(("type_name", "kind"), CASES, ids=[f"{t}-{k}" for t, k in CASES])
def test_rows_equal_ggml_quantize_chunk_bytes(type_name, kind):
    x = quant_cases.weights()
    imatrix = quant_cases.importance() if kind == "imatrix" else None
    q = quantize_rows(type_name, x, imatrix)
    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    assert q.dtype == np.uint8 and q.shape == (x.shape[0], x.shape[1] // block * type_size)
    want = EXPECTED[(type_name, kind)]
    bad = [
        f"row {r} ({ROWS.get(r, 'normal')}): {got} != ggml {exp}"
        for r, (got, exp) in enumerate(zip(_digests(q), want, strict=True))
        if got != exp
    ]
    assert not bad, f"{type_name} {kind} differs from ggml: " + "; ".join(bad)


def test_f32_rows_are_copied_unchanged():
    x = quant_cases.weights()
    assert np.array_equal(quantize_rows("F32", x).view(np.float32), x)


@pytest.mark.parametrize("type_name", sorted(SUPPORTED))
def test_results_do_not_depend_on_threads(type_name):
    x = quant_cases.weights(nrows=23, n_per_row=768, seed=3)
    w = quant_cases.importance(n_per_row=768, seed=5)
    for imatrix in (None, w):
        one = quantize_rows(type_name, x, imatrix, threads=1)
        for threads in (2, 5, 64):
            assert np.array_equal(quantize_rows(type_name, x, imatrix, threads=threads), one), threads


def test_a_row_does_not_depend_on_its_neighbours():
    x = quant_cases.weights()
    w = quant_cases.importance()
    for type_name in ("Q4_0", "Q4_K", "Q6_K"):
        whole = quantize_rows(type_name, x, w)
        for r in (0, 6, 11):
            assert np.array_equal(quantize_rows(type_name, x[r : r + 1], w)[0], whole[r])


def test_unknown_type_is_rejected_with_the_supported_list():
    with pytest.raises(ValueError, match="supported: .*Q4_K"):
        quantize_rows("Q7_K", quant_cases.weights())
    with pytest.raises(ValueError, match="Q8_K"):
        quantize_rows("Q8_K", quant_cases.weights())  # an activation type, not a weight type


@pytest.mark.parametrize(
    ("type_name", "n_per_row"), [("Q4_K", 96), ("Q6_K", 320), ("Q4_0", 48), ("IQ4_XS", 32)]
)
def test_row_length_not_a_multiple_of_the_block_is_rejected(type_name, n_per_row):
    with pytest.raises(ValueError, match="multiple of"):
        quantize_rows(type_name, np.zeros((2, n_per_row), np.float32))


@pytest.mark.parametrize(
    "bad", [np.ones(511, np.float32), np.ones(513, np.float32), np.ones((2, 512), np.float32)]
)
def test_imatrix_must_hold_one_value_per_column(bad):
    with pytest.raises(ValueError, match="one value per column"):
        quantize_rows("Q4_K", quant_cases.weights(), bad)


def test_x_must_be_two_dimensional():
    with pytest.raises(ValueError, match="2-D"):
        quantize_rows("Q4_K", np.zeros(512, np.float32))
