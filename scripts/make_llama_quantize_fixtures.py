"""Run llama.cpp's llama-quantize on the real models and write tests/fixtures/quantize/llama_quantize.json.

Usage: python scripts/make_llama_quantize_fixtures.py --bin path/to/llama.cpp/build/bin [--threads 2]
For each model and file type: `llama-quantize --allow-requantize IN OUT TYPE THREADS`, then the output
file's sha256 and each tensor's "TYPE:sha256" (the first 16 hex digits), which tests/test_quantize.py
compares with `edgellm quantize`'s output. The models come from edgellm's cache (`edgellm pull`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from edgellm import store
from edgellm.gguf import ModelFile

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "quantize" / "llama_quantize.json"
# every file type on the small model; on the 0.5B the four and one of each K-quant family
TYPES = {
    "smollm2-135m": ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S",
                     "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "F16", "BF16"),
    "qwen2.5-coder-0.5b": ("Q4_0", "Q8_0", "Q5_1", "Q4_K_M", "Q6_K", "Q3_K_M", "Q2_K", "IQ4_NL"),
}  # fmt: skip


def describe(path: Path) -> dict:
    with ModelFile(path) as m:
        tensors = {
            n: f"{t.type.name}:{hashlib.sha256(t.data).hexdigest()[:16]}" for n, t in m.tensors.items()
        }
    return {"sha256": store.sha256_file(path), "size": path.stat().st_size, "tensors": tensors}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True, type=Path, help="llama.cpp's build/bin (llama-quantize)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--models", default=",".join(TYPES), help="redo these models only, keep the others' entries"
    )
    args = ap.parse_args()
    env = dict(os.environ, LD_LIBRARY_PATH=str(args.bin))
    fixture: dict = json.loads(OUT.read_text()) if OUT.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for alias in args.models.split(","):
            src = store.resolve(alias)
            fixture[alias] = {}
            for t in TYPES[alias]:
                out = Path(tmp) / f"{alias}.{t}.gguf"
                cmd = [
                    str(args.bin / "llama-quantize"),
                    "--allow-requantize",
                    str(src),
                    str(out),
                    t,
                    str(args.threads),
                ]
                t0 = time.perf_counter()
                subprocess.run(cmd, env=env, check=True, capture_output=True)
                seconds = time.perf_counter() - t0
                fixture.setdefault(alias, {})[t] = {
                    **describe(out),
                    "llama_quantize_seconds": round(seconds, 2),
                }
                print(f"{alias} {t}: {seconds:.2f} s")
                out.unlink()
    OUT.write_text(json.dumps(fixture, indent=0, sort_keys=True) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
