// Greedy sampling on the device: each row's argmax (the first maximum), or -1 when the row's maximum is
// not finite or a NaN appears (base.greedy_ids). One workgroup per row; only B ids go to the host.
// Mirrors ggml-vulkan argmax.comp (a shared-memory reduction of (value, index) pairs).

struct Params {
    rows: u32,
    n: u32,
    gx: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> L: array<f32>;
@group(0) @binding(1) var<storage, read_write> IDS: array<i32>;
@group(0) @binding(2) var<uniform> p: Params;

const WG: u32 = 64u;
var<workgroup> best: array<f32, WG>;
var<workgroup> where_: array<u32, WG>;
var<workgroup> bad: array<u32, WG>;

@compute @workgroup_size(64)
fn argmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * p.gx + wid.x;
    if (row >= p.rows) {
        return;
    }
    var m = -3.4028235e38;
    var at = 0xFFFFFFFFu;
    var nan = 0u;
    for (var i = lid; i < p.n; i += WG) {
        let v = L[row * p.n + i];
        if (v != v) {
            nan = 1u;
        } else if (v > m || at == 0xFFFFFFFFu) {
            m = v;
            at = i;
        }
    }
    best[lid] = m;
    where_[lid] = at;
    bad[lid] = nan;
    workgroupBarrier();
    if (lid == 0u) {
        var bm = best[0];
        var bi = where_[0];
        var anybad = bad[0];
        for (var j = 1u; j < WG; j++) {
            anybad |= bad[j];
            let wj = where_[j];
            if (wj != 0xFFFFFFFFu && (bi == 0xFFFFFFFFu || best[j] > bm || (best[j] == bm && wj < bi))) {
                bm = best[j];
                bi = wj;
            }
        }
        var out = i32(bi);
        if (anybad != 0u || abs(bm) > 3.4028235e38 || bi == 0xFFFFFFFFu) {
            out = -1;
        }
        IDS[row] = out;
    }
}
