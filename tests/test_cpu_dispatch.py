"""The native backend on older x86 CPUs: this machine's Python run under qemu-user emulating a CPU without
AVX (Nehalem) and one with AVX2 but no AVX-512 (Haswell) picks the level that CPU has (no illegal
instruction) and generates the same greedy tokens as the host, over an f16 and a q8_0 KV cache.

The levels do not promise identical bits: quantized activations are byte-identical on every level, but
vec_dot's float sums run in a different order (tests/test_native_kernels_cross.py bounds them per type). On
this model the logits of Nehalem vs the host then agree to ~1e-6 for Q4_0/Q5_0/Q8_0 and the K-quants, but a
1e-6 difference that moves a value across a Q8 rounding step of the next layer's activations shows up as
up to ~0.06 (measured for Q5_1, IQ4_NL and Q6_K weights); a wrong kernel is off by whole units.

The aarch64 side of dispatch (dotprod only where the CPU has it) is checked by the kernel harness under
qemu-aarch64 in test_native_kernels_cross.py and, through the whole runtime, by scripts/aarch64_e2e.sh.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from tiny_models import Spec, random_weights, write_gguf

QEMU = "qemu-x86_64-static"
# every weight type the native kernels handle, spread over the matrices of a 2-layer model
TYPES = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.IQ4_NL]
TYPES += [QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.F16]
PROBE = """
import json, sys
import numpy as np
import edgellm
llm = edgellm.LLM(sys.argv[1], backend="native", n_ctx=64, threads=2)
out = llm.generate("the cat", max_tokens=8, temperature=0)
logits = llm.logits(llm.tokenize("the cat"))
q8 = edgellm.LLM(sys.argv[1], backend="native", n_ctx=64, threads=2, cache_type_k="q8_0", cache_type_v="q8_0")
out8 = q8.generate("the cat", max_tokens=8, temperature=0)
logits8 = q8.logits(q8.tokenize("the cat"))
print(json.dumps({"level": llm.backend.level, "tokens": out.tokens, "logits": np.asarray(logits).tolist(),
                  "tokens_q8": out8.tokens, "logits_q8": np.asarray(logits8).tolist()}))
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    spec = Spec(arch="llama", n_embd=256, n_ff=512)
    w = random_weights(spec)
    matrices = [n for n, a in w.items() if a.ndim == 2]
    qtypes = {n: TYPES[i % len(TYPES)] for i, n in enumerate(matrices)}
    return write_gguf(tmp_path_factory.mktemp("dispatch") / "m.gguf", spec, w, qtypes)


def _probe(model: Path, prefix: list[str], env: dict[str, str] | None = None) -> dict:
    res = subprocess.run(
        [*prefix, sys.executable, "-c", PROBE, str(model)],
        capture_output=True,
        text=True,
        timeout=300,
        env=None if env is None else {**os.environ, **env},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def host(model) -> dict:
    if platform.machine() != "x86_64":
        pytest.skip("x86-64 only")
    from edgellm.backends import native

    if native.available() is not None:
        pytest.skip(f"native backend: {native.available()}")
    return _probe(model, [])


@pytest.mark.parametrize(("cpu", "level"), [("Nehalem", "scalar"), ("Haswell", "avx2")])
def test_an_older_x86_cpu_runs_its_own_level_and_generates_the_same_tokens(model, host, cpu, level):
    if shutil.which(QEMU) is None:
        pytest.skip(f"{QEMU} not installed (apt-get install qemu-user-static)")
    # numpy's OpenBLAS picks its kernels by its own CPU probe, which under qemu-user can see past the
    # emulated CPU (on a Zen 5 host it chose Haswell's AVX2 kernels under -cpu Nehalem and died of SIGILL
    # in numpy's import): name the emulated CPU to it, as OpenBLAS's docs say for a misdetected core.
    got = _probe(model, [QEMU, "-cpu", cpu], env={"OPENBLAS_CORETYPE": cpu})
    assert got["level"] == level
    assert got["tokens"] == host["tokens"]
    np.testing.assert_allclose(got["logits"], host["logits"], rtol=0, atol=0.15)
    assert got["tokens_q8"] == host["tokens_q8"]  # a q8_0 KV cache (-ctk/-ctv q8_0): its loops per level
    np.testing.assert_allclose(got["logits_q8"], host["logits_q8"], rtol=0, atol=0.15)
