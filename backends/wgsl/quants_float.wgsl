// Float weights (F32, F16, BF16) read as 32-element blocks of W, the deq4_* interface every weight type
// shares: deq4_<type>(bw, q) = elements 4q .. 4q+3 of the block starting at word bw of
// `var<storage, read> W: array<u32>`, which the including shader declares.
// Mirrors gguf-py gguf/quants.py dequantize (F16: astype(float32); BF16: int16 << 16 viewed as float32)
// and ggml-org/llama.cpp ggml/src/ggml-impl.h ggml_compute_bf16_to_fp32.
// Layout: edgellm/backends/webgpu_layout.py.

// F32: 32 words, one element each.
fn deq4_f32(bw: u32, q: u32) -> vec4<f32> {
    let i = bw + 4u * q;
    return bitcast<vec4<f32>>(vec4<u32>(W[i], W[i + 1u], W[i + 2u], W[i + 3u]));
}

// F16: 16 words, two halves each, low half first. f16 -> f32 is exact.
fn deq4_f16(bw: u32, q: u32) -> vec4<f32> {
    let i = bw + 2u * q;
    return vec4<f32>(unpack2x16float(W[i]), unpack2x16float(W[i + 1u]));
}

// BF16: 16 words, two halves each, low half first; a bf16 is the top half of its f32.
fn deq4_bf16(bw: u32, q: u32) -> vec4<f32> {
    let i = bw + 2u * q;
    let a = W[i];
    let b = W[i + 1u];
    return bitcast<vec4<f32>>(vec4<u32>(a << 16u, a & 0xffff0000u, b << 16u, b & 0xffff0000u));
}
