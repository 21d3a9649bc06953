// matmul_quant.wgsl: y[r, n] (+)= sum_k x[r, k] * W[k, n] with W kept as GGML blocks (Q8_0, Q4_0,
// Q4_1) and dequantized while multiplying. Same roles as matmul.wgsl (decode GEMV, verify, prefill).
//
// Bindings (group 0):
//   0 uniform  Params (dynamic offset; the same struct as matmul.wgsl)
//   1 storage  x: array<f32>, row r starts at x_offset + r * x_stride
//   2 storage  w: one column chunk as array<vec4<u32>>: one GROUP per (32-value block kb, 16-column
//              block blk) at group index kb * (wcols / 16) + blk, V4 vec4 (WORDS u32) per group:
//                quants  word j * 16 + c for column c (0..16) of the group, j in 0..QW:
//                        Q8_0 (QW = 8): word j = values 4j..4j+3 as i8 (value 4j+e in byte e);
//                        Q4_x (QW = 4): word j = values 8j..8j+7 as nibbles (value 8j+e at bits 4e).
//                d       8 words, f16 pairs: column c in word c / 2, low half for even c.
//                m       (Q4_1 only) 8 more words, same packing.
//              Columns past `cols` are zero blocks (d = 0). quant.rs writes this layout.
//              TEXTURE variant (CPU adapters): texels of a texture_2d<u32> read as one linear array
//              (texel i at (i & (W-1), i >> TEX_SHIFT)); within each block-row kb the groups are
//              interleaved in runs of 8 (wcols / 16 is a multiple of 8): vec4 x of group blk is texel
//              ((kb * wcols / 128 + blk / 8) * V4 + x) * 8 + blk % 8, so 8 neighbouring invocations read
//              8 neighbouring texels (tensor.rs interleave_groups).
//   3 storage  w_up (GLU variant only): the up projection, same layout
//   3/4 storage y: array<f32>, row r column (col0 + c) at y_offset + r * y_stride + col0 + c
//   5 storage  norm_w (NORM only): array<f32>, the k RMSNorm weights of x's rows
// Defines: Q8_0 | Q4_0 | Q4_1, ROWS (1 for decode, 3 otherwise: MATMUL_ROWS in kernels.rs), GLU,
// TEXTURE with TEX_SHIFT, NORM (x is RMSNorm-ed on the fly: binding 5 holds the k norm weights, eps
// in Params; see inv_rms).
//
// Invariants: an invocation owns 16 output columns for ROWS rows and accumulates over k strictly in
// order 0..k with fma of the dequantized weight (q·d, (q-8)·d or q·d+m: exact in f32, so identical to
// the CPU reference's weights). No cross-invocation reduction: a row's result is bit-identical whatever
// the number of rows in the batch (batch invariance). Only unpack2x16float touches f16, so this one
// variant serves adapters with and without shader-f16. k is a multiple of 32.

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

#if Q8_0
const QW: u32 = 8u;
const V4: u32 = 34u;
#elif Q4_1
const QW: u32 = 4u;
const V4: u32 = 20u;
#else
const QW: u32 = 4u;
const V4: u32 = 18u;
#endif
// Values per quant word.
const PER_WORD: u32 = 32u / QW;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
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
    return x[i];
}

#if NORM
@group(0) @binding(5) var<storage, read> norm_w: array<f32>;

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

// Dequantize value e of quant word q for four columns.
fn dequant(q: vec4<u32>, e: u32, d: vec4<f32>, m: vec4<f32>) -> vec4<f32> {
#if Q8_0
    let v = vec4<f32>(bitcast<vec4<i32>>(q << vec4<u32>(24u - 8u * e)) >> vec4<u32>(24u));
    return v * d;
#elif Q4_1
    let v = vec4<f32>((q >> vec4<u32>(4u * e)) & vec4<u32>(15u));
    return fma(v, d, m);
#else
    let v = vec4<f32>((q >> vec4<u32>(4u * e)) & vec4<u32>(15u));
    return (v - vec4<f32>(8.0)) * d;
#endif
}

#if GLU
fn silu(v: vec4<f32>) -> vec4<f32> {
    return v / (vec4<f32>(1.0) + exp(-v));
}
#endif

