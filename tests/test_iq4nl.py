"""edgellm.iq4nl against llama.cpp: the per-row digests of ggml_quantize_chunk(IQ4_NL) in
tests/fixtures/quantize/ggml.json (made by scripts/make_quant_fixtures.py), with and without an imatrix."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import quant_cases
from gguf import GGMLQuantizationType as T

from edgellm.iq4nl import quantize_iq4_nl
from edgellm.quants import dequantize

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "quantize" / "ggml.json").read_text())["IQ4_NL"]


def _digests(q: np.ndarray) -> list[str]:
    return [hashlib.sha256(row.tobytes()).hexdigest()[:16] for row in q]


@pytest.mark.parametrize("case", ["plain", "imatrix"])
def test_iq4_nl_rows_match_ggml_quantize_chunk_bit_exact(case):
    x = quant_cases.weights()
    imatrix = quant_cases.importance() if case == "imatrix" else None
    got = _digests(quantize_iq4_nl(x, imatrix))
    bad = [i for i, (g, w) in enumerate(zip(got, FIXTURE[case])) if g != w]
    assert len(got) == len(FIXTURE[case])
    assert bad == [], f"rows {bad} differ from llama.cpp (see tests/quant_cases.py for what each row is)"


def test_iq4_nl_output_layout_and_round_trip():
    x = quant_cases.weights()
    q = quantize_iq4_nl(x)
    assert q.shape == (x.shape[0], x.shape[1] // 32 * 18) and q.dtype == np.uint8
    y = dequantize(q, T.IQ4_NL, x.shape)
    assert np.all(y[1] == 0)  # the all-zero row stays zero
    err = np.abs(y - x).max(axis=1) / np.maximum(np.abs(x).max(axis=1), 1e-30)
    assert err[0] < 0.1 and err[7] < 0.1


def test_iq4_nl_imatrix_changes_the_choice_and_zero_weights_give_zero_scales():
    x = quant_cases.weights(n_per_row=64)
    plain, weighted = quantize_iq4_nl(x), quantize_iq4_nl(x, quant_cases.importance(64))
    assert not np.array_equal(plain, weighted)
    # all-zero importance: sumq2 is 0 for every candidate, so every block scale is 0 (as in ggml)
    zero = quantize_iq4_nl(x, np.zeros(64, np.float32)).reshape(12, 2, 18)
    assert np.all(zero[:, :, :2] == 0)


@pytest.mark.parametrize("threads", [2, 3, 16])
def test_iq4_nl_does_not_depend_on_threads(threads):
    x = quant_cases.weights(nrows=12, seed=3)
    imatrix = quant_cases.importance()
    assert np.array_equal(quantize_iq4_nl(x, imatrix, threads=threads), quantize_iq4_nl(x, imatrix))


def test_iq4_nl_accepts_non_contiguous_and_float64_input():
    x = quant_cases.weights()
    ref = quantize_iq4_nl(x)
    assert np.array_equal(quantize_iq4_nl(np.asfortranarray(x)), ref)
    assert np.array_equal(quantize_iq4_nl(x.astype(np.float64)), ref)  # exact: float32 values widened


@pytest.mark.parametrize(
    "x, imatrix, message",
    [
        (np.zeros(64, np.float32), None, "2-d"),
        (np.zeros((2, 2, 32), np.float32), None, "2-d"),
        (np.zeros((2, 48), np.float32), None, "multiple of 32"),
        (np.zeros((2, 0), np.float32), None, "multiple of 32"),
        (np.zeros((2, 64), np.float32), np.ones(32, np.float32), "one float32 per column"),
        (np.zeros((2, 64), np.float32), np.ones((2, 64), np.float32), "one float32 per column"),
    ],
)
def test_iq4_nl_rejects_bad_shapes_with_a_clear_error(x, imatrix, message):
    with pytest.raises(ValueError, match=message):
        quantize_iq4_nl(x, imatrix)


def test_iq4_nl_rejects_zero_threads():
    with pytest.raises(ValueError, match="threads"):
        quantize_iq4_nl(np.zeros((1, 32), np.float32), threads=0)


def test_iq4_nl_zero_rows():
    assert quantize_iq4_nl(np.zeros((0, 64), np.float32)).shape == (0, 36)
