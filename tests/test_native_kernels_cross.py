"""The C kernels (native/kernels/) against the numpy reference, on every code path this machine can run.

Cases (random rows and rows sliced from the real models) are written to a binary file; the standalone
harness native/tests/kernel_check.c checks, for each level the CPU runs, that the quantized activations
are byte-identical to numpy's and that vec_dot is within a per-type relative tolerance of the float64 dot
of dequant(weight) * activation_roundtrip(x), and that vec_dot_nx (one weight row against 1..4 activation
rows) gives every row vec_dot's bits exactly. The harness is built with the host compiler (scalar, AVX2,
AVX-512 where the CPU has it) and cross-built for aarch64 and run under qemu (NEON with and without the
dot-product extension).
"""

from __future__ import annotations

import os
import platform
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edgellm import quants
from edgellm.backends.reference import activation_roundtrip
from edgellm.gguf import ModelFile

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "native/tests/kernel_check.c", *sorted((ROOT / "native/kernels").glob("*.c"))]
# native/tests/attention_check.c includes native/runtime/attention.c (its loops are static)
ATTENTION_SOURCES = [
    ROOT / "native/tests/attention_check.c",
    *(p for p in sorted((ROOT / "native/runtime").glob("*.c")) if p.name != "attention.c"),
    *sorted((ROOT / "native/kernels").glob("*.c")),
]
ATTENTION_FLAGS = ["-pthread", f"-I{ROOT / 'native/runtime'}", f"-I{ROOT / 'native'}"]
QEMU = "qemu-aarch64-static"
AARCH64_CC = "aarch64-linux-gnu-gcc"
AARCH64_SYSROOT = "/usr/aarch64-linux-gnu"

# weight type -> the row lengths its random cases use (a whole number of blocks)
RANDOM_SHAPES = {
    T.Q4_0: (32, 576, 1536),
    T.Q4_1: (32, 576, 1536),
    T.Q5_0: (64, 640),
    T.Q5_1: (64, 640),
    T.Q8_0: (32, 576, 640),
    T.IQ4_NL: (32, 576),
    T.Q2_K: (256, 1024, 2304),
    T.Q3_K: (256, 1024, 2304),
    T.Q4_K: (256, 1024),
    T.Q5_K: (256, 1024),
    T.Q6_K: (256, 2048),
    # 48, 1043: a 16-element step after the 32s; 2059: K blocks; 24, 2059: AVX2's 8-element step after its 16s
    T.F16: (1, 7, 24, 33, 48, 576, 1027, 1043, 2059),
    T.BF16: (1, 9, 24, 64, 80, 577, 1000, 2600),  # 24, 1000, 2600: AVX2's 8-element step (1000: 2 x 6)
    T.F32: (3, 31, 576, 1030),
}


@dataclass
class Case:
    name: str
    wtype: T
    x: np.ndarray  # (n,) float32 activation row
    w: np.ndarray  # (row_bytes,) uint8 weight row


# ------------------------------------------------------------------------------------ expected values


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(v.astype("<f2")).view(np.uint8).reshape(len(v), -1)


def _q8_legacy(x: np.ndarray, with_sum: bool) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 / Q8_1 bytes as ggml-cpu's x86 quantize_row_q8_0/q8_1 write them, and the s of each block."""
    b = x.reshape(-1, 32)
    amax = np.abs(b).max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    d = (amax / np.float32(127)).astype(np.float32)
    q = np.rint(b * inv)
    s = (d[:, 0] * q.sum(axis=1, dtype=np.float32)).astype(np.float16)
    parts = [_f16_bytes(d[:, 0])] + ([_f16_bytes(s)] if with_sum else []) + [q.astype(np.int8).view(np.uint8)]
    return np.concatenate(parts, axis=1).reshape(-1), s.astype(np.float32)


def activation_bytes(x: np.ndarray, wtype: T) -> tuple[np.ndarray, np.ndarray | None]:
    """The activation row ggml's vec_dot for `wtype` reads, as bytes, and Q8_1's s per block (else None).
    Checked to decode to exactly `activation_roundtrip`, the project's reference."""
    t = quants.quant_type(wtype).vec_dot_type
    s = None
    if t in (T.Q8_0, T.Q8_1):
        raw, s = _q8_legacy(x, t == T.Q8_1)
        decoded = quants.dequantize(
            raw.reshape(-1, 36)[:, [0, 1, *range(4, 36)]] if t == T.Q8_1 else raw, T.Q8_0, x.shape
        )
    else:
        raw = quants.quantize(x, t).reshape(-1)
        decoded = quants.dequantize(raw, t, x.shape)
    np.testing.assert_array_equal(decoded, activation_roundtrip(x[None, :], wtype)[0])
    return raw, (s if t == T.Q8_1 else None)


