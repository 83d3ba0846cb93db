#!/usr/bin/env bash
# The native runtime's own tests (plan executor, attention, thread pool: tests/test_native_backend.py) on
# aarch64 under qemu-user, quickly enough for CI: the reduced version of
# scripts/aarch64_e2e.sh. Nothing runs emulated but the tests themselves:
#   - an arm64 Debian sysroot from `debootstrap --foreign` (download and unpack only; the packages the first
#     stage leaves packed are unpacked with dpkg-deb: Python needs no maintainer script),
#   - numpy, cffi, gguf, pytest as aarch64 wheels installed by this machine's pip (--platform),
#   - edgellm._native cross-compiled with aarch64-linux-gnu-gcc from the cffi source (the flags of
#     native/build_native.py, no -march: the NEON variant is chosen at run time),
# then `qemu-aarch64-static -cpu CPU -L SYSROOT python3.11 -m pytest ...` for each CPU given (default:
# cortex-a72 = Pi 4, no dotprod; cortex-a76 = Pi 5, dotprod), asserting the level each one picks.
#
# Usage: scripts/aarch64_runtime_tests.sh [CPU...] [-- PYTEST ARGS]. Needs root (debootstrap),
# debootstrap, gcc-aarch64-linux-gnu and qemu-user-static. The sysroot and wheels are cached under
# $EDGELLM_AARCH64_CACHE (default ~/.cache/edgellm/aarch64).
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${EDGELLM_AARCH64_CACHE:-$HOME/.cache/edgellm/aarch64}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
cpus=() pytest_args=()
while (($#)); do
    if [[ $1 == -- ]]; then
        shift && pytest_args=("$@") && break
    fi
    cpus+=("$1") && shift
done
((${#cpus[@]})) || cpus=(cortex-a72 cortex-a76)
# the default: every test of the runtime on tiny models (ops against the reference, attention, plans,
# threads); the real-model checks take ~0.5 tok/s emulated, so scripts/aarch64_e2e.sh runs SmolLM2 instead
# (repacked_at_load too where the CPU has no sdot: Q4_0/Q8_0/IQ4_NL are repacked for the sdot kernels only;
# repack_off starts a Python process, which qemu-user without binfmt_misc cannot exec)
default_args=$((${#pytest_args[@]} == 0))
say() { echo "aarch64_runtime_tests: $*" >&2; }
for tool in debootstrap dpkg-deb aarch64-linux-gnu-gcc qemu-aarch64-static; do
    command -v $tool >/dev/null || { say "needs $tool" && exit 1; }
done

sysroot="$cache/sysroot-bookworm"
t0=$SECONDS
if [[ ! -f $sysroot/.edgellm-ready ]]; then
    rm -rf "$sysroot" "$sysroot.tmp" && mkdir -p "$cache/debs"
    debootstrap --foreign --arch=arm64 --variant=minbase --cache-dir="$cache/debs" \
        --include=python3.11,libpython3.11-stdlib,libpython3.11-dev bookworm "$sysroot.tmp" "$mirror" \
        >"$cache/debootstrap-foreign.log" 2>&1 || { tail -20 "$cache/debootstrap-foreign.log" >&2 && exit 1; }
    for deb in "$sysroot.tmp"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$sysroot.tmp"; done
    mv "$sysroot.tmp" "$sysroot" && touch "$sysroot/.edgellm-ready"
fi
py="$sysroot/usr/bin/python3.11"
pyver=$(qemu-aarch64-static -L "$sysroot" "$py" -c 'import sys; print("%d%d" % sys.version_info[:2])')
say "sysroot ready ($((SECONDS - t0)) s): python ${pyver:0:1}.${pyver:1}"

t0=$SECONDS
site="$cache/site-cp$pyver"
if [[ ! -f $site/.edgellm-ready ]]; then
    rm -rf "$site"
    deps=$(python3 -c 'import tomllib; d = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print(" ".join(x for x in d if not x.startswith(("numba", "llvmlite", "typer"))))')
    # numba is left out on purpose: these are the native backend's tests (numba needs a compiled LLVM)
    python3 -m pip install -q --disable-pip-version-check --target "$site" --platform manylinux2014_aarch64 \
        --implementation cp --python-version "${pyver:0:1}.${pyver:1}" --only-binary=:all: \
        $deps "pytest>=7" "pytest-timeout>=2" >"$cache/pip.log" 2>&1 || { tail -20 "$cache/pip.log" >&2 && exit 1; }
    touch "$site/.edgellm-ready"
fi
say "aarch64 wheels ready ($((SECONDS - t0)) s)"

t0=$SECONDS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -C "$work" -xf -
rm -f "$work"/edgellm/_native*.so
python3 - "$work/_native.c" >/dev/null <<'EOF'
import sys
sys.path.insert(0, "native")
from build_native import make_builder
make_builder(relative=False).emit_c_code(sys.argv[1])
EOF
ext="_native.cpython-$pyver-aarch64-linux-gnu.so"
inc="$sysroot/usr/include/python${pyver:0:1}.${pyver:1}"
aarch64-linux-gnu-gcc -O3 -std=c11 -fPIC -pthread -shared -I native/runtime -I native -I "$inc" \
    -idirafter "$sysroot/usr/include" \
    -o "$work/edgellm/$ext" "$work/_native.c" native/runtime/*.c native/kernels/*.c -lm
say "cross-built edgellm/$ext ($((SECONDS - t0)) s)"

failed=0
for cpu in "${cpus[@]}"; do
    t0=$SECONDS
    want=$( [[ $cpu == cortex-a72 || $cpu == cortex-a53 ]] && echo neon || echo neon+dotprod )
    run() { (cd "$work" && QEMU_CPU=$cpu PYTHONPATH="$work:$site" qemu-aarch64-static -L "$sysroot" "$py" "$@"); }
    level=$(run -c 'from edgellm.backends.native import NativeBackend; print(NativeBackend(threads=1).level)')
    if [[ $level != "$want" ]]; then
        say "$cpu: the native backend chose '$level', expected '$want'" && failed=1 && continue
    fi
    if ((default_args)); then
        skip="not smollm2 and not gemma3 and not qwen2 and not amx_is_in_use and not amx_tiles_over and not repack_off and not every_x86_level"
        [[ $want == neon ]] && skip+=" and not repacked_at_load"
        pytest_args=(tests/test_native_backend.py -m "not slow" -k "$skip")
    fi
    # a skipped test fails the run: the ARM path must not pass by skipping
    if run -m pytest -q -p no:cacheprovider "${pytest_args[@]}" | tee "$work/pytest.log" &&
        ! tail -1 "$work/pytest.log" | grep -q skipped; then
        say "$cpu ($level): passed ($((SECONDS - t0)) s)"
    else
        say "$cpu ($level): FAILED ($((SECONDS - t0)) s)" && failed=1
    fi
done
exit $failed
