// matmul_quant.wgsl: y[r, n] (+)= sum_k x[r, k] * W[k, n] with W kept as GGML blocks (Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) and dequantized while multiplying. Same roles as matmul.wgsl
// (decode GEMV, verify, prefill).
//
// Bindings (group 0):
//   0 uniform  Params (dynamic offset; the same struct as matmul.wgsl)
//   1 storage  x: array<f32>, row r starts at x_offset + r * x_stride
//   2 storage  w: one column chunk as array<vec4<u32>>: one GROUP per (block g of the type's 32 or
//              256 values, 16-column block blk) at group index g * (wcols / 16) + blk, V4 vec4 (WORDS
//              u32) per group (quant.rs gpu_group_words / pack_gpu). A block is SB 32-value units.
//                quants  word (s * QW + j) * 16 + c for unit s, column c (0..16) of the group, j in 0..QW:
//                        Q8_0 (QW = 8): word j = values 4j..4j+3 as i8 (value 4j+e in byte e);
//                        else (QW = 4): word j = values 8j..8j+7 as nibbles (value 8j+e at bits 4e).
//                high    (HW > 0) from word 16 * SB * QW: word (s * HW + h) * 16 + c. Q5_x (HW = 1):
//                        bit i = bit 4 of value i; Q6_K (HW = 2): word h, bits 2 (i % 16) = bits 4..5
//                        of value i = 16 h + i % 16.
//                scales  from word SC = 16 * SB * (QW + HW):
//                        32-value types: d, 8 words of f16 pairs (column c in word c / 2, low half for
//                        even c); Q4_1 / Q5_1: then m, 8 more words, same packing.
//                        K-quants: per unit s 8 words of 16-bit fields (column c in word s * 8 + c / 2):
//                        Q4_K / Q5_K sc | m << 8 (6 bits each), Q6_K the i8 scales of values 0..16 and
//                        16..32; then 16 words, one per column: f16 d | f16 dmin << 16.
//              Columns past `cols` are zero blocks (d = 0). quant.rs writes this layout.
//              TEXTURE variant (CPU adapters): texels of a texture_2d<u32> read as one linear array
//              (texel i at (i & (W-1), i >> TEX_SHIFT)); within each block-row g the groups are
//              interleaved in runs of 8 (wcols / 16 is a multiple of 8): vec4 x of group blk is texel
//              ((g * wcols / 128 + blk / 8) * V4 + x) * 8 + blk % 8, so 8 neighbouring invocations read
//              8 neighbouring texels (tensor.rs interleave_groups).
//   3 storage  w_up (GLU variant only): the up projection, same layout
//   3/4 storage y: array<f32>, row r column (col0 + c) at y_offset + r * y_stride + col0 + c
//   5 storage  norm_w (NORM only): array<f32>, the k RMSNorm weights of x's rows
//   X4 variant: x read as vec4s (x_offset, x_stride and k multiples of 4; in a uniform window too),
//              four inputs of a row per load.
//   X_UNIFORM variant (CPU adapters): x is a uniform window of X_WINDOW vec4s (x_offset counts from
//              the window's start) and norm_w a uniform array of NORM_WINDOW = k / 4 vec4s. llvmpipe
//              gathers uniform words branch-free but loads storage words in a per-lane loop of
//              branches; every lane reads the same x, so the input loads cost far less this way.
// Defines: Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q4_K | Q5_K | Q6_K, ROWS (1 for decode, else up to
// MATMUL_QUANT_ROWS = 8, balanced over the passes: kernels.rs rows_per_invocation), GLU, TEXTURE with TEX_SHIFT, X4, NORM (x is RMSNorm-ed on the fly: binding 5
// holds the k norm weights, eps in Params; see inv_rms), X_UNIFORM with X_WINDOW (and NORM_WINDOW).
//
// Invariants: an invocation owns 16 output columns for ROWS rows and accumulates over k strictly in
// order 0..k with fma of the dequantized weight (q·d, (q-8)·d, (q-16)·d, q·d+m, q·(d·sc) - dmin·m,
// (q-32)·(d·sc): exact in f32 or rounded once, so identical to the CPU reference's weights). No
// cross-invocation reduction: a row's result is bit-identical whatever the number of rows in the
// batch (batch invariance). Only unpack2x16float touches f16, so this one variant serves adapters with
// and without shader-f16. k is a multiple of the block size.

