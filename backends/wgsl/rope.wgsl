// RoPE, ggml's modes 0 (normal: pairs 2i, 2i+1) and 2 (neox: pairs i, i + n_dims/2), mirroring ggml-cpu
// ops.cpp rope_yarn / ggml-vulkan rope_norm.comp, rope_neox.comp. The cos/sin table is the host's
// base.rope_table (float32, one row per position), so the device rotates by the very same values.
// One invocation per (token, head, pair); dimensions past n_dims are copied.

struct Params {
    n_tok: u32,
    heads: u32,
    dh: u32,
    n_dims: u32,
    neox: u32,
    gx: u32,     // invocations along x (64 per workgroup)
    zero: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> POS: array<i32>;
@group(0) @binding(2) var<storage, read> COS: array<f32>;  // (positions, n_dims / 2)
@group(0) @binding(3) var<storage, read> SIN: array<f32>;
@group(0) @binding(4) var<storage, read_write> Y: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half_dh = p.dh / 2u;
    let idx = gid.y * p.gx + gid.x;  // (token, head, pair of the head's dh / 2)
    if (idx >= p.n_tok * p.heads * half_dh) {
        return;
    }
    let i = idx % half_dh;
    let th = idx / half_dh;  // token * heads + head
    let tok = th / p.heads;
    let base = th * p.dh;
    let half = p.n_dims / 2u;
    if (i >= half) {  // not rotated: copy the pair of dimensions this invocation stands for
        let d = 2u * i;
        Y[base + d] = X[base + d];
        Y[base + d + 1u] = X[base + d + 1u];
        return;
    }
    var ia = 2u * i;
    var ib = 2u * i + 1u;
    if (p.neox != 0u) {
        ia = i;
        ib = i + half;
    }
    let t = u32(POS[tok]) * half + i;
    let c = COS[t];
    let s = SIN[t];
    let a = X[base + ia];
    let b = X[base + ib];
    let z = p.zero;
    Y[base + ia] = opaque(a * c, z) - opaque(b * s, z);
    Y[base + ib] = opaque(a * s, z) + opaque(b * c, z);
}
