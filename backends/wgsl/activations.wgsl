// Activations rounded as ggml-cpu quantizes them for its dot products (type_traits_cpu vec_dot_type), so a
// device matmul multiplies the same values as the CPU backends and the reference: Q8_0 / Q8_1 blocks of 32
// (ggml-quants.c quantize_row_q8_0: d = amax / 127, q = round(x * 127 / amax)), Q8_K blocks of 256
// (quantize_row_q8_K: the signed value of largest magnitude, iscale = -127 / max), f16 and bf16. XR gets
// the dequantized values d * q; for Q8_1 (Q4_1 / Q5_1 weights) CORR gets, per block, how ggml's
// precomputed f16(d * sum q) differs from f16(d) * sum q (reference.py ReferenceBackend.matmul).
// One invocation per block.

struct Params {
    n_blocks: u32,
    gx: u32,
    zero: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> XR: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read_write> CORR: array<f32>;

fn block_index(gid: vec3<u32>) -> u32 {
    return gid.y * p.gx + gid.x;
}

fn q8_32(b: u32) -> vec2<f32> {  // (d, sum of q) of block b, XR written
    let base = b * 32u;
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs(X[base + j]));
    }
    let d = amax / 127.0;
    var inv = 0.0;
    if (amax > 0.0) {
        inv = 127.0 / amax;
    }
    let d16 = f16_round(d);
    var sq = 0.0;
    for (var j = 0u; j < 32u; j++) {
        let q = round(opaque(X[base + j] * inv, p.zero));
        XR[base + j] = d16 * q;
        sq += q;
    }
    return vec2<f32>(d, sq);
}

@compute @workgroup_size(64)
fn q8_0(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = block_index(gid);
    if (b < p.n_blocks) {
        _ = q8_32(b);
    }
}

@compute @workgroup_size(64)
fn q8_1(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = block_index(gid);
    if (b < p.n_blocks) {
        let r = q8_32(b);
        CORR[b] = f16_round(opaque(r.x * r.y, p.zero)) - opaque(f16_round(r.x) * r.y, p.zero);
    }
}

@compute @workgroup_size(64)
fn q8_k(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = block_index(gid);
    if (b >= p.n_blocks) {
        return;
    }
    let base = b * 256u;
    var amax = -1.0;
    var vmax = 0.0;
    for (var j = 0u; j < 256u; j++) {
        let x = X[base + j];
        if (abs(x) > amax) {  // the first of equal magnitudes, as numpy's argmax
            amax = abs(x);
            vmax = x;
        }
    }
    var iscale = 0.0;
    if (vmax != 0.0) {
        iscale = -127.0 / vmax;
    }
    var d = 0.0;
    if (iscale != 0.0) {
        d = 1.0 / iscale;
    }
    for (var j = 0u; j < 256u; j++) {
        let q = min(127.0, round(opaque(iscale * X[base + j], p.zero)));
        XR[base + j] = d * q;
    }
}

@compute @workgroup_size(64)
fn f16(@builtin(global_invocation_id) gid: vec3<u32>) {  // one invocation per 32 values
    let b = block_index(gid);
    if (b < p.n_blocks) {
        for (var j = b * 32u; j < b * 32u + 32u; j++) {
            XR[j] = f16_round(X[j]);
        }
    }
}

@compute @workgroup_size(64)
fn bf16(@builtin(global_invocation_id) gid: vec3<u32>) {  // ggml_compute_fp32_to_bf16, nearest even
    let b = block_index(gid);
    if (b < p.n_blocks) {
        for (var j = b * 32u; j < b * 32u + 32u; j++) {
            let x = X[j];
            let u = bitcast<u32>(x);
            var r = ((u + 0x7FFFu + ((u >> 16u) & 1u)) >> 16u) << 16u;
            if (x != x) {
                r = u;
            }
            XR[j] = bitcast<f32>(r);
        }
    }
}
