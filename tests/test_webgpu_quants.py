"""WebGPU weight formats: webgpu_layout.repack plus backends/wgsl deq4_<type> reproduce gguf-py's
`gguf.quants.dequantize` bit for bit, for every type the WebGPU backend reads, on whatever Vulkan
adapter wgpu finds (Mesa lavapipe on CI)."""

from __future__ import annotations

import os
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants

from edgellm.backends.webgpu_layout import LAYOUT, repack

WGSL = Path(__file__).resolve().parents[1] / "backends" / "wgsl"
FAMILIES = ("quants_float", "quants_legacy", "quants_k")
FLOATS = [T.F32, T.F16, T.BF16]
QUANTIZABLE = [*FLOATS, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]  # gguf-py has a quantizer for these
# byte offsets of the f16 scales (d, and dmin or m if any) in each GGUF block, from ggml-common.h
F16_SCALES = {
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q8_0: (0,),
    T.IQ4_NL: (0,),
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
}
ALL_TYPES = FLOATS + list(F16_SCALES)
ROWS, COLS = 3, 512

DECLARE_W = "@group(0) @binding(0) var<storage, read> W: array<u32>;\n"
KERNEL = (
    DECLARE_W
    + """@group(0) @binding(1) var<storage, read_write> O: array<vec4<f32>>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&O)) {
        return;
    }
    O[i] = deq4_%(name)s((i / %(quads)du) * %(words)du, i %% %(quads)du);
}
"""
)


def row_bytes(t: T, cols: int) -> int:
    elems, size = GGML_QUANT_SIZES[t]
    return cols // elems * size


