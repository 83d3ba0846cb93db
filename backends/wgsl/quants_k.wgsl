// 256-element K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): deq4_<type>(bw, q) = elements 4q .. 4q+3 of the
// repacked super-block starting at word bw of `var<storage, read> W: array<u32>`, which the including
// shader declares. Element order and float arithmetic follow gguf-py gguf/quants.py dequantize_blocks,
// so results are bit-exact with it; that mirrors ggml-org/llama.cpp ggml/src/ggml-quants.c
// dequantize_row_q2_K ... dequantize_row_q6_K (blocks: ggml/src/ggml-common.h; GPU form:
// ggml/src/ggml-vulkan/vulkan-shaders/dequant_funcs.glsl, dequant_q*_k.comp). Repacked layouts (byte
// offsets): edgellm/backends/webgpu_layout.py. Below e = 4q is the quad's first element; a quad never
// straddles a sub-block, so it shares one scale, and its 4 quants sit in the 4 bytes of one word.
//
// Why this holds on any GPU whose unpack2x16float is exact (subnormal halves included), not only the one
// tested: every product below is exact in f32 (an f16 d has 11 significant bits, a sub-block scale at
// most 7, a quant at most 6: 24 bits or fewer), so an element gets at most one rounding, in the final
// `- dmin * m`. A compiler fusing that into an fma or reassociating the products cannot change a result.

// Q2_K {scales[16] @0, qs[64] @16, d @80, dmin @82}: 16 sub-blocks of 16, x = (d * sc) * q - (dmin * m),
// sc / m the low / high nibble of scales[e / 16]; q = 2 bits of qs[32 * (e / 128) + e % 32] at
// shift 2 * ((e / 32) % 4).
fn deq4_q2_k(bw: u32, q: u32) -> vec4<f32> {
    let e = 4u * q;
    let dm = unpack2x16float(W[bw + 20u]);
    let sc = (W[bw + (e >> 6u)] >> (8u * ((e >> 4u) & 3u))) & 0xffu;
    let dl = dm.x * f32(sc & 15u);
    let ml = dm.y * f32(sc >> 4u);
    let w = W[bw + 4u + 8u * (e >> 7u) + (q & 7u)];
    let n = (vec4<u32>(w) >> (vec4<u32>(0u, 8u, 16u, 24u) + 2u * ((e >> 5u) & 3u))) & vec4<u32>(3u);
    return dl * vec4<f32>(n) - ml;
}

// Q3_K {hmask[32] @0, qs[64] @32, scales[12] @96, d @108}: 16 sub-blocks of 16, x = (d * sc) * q with
// sc = 6-bit scales[e / 16] - 32 (low 4 bits: nibble (i / 8) of byte i % 8, high 2 bits: bits 2 * (i / 4)
// of byte 8 + i % 4, i = e / 16), q = low 2 bits as in Q2_K minus 4 where hmask bit e / 32 of byte e % 32
// is clear.
fn deq4_q3_k(bw: u32, q: u32) -> vec4<f32> {
    let e = 4u * q;
    let i = e >> 4u;
    let d = unpack2x16float(W[bw + 27u]).x;
    let lo = (W[bw + 24u + ((i & 7u) >> 2u)] >> (8u * (i & 3u) + 4u * (i >> 3u))) & 15u;
    let hi = (W[bw + 26u] >> (8u * (i & 3u) + 2u * (i >> 2u))) & 3u;
    let dl = d * f32(i32(lo | (hi << 4u)) - 32);
    let sh = vec4<u32>(0u, 8u, 16u, 24u) + 2u * ((e >> 5u) & 3u);
    let ql = (vec4<u32>(W[bw + 8u + 8u * (e >> 7u) + (q & 7u)]) >> sh) & vec4<u32>(3u);
    let hm = (vec4<u32>(W[bw + (q & 7u)]) >> (vec4<u32>(0u, 8u, 16u, 24u) + (e >> 5u))) & vec4<u32>(1u);
    return dl * vec4<f32>(vec4<i32>(ql) - vec4<i32>((hm ^ vec4<u32>(1u)) << vec4<u32>(2u)));
}