struct Params {
    k: u32,
    n_rows: u32,
    x_offset: u32,
    x_stride: u32,
    y_offset: u32,
    y_stride: u32,
    col0: u32,
    cols: u32,
    wcols: u32,
    accumulate: u32,
    // NORM: the RMSNorm epsilon.
    eps: f32,
    _pad1: u32,
}

// QW low-code words and HW high-bit words per unit, SB units per block, SW scale words per group.
#if Q8_0
const QW: u32 = 8u;
#else
const QW: u32 = 4u;
#endif
#if Q5_0 || Q5_1 || Q5_K
const HW: u32 = 1u;
#elif Q6_K
const HW: u32 = 2u;
#else
const HW: u32 = 0u;
#endif
#if Q4_K || Q5_K || Q6_K
const SB: u32 = 8u;
const SW: u32 = 80u;
#elif Q4_1 || Q5_1
const SB: u32 = 1u;
const SW: u32 = 16u;
#else
const SB: u32 = 1u;
const SW: u32 = 8u;
#endif
// vec4s per group, and the vec4 where the scales start.
const V4: u32 = (16u * SB * (QW + HW) + SW) / 4u;
const SC4: u32 = 4u * SB * (QW + HW);
// Values per quant word.
const PER_WORD: u32 = 32u / QW;

@group(0) @binding(0) var<uniform> p: Params;
#if X_UNIFORM
@group(0) @binding(1) var<uniform> x: array<vec4<f32>, {{X_WINDOW}}>;
#elif X4
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
#else
@group(0) @binding(1) var<storage, read> x: array<f32>;
#endif
#if TEXTURE
@group(0) @binding(2) var w: texture_2d<u32>;
#if GLU
@group(0) @binding(3) var w_up: texture_2d<u32>;
#endif
const TEX_SHIFT: u32 = {{TEX_SHIFT}}u;

fn texel_coords(i: u32) -> vec2<u32> {
    return vec2<u32>(i & ((1u << TEX_SHIFT) - 1u), i >> TEX_SHIFT);
}

fn w_at(i: u32) -> vec4<u32> {
    return textureLoad(w, texel_coords(i), 0);
}
#if GLU
fn up_at(i: u32) -> vec4<u32> {
    return textureLoad(w_up, texel_coords(i), 0);
}
#endif
#else
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;
#if GLU
@group(0) @binding(3) var<storage, read> w_up: array<vec4<u32>>;
#endif

fn w_at(i: u32) -> vec4<u32> {
    return w[i];
}
#if GLU
fn up_at(i: u32) -> vec4<u32> {
    return w_up[i];
}
#endif
#endif
#if GLU
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#else
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
#endif

const ROWS: u32 = {{ROWS}}u;
// Distance between a group's consecutive vec4s: 8 in weight textures (groups interleaved), else 1.
#if TEXTURE
const STEP: u32 = 8u;
#else
const STEP: u32 = 1u;
#endif

fn x_scalar(i: u32) -> f32 {
#if X_UNIFORM || X4
    return x[i / 4u][i % 4u];
#else
    return x[i];
#endif
}

#if NORM
#if X_UNIFORM
@group(0) @binding(5) var<uniform> norm_w: array<vec4<f32>, {{NORM_WINDOW}}>;

fn norm_at(k: u32) -> f32 {
    return norm_w[k / 4u][k % 4u];
}

