// RMSNorm over the last axis, mirroring ggml-cpu ops.cpp ggml_compute_forward_rms_norm_f32 as the reference
// backend computes it (ggml-vulkan's rms_norm.comp has the same shape but sums in float): the mean of
// squares in double (here an exact double-float sum), scale = 1 / sqrt(float(mean + eps)), y = x * scale,
// then y * weight. One workgroup per row.

struct Params {
    rows: u32,
    n: u32,       // row length
    has_w: u32,
    gx: u32,      // workgroups along x (rows may span a 2-D grid)
    eps_hi: f32,  // eps as a double-float
    eps_lo: f32,
    zero: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read> Wt: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const WG: u32 = 64u;
var<workgroup> partial: array<vec2<f32>, WG>;
var<workgroup> row_scale: f32;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * p.gx + wid.x;
    if (row >= p.rows) {
        return;
    }
    let z = p.zero;
    let base = row * p.n;
    var acc = vec2<f32>(0.0, 0.0);
    for (var i = lid; i < p.n; i += WG) {
        let t = square_terms(X[base + i]);
        acc = df_add_f(acc, t.x, z);
        acc = df_add_f(acc, t.y, z);
        acc = df_add_f(acc, t.z, z);
    }
    partial[lid] = acc;
    workgroupBarrier();
    if (lid == 0u) {
        var s = partial[0];
        for (var j = 1u; j < WG; j++) {
            s = df_add(s, partial[j], z);
        }
        // mean = s / n in double-float: q1 + (s - q1 * n) / n, the product split into exact terms
        let k = f32(p.n);
        let q1 = s.x / k;
        let t = times_int_terms(q1, k);
        var r = df_add_f(s, -t.x, z);
        r = df_add_f(r, -t.y, z);
        r = df_add_f(r, -t.z, z);
        let q2 = (r.x + r.y) / k;
        let m = df_add(two_sum(q1, q2, z), vec2<f32>(p.eps_hi, p.eps_lo), z);
        row_scale = 1.0 / opaque(sqrt(m.x + m.y), z);
    }
    workgroupBarrier();
    let sc = row_scale;
    for (var i = lid; i < p.n; i += WG) {
        var y = opaque(X[base + i] * sc, z);
        if (p.has_w != 0u) {
            y = y * Wt[i];
        }
        Y[base + i] = y;
    }
}