const WG: u32 = {{WG}}u;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let blk = gid.x;
    let r0 = gid.y * ROWS;
    if (blk * 16u >= p.cols || r0 >= p.n_rows) {
        return;
    }
    let groups_per_kb = p.wcols / 16u;
    var acc: array<vec4<f32>, ROWS * 4u>;
#if GLU
    var acc_up: array<vec4<f32>, ROWS * 4u>;
#endif
#if NORM
    var inv: array<f32, ROWS>;
    for (var r = 0u; r < ROWS; r = r + 1u) {
        inv[r] = inv_rms(min(r0 + r, p.n_rows - 1u));
    }
#endif
    for (var kb = 0u; kb < p.k / 32u; kb = kb + 1u) {
#if TEXTURE
        // Groups interleaved in runs of 8 (tensor.rs interleave_groups): vec4 x of this group at base + x * 8.
        let base = ((kb * (groups_per_kb / 8u) + blk / 8u) * V4) * 8u + blk % 8u;
#else
        let base = (kb * groups_per_kb + blk) * V4;
#endif
        let d = scales(w_at(base + (QW * 4u) * STEP), w_at(base + (QW * 4u + 1u) * STEP));
#if Q4_1
        let m = scales(w_at(base + (QW * 4u + 2u) * STEP), w_at(base + (QW * 4u + 3u) * STEP));
#else
        let m = d;
#endif
#if GLU
        let du = scales(up_at(base + (QW * 4u) * STEP), up_at(base + (QW * 4u + 1u) * STEP));
#if Q4_1
        let mu = scales(up_at(base + (QW * 4u + 2u) * STEP), up_at(base + (QW * 4u + 3u) * STEP));
#else
        let mu = du;
#endif
#endif
        for (var j = 0u; j < QW; j = j + 1u) {
            let q = array<vec4<u32>, 4>(w_at(base + (j * 4u) * STEP), w_at(base + (j * 4u + 1u) * STEP), w_at(base + (j * 4u + 2u) * STEP), w_at(base + (j * 4u + 3u) * STEP));
#if GLU
            let qu = array<vec4<u32>, 4>(up_at(base + (j * 4u) * STEP), up_at(base + (j * 4u + 1u) * STEP), up_at(base + (j * 4u + 2u) * STEP), up_at(base + (j * 4u + 3u) * STEP));
#endif
            for (var e = 0u; e < PER_WORD; e = e + 1u) {
                let k = kb * 32u + j * PER_WORD + e;
                var wg: array<vec4<f32>, 4>;
#if GLU
                var wu: array<vec4<f32>, 4>;
#endif
                for (var c = 0u; c < 4u; c = c + 1u) {
                    wg[c] = dequant(q[c], e, d[c], m[c]);
#if GLU
                    wu[c] = dequant(qu[c], e, du[c], mu[c]);
#endif
                }
                for (var r = 0u; r < ROWS; r = r + 1u) {
                    // Rows past n_rows re-read the last row; their results are never stored.
                    let row = min(r0 + r, p.n_rows - 1u);
#if NORM
                    let xv = vec4<f32>(x[p.x_offset + row * p.x_stride + k] * inv[r] * norm_w[k]);
#else
                    let xv = vec4<f32>(x[p.x_offset + row * p.x_stride + k]);
#endif
                    for (var c = 0u; c < 4u; c = c + 1u) {
                        acc[r * 4u + c] = fma(xv, wg[c], acc[r * 4u + c]);
#if GLU
                        acc_up[r * 4u + c] = fma(xv, wu[c], acc_up[r * 4u + c]);
#endif
                    }
                }
            }
        }
    }
    for (var r = 0u; r < ROWS; r = r + 1u) {
        let row = r0 + r;
        if (row >= p.n_rows) {
            break;
        }
        let base = p.y_offset + row * p.y_stride + p.col0 + blk * 16u;
        for (var j = 0u; j < 4u; j = j + 1u) {
#if GLU
            let out = silu(acc[r * 4u + j]) * acc_up[r * 4u + j];
#else
            let out = acc[r * 4u + j];
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
}
