#!/usr/bin/env bash
# A Raspberry Pi deployment end to end, emulated on this machine: an arm64 Debian userland built with
# debootstrap and run through qemu-user (binfmt_misc), the project installed in it with pip from the
# working tree twice -- once where gcc is installed (the native NEON backend is built) and once where no
# compiler exists (edgellm runs on numba) -- then `edgellm run MODEL --temp 0 -n 16` under
# `qemu-aarch64 -cpu cortex-a72` (Pi 4: armv8.0, no dotprod) and `-cpu cortex-a76` (Pi 5: dotprod), and
# the native runtime's own tests (plan executor, attention, thread pool, on tiny models: the real-model
# checks run at ~0.5 tok/s emulated, and the greedy run above is SmolLM2's) on aarch64.
#
# The bar is identical greedy tokens: every run must print exactly the tokens of this machine's native
# run. The levels are not bit-identical (their float sums run in different orders), so the prompt is one
# whose every greedy step has a top-2 margin >= 0.3 here (printed): a different token is then a bug, not
# noise at a near-tie. The last line says whether both installs worked and whether the tokens matched on
# both CPU models.
#
# Needs root (chroot, mount), debootstrap and qemu-user-static (Debian packages); registers qemu-aarch64
# with binfmt_misc when it is not already. Downloads (Debian packages, PyPI wheels, the model) and the two
# userlands are cached under $EDGELLM_AARCH64_CACHE (default ~/.cache/edgellm/aarch64), so a second run
# only reinstalls the project and runs. Options: --quick (skip the runtime's tests), --fresh (rebuild the
# userlands).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
cache="${EDGELLM_AARCH64_CACHE:-$HOME/.cache/edgellm/aarch64}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
suite=bookworm
model=smollm2-135m
# chosen so that each of the 16 greedy steps has a top-2 logit margin >= 0.3 here (checked below): the
# levels sum in different orders (~1e-3 apart), so at a near-tie a different token is float noise, not a
# bug, and this prompt makes any difference decisive
prompt="What is the boiling point of water in Celsius?"
cpus=(cortex-a72 cortex-a76)
quick=0 fresh=0
for arg in "$@"; do
    case $arg in
    --quick) quick=1 ;;
    --fresh) fresh=1 ;;
    *) echo "usage: $0 [--quick] [--fresh]" >&2 && exit 2 ;;
    esac
done

say() { echo "aarch64_e2e: $*" >&2; }
die() { say "$*" && exit 1; }
timings=()
stage() { # stage NAME COMMAND...: run it and keep its wall time for the summary
    local name=$1 t0=$SECONDS
    shift
    say "$name ..."
    "$@"
    timings+=("$name $((SECONDS - t0)) s")
}

[[ $(id -u) == 0 ]] || die "needs root (debootstrap, chroot and mount)"
for tool in debootstrap qemu-aarch64-static chroot; do
    command -v $tool >/dev/null || die "needs $tool (apt-get install debootstrap qemu-user-static)"
done
mkdir -p "$cache/debs" "$cache/pip"
work=$(mktemp -d)
mounts=()
cleanup() {
    local m
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

binfmt() { # arm64 ELF files run through qemu-aarch64-static ('F': opened now, so it works inside chroots)
    local dir=/proc/sys/fs/binfmt_misc
    [[ -e $dir/qemu-aarch64 ]] && return
    [[ -e $dir/register ]] || mount -t binfmt_misc binfmt_misc $dir || die "cannot mount binfmt_misc"
    [[ -f /usr/lib/binfmt.d/qemu-aarch64.conf ]] || die "qemu-user-static has no binfmt entry for aarch64"
    cat /usr/lib/binfmt.d/qemu-aarch64.conf >$dir/register
}

userland() { # userland DIR [PACKAGES]: a minimal arm64 Debian with python3 (+ PACKAGES), cached
    local root=$1 extra=${2:-}
    ((fresh)) && rm -rf "$root"
    [[ -f $root/.edgellm-ready ]] && return
    rm -rf "$root"
    debootstrap --arch=arm64 --variant=minbase --cache-dir="$cache/debs" \
        --include="python3,python3-venv,ca-certificates${extra:+,$extra}" $suite "$root" "$mirror" \
        >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2 && die "debootstrap failed"; }
    touch "$root/.edgellm-ready"
}

