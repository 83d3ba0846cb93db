// 32-element legacy quants (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL): deq4_<type>(bw, q) = elements
// 4q .. 4q+3 of the repacked block starting at word bw of `var<storage, read> W: array<u32>`, which the
// including shader declares. Element order and float arithmetic follow gguf-py gguf/quants.py
// dequantize_blocks, so results are bit-exact with it; that mirrors ggml-org/llama.cpp
// ggml/src/ggml-quants.c dequantize_row_q4_0 ... dequantize_row_iq4_nl (blocks: ggml/src/ggml-common.h;
// GPU form: ggml/src/ggml-vulkan/vulkan-shaders/dequant_funcs.glsl). Repacked layouts (byte offsets):
// edgellm/backends/webgpu_layout.py.
//
// Why this holds on any GPU whose unpack2x16float is exact (subnormal halves included), not only the one
// tested: every product below is exact in f32 (an f16 d has 11 significant bits, a quant or codebook
// value at most 7), so an element gets at most one rounding, in Q4_1 / Q5_1's final `+ m`. A compiler
// fusing d * q + m into an fma cannot change a result.
//
// Nibble order in every 4-bit type: element j < 16 is the low nibble of qs[j], element j >= 16 the high
// nibble of qs[j - 16], so quad q reads qs word (q & 3) and shifts by 4 * (q >> 2).

// Q4_0 {qs[16] @0, d @16}: x = d * (nibble - 8).
fn deq4_q4_0(bw: u32, q: u32) -> vec4<f32> {
    let d = unpack2x16float(W[bw + 4u]).x;
    let n = (vec4<u32>(W[bw + (q & 3u)]) >> (vec4<u32>(0u, 8u, 16u, 24u) + 4u * (q >> 2u))) & vec4<u32>(15u);
    return d * vec4<f32>(vec4<i32>(n) - vec4<i32>(8));
}

// Q4_1 {d @0, m @2, qs[16] @4}: x = (d * nibble) + m.
fn deq4_q4_1(bw: u32, q: u32) -> vec4<f32> {
    let dm = unpack2x16float(W[bw]);
    let sh = vec4<u32>(0u, 8u, 16u, 24u) + 4u * (q >> 2u);
    let n = (vec4<u32>(W[bw + 1u + (q & 3u)]) >> sh) & vec4<u32>(15u);
    return dm.x * vec4<f32>(n) + dm.y;
}

// Q5_0 {qh[4] @0, qs[16] @4, d @20}: x = d * ((nibble | bit_j << 4) - 16), bit_j = bit j of qh as a u32.
fn deq4_q5_0(bw: u32, q: u32) -> vec4<f32> {
    let d = unpack2x16float(W[bw + 5u]).x;
    let sh = vec4<u32>(0u, 8u, 16u, 24u) + 4u * (q >> 2u);
    let lo = (vec4<u32>(W[bw + 1u + (q & 3u)]) >> sh) & vec4<u32>(15u);
    let hi = (vec4<u32>(W[bw]) >> (vec4<u32>(0u, 1u, 2u, 3u) + 4u * q)) & vec4<u32>(1u);
    return d * vec4<f32>(vec4<i32>(lo | (hi << vec4<u32>(4u))) - vec4<i32>(16));
}

// Q5_1 {d @0, m @2, qh[4] @4, qs[16] @8}: x = (d * (nibble | bit_j << 4)) + m.
fn deq4_q5_1(bw: u32, q: u32) -> vec4<f32> {
    let dm = unpack2x16float(W[bw]);
    let sh = vec4<u32>(0u, 8u, 16u, 24u) + 4u * (q >> 2u);
    let lo = (vec4<u32>(W[bw + 2u + (q & 3u)]) >> sh) & vec4<u32>(15u);
    let hi = (vec4<u32>(W[bw + 1u]) >> (vec4<u32>(0u, 1u, 2u, 3u) + 4u * q)) & vec4<u32>(1u);
    return dm.x * vec4<f32>(lo | (hi << vec4<u32>(4u))) + dm.y;
}

// Q8_0 {qs[32] @0 (int8), d @32}: x = q * d.
fn deq4_q8_0(bw: u32, q: u32) -> vec4<f32> {
    let d = unpack2x16float(W[bw + 8u]).x;
    // move byte k to the top, then an arithmetic shift sign-extends it
    let s = bitcast<vec4<i32>>(vec4<u32>(W[bw + q]) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u);
    return vec4<f32>(s) * d;
}

// IQ4_NL codebook kvalues_iq4nl (ggml-common.h) as int8 bytes: word i holds entries 4i .. 4i+3.
const IQ4NL_K0: u32 = 0xbfad9881u; // -127, -104, -83, -65
const IQ4NL_K1: u32 = 0xf6eaddcfu; //  -49,  -35, -22, -10
const IQ4NL_K2: u32 = 0x26190d01u; //    1,   13,  25,  38
const IQ4NL_K3: u32 = 0x71594535u; //   53,   69,  89, 113

// IQ4_NL {qs[16] @0, d @16}: x = d * kvalues[nibble]. The table lookup is two selects on the nibble's
// top bits and a byte extract, so it needs no dynamically indexed array.
fn deq4_iq4_nl(bw: u32, q: u32) -> vec4<f32> {
    let d = unpack2x16float(W[bw + 4u]).x;
    let n = (vec4<u32>(W[bw + (q & 3u)]) >> (vec4<u32>(0u, 8u, 16u, 24u) + 4u * (q >> 2u))) & vec4<u32>(15u);
    let b2 = (n & vec4<u32>(4u)) != vec4<u32>(0u);
    let word = select(
        select(vec4<u32>(IQ4NL_K0), vec4<u32>(IQ4NL_K1), b2),
        select(vec4<u32>(IQ4NL_K2), vec4<u32>(IQ4NL_K3), b2),
        (n & vec4<u32>(8u)) != vec4<u32>(0u),
    );
    let k = bitcast<vec4<i32>>(word << (vec4<u32>(24u) - 8u * (n & vec4<u32>(3u)))) >> vec4<u32>(24u);
    return d * vec4<f32>(k);
}
