// Matmul y = x W^T and embedding rows for every weight format, instantiated per format: the driver
// (edgellm/backends/webgpu.py) prepends common.wgsl and the format's quants_*.wgsl, and replaces
// DEQ4 with the format's function and the R, NT, QPB, BW placeholders with numbers.
//
// The driver declares `@group(0) @binding(0) var<storage, read> W: array<u32>;` (the weight, read by the
// format's functions) and takes one of the two kernels below (split at the `// ----` lines).
//
// Mirrors ggml-vulkan's mul_mat_vec.comp in structure (a workgroup per group of rows, its invocations
// striding over the row's blocks, a shared-memory reduction at the end), with activations as ggml-cpu
// rounds them (activations.wgsl) so that the products are the CPU backends' products. NT tokens share
// each dequantized weight quad (prefill); R rows per workgroup.

// ---- matvec ----
struct Params {
    m: u32,          // rows of this weight chunk
    k: u32,          // row length
    n: u32,          // tokens
    row_words: u32,  // u32 words per repacked row
    gx: u32,         // workgroups along x
    ld: u32,         // Y's row stride (all the weight's rows)
    col0: u32,       // Y column of this chunk's first row
    zero: u32,
}

@group(0) @binding(1) var<storage, read> XR: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
//$CORR_BINDING

const WG: u32 = 64u;
const R: u32 = ${R}u;
const NT: u32 = ${NT}u;
const QPB: u32 = ${QPB}u;  // quads (4 values) per block
const BW: u32 = ${BW}u;    // words per repacked block
var<workgroup> red: array<f32, 2048>;  // R * NT * WG

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row0 = (wid.y * p.gx + wid.x) * R;
    if (row0 >= p.m) {
        return;
    }
    let kq = p.k / 4u;
    for (var n0 = 0u; n0 < p.n; n0 += NT) {
        var acc: array<f32, R * NT>;  // zeroed by hand: naga hoists a loop's local declarations
        for (var j = 0u; j < R * NT; j++) {
            acc[j] = 0.0;
        }
        for (var qi = lid; qi < kq; qi += WG) {
            let blk = qi / QPB;
            let q = qi % QPB;
            var xs: array<vec4<f32>, NT>;
            for (var t = 0u; t < NT; t++) {
                if (n0 + t < p.n) {
                    xs[t] = XR[(n0 + t) * kq + qi];
                }
            }
            for (var r = 0u; r < R; r++) {
                let row = row0 + r;
                if (row < p.m) {
                    let bw = row * p.row_words + blk * BW;
                    let w = DEQ4(bw, q);
                    for (var t = 0u; t < NT; t++) {
                        acc[r * NT + t] += dot(w, xs[t]);
                    }
                    //$MIN_TERM
                }
            }
        }
        for (var j = 0u; j < R * NT; j++) {
            red[j * WG + lid] = acc[j];
        }
        workgroupBarrier();
        if (lid < R * NT) {
            let r = lid / NT;
            let t = lid % NT;
            var s = 0.0;
            for (var j = 0u; j < WG; j++) {
                s += red[lid * WG + j];
            }
            if (row0 + r < p.m && n0 + t < p.n) {
                Y[(n0 + t) * p.ld + p.col0 + row0 + r] = s;
            }
        }
        workgroupBarrier();
    }
}

// ---- rows ----
// Embedding rows: Y row i = the dequantized weight row IDS[i] (when it lies in this chunk).
struct RowParams {
    n_ids: u32,
    k: u32,
    row_words: u32,
    row0: u32,   // the chunk's first row
    rows: u32,   // rows in the chunk
    gx: u32,
    zero: u32,
    _pad: u32,
}

const WG: u32 = 64u;
const QPB: u32 = ${QPB}u;
const BW: u32 = ${BW}u;
@group(0) @binding(1) var<storage, read> IDS: array<i32>;
@group(0) @binding(2) var<storage, read_write> Y4: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> rp: RowParams;

@compute @workgroup_size(64)
fn rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = wid.y * rp.gx + wid.x;
    if (i >= rp.n_ids) {
        return;
    }
    let id = IDS[i] - i32(rp.row0);
    if (id < 0 || id >= i32(rp.rows)) {
        return;
    }
    let kq = rp.k / 4u;
    for (var qi = lid; qi < kq; qi += WG) {
        Y4[i * kq + qi] = DEQ4(u32(id) * rp.row_words + (qi / QPB) * BW, qi % QPB);
    }
}