bind() { # bind SRC DST [ro]
    mkdir -p "$2"
    mount --bind "$1" "$2"
    mounts+=("$2")
    [[ ${3:-} == ro ]] && mount -o remount,bind,ro "$2"
    return 0
}

enter() { # enter ROOT: the mounts a pip install and a run need (proc, dev, the caches, the source)
    local root=$1
    bind /proc "$root/proc"
    bind /dev "$root/dev"
    bind "$cache/pip" "$root/root/.cache/pip"
    bind "$models" "$root/root/.cache/edgellm/models" ro
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    # this machine's trust store: a TLS-intercepting proxy trusted here is trusted by pip there too
    cp "$(python3 -c 'import ssl; print(ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt")')" \
        "$root/etc/ssl/host-ca.crt"
    rm -rf "$root/src" && mkdir -p "$root/src"
    git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -C "$root/src" -xf -
}

in_arm() { # in_arm ROOT CPU COMMAND: COMMAND in ROOT's shell, its arm64 programs run as CPU
    local root=$1 cpu=$2
    shift 2
    local proxy=()
    for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
        [[ -n ${!v:-} ]] && proxy+=("$v=${!v}")
    done
    # QEMU_CPU twice: chroot's child (env) is emulated as CPU, and env -i must hand it on to the shell
    QEMU_CPU=$cpu chroot "$root" /usr/bin/env -i QEMU_CPU="$cpu" HOME=/root PATH=/opt/venv/bin:/usr/bin:/bin \
        LANG=C.UTF-8 \
        PIP_CERT=/etc/ssl/host-ca.crt SSL_CERT_FILE=/etc/ssl/host-ca.crt "${proxy[@]}" \
        NUMBA_CACHE_DIR=/root/.cache/numba /bin/sh -ec "$*"
}

pip_install() { # pip_install ROOT: a fresh venv with the project from the working tree
    in_arm "$1" max "rm -rf /opt/venv && python3 -m venv /opt/venv && pip install -q --disable-pip-version-check /src"
}

run_model() { # run_model ROOT CPU OUT: the greedy run; stdout (the tokens' text) to OUT, -v's lines to OUT.log
    in_arm "$1" "$2" "edgellm run $model -p '$prompt' --temp 0 -n 16 -t 2 -v" >"$3" 2>"$3.log" ||
        { cat "$3.log" >&2 && return 1; }
}

# 1. this machine's native run: the tokens every aarch64 run must reproduce (it also fetches the model)
host_run() {
    python3 -c "import edgellm.backends.native as n; assert n.available() is None, n.available()" 2>/dev/null ||
        python3 native/build_native.py -q >/dev/null
    python3 -m edgellm run $model -p "$prompt" --temp 0 -n 16 -t 2 -v --backend native \
        >"$work/host.txt" 2>"$work/host.txt.log" || { cat "$work/host.txt.log" >&2 && return 1; }
}
stage "native run on this machine" host_run
margin=$(python3 - "$model" "$prompt" <<'EOF'
import sys
import numpy as np
import edgellm
llm = edgellm.LLM(sys.argv[1], backend="native", threads=2)
ids, margins = llm.chat_prompt([{"role": "user", "content": sys.argv[2]}]), []
for _ in range(16):
    last = np.asarray(llm.logits(ids))[-1]
    top2 = np.sort(last)[-2:]
    margins.append(float(top2[1] - top2[0]))
    ids.append(int(np.argmax(last)))
print(f"{min(margins):.3f}")
EOF
)
say "smallest top-2 margin over the 16 greedy steps here: $margin (decisive above 0.3)"
models=$(python3 -c "from edgellm import store; print(store.models_dir())")
say "$(grep '^loaded ' "$work/host.txt.log" | grep -o 'backend [^,]*') here: $(cat "$work/host.txt")"