def finite_f16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random f16 bit patterns over the whole finite range: zeros, subnormals, both signs, up to 65504."""
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    return np.where((bits & 0x7C00) == 0x7C00, bits & 0x83FF, bits).astype(np.uint16)


def make_raw(t: T, case: str, rng: np.random.Generator) -> np.ndarray:
    """(ROWS, row_bytes) uint8 GGUF data of type t. `quantized`: gguf-py's quantizer on random normals.
    `random-model-d`: random bytes everywhere (quants, packed scales, high bits) with f16 scales the size
    a trained model has. `random-any-d`: random bytes with any finite f16 scale, subnormals included.
    For the float types both random cases are random finite values of the type."""
    if case == "quantized":
        q = gguf_quants.quantize(rng.standard_normal((ROWS, COLS)).astype(np.float32), t)
        return np.ascontiguousarray(q).view(np.uint8).reshape(ROWS, row_bytes(t, COLS))
    if t == T.F32:
        bits = rng.integers(0, 1 << 32, ROWS * COLS, dtype=np.uint32)
        bits = np.where((bits & 0x7F800000) == 0x7F800000, bits & 0x807FFFFF, bits).astype(np.uint32)
        return bits.view(np.uint8).reshape(ROWS, -1)
    if t == T.F16:
        return finite_f16_bits(rng, ROWS * COLS).view(np.uint8).reshape(ROWS, -1)
    if t == T.BF16:  # bf16 has f32's exponent: clear the all-ones exponent the same way
        bits = rng.integers(0, 1 << 16, ROWS * COLS, dtype=np.uint16)
        bits = np.where((bits & 0x7F80) == 0x7F80, bits & 0x807F, bits).astype(np.uint16)
        return bits.view(np.uint8).reshape(ROWS, -1)
    elems, size = GGML_QUANT_SIZES[t]
    blocks = rng.integers(0, 256, (ROWS * COLS // elems, size), dtype=np.uint8)
    for o in F16_SCALES[t]:
        if case == "random-model-d":
            s = rng.uniform(0.5, 2.0, len(blocks)) * rng.choice([-1, 1], len(blocks)) * 2e-3
            bits = s.astype("<f2").view(np.uint16)
        else:
            bits = finite_f16_bits(rng, len(blocks))
        blocks[:, o : o + 2] = bits.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(ROWS, -1)


CASES = [
    (t, case)
    for t in ALL_TYPES
    for case in (["quantized"] if t in QUANTIZABLE else []) + ["random-model-d", "random-any-d"]
]


@pytest.fixture(scope="module")
def gpu():
    """(wgpu, device, pipeline cache); skips when wgpu or a Vulkan adapter is missing."""
    os.environ.setdefault("WGPU_BACKEND_TYPE", "Vulkan")
    if not os.environ.get("XDG_RUNTIME_DIR"):  # the Vulkan loader warns without one
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="xdg-")
    try:
        import wgpu
    except ImportError as e:
        pytest.skip(f"wgpu is not importable ({e}); pip install wgpu")
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as e:  # wgpu-native raises when the forced backend has no adapter
        why = " ".join(str(e).split())  # one line for pytest's summary
        pytest.skip(f"no Vulkan adapter found ({why}); install a Vulkan driver, e.g. mesa-vulkan-drivers")
    if adapter is None:
        pytest.skip("no Vulkan adapter found; install a Vulkan driver, e.g. mesa-vulkan-drivers")
    return wgpu, adapter.request_device_sync(), {}


def pipeline(gpu, t: T):
    """Compute pipeline dequantizing every quad of every block of W into O, with all three WGSL files
    concatenated after W's declaration (so they also must not clash with each other)."""
    wgpu, device, cache = gpu
    if t not in cache:
        elems, words = LAYOUT[t]
        source = KERNEL % {"name": t.name.lower(), "quads": elems // 4, "words": words}
        source += "".join((WGSL / f"{f}.wgsl").read_text() for f in FAMILIES)
        module = device.create_shader_module(code=source)
        compute = {"module": module, "entry_point": "main"}
        cache[t] = device.create_compute_pipeline(layout="auto", compute=compute)
    return cache[t]


def gpu_dequantize(gpu, t: T, words: np.ndarray) -> np.ndarray:
    wgpu, device, _ = gpu
    n_elems = words.shape[0] * LAYOUT[t][0] * (words.shape[1] // LAYOUT[t][1])
    w_buf = device.create_buffer_with_data(data=np.ascontiguousarray(words), usage=wgpu.BufferUsage.STORAGE)
    o_buf = device.create_buffer(size=n_elems * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    pipe = pipeline(gpu, t)
    bind = device.create_bind_group(
        layout=pipe.get_bind_group_layout(0),
        entries=[
            {"binding": 0, "resource": {"buffer": w_buf, "offset": 0, "size": w_buf.size}},
            {"binding": 1, "resource": {"buffer": o_buf, "offset": 0, "size": o_buf.size}},
        ],
    )
    encoder = device.create_command_encoder()
    cpass = encoder.begin_compute_pass()
    cpass.set_pipeline(pipe)
    cpass.set_bind_group(0, bind)
    cpass.dispatch_workgroups((n_elems // 4 + 63) // 64)
    cpass.end()
    device.queue.submit([encoder.finish()])
    return np.frombuffer(device.queue.read_buffer(o_buf), dtype=np.float32).reshape(words.shape[0], -1)


@pytest.mark.parametrize("t,case", CASES, ids=[f"{t.name}-{c}" for t, c in CASES])
def test_deq4_matches_gguf_py_bit_exact(gpu, t, case):
    raw = make_raw(t, case, np.random.default_rng([int(t), zlib.crc32(case.encode())]))
    want = gguf_quants.dequantize(raw, t).reshape(ROWS, COLS).astype(np.float32)
    got = gpu_dequantize(gpu, t, repack(t, raw))
    assert np.isfinite(want).all()
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))[:4]
    assert bad.size == 0, f"elements {bad} differ: {got.flat[bad]} vs gguf-py {want.flat[bad]}"


@pytest.mark.parametrize("family", FAMILIES)
def test_each_wgsl_file_is_valid_after_a_declaration_of_w(gpu, family):
    _, device, _ = gpu
    source = DECLARE_W + (WGSL / f"{family}.wgsl").read_text()
    device.create_shader_module(code=source)  # wgpu validates every function, used or not, and raises


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_repack_shape_and_word_alignment(t):
    elems, words = LAYOUT[t]
    ggml_elems, size = GGML_QUANT_SIZES[t]
    assert elems == (32 if ggml_elems == 1 else ggml_elems)
    block_bytes = elems * size // ggml_elems
    assert block_bytes <= 4 * words < block_bytes + 4  # pads only up to the next word
    raw = make_raw(t, "random-model-d", np.random.default_rng(0))
    out = repack(t, raw)
    assert out.dtype == np.uint32 and out.shape == (ROWS, COLS // elems * words)
    # a pure permutation plus zero padding: same bytes, as many zeros more as padding was added
    pad = 4 * words - block_bytes
    got, src = np.sort(out.view(np.uint8).ravel()), np.sort(raw.ravel())
    assert np.array_equal(got[got.size - src.size :], src) and not got[: got.size - src.size].any()
    assert pad == 0 or not out.view(np.uint8).reshape(-1, 4 * words)[:, block_bytes:].any()


@pytest.mark.parametrize("t,quant_bytes", [(T.Q4_0, 16), (T.Q5_0, 20), (T.Q8_0, 32), (T.IQ4_NL, 16)])
def test_repack_moves_leading_d_behind_the_quants(t, quant_bytes):
    raw = make_raw(t, "random-model-d", np.random.default_rng(1))
    blocks = raw.reshape(-1, GGML_QUANT_SIZES[t][1])
    out = repack(t, raw).view(np.uint8).reshape(len(blocks), -1)
    assert np.array_equal(out[:, :quant_bytes], blocks[:, 2:])
    assert np.array_equal(out[:, quant_bytes : quant_bytes + 2], blocks[:, :2])


def test_repack_of_a_word_aligned_block_is_a_view():
    raw = make_raw(T.Q4_K, "random-model-d", np.random.default_rng(2))
    assert np.shares_memory(repack(T.Q4_K, raw), raw)


def test_repack_rejects_what_it_cannot_lay_out():
    with pytest.raises(ValueError, match="no WebGPU layout"):
        repack(int(T.IQ2_XXS), np.zeros((1, 66), np.uint8))
    with pytest.raises(ValueError, match="whole number"):
        repack(int(T.Q4_0), np.zeros((1, 19), np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        repack(int(T.Q4_0), np.zeros((1, 18), np.int8))
