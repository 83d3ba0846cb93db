// Helpers every edgellm kernel may use (prepended to each shader).
//
// `opaque(x)` hides a value from the shader compiler's algebra: shader compilers may fuse a*b + c into an
// FMA or simplify (a + b) - a, which changes float32 bits. Passing an operand through opaque() (an OR with
// a uniform that holds 0) keeps each operation rounded on its own, as numpy and the C kernels round it.

fn opaque(x: f32, zero: u32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) | zero);
}

fn opaque4(x: vec4<f32>, zero: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(bitcast<vec4<u32>>(x) | vec4<u32>(zero));
}

// float32 -> float16 -> float32, round to nearest even (what ggml's FP32_TO_FP16 does)
fn f16_round(x: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

// Cephes' expf, the native backend's exp (native/runtime/vmath.c exp_c): the same operations in the same
// order, each rounded on its own, so the same bits as the CPU's SiLU and softmax.
fn exp_cephes(x_in: f32, zero: u32) -> f32 {
    let x = clamp(x_in, -87.3, 88.7);
    let n = floor(opaque(x * 1.44269504088896341, zero) + 0.5);
    var r = x - opaque(n * 0.693359375, zero);
    r = r - opaque(n * -2.12194440e-4, zero);
    let z = opaque(r * r, zero);
    var y = 1.9875691500e-4;
    y = opaque(y * r, zero) + 1.3981999507e-3;
    y = opaque(y * r, zero) + 8.3334519073e-3;
    y = opaque(y * r, zero) + 4.1665795894e-2;
    y = opaque(y * r, zero) + 1.6666665459e-1;
    y = opaque(y * r, zero) + 5.0000001201e-1;
    y = opaque(y * z, zero) + r;
    y = y + 1.0;
    return y * bitcast<f32>(u32(i32(n) + 127) << 23u);
}

// double-float arithmetic (a value as hi + lo): exact sums of float32 terms, for the reductions the
// reference backend does in float64
fn two_sum(a: f32, b: f32, zero: u32) -> vec2<f32> {
    let s = opaque(a + b, zero);
    let bb = opaque(s - a, zero);
    let e = (a - opaque(s - bb, zero)) + (b - bb);
    return vec2<f32>(s, e);
}

fn df_add_f(a: vec2<f32>, b: f32, zero: u32) -> vec2<f32> {
    let s = two_sum(a.x, b, zero);
    return two_sum(s.x, s.y + a.y, zero);
}

fn df_add(a: vec2<f32>, b: vec2<f32>, zero: u32) -> vec2<f32> {
    let s = two_sum(a.x, b.x, zero);
    return two_sum(s.x, s.y + (a.y + b.y), zero);
}

// x * x as three exactly representable float32 terms (x = hi + lo, hi its top 12 significand bits)
fn square_terms(x: f32) -> vec3<f32> {
    let hi = bitcast<f32>(bitcast<u32>(x) & 0xFFFFF000u);
    let lo = x - hi;
    return vec3<f32>(hi * hi, 2.0 * hi * lo, lo * lo);
}

// f * k exactly as three float32 terms, for an integer k < 2^16 (f split into 8-bit significand pieces)
fn times_int_terms(f: f32, k: f32) -> vec3<f32> {
    let a = bitcast<f32>(bitcast<u32>(f) & 0xFFFF0000u);
    let rest = f - a;
    let b = bitcast<f32>(bitcast<u32>(rest) & 0xFFFF0000u);
    let c = rest - b;
    return vec3<f32>(a * k, b * k, c * k);
}

// Cephes' tanhf (exp_cephes beyond |x| >= 0.625, an odd polynomial below): within a few ulp everywhere,
// where some drivers' tanh loses digits near 0.
fn tanh_cephes(x: f32, zero: u32) -> f32 {
    let a = abs(x);
    if (a >= 0.625) {
        let s = exp_cephes(a + a, zero);
        var t = 1.0 - 2.0 / (s + 1.0);
        if (a > 44.0) {
            t = 1.0;
        }
        return select(t, -t, x < 0.0);
    }
    let s = opaque(x * x, zero);
    var y = -5.70498872745e-3;
    y = opaque(y * s, zero) + 2.06390887954e-2;
    y = opaque(y * s, zero) - 5.37397155531e-2;
    y = opaque(y * s, zero) + 1.33314422036e-1;
    y = opaque(y * s, zero) - 3.33332819422e-1;
    return opaque(opaque(y * s, zero) * x, zero) + x;
}
