"""Make tests/fixtures/quantize/'s importance-matrix fixtures with llama.cpp's own tools.

Usage: python scripts/make_imatrix_fixtures.py --bin path/to/llama.cpp/build/bin [--model M] [--digests-only]
(`cmake --build build --target llama-imatrix llama-quantize` in any llama.cpp checkout, e.g. the
llama-cpp-python sdist's vendor/llama.cpp). Writes
  smollm2.imatrix.gguf, smollm2.imatrix.dat: llama-imatrix on SmolLM2-135M-Instruct.Q4_1 over two 64-token
      chunks of tests/fixtures/text/licenses.txt, in its GGUF and its legacy (--output-format dat) format;
  smollm2_imatrix_<T>.json for T in Q4_K_M, Q4_0, IQ4_NL: every tensor of
      `llama-quantize --allow-requantize --imatrix smollm2.imatrix.gguf <model> out.gguf T 2`
      as {name: {"type": ggml type name, "sha256": sha256 of its bytes}}, read back with gguf-py.
The activations (hence the imatrix) depend on the CPU's SIMD paths, so --digests-only keeps the committed
imatrix files and recomputes only the digests from them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from gguf import GGUFReader

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "quantize"
TEXT = "tests/fixtures/text/licenses.txt"  # relative: llama-imatrix records it as the dataset name
MODEL = Path.home() / ".cache" / "edgellm" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TYPES = ["Q4_K_M", "Q4_0", "IQ4_NL"]


def run(cmd: list[str], bin_dir: Path) -> None:
    env = dict(os.environ, LD_LIBRARY_PATH=str(bin_dir))
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")


def make_imatrix(bin_dir: Path, model: Path, tmp: Path) -> None:
    base = [str(bin_dir / "llama-imatrix"), "-m", str(model), "-f", TEXT, "-c", "64", "--chunks", "2"]
    # -o x.dat alone still writes GGUF (only warning about the suffix): the legacy format needs the flag
    for fmt in ("gguf", "dat"):
        out = tmp / f"smollm2.imatrix.{fmt}"
        run([*base, "-t", "2", "-o", str(out), "--output-format", fmt], bin_dir)
        shutil.copyfile(out, OUT / out.name)
        print(f"wrote {(OUT / out.name).relative_to(ROOT)}: {out.stat().st_size} bytes")


def tensor_digests(path: Path) -> dict[str, dict[str, str]]:
    return {
        t.name: {"type": t.tensor_type.name, "sha256": hashlib.sha256(t.data.tobytes()).hexdigest()}
        for t in GGUFReader(path).tensors
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--bin", required=True, type=Path, help="llama.cpp build/bin (llama-imatrix, llama-quantize)"
    )
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--digests-only", action="store_true", help="keep the committed imatrix files")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if not args.digests_only:
            make_imatrix(args.bin, args.model, tmp)
        imatrix = OUT / "smollm2.imatrix.gguf"
        for t in TYPES:
            out = tmp / f"out-{t}.gguf"
            quantize = [str(args.bin / "llama-quantize"), "--allow-requantize", "--imatrix", str(imatrix)]
            run([*quantize, str(args.model), str(out), t, "2"], args.bin)
            target = OUT / f"smollm2_imatrix_{t}.json"
            digests = tensor_digests(out)
            target.write_text(json.dumps(digests, indent=1, sort_keys=False) + "\n")
            print(f"wrote {target.relative_to(ROOT)}: {len(digests)} tensors")


if __name__ == "__main__":
    main()
