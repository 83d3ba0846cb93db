// Attention over the paged float16 KV cache (the layout of edgellm/backends/paged_kv.py, on the device):
// position t of sequence s lives at slot TABLE[s * tw + t / bs] * bs + t % bs of a layer's K and V
// (slot-major, Hkv heads of Dh values, two f16 per u32). `store` writes every row's k and v first;
// `attend` then computes, per (token, kv head, group of up to 8 query heads), the reference backend's
// numbers (reference.py ReferenceBackend.attention, after ggml-cpu's f16 flash path): q rounded to f16,
// q.k * scale, optional softcap c * tanh(s / c), softmax with common.wgsl's exp and an exact sum, weights
// rounded to f16 before their product with V. Mirrors ggml-vulkan flash_attn.comp's GQA grouping.

struct Params {
    n_tok: u32,
    n_head: u32,
    hkv: u32,
    dh: u32,
    bs: u32,      // positions per KV block
    tw: u32,      // block table width (blocks per sequence)
    window: u32,  // 0: attend to every earlier position
    gx: u32,
    scale: f32,
    softcap: f32,  // 0: none
    zero: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> SEQ: array<i32>;
@group(0) @binding(1) var<storage, read> POS: array<i32>;
@group(0) @binding(2) var<storage, read> TABLE: array<i32>;
@group(0) @binding(3) var<uniform> p: Params;

fn slot_of(seq: u32, t: u32) -> u32 {
    return u32(TABLE[seq * p.tw + t / p.bs]) * p.bs + t % p.bs;
}

// ---- store ----
@group(0) @binding(4) var<storage, read> KIN: array<f32>;
@group(0) @binding(5) var<storage, read> VIN: array<f32>;
@group(0) @binding(6) var<storage, read_write> KC: array<u32>;
@group(0) @binding(7) var<storage, read_write> VC: array<u32>;

@compute @workgroup_size(64)
fn store(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half = p.dh / 2u;
    let idx = gid.y * p.gx + gid.x;  // (token, kv head, pair)
    if (idx >= p.n_tok * p.hkv * half) {
        return;
    }
    let j = idx % half;
    let th = idx / half;
    let tok = th / p.hkv;
    let h = th % p.hkv;
    let slot = slot_of(u32(SEQ[tok]), u32(POS[tok]));
    let src = th * p.dh + 2u * j;
    let dst = (slot * p.hkv + h) * half + j;
    KC[dst] = pack2x16float(vec2<f32>(KIN[src], KIN[src + 1u]));
    VC[dst] = pack2x16float(vec2<f32>(VIN[src], VIN[src + 1u]));
}

// ---- attend ----
@group(0) @binding(4) var<storage, read> Q: array<f32>;
@group(0) @binding(5) var<storage, read> KC: array<u32>;
@group(0) @binding(6) var<storage, read> VC: array<u32>;
@group(0) @binding(7) var<storage, read_write> O: array<f32>;

const WG: u32 = 64u;
const GMAX: u32 = 8u;     // query heads per workgroup
const DMAX: u32 = 256u;   // head width
var<workgroup> qs: array<f32, 2048>;            // GMAX * DMAX, f16-rounded queries
var<workgroup> wts: array<f32, 512>;            // GMAX * WG weights of one tile of positions
var<workgroup> red: array<vec2<f32>, 512>;      // GMAX * WG partial maxima / double-float sums
var<workgroup> stat: array<vec2<f32>, 8>;       // per head: (max, sum)

// q . k as the native backend sums it (native/runtime/attention.c qk): 8 lanes, lane l taking elements
// l, l + 8, ... (each product rounded, then added), combined ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
fn score(g: u32, slot: u32, h: u32) -> f32 {
    let kb = (slot * p.hkv + h) * (p.dh / 2u);
    let z = p.zero;
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    for (var j = 0u; j < p.dh / 8u; j++) {
        let qb = g * DMAX + 8u * j;
        let k0 = vec4<f32>(unpack2x16float(KC[kb + 4u * j]), unpack2x16float(KC[kb + 4u * j + 1u]));
        let k1 = vec4<f32>(unpack2x16float(KC[kb + 4u * j + 2u]), unpack2x16float(KC[kb + 4u * j + 3u]));
        a += opaque4(vec4<f32>(qs[qb], qs[qb + 1u], qs[qb + 2u], qs[qb + 3u]) * k0, z);
        b += opaque4(vec4<f32>(qs[qb + 4u], qs[qb + 5u], qs[qb + 6u], qs[qb + 7u]) * k1, z);
    }
    var s = opaque(opaque(a.x + a.y, z) + opaque(a.z + a.w, z), z);
    s = s + opaque(opaque(b.x + b.y, z) + opaque(b.z + b.w, z), z);
    s = s * p.scale;
    if (p.softcap > 0.0) {
        s = p.softcap * tanh_cephes(s / p.softcap, p.zero);
    }
    return s;
}

@compute @workgroup_size(64)
fn attend(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let th = wid.y * p.gx + wid.x;  // (token, kv head)
    if (th >= p.n_tok * p.hkv) {
        return;
    }
    let tok = th / p.hkv;
    let h = th % p.hkv;
    let group = p.n_head / p.hkv;
    let g0 = wid.z * GMAX;
    let ng = min(GMAX, group - g0);
    let seq = u32(SEQ[tok]);
    let pos = u32(POS[tok]);
    var lo = 0u;
    if (p.window > 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
    let n_pos = pos + 1u - lo;
    let z = p.zero;
    for (var i = lid; i < ng * p.dh; i += WG) {
        let g = i / p.dh;
        let d = i % p.dh;
        qs[g * DMAX + d] = f16_round(Q[(tok * p.n_head + h * group + g0 + g) * p.dh + d]);
    }
    workgroupBarrier();
    // pass 1: each head's largest score
    var m: array<f32, GMAX>;
    for (var g = 0u; g < GMAX; g++) {
        m[g] = -3.4e38;
    }
    for (var t = lo + lid; t <= pos; t += WG) {
        let slot = slot_of(seq, t);
        for (var g = 0u; g < ng; g++) {
            m[g] = max(m[g], score(g, slot, h));
        }
    }
    for (var g = 0u; g < GMAX; g++) {
        red[g * WG + lid] = vec2<f32>(m[g], 0.0);
    }
    workgroupBarrier();
    if (lid < ng) {
        var mx = -3.4e38;
        for (var j = 0u; j < WG; j++) {
            mx = max(mx, red[lid * WG + j].x);
        }
        stat[lid] = vec2<f32>(mx, 0.0);
    }
    workgroupBarrier();
    // pass 2: the sums of exp(s - max), exact
    var sums: array<vec2<f32>, GMAX>;
    for (var t = lo + lid; t <= pos; t += WG) {
        let slot = slot_of(seq, t);
        for (var g = 0u; g < ng; g++) {
            sums[g] = df_add_f(sums[g], exp_cephes(score(g, slot, h) - stat[g].x, z), z);
        }
    }
    for (var g = 0u; g < GMAX; g++) {
        red[g * WG + lid] = sums[g];
    }
    workgroupBarrier();
    if (lid < ng) {
        var s = vec2<f32>(0.0, 0.0);
        for (var j = 0u; j < WG; j++) {
            s = df_add(s, red[lid * WG + j], z);
        }
        stat[lid] = vec2<f32>(stat[lid].x, s.x + s.y);
    }
    workgroupBarrier();
    // pass 3: tiles of WG positions; each invocation owns dimensions lid, lid + WG, ... of every head
    let half = p.dh / 2u;
    var acc: array<f32, 32>;  // GMAX heads x DMAX / WG dimensions
    for (var t0 = lo; t0 <= pos; t0 += WG) {
        let t = t0 + lid;
        for (var g = 0u; g < GMAX; g++) {
            var w = 0.0;
            if (t <= pos && g < ng) {
                let e = exp_cephes(score(g, slot_of(seq, t), h) - stat[g].x, z);
                w = f16_round(e / stat[g].y);
            }
            wts[g * WG + lid] = w;
        }
        workgroupBarrier();
        let n_t = min(WG, pos + 1u - t0);
        for (var j = 0u; j < n_t; j++) {
            let vb = (slot_of(seq, t0 + j) * p.hkv + h) * p.dh;
            for (var c = 0u; c < 4u; c++) {
                let d = lid + c * WG;
                if (d < p.dh) {
                    let v = unpack2x16float(VC[(vb + d) / 2u])[d % 2u];
                    for (var g = 0u; g < ng; g++) {
                        acc[g * 4u + c] += opaque(wts[g * WG + j] * v, z);
                    }
                }
            }
        }
        workgroupBarrier();
    }
    for (var c = 0u; c < 4u; c++) {
        let d = lid + c * WG;
        if (d < p.dh) {
            for (var g = 0u; g < ng; g++) {
                O[(tok * p.n_head + h * group + g0 + g) * p.dh + d] = acc[g * 4u + c];
            }
        }
    }
}