stage "binfmt_misc" binfmt
stage "arm64 userland with gcc" userland "$cache/rootfs-gcc" gcc,libc6-dev,python3-dev
stage "arm64 userland without a compiler" userland "$cache/rootfs-nocc"

verdict=()
check() { # check LABEL OUT WANT-BACKEND: same text as the host run, on the backend (and level) expected
    local label=$1 out=$2 want=$3 got
    got=$(grep '^loaded ' "$out.log" | grep -o 'backend [^,]*' || true)  # -v's load line
    if ! cmp -s "$out" "$work/host.txt"; then
        say "$label: DIFFERENT tokens: $(cat "$out")"
        verdict+=("$label different")
    elif [[ $got != "backend $want" ]]; then
        say "$label: ran on '$got', expected 'backend $want'"
        verdict+=("$label wrong-backend")
    else
        say "$label: identical tokens ($got)"
    fi
}

# 2. with gcc: pip builds the native extension for aarch64; each CPU model picks its NEON variant
gcc_root="$cache/rootfs-gcc"
enter "$gcc_root"
gcc_ok=no
if stage "pip install with gcc" pip_install "$gcc_root" &&
    in_arm "$gcc_root" max "python -c 'import edgellm.backends.native as n; assert n.available() is None, n.available()'"; then
    gcc_ok=yes
    stage "run (native) on cortex-a72" run_model "$gcc_root" cortex-a72 "$work/gcc-a72.txt" &&
        check "native cortex-a72" "$work/gcc-a72.txt" "native (neon)"
    stage "run (native) on cortex-a76" run_model "$gcc_root" cortex-a76 "$work/gcc-a76.txt" &&
        check "native cortex-a76" "$work/gcc-a76.txt" "native (neon+dotprod)"
    if ((!quick)); then
        runtime_tests() {
            # from /src/tests with the installed package (not /src's sources, which have no extension);
            # a skipped test fails the stage: the ARM path must not pass by skipping
            in_arm "$gcc_root" "$1" "pip install -q --disable-pip-version-check pytest pytest-timeout && \
                cd /src && pytest -q -p no:cacheprovider -m 'not slow' -k 'not smollm2 and not gemma3 and not qwen2' \
                tests/test_native_backend.py | tee /tmp/pytest.log && ! tail -1 /tmp/pytest.log | grep -q skipped"
        }
        for cpu in "${cpus[@]}"; do
            stage "native runtime tests on $cpu" runtime_tests "$cpu" || verdict+=("runtime-tests-$cpu failed")
        done
    fi
fi

# 3. no compiler: the install still works (the C build is optional) and edgellm runs on numba
nocc_root="$cache/rootfs-nocc"
enter "$nocc_root"
nocc_ok=no
if in_arm "$nocc_root" max "! command -v cc && ! command -v gcc" >/dev/null &&
    stage "pip install without a compiler" pip_install "$nocc_root"; then
    nocc_ok=yes
    for cpu in "${cpus[@]}"; do
        stage "run (numba) on $cpu" run_model "$nocc_root" "$cpu" "$work/nocc-$cpu.txt" &&
            check "numba $cpu" "$work/nocc-$cpu.txt" numba
    done
fi

say "timings:"
for t in "${timings[@]}"; do say "  $t"; done
runs=$(ls "$work"/gcc-*.txt "$work"/nocc-*.txt 2>/dev/null | grep -c 'txt$' || true)
if [[ $gcc_ok == yes && $nocc_ok == yes && $runs == 4 && ${#verdict[@]} == 0 ]]; then
    echo "aarch64_e2e: OK: install with gcc (native) and without a compiler (numba) worked; greedy tokens identical to this machine's on ${cpus[*]}"
else
    echo "aarch64_e2e: FAILED: install with gcc: $gcc_ok, without a compiler: $nocc_ok, runs: $runs of 4${verdict:+, ${verdict[*]}}"
    exit 1
fi
