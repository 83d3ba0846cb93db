#!/usr/bin/env bash
# The cuda backend on a real NVIDIA GPU, in one command that needs no network (issue: CUDA backend): the
# contract and cuda tests on the device (EDGELLM_CUDA_DEVICE=1 keeps numba-cuda's simulator off), greedy
# tokens against the native backend for SmolLM2 and gemma3, and `edgellm bench --backend cuda` for every
# model found, decode tok/s next to the card's memory bandwidth (PEAK_BPS: the H100's or H200's). Ends in
# < 8 min on an H200. That machine has numba, numba-cuda, cuda-bindings, cupy and nvcc; beside the tree it
# needs (scripts/device/README.md says how to stage them):
#   .whl/*.whl  gguf, typer, jinja2 and anything else its pip lacks, installed with --no-index
#   .models/    GGUFs under the names `edgellm pull` gives them, or pieces of them (see the README)
# Results go to $OUT (or /tmp/cuda_check): cuda_check.log and one bench JSON per model.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/cuda_check}"
mkdir -p "$OUT"
exec > >(tee "$OUT/cuda_check.log") 2>&1
say() { printf '\n== %s\n' "$*"; }

say "Python packages"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "carried wheels failed to install"; exit 2; }
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 EDGELLM_OFFLINE=1 EDGELLM_CUDA_DEVICE=1 NUMBA_ENABLE_CUDASIM=0
# the native backend (the greedy comparison) builds its extension in place: a few seconds with gcc
python3 native/build_native.py >/dev/null 2>&1 || echo "native build failed: greedy comparison skipped"
python3 - <<'PY' || exit 2
from edgellm.backends import get_backend
b = get_backend("cuda")
print(f"cuda: {b.device_name}, {b.free_memory() / 2**30:.1f} GiB free")
PY
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv 2>/dev/null || true

say "models"
models=/tmp/cuda_home/models  # EDGELLM_HOME's cache: the tests find the models there
mkdir -p $models /tmp/gpu_pieces
for f in .models/*.gguf; do [ -f "$f" ] && ln -sf "$PWD/$f" $models/; done
cp .models/*.part-* .models/*.parts /tmp/gpu_pieces/ 2>/dev/null
for count in /tmp/gpu_pieces/*.parts; do
    [ -f "$count" ] || continue
    name=$(basename "$count" .parts)
    have=$(ls /tmp/gpu_pieces/"$name".part-* 2>/dev/null | wc -l)
    if [ "$have" -eq "$(cat "$count")" ]; then
        [ -f "$models/$name" ] || cat /tmp/gpu_pieces/"$name".part-* > "$models/$name"
    else
        echo "$name: $have of $(cat "$count") pieces so far"
    fi
done
ls -la $models
export EDGELLM_HOME=/tmp/cuda_home

if [ "${CHECK_TESTS:-1}" = 1 ]; then  # CHECK_TESTS=0: models only (a second call, once a model has arrived)
    say "contract and cuda tests on the device"
    timeout 200 python3 -m pytest -q -x -p no:cacheprovider -k cuda tests/test_backend_contract.py tests/test_cuda_backend.py tests/test_cuda_blocks.py
fi

say "greedy tokens: cuda against native (to the first near-tie)"
for m in $models/SmolLM2*.gguf $models/gemma-3*.gguf; do
    [ -f "$m" ] && { timeout 60 python3 scripts/greedy_vs_backend.py --model "$m" --backends native cuda -n 32 \
        || echo "greedy comparison failed: $m"; }
done

say "benchmarks (decode tok/s against the memory-bandwidth ceiling)"
# NVIDIA's figures for the lent cards (an H100 machine's device-to-device copy read ~3.0 TB/s, an H200's
# ~4.3); another card: set PEAK_BPS
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
    *H100*) export PEAK_BPS="${PEAK_BPS:-3.35e12}" ;;
    *) export PEAK_BPS="${PEAK_BPS:-4.8e12}" ;;  # the H200
esac
for m in $models/*.gguf; do
    [ -f "$m" ] || continue
    timeout 90 python3 -m edgellm.cli bench "$m" --backend cuda -p 512 -n 128 -r 3 --json > "$OUT/$(basename "$m" .gguf).json" \
        && python3 - "$OUT/$(basename "$m" .gguf).json" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
peak = float(os.environ["PEAK_BPS"])  # the card's memory bandwidth, bytes/s (above)
gbs = r["tg_tok_s"] * r["weight_bytes_per_token"]
print(f"{sys.argv[1]}: pp512 {r['pp_tok_s']:.0f} tok/s, tg128 {r['tg_tok_s']:.1f} tok/s, "
      f"{gbs / 1e9:.0f} GB/s = {100 * gbs / peak:.1f}% of {peak / 1e12:.1f} TB/s")
PY
done
say "done"
