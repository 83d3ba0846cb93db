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
var<workgroup> red: array<f32, 2048>;  // R * NT * WG partial sums (TPR > 1)

// TPR invocations share a row (striding over its quads, then summed through `red`): 16 on a GPU, for
// coalesced reads; 1 on a CPU driver (lavapipe), where a workgroup must carry many rows to pay for itself.
// Each invocation keeps R rows x NT tokens of scalar accumulators `acc_r_t`, written out by the driver:
// a dynamically indexed private array is slow or spilled on several drivers. With TPR = 1 the loop
// runs block by block, quads inside (a constant trip count the compiler unrolls, so a block's scale
// words are loaded once rather than once per quad).
const TPR: u32 = ${TPR}u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let sub = lid % TPR;
    let row0 = ((wid.y * p.gx + wid.x) * (WG / TPR) + lid / TPR) * R;
    let kq = p.k / 4u;
    let last_row = p.m - 1u;
    let last_tok = p.n - 1u;
    for (var n0 = 0u; n0 < p.n; n0 += NT) {
${DECLARE}
        if (row0 < p.m) {
${LOOP}
${BODY}
${END_LOOP}
        }
${FINISH}
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