fn norm4(k: u32) -> vec4<f32> {
    return norm_w[k / 4u];
}
#else
@group(0) @binding(5) var<storage, read> norm_w: array<f32>;

fn norm_at(k: u32) -> f32 {
    return norm_w[k];
}

fn norm4(k: u32) -> vec4<f32> {
    return vec4<f32>(norm_w[k], norm_w[k + 1u], norm_w[k + 2u], norm_w[k + 3u]);
}
#endif

#include rms_scale.wgsl
#endif

// Four columns' f16 values from two packed words (columns 4i..4i+3 of the group).
fn halves(v: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y));
}

// Scale (or minimum) of the group's 16 columns from two vec4 words.
fn scales(a: vec4<u32>, b: vec4<u32>) -> array<vec4<f32>, 4> {
    return array<vec4<f32>, 4>(halves(a.xy), halves(a.zw), halves(b.xy), halves(b.zw));
}

// The 16-bit fields of four columns from two words (columns 4i..4i+3 of the group).
fn fields(v: vec2<u32>) -> vec4<u32> {
    return vec4<u32>(v.x & 0xffffu, v.x >> 16u, v.y & 0xffffu, v.y >> 16u);
}

// The low (h = 0) or high (h = 1) f16 halves of four columns' words.
fn halves_of(v: vec4<u32>, h: u32) -> vec4<f32> {
    let s = vec4<u32>(16u * h);
    let w = v >> s;
    return vec4<f32>(unpack2x16float(w.x).x, unpack2x16float(w.y).x, unpack2x16float(w.z).x, unpack2x16float(w.w).x);
}

// Low bytes of four fields as signed values.
fn i8s(v: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(v << vec4<u32>(24u)) >> vec4<u32>(24u));
}

// vec4 i of the gate (or only) weight, or of the up weight (GLU).
fn wv(up: bool, i: u32) -> vec4<u32> {
#if GLU
    if (up) {
        return up_at(i);
    }
#endif
    return w_at(i);
}

// A unit's scales for the group's 16 columns, 4 at a time: d and m (Q6_K: the scales of values
// 0..16 and 16..32). `base` is the group's first vec4; `sup` its super-block words (K-quants).
struct UnitScales {
    d: array<vec4<f32>, 4>,
    m: array<vec4<f32>, 4>,
}

fn unit_scales(up: bool, base: u32, s: u32, sup: array<vec4<u32>, 4>) -> UnitScales {
    var out: UnitScales;
#if Q4_K || Q5_K || Q6_K
    let a = wv(up, base + (SC4 + 2u * s) * STEP);
    let b = wv(up, base + (SC4 + 2u * s + 1u) * STEP);
    let f = array<vec4<u32>, 4>(fields(a.xy), fields(a.zw), fields(b.xy), fields(b.zw));
    for (var c = 0u; c < 4u; c = c + 1u) {
        let d = halves_of(sup[c], 0u);
#if Q6_K
        out.d[c] = d * i8s(f[c] & vec4<u32>(0xffu));
        out.m[c] = d * i8s(f[c] >> vec4<u32>(8u));
#else
        out.d[c] = d * vec4<f32>(bitcast<vec4<i32>>(f[c] & vec4<u32>(0xffu)));
        out.m[c] = halves_of(sup[c], 1u) * vec4<f32>(bitcast<vec4<i32>>(f[c] >> vec4<u32>(8u)));
#endif
    }
#else
    out.d = scales(wv(up, base + SC4 * STEP), wv(up, base + (SC4 + 1u) * STEP));
#if Q4_1 || Q5_1
    out.m = scales(wv(up, base + (SC4 + 2u) * STEP), wv(up, base + (SC4 + 3u) * STEP));
#else
    out.m = out.d;
#endif
#endif
    return out;
}

