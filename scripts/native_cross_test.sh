#!/usr/bin/env bash
# Check the C kernels (native/kernels/) on every code path this machine runs or emulates, outside pytest:
# the host build (scalar, AVX2, AVX-512 where present), AVX-512 on SIMDe, aarch64 NEON under qemu with and
# without sdot. Cases come from tests/test_native_kernels_cross.py (random rows + real-model rows when
# cached). `--bench` also prints single-thread ns per vec_dot / from_float for one row of each type
# (576 elements, 1024 for K-quants) at each host level.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${TMPDIR:-/tmp}/edgellm-kernels"
mkdir -p "$out"
bench=0
[[ "${1:-}" == "--bench" ]] && bench=1

python - "$out" <<'EOF'
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T

sys.path.insert(0, "tests")
import test_native_kernels_cross as k  # noqa: E402
from edgellm import store  # noqa: E402

out = Path(sys.argv[1])
specs = [store.spec_for(a) for a in ("smollm2-135m", "gemma3-270m")]
paths = [store.cached_path(s) for s in specs if store.is_cached(s)]
k.write_case_file(out / "cases.bin", k.random_cases() + k.model_cases(paths))
rng = np.random.default_rng(5)
rows = [(t, 1024 if t in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K) else 576) for t in k.RANDOM_SHAPES]
bench = [k.Case(f"{t.name}/n={n}", t, rng.standard_normal(n).astype(np.float32), k._random_weight(rng, t, n))
         for t, n in rows]
k.write_case_file(out / "bench.bin", bench)
EOF

srcs=(native/tests/kernel_check.c native/kernels/*.c)
flags=(-O3 -std=c11 -Wall -Wextra)
cc "${flags[@]}" -o "$out/kernel_check" "${srcs[@]}" -lm
"$out/kernel_check" "$out/cases.bin"
if [[ -f /usr/include/simde/x86/avx512.h && "$(uname -m)" == x86_64 ]]; then
    cc "${flags[@]}" -Wno-psabi -DED_EMULATE_AVX512 -o "$out/kernel_check_emu" "${srcs[@]}" -lm
    for vnni in 1 0; do ED_EMULATE_VNNI=$vnni "$out/kernel_check_emu" "$out/cases.bin" --level avx512; done
fi
if command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64-static >/dev/null; then
    aarch64-linux-gnu-gcc "${flags[@]}" -march=armv8-a -static -o "$out/kernel_check_a64" "${srcs[@]}" -lm
    for cpu in max cortex-a53; do
        qemu-aarch64-static -cpu "$cpu" -L /usr/aarch64-linux-gnu "$out/kernel_check_a64" "$out/cases.bin"
    done
fi
if ((bench)); then
    "$out/kernel_check" "$out/bench.bin" --bench | grep -E '^bench'
fi