// 6-bit scale and min of sub-block j (0..7) from the 12 scale bytes in words s0, s1, s2, as
// get_scale_min_k4 in ggml-quants.c: j < 4 low 6 bits of bytes j and j + 4; j >= 4 a nibble of
// byte j + 4 with the top 2 bits of bytes j - 4 and j.
fn q4_k_scale_min(s0: u32, s1: u32, s2: u32, j: u32) -> vec2<u32> {
    let b = 8u * (j & 3u);
    let a0 = (s0 >> b) & 0xffu;
    let a1 = (s1 >> b) & 0xffu;
    let a2 = (s2 >> b) & 0xffu;
    let low = vec2<u32>(a0 & 63u, a1 & 63u);
    let high = vec2<u32>((a2 & 15u) | ((a0 >> 6u) << 4u), (a2 >> 4u) | ((a1 >> 6u) << 4u));
    return select(low, high, j >= 4u);
}

// Q4_K and Q5_K's sub-block factors of element e: (d * sc, dmin * m)
fn q4_k_sub_block(bw: u32, e: u32) -> vec2<f32> {
    let dm = unpack2x16float(W[bw]);
    let sm = q4_k_scale_min(W[bw + 1u], W[bw + 2u], W[bw + 3u], e >> 5u);
    return vec2<f32>(dm.x * f32(sm.x), dm.y * f32(sm.y));
}

// Q4_K {d @0, dmin @2, scales[12] @4, qs[128] @16}: 8 sub-blocks of 32, x = (d * sc) * q - (dmin * m),
// q = nibble (e / 32) % 2 of qs[32 * (e / 64) + e % 32].
fn deq4_q4_k(bw: u32, q: u32) -> vec4<f32> {
    let e = 4u * q;
    let s = q4_k_sub_block(bw, e);  // (d * sc, dmin * m)
    let dl = s.x;
    let ml = s.y;
    let w = W[bw + 4u + 8u * (e >> 6u) + (q & 7u)];
    let n = (vec4<u32>(w) >> (vec4<u32>(0u, 8u, 16u, 24u) + 4u * ((e >> 5u) & 1u))) & vec4<u32>(15u);
    return dl * vec4<f32>(n) - ml;
}

// Q5_K {d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48}: as Q4_K with a fifth bit, bit e / 32
// of qh[e % 32].
fn deq4_q5_k(bw: u32, q: u32) -> vec4<f32> {
    let e = 4u * q;
    let s = q4_k_sub_block(bw, e);  // (d * sc, dmin * m)
    let dl = s.x;
    let ml = s.y;
    let sh = vec4<u32>(0u, 8u, 16u, 24u) + 4u * ((e >> 5u) & 1u);
    let lo = (vec4<u32>(W[bw + 12u + 8u * (e >> 6u) + (q & 7u)]) >> sh) & vec4<u32>(15u);
    let hi = (vec4<u32>(W[bw + 4u + (q & 7u)]) >> (vec4<u32>(0u, 8u, 16u, 24u) + (e >> 5u))) & vec4<u32>(1u);
    return dl * vec4<f32>(lo | (hi << vec4<u32>(4u))) - ml;
}

// Q6_K {ql[128] @0, qh[64] @128, scales[16] @192 (int8), d @208}: 16 sub-blocks of 16,
// x = (d * scales[e / 16]) * (q - 32), q = nibble (e / 64) % 2 of ql[64 * (e / 128) + e % 64] with
// 2 high bits at shift 2 * ((e / 32) % 4) of qh[32 * (e / 128) + e % 32].
fn deq4_q6_k(bw: u32, q: u32) -> vec4<f32> {
    let e = 4u * q;
    let d = unpack2x16float(W[bw + 52u]).x;
    let sc = bitcast<i32>(W[bw + 48u + (e >> 6u)] << (24u - 8u * ((e >> 4u) & 3u))) >> 24u;
    let dl = d * f32(sc);
    let bytes = vec4<u32>(0u, 8u, 16u, 24u);
    let ql = W[bw + 16u * (e >> 7u) + (q & 15u)];
    let qh = W[bw + 32u + 8u * (e >> 7u) + (q & 7u)];
    let lo = (vec4<u32>(ql) >> (bytes + 4u * ((e >> 6u) & 1u))) & vec4<u32>(15u);
    let hi = (vec4<u32>(qh) >> (bytes + 2u * ((e >> 5u) & 3u))) & vec4<u32>(3u);
    return dl * vec4<f32>(vec4<i32>(lo | (hi << vec4<u32>(4u))) - vec4<i32>(32));
}
