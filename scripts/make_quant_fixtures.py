"""Quantize tests/quant_cases.py's inputs with llama.cpp's ggml and write tests/fixtures/quantize/ggml.json.

Usage: python scripts/make_quant_fixtures.py --ggml path/to/libggml-base.so
(libggml-base.so comes with any llama.cpp build, e.g. the llama-cpp-python sdist's vendor/llama.cpp built
with cmake). `ggml_quantize_chunk` is what llama-quantize calls for every tensor, so these digests are
llama-quantize's bytes for the same rows. Each entry holds one sha256 per row (the first 16 hex digits):
a failing test then names the row, and quant_cases.py says which corner case that row is.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import quant_cases  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "quantize" / "ggml.json"


def ggml_quantize(lib: ctypes.CDLL, type_name: str, x: np.ndarray, imatrix: np.ndarray | None) -> np.ndarray:
    t = GGMLQuantizationType[type_name]
    block, type_size = GGML_QUANT_SIZES[t]
    nrows, n_per_row = x.shape
    row_bytes = n_per_row // block * type_size
    out = np.zeros((nrows, row_bytes), dtype=np.uint8)
    x = np.ascontiguousarray(x, dtype=np.float32)
    imat = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32)
    fptr = ctypes.POINTER(ctypes.c_float)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int,
        fptr,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        fptr,
    ]
    n = lib.ggml_quantize_chunk(
        int(t),
        x.ctypes.data_as(fptr),
        out.ctypes.data,
        0,
        nrows,
        n_per_row,
        None if imat is None else imat.ctypes.data_as(fptr),
    )
    assert n == out.size, (type_name, n, out.size)
    return out


def row_digests(q: np.ndarray) -> list[str]:
    return [hashlib.sha256(row.tobytes()).hexdigest()[:16] for row in q]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ggml", required=True, help="path to llama.cpp's libggml-base.so")
    args = ap.parse_args()
    lib = ctypes.CDLL(args.ggml)
    x, imatrix = quant_cases.weights(), quant_cases.importance()
    fixture: dict[str, dict[str, list[str]]] = {}
    for type_name, with_imatrix in quant_cases.CASES:
        q = ggml_quantize(lib, type_name, x, imatrix if with_imatrix else None)
        fixture.setdefault(type_name, {})["imatrix" if with_imatrix else "plain"] = row_digests(q)
    OUT.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(quant_cases.CASES)} cases")


if __name__ == "__main__":
    main()
