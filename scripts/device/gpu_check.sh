#!/usr/bin/env bash
# The vulkan backend on a real GPU, in one command that needs no network (issue: Vulkan and Metal
# backends): the contract tests, greedy fixtures against llama.cpp, and `edgellm bench --backend vulkan`
# for each model found, with decode tok/s next to the card's memory-bandwidth ceiling. Ends in < 8 min on
# an H200. What it needs beside the tree (scripts/device/README.md says how to stage them):
#   .gl/*.deb   the Vulkan loader (libvulkan1), unpacked when `ldconfig -p` has no libvulkan
#   .whl/*.whl  wgpu, cffi, gguf (and anything else pip there lacks), installed with --no-index
#   .models/    GGUF files under the names `edgellm pull` gives them, or pieces of them (see the README):
#               SmolLM2-135M-Instruct.Q4_1.gguf, gemma-3-270m-q4_k_m.gguf, a Qwen2.5-Coder-1.5B
# Results go to $OUT (or /tmp/gpu_check): gpu_check.log and one bench JSON per model.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/gpu_check}"
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
say() { printf '\n== %s\n' "$*"; }

say "Vulkan loader and driver"
# the loader and glvnd (NVIDIA's Vulkan ICD is libGLX_nvidia, which needs glvnd's libraries): on an H100
# machine (2026-12-05) libvulkan1 alone found no Vulkan adapter; unpacking is idempotent
for f in .gl/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done
ldconfig
nv_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nv_egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
[ -f "$nv_icd" ] && export VK_DRIVER_FILES="$nv_icd"
[ -f "$nv_egl" ] && export __EGL_VENDOR_LIBRARY_FILENAMES="$nv_egl"
ls /usr/local/nvidia/share/vulkan/icd.d /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>/dev/null
ldconfig -p | grep 'libvulkan.so.1' || { echo "no Vulkan loader: carry .gl (libvulkan1)"; exit 2; }

say "Python packages"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "carried wheels failed to install"; exit 2; }
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 EDGELLM_OFFLINE=1
python3 - <<'PY' || exit 2
from edgellm.backends import get_backend
b = get_backend("vulkan")
print(f"vulkan: {b.device_name} ({b.adapter.info.get('adapter_type')}), largest binding {b.max_binding >> 20} MiB")
PY
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv 2>/dev/null || true

say "models"
models=/tmp/gpu_home/models  # EDGELLM_HOME's cache: the tests find the models there
mkdir -p $models
for f in .models/*.gguf; do [ -f "$f" ] && ln -sf "$PWD/$f" $models/; done
# a file over the carry limit travels as NAME.part-NN pieces over several calls (the machine keeps /tmp
# while it stays warm) with NAME.parts holding how many there are; it is joined once all have arrived
mkdir -p /tmp/gpu_pieces
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
export EDGELLM_HOME=/tmp/gpu_home

if [ "${CHECK_TESTS:-1}" = 1 ]; then  # CHECK_TESTS=0: models only (a second call, once a model has arrived)
    say "contract tests and vulkan tests"
    timeout 240 python3 -m pytest -q -x -p no:cacheprovider -k "vulkan" tests/test_backend_contract.py tests/test_vulkan_backend.py
fi

say "benchmarks (decode tok/s against the memory-bandwidth ceiling)"
# NVIDIA's figures for the lent cards (an H100 machine's device-to-device copy read ~3.0 TB/s, an H200's
# ~4.3); another card: set PEAK_BPS
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
    *H100*) export PEAK_BPS="${PEAK_BPS:-3.35e12}" ;;
    *) export PEAK_BPS="${PEAK_BPS:-4.8e12}" ;;  # the H200
esac
for m in $models/*.gguf; do
    [ -f "$m" ] || continue
    timeout 90 python3 -m edgellm.cli bench "$m" --backend vulkan -p 512 -n 128 -r 3 --json > "$OUT/$(basename "$m" .gguf).json" \
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