// The super-block words of the group's 16 columns (K-quants; zeros otherwise).
fn super_words(up: bool, base: u32) -> array<vec4<u32>, 4> {
#if Q4_K || Q5_K || Q6_K
    let at = SC4 + 2u * SB;
    return array<vec4<u32>, 4>(wv(up, base + at * STEP), wv(up, base + (at + 1u) * STEP), wv(up, base + (at + 2u) * STEP), wv(up, base + (at + 3u) * STEP));
#else
    return array<vec4<u32>, 4>();
#endif
}

// The high-bit words of unit s for low-code word j, four columns per vec4 (zeros without them).
fn high_words(up: bool, base: u32, s: u32, j: u32) -> array<vec4<u32>, 4> {
#if Q5_0 || Q5_1 || Q5_K
    let at = 4u * SB * QW + s * 4u;
#elif Q6_K
    let at = 4u * SB * QW + (s * 2u + j / 2u) * 4u;
#endif
#if Q5_0 || Q5_1 || Q5_K || Q6_K
    return array<vec4<u32>, 4>(wv(up, base + at * STEP), wv(up, base + (at + 1u) * STEP), wv(up, base + (at + 2u) * STEP), wv(up, base + (at + 3u) * STEP));
#else
    return array<vec4<u32>, 4>();
#endif
}

// Dequantize value e of low-code word j (high bits h) for four columns.
fn dequant(q: vec4<u32>, h: vec4<u32>, j: u32, e: u32, d: vec4<f32>, m: vec4<f32>) -> vec4<f32> {
#if Q8_0
    let v = vec4<f32>(bitcast<vec4<i32>>(q << vec4<u32>(24u - 8u * e)) >> vec4<u32>(24u));
    return v * d;
#else
    var c = (q >> vec4<u32>(4u * e)) & vec4<u32>(15u);
#if Q5_0 || Q5_1 || Q5_K
    c = c | (((h >> vec4<u32>(8u * j + e)) & vec4<u32>(1u)) << vec4<u32>(4u));
#elif Q6_K
    c = c | (((h >> vec4<u32>(2u * (8u * (j % 2u) + e))) & vec4<u32>(3u)) << vec4<u32>(4u));
#endif
    // Through i32 (c < 64, the same value): AVX2 has no unsigned-to-float conversion.
    let v = vec4<f32>(bitcast<vec4<i32>>(c));
#if Q4_1 || Q5_1
    return fma(v, d, m);
#elif Q4_K || Q5_K
    // q·(d·sc) is exact, so this rounds once, as the reference's d1 * q - m1.
    return fma(v, d, -m);
#elif Q6_K
    return (v - vec4<f32>(32.0)) * select(d, m, j >= 2u);
#elif Q5_0
    return (v - vec4<f32>(16.0)) * d;
#else
    return (v - vec4<f32>(8.0)) * d;
#endif
#endif
}

#if GLU
fn silu(v: vec4<f32>) -> vec4<f32> {
    return v / (vec4<f32>(1.0) + exp(-v));
}
#endif

const WG: u32 = {{WG}}u;

// The 16 columns' sums of one row, four vec4s. Each row has its own variable, indexed only by
// constants: llvmpipe keeps such arrays in registers, but a row loop too long for its unroller
// leaves acc[r * 4 + c] dynamically indexed in memory (4 rows per invocation ran 4x slower).
alias Acc4 = array<vec4<f32>, 4>;

// acc += xv * w, column by column with one fma each (the order the invariants require).
fn mac4(acc: ptr<function, Acc4>, xv: f32, w: Acc4) {
    let v = vec4<f32>(xv);
    (*acc)[0] = fma(v, w[0], (*acc)[0]);
    (*acc)[1] = fma(v, w[1], (*acc)[1]);
    (*acc)[2] = fma(v, w[2], (*acc)[2]);
    (*acc)[3] = fma(v, w[3], (*acc)[3]);
}