def expected_dot(c: Case) -> tuple[float, float, np.ndarray]:
    """(float64 reference dot, magnitude sum |w_i x_i| the tolerance scales with, activation bytes)."""
    n = len(c.x)
    w = quants.dequantize(c.w, c.wtype, (n,)).astype(np.float64)
    a_raw, s = activation_bytes(c.x, c.wtype)
    a = activation_roundtrip(c.x[None, :], c.wtype)[0].astype(np.float64)
    dot, magnitude = float(np.sum(w * a)), float(np.sum(np.abs(w * a)))
    if s is not None:  # ggml adds m * s with s = f16(d * sum q), not m * f16(d) * sum q
        blocks = c.w.reshape(n // 32, -1)
        m = blocks[:, 2:4].copy().view("<f2")[:, 0].astype(np.float64)
        q = a_raw.reshape(n // 32, 36)[:, 4:].view(np.int8).astype(np.float64)
        d = a_raw.reshape(n // 32, 36)[:, 0:2].copy().view("<f2")[:, 0].astype(np.float64)
        dot += float(np.sum(m * (s - d * q.sum(axis=1))))
        magnitude += float(np.sum(np.abs(m) * np.abs(a.reshape(-1, 32)).sum(axis=1)))
    return dot, magnitude, a_raw


# ----------------------------------------------------------------------------------------- the cases


def _activation_rows(rng: np.random.Generator, n: int) -> list[tuple[str, np.ndarray]]:
    """Rows that reach the quantizers' edge cases: ties to even, zero blocks, tiny and big scales."""
    rows = [("normal", rng.standard_normal(n).astype(np.float32))]
    if n >= 32:
        # integers with a block maximum of -254: x * 127/amax (Q8_0) and x * -127/max (Q8_K) are exact halves
        ties = rng.integers(-253, 254, n).astype(np.float32)
        ties[:: min(n, 32)] = -254
        rows.append(("ties", ties))
        zero = rng.standard_normal(n).astype(np.float32)
        zero[:32] = 0  # an all-zero block: d = 0, q = 0, s = 0
        rows.append(("zero-block", zero))
    rows.append(("tiny", (rng.standard_normal(n) * 1e-6).astype(np.float32)))  # f16 subnormals
    rows.append(
        ("outlier", (rng.standard_normal(n) * np.where(rng.random(n) < 0.02, 300, 1)).astype(np.float32))
    )
    return rows


def _random_weight(rng: np.random.Generator, t: T, n: int) -> np.ndarray:
    q = quants.quant_type(t)
    if q.quantize_blocks is not None:
        return quants.quantize(rng.standard_normal(n).astype(np.float32), t).reshape(-1)
    # no reference quantizer (IQ4_NL, K-quants): random bytes are valid quants; give the scales sane values
    blocks = rng.integers(0, 256, (n // q.block_size, q.type_size), dtype=np.uint8)
    scale = (rng.random((len(blocks), 2)) * 0.02 + 0.001).astype("<f2").view(np.uint8)
    if t in (T.Q3_K, T.Q6_K):
        blocks[:, -2:] = scale[:, :2]  # d is the last field
    elif t == T.Q2_K:
        blocks[:, -4:] = scale  # d, dmin close the block
    else:
        width = 4 if t in (T.Q4_K, T.Q5_K) else 2  # d (and dmin) lead the block
        blocks[:, :width] = scale[:, :width]
    return blocks.reshape(-1)


def random_cases(seed: int = 0) -> list[Case]:
    rng = np.random.default_rng(seed)
    cases = []
    for t, shapes in RANDOM_SHAPES.items():
        for n in shapes:
            w = _random_weight(rng, t, n)
            for label, x in _activation_rows(rng, n):
                cases.append(Case(f"random/{t.name}/n={n}/{label}", t, x, w))
    return cases


def model_cases(paths: list[Path], seed: int = 1, rows_per_tensor: int = 2) -> list[Case]:
    """Rows of one tensor of each (type, row length) in the real models, with random activations."""
    rng = np.random.default_rng(seed)
    cases, seen = [], set()
    for path in paths:
        mf = ModelFile(path)
        for qt in mf.tensors.values():
            key = (qt.type, qt.ne[0])
            if qt.type not in RANDOM_SHAPES or len(qt.ne) < 2 or key in seen:
                continue
            seen.add(key)
            for r in rng.choice(qt.data.shape[0], rows_per_tensor, replace=False):
                x = rng.standard_normal(qt.ne[0]).astype(np.float32)
                cases.append(Case(f"{path.stem}/{qt.name}/row{r}", qt.type, x, np.array(qt.data[r])))
    return cases


def write_case_file(path: Path, cases: list[Case]) -> None:
    """The binary format native/tests/kernel_check.c reads (see its header comment)."""
    with open(path, "wb") as f:
        f.write(b"EDKC" + struct.pack("<II", 1, len(cases)))
        for c in cases:
            dot, magnitude, a_raw = expected_dot(c)
            name = c.name.encode()[:127]
            atype = quants.quant_type(c.wtype).vec_dot_type
            f.write(struct.pack("<I", len(name)) + name)
            f.write(struct.pack("<IIIIIdd", c.wtype, len(c.x), len(c.w), atype, len(a_raw), dot, magnitude))
            f.write(c.x.astype("<f4").tobytes() + c.w.tobytes() + a_raw.tobytes())


# ------------------------------------------------------------------------------------------ the tests


@pytest.fixture(scope="module")
def case_file(tmp_path_factory, request) -> Path:
    cases = random_cases()
    try:
        cases += model_cases(request.getfixturevalue("real_model_paths"))
    except pytest.skip.Exception:
        pass  # random cases still cover every type
    path = tmp_path_factory.mktemp("kernels") / "cases.bin"
    write_case_file(path, cases)
    return path


def _build(
    compiler: str, flags: list[str], out: Path, opt: str = "-O3", sources: list[Path] = SOURCES
) -> Path:
    cmd = [compiler, opt, "-std=c11", "-Wall", "-Wextra", *flags, "-o", str(out), *map(str, sources), "-lm"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    assert "warning" not in res.stderr, res.stderr
    return out


def _cpu_flags() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _run(cmd: list[str], env: dict[str, str] | None = None) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})
    assert res.returncode == 0, f"{' '.join(cmd)} exited {res.returncode}\n{res.stdout[-6000:]}\n{res.stderr}"
    return res.stdout


def _compiler(name: str) -> str | None:
    """`cc`, or clang under its plain or versioned name."""
    if name == "cc":
        return shutil.which("cc") or shutil.which("gcc")
    return shutil.which("clang") or next(
        filter(None, map(shutil.which, [f"clang-{v}" for v in range(20, 13, -1)])), None
    )


@pytest.mark.parametrize("compiler", ["cc", "clang"])
def test_kernels_match_numpy_on_every_host_level(case_file, tmp_path, compiler):
    cc = _compiler(compiler)
    if cc is None:
        pytest.skip(f"no {compiler} compiler")
    exe = _build(cc, [], tmp_path / "kernel_check")
    out = _run([str(exe), str(case_file)])
    assert "scalar " in out and "OK:" in out
    flags = _cpu_flags()
    if " avx2 " in flags and " fma " in flags and " f16c " in flags:
        assert "\navx2 " in out, out  # the AVX2 level ran too
    if " avx512bw " in flags and " avx512vl " in flags:
        assert "\navx512 " in out, out
    if " avx_vnni " in flags:  # the AVX2 table's legacy x16 GEMMs by AVX-VNNI (avx2_vnni.c), and without
        assert "avxvnni 1" in out, out
        out = _run([str(exe), str(case_file)], {"EDGELLM_AVXVNNI": "0"})
        assert "avxvnni 0" in out and "\navx2 " in out and "OK:" in out, out
    if " amx_int8 " in flags:  # AMX machines' tiles over the file's blocks: the table of EDGELLM_REPACK=0
        out = _run([str(exe), str(case_file)], {"EDGELLM_REPACK": "0"})
        assert "amx 1" in out and "OK:" in out, out


@pytest.fixture(scope="module")
def emulated_kernel_check(tmp_path_factory) -> Path:
    """kernel_check built once against SIMDe (both VNNI settings run the same binary). -O1: GCC takes
    over two minutes on the emulated avx512.c at -O3 (SIMDe's inlined intrinsics), a third of that at -O1;
    the emulation's results do not depend on the level (no -ffast-math; fused multiply-adds are fmaf)."""
    cc = _compiler("cc")
    if cc is None or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("needs an x86-64 C compiler")
    if not Path("/usr/include/simde/x86/avx512.h").exists():
        pytest.skip("SIMDe headers not installed (apt-get install libsimde-dev)")
    out = tmp_path_factory.mktemp("emu") / "kernel_check_emu"
    return _build(cc, ["-DED_EMULATE_AVX512", "-Wno-psabi"], out, opt="-O1")


@pytest.mark.parametrize("vnni", ["1", "0"])
def test_avx512_kernels_match_numpy_under_simde_emulation(case_file, emulated_kernel_check, vnni):
    """The AVX-512 code (VNNI and BW variants; BF16 weights by vdpbf16ps with VNNI, by FMAs without)
    compiled against SIMDe's portable intrinsics, so it is checked on machines without AVX-512 too."""
    exe = emulated_kernel_check
    if " avx2 " not in _cpu_flags():
        pytest.skip("the emulated AVX-512 table builds on the AVX2 one, which this CPU cannot run")
    res = subprocess.run(
        [str(exe), str(case_file), "--level", "avx512"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ED_EMULATE_VNNI": vnni, "ED_EMULATE_BF16": vnni},
    )
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr
    assert f"avx512vnni {vnni}, avx512bf16 {vnni}" in res.stdout and "\navx512 " in res.stdout, res.stdout


@pytest.mark.parametrize(
    ("march", "qemu_cpu", "dotprod"),
    [("armv8.2-a+dotprod", "max", 1), ("armv8-a", "cortex-a53", 0), ("armv8-a", "cortex-a76", 1)],
)
def test_kernels_match_numpy_on_aarch64_neon(case_file, tmp_path, march, qemu_cpu, dotprod):
    for tool in (AARCH64_CC, QEMU):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (apt-get install gcc-aarch64-linux-gnu qemu-user-static)")
    exe = _build(AARCH64_CC, [f"-march={march}", "-static"], tmp_path / "kernel_check")
    out = _run([QEMU, "-cpu", qemu_cpu, "-L", AARCH64_SYSROOT, str(exe), str(case_file)])
    assert f"cpu level neon, dotprod {dotprod}" in out, out
    assert "\nneon " in out and "OK:" in out, out


# ------------------------------------------------------------------------------------ attention's loops


@pytest.mark.parametrize("compiler", ["cc", "clang"])
def test_attention_loops_give_the_portable_loops_bits_on_this_host(tmp_path, compiler):
    """native/tests/attention_check.c: each level's attention loops (AVX + F16C, AVX-512VL) against the
    portable C loops, bit for bit (clang too: attention.c turns its default fused multiply-adds off)."""
    cc = _compiler(compiler)
    if cc is None:
        pytest.skip(f"no {compiler} compiler")
    exe = _build(cc, ATTENTION_FLAGS, tmp_path / "attention_check", sources=ATTENTION_SOURCES)
    out = _run([str(exe)])
    assert "OK:" in out, out
    flags = _cpu_flags()
    if platform.machine() == "x86_64" and " avx2 " in flags and " fma " in flags and " f16c " in flags:
        assert "avx2 attention loops" in out, out
        # and the other vendor's AVX2 loops (fused on AMD, multiply then add on Intel)
        assert "avx2 fused attention loops" in out or "avx2 unfused attention loops" in out, out
    if " avx512bw " in flags and " avx512vl " in flags:
        assert "avx512 attention loops" in out, out


@pytest.fixture(scope="module")
def aarch64_attention_check(tmp_path_factory) -> Path:
    for tool in (AARCH64_CC, QEMU):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (apt-get install gcc-aarch64-linux-gnu qemu-user-static)")
    out = tmp_path_factory.mktemp("a64") / "attention_check"
    return _build(AARCH64_CC, [*ATTENTION_FLAGS, "-static"], out, sources=ATTENTION_SOURCES)


@pytest.mark.parametrize("qemu_cpu", ["cortex-a72", "cortex-a76"])
def test_attention_loops_give_the_portable_loops_bits_on_aarch64(aarch64_attention_check, qemu_cpu):
    """The NEON attention loops (every AArch64 CPU: the Pi 4 and the Pi 5) against the portable C loops."""
    out = _run([QEMU, "-cpu", qemu_cpu, "-L", AARCH64_SYSROOT, str(aarch64_attention_check)])
    assert "neon attention loops" in out and "OK:" in out, out
