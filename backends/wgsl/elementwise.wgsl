// Elementwise ops over float32 arrays, one invocation per output element (ggml-cpu vec.h / ggml-vulkan
// add.comp, scale.comp, swiglu.comp, geglu.comp, get_rows.comp). SwiGLU uses common.wgsl's Cephes exp, as
// the native backend does; GeGLU looks GELU up by the f16 bits of the gate, as ggml does under
// GGML_GELU_FP16 (0 below -10, identity above 10).

struct Params {
    n: u32,       // output elements
    b_len: u32,   // add: elements of B (B repeats over A when it is one row)
    cols: u32,    // columns / take_rows: row length of A
    start: u32,   // columns: first column taken
    width: u32,   // columns: columns taken
    gx: u32,      // invocations along x
    f: f32,       // scale: factor; softcap: cap
    zero: u32,
}

@group(0) @binding(0) var<storage, read> A: array<f32>;
@group(0) @binding(1) var<storage, read> B: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read> GELU: array<f32>;  // ggml's f16 GELU table, widened
@group(0) @binding(5) var<storage, read> IDX: array<i32>;

fn index(gid: vec3<u32>) -> u32 {
    return gid.y * p.gx + gid.x;
}

@compute @workgroup_size(64)
fn silu_mul(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i >= p.n) {
        return;
    }
    let g = A[i];
    let e = exp_cephes(-g, p.zero);
    Y[i] = opaque(g / (1.0 + e), p.zero) * B[i];
}

@compute @workgroup_size(64)
fn gelu_mul(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i >= p.n) {
        return;
    }
    let g = A[i];
    var v = GELU[pack2x16float(vec2<f32>(g, 0.0)) & 0xFFFFu];
    if (g <= -10.0) {
        v = 0.0;
    } else if (g >= 10.0) {
        v = g;
    }
    Y[i] = v * B[i];
}

@compute @workgroup_size(64)
fn add(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i >= p.n) {
        return;
    }
    Y[i] = A[i] + B[i % p.b_len];
}

@compute @workgroup_size(64)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i >= p.n) {
        return;
    }
    Y[i] = A[i] * p.f;
}

@compute @workgroup_size(64)
fn softcap(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i >= p.n) {
        return;
    }
    Y[i] = p.f * tanh_cephes(A[i] / p.f, p.zero);
}

@compute @workgroup_size(64)
fn columns(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i >= p.n) {
        return;
    }
    let r = i / p.width;
    Y[i] = A[r * p.cols + p.start + i % p.width];
}

@compute @workgroup_size(64)
fn take_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i >= p.n) {
        return;
    }
    Y[i] = A[u32(IDX[i / p.cols]) * p.cols + i % p.cols];
}