// Inputs k..k+3 (k a multiple of 4) of the invocation's row r (rows past n_rows re-read the last
// row; their results are never stored), RMSNorm-ed with the row's scale `inv` when NORM.
fn x_in4(r0: u32, r: u32, k: u32, inv: f32) -> vec4<f32> {
    let row = min(r0 + r, p.n_rows - 1u);
    let i = p.x_offset + row * p.x_stride + k;
#if X4
    let v = x[i / 4u];
#else
    let v = vec4<f32>(x_scalar(i), x_scalar(i + 1u), x_scalar(i + 2u), x_scalar(i + 3u));
#endif
#if NORM
    return v * inv * norm4(k);
#else
    return v;
#endif
}

// Write row r0 + r of the group's 16 columns (gate `acc`, and `up` for the GLU).
fn store_row(blk: u32, r0: u32, r: u32, acc: Acc4, up: Acc4) {
    let row = r0 + r;
    if (row >= p.n_rows) {
        return;
    }
    let base = p.y_offset + row * p.y_stride + p.col0 + blk * 16u;
    for (var j = 0u; j < 4u; j = j + 1u) {
#if GLU
        let out = silu(acc[j]) * up[j];
#else
        let out = acc[j];
#endif
        for (var e = 0u; e < 4u; e = e + 1u) {
            let c = blk * 16u + j * 4u + e;
            if (c < p.cols) {
                if (p.accumulate != 0u) {
                    y[base + j * 4u + e] = y[base + j * 4u + e] + out[e];
                } else {
                    y[base + j * 4u + e] = out[e];
                }
            }
        }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let blk = gid.x;
    let r0 = gid.y * ROWS;
    if (blk * 16u >= p.cols || r0 >= p.n_rows) {
        return;
    }
    let groups_per_kb = p.wcols / 16u;
    // One accumulator set per row (ROWS <= 8); `if (ROWS > n)` is constant, so unused rows vanish.
    var a0: Acc4;
    var a1: Acc4;
    var a2: Acc4;
    var a3: Acc4;
    var a4: Acc4;
    var a5: Acc4;
    var a6: Acc4;
    var a7: Acc4;
    var u0: Acc4;
    var u1: Acc4;
    var u2: Acc4;
    var u3: Acc4;
    var u4: Acc4;
    var u5: Acc4;
    var u6: Acc4;
    var u7: Acc4;
    var inv = array<f32, 8>(1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0);
#if NORM
    for (var r = 0u; r < ROWS; r = r + 1u) {
        inv[r] = inv_rms(min(r0 + r, p.n_rows - 1u));
    }
#endif
    for (var g = 0u; g < p.k / (32u * SB); g = g + 1u) {
#if TEXTURE
        // Groups interleaved in runs of 8 (tensor.rs interleave_groups): vec4 x of this group at base + x * 8.
        let base = ((g * (groups_per_kb / 8u) + blk / 8u) * V4) * 8u + blk % 8u;
#else
        let base = (g * groups_per_kb + blk) * V4;
#endif
        let sup = super_words(false, base);
#if GLU
        let sup_up = super_words(true, base);
#endif
        for (var s = 0u; s < SB; s = s + 1u) {
            let sc = unit_scales(false, base, s, sup);
#if GLU
            let scu = unit_scales(true, base, s, sup_up);
#endif
            for (var j = 0u; j < QW; j = j + 1u) {
                let qi = (s * QW + j) * 4u;
                let q = array<vec4<u32>, 4>(w_at(base + qi * STEP), w_at(base + (qi + 1u) * STEP), w_at(base + (qi + 2u) * STEP), w_at(base + (qi + 3u) * STEP));
                let h = high_words(false, base, s, j);
#if GLU
                let qu = array<vec4<u32>, 4>(up_at(base + qi * STEP), up_at(base + (qi + 1u) * STEP), up_at(base + (qi + 2u) * STEP), up_at(base + (qi + 3u) * STEP));
                let hu = high_words(true, base, s, j);
#endif
                // Four inputs of each row at a time: one x load per row and 4 values (X4), where
                // reading them one by one cost llvmpipe a vec4 gather and a select per value.
                for (var e4 = 0u; e4 < PER_WORD; e4 = e4 + 4u) {
                    let k4 = (g * SB + s) * 32u + j * PER_WORD + e4;
                    let in0 = x_in4(r0, 0u, k4, inv[0]);
                    var in1: vec4<f32>;
                    if (ROWS > 1u) {
                        in1 = x_in4(r0, 1u, k4, inv[1]);
                    }
                    var in2: vec4<f32>;
                    if (ROWS > 2u) {
                        in2 = x_in4(r0, 2u, k4, inv[2]);
                    }
                    var in3: vec4<f32>;
                    if (ROWS > 3u) {
                        in3 = x_in4(r0, 3u, k4, inv[3]);
                    }
                    var in4: vec4<f32>;
                    if (ROWS > 4u) {
                        in4 = x_in4(r0, 4u, k4, inv[4]);
                    }
                    var in5: vec4<f32>;
                    if (ROWS > 5u) {
                        in5 = x_in4(r0, 5u, k4, inv[5]);
                    }
                    var in6: vec4<f32>;
                    if (ROWS > 6u) {
                        in6 = x_in4(r0, 6u, k4, inv[6]);
                    }
                    var in7: vec4<f32>;
                    if (ROWS > 7u) {
                        in7 = x_in4(r0, 7u, k4, inv[7]);
                    }
                    for (var i = 0u; i < 4u; i = i + 1u) {
                        let e = e4 + i;
                        var wg: Acc4;
#if GLU
                        var wu: Acc4;
#endif
                        for (var c = 0u; c < 4u; c = c + 1u) {
                            wg[c] = dequant(q[c], h[c], j, e, sc.d[c], sc.m[c]);
#if GLU
                            wu[c] = dequant(qu[c], hu[c], j, e, scu.d[c], scu.m[c]);
#endif
                        }
                        mac4(&a0, in0[i], wg);
#if GLU
                        mac4(&u0, in0[i], wu);
#endif
                        if (ROWS > 1u) {
                            mac4(&a1, in1[i], wg);
#if GLU
                            mac4(&u1, in1[i], wu);
#endif
                        }
                        if (ROWS > 2u) {
                            mac4(&a2, in2[i], wg);
#if GLU
                            mac4(&u2, in2[i], wu);
#endif
                        }
                        if (ROWS > 3u) {
                            mac4(&a3, in3[i], wg);
#if GLU
                            mac4(&u3, in3[i], wu);
#endif
                        }
                        if (ROWS > 4u) {
                            mac4(&a4, in4[i], wg);
#if GLU
                            mac4(&u4, in4[i], wu);
#endif
                        }
                        if (ROWS > 5u) {
                            mac4(&a5, in5[i], wg);
#if GLU
                            mac4(&u5, in5[i], wu);
#endif
                        }
                        if (ROWS > 6u) {
                            mac4(&a6, in6[i], wg);
#if GLU
                            mac4(&u6, in6[i], wu);
#endif
                        }
                        if (ROWS > 7u) {
                            mac4(&a7, in7[i], wg);
#if GLU
                            mac4(&u7, in7[i], wu);
#endif
                        }
                    }
                }
            }
        }
    }
    store_row(blk, r0, 0u, a0, u0);
    if (ROWS > 1u) { store_row(blk, r0, 1u, a1, u1); }
    if (ROWS > 2u) { store_row(blk, r0, 2u, a2, u2); }
    if (ROWS > 3u) { store_row(blk, r0, 3u, a3, u3); }
    if (ROWS > 4u) { store_row(blk, r0, 4u, a4, u4); }
    if (ROWS > 5u) { store_row(blk, r0, 5u, a5, u5); }
    if (ROWS > 6u) { store_row(blk, r0, 6u, a6, u6); }
    if (ROWS > 7u) { store_row(blk, r0, 7u, a7, u7); }
}
