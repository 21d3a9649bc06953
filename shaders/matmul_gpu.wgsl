// matmul_gpu.wgsl: y[r, n] (+)= sum_k xn[r, k] * W[n, k], the GPU kernel family's GEMV (decode, 1 row)
// and GEMM (verify and prefill, ROWS rows per workgroup), for f32, f16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// Q4_K, Q5_K and Q6_K weights.
// xn = x, or with NORM the row's RMSNorm computed in the same workgroup: x * inv_rms(x) * norm_w.
//
// Bindings (group 0):
//   0 uniform  Params (dynamic offset)
//   1 storage  x: array<f32> (array<vec4<f32>> with X4), row r starts at x_offset + r * x_stride
//   2 storage  w: array<vec4<u32>>, one chunk in the ROW-MAJOR layout of row_major.rs: output column
//              c's k weights are contiguous (f32: 4 per 16-byte word; f16: 8 packed halves; Q8_0: half
//              a block; Q4_0 / Q4_1: one block's 16 quant bytes; Q5_x / K-quants: one 32-value unit's
//              low nibbles in value order), `row_words` u32 per column. Quantized chunks keep their
//              scales after word `scales_at`, the Q5_x / Q6_K high code bits after `high_at` and the
//              K-quants' super-block words after `super_at` (row_major.rs).
//   3 storage  w_up (GLU only): the up projection, same layout
//   4 storage  norm_w (NORM only): array<f32>, k RMSNorm weights
//   5 storage  y: array<f32>, row r column (col0 + c) at y_offset + r * y_stride + col0 + c
// Defines: F32 | HALF (f16, packed pairs) | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q4_K | Q5_K | Q6_K (weight
// format), ROWS (rows per workgroup: 1 decode, 8 else),
// COLS (output columns per workgroup: 4, or 1 for narrow outputs so more workgroups exist), GLU, NORM,
// X4 (x_offset and x_stride multiples of 4: x read as vec4).
//
// Work split: a workgroup has COLS segments of 64 lanes; segment s owns output column
// wg.x * COLS + s for ROWS rows. Lane l reads the column's 16-byte words l, l + 64, l + 128, ... so
// the 64 lanes of a segment read 1 KiB of contiguous weights per step (coalesced), and each weight
// word is applied to all ROWS rows (the GEMM's reuse: a verify pass reads the weights once per 8 rows).
// x is read straight from storage: the segments of a workgroup read the same x words (L1 hits).
//
// Invariants (batch invariance): lane l accumulates its words in increasing order with fma, each
// word's elements in a fixed order; then the 64 lanes' partial sums are added by a fixed binary tree
// in workgroup memory (stride 32, 16, ..., 1). The NORM scale is computed the same way. Neither
// depends on ROWS, COLS or the number of rows, so row r of any pass is bit-identical to that row alone.
// Every lane reaches every barrier (loops are bounded by uniform params; no early return).

struct Params {
    k: u32,
    n_rows: u32,
    x_offset: u32,
    x_stride: u32,
    y_offset: u32,
    y_stride: u32,
    col0: u32,
    cols: u32,
    row_words: u32,
    scales_at: u32,
    accumulate: u32,
    eps: f32,
    high_at: u32,
    super_at: u32,
    _pad0: u32,
    _pad1: u32,
}

const ROWS: u32 = {{ROWS}}u;
const COLS: u32 = {{COLS}}u;
const LANES: u32 = 64u;
const WG: u32 = LANES * COLS;

@group(0) @binding(0) var<uniform> p: Params;
#if X4
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
#else
@group(0) @binding(1) var<storage, read> x: array<f32>;
#endif
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;
#if GLU
@group(0) @binding(3) var<storage, read> w_up: array<vec4<u32>>;
#endif
#if NORM
@group(0) @binding(4) var<storage, read> norm_w: array<f32>;
#endif
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

// 8 KiB at ROWS = 8, COLS = 4: within WebGPU's 16 KiB minimum. GLU reduces its two sums one after
// the other through the same array (gate_sum keeps the first).
var<workgroup> red: array<f32, ROWS * WG>;
#if GLU
var<workgroup> gate_sum: array<f32, ROWS * COLS>;
#endif
var<workgroup> inv_rms: array<f32, ROWS>;

// Elements of x per 16-byte weight word.
#if F32
const E: u32 = 4u;
#elif HALF
const E: u32 = 8u;
#elif Q8_0
const E: u32 = 16u;
#else
const E: u32 = 32u;
#endif

// x[row][e] (0 past k).
fn x_at(row: u32, e: u32) -> f32 {
    if (e >= p.k) {
        return 0.0;
    }
    let i = p.x_offset + row * p.x_stride + e;
#if X4
    return x[i / 4u][i % 4u];
#else
    return x[i];
#endif
}

// x[row][e..e+4] (zeros past k); e is a multiple of 4.
fn x4_at(row: u32, e: u32) -> vec4<f32> {
#if X4
    if (e + 4u <= p.k) {
        return x[(p.x_offset + row * p.x_stride + e) / 4u];
    }
#endif
    return vec4<f32>(x_at(row, e), x_at(row, e + 1u), x_at(row, e + 2u), x_at(row, e + 3u));
}

// The normalised input: x[row][e..e+4] * inv_rms[r] * norm_w[e..e+4] with NORM, else x.
fn xn4(r: u32, row: u32, e: u32) -> vec4<f32> {
    let v = x4_at(row, e);
#if NORM
    var nw = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j = j + 1u) {
        if (e + j < p.k) {
            nw[j] = norm_w[e + j];
        }
    }
    return v * inv_rms[r] * nw;
#else
    return v;
#endif
}

// Fixed-shape tree over the 64 lanes of segment `seg` for each row: red[r * WG + seg * 64] ends with
// the sum. Called by every invocation (barriers inside).
fn reduce_segments(lane: u32, seg: u32) {
    for (var stride = LANES / 2u; stride > 0u; stride = stride / 2u) {
        workgroupBarrier();
        if (lane < stride) {
            for (var r = 0u; r < ROWS; r = r + 1u) {
                let i = r * WG + seg * LANES + lane;
                red[i] = red[i] + red[i + stride];
            }
        }
    }
    workgroupBarrier();
}

// 16-byte word i of the gate (or only) weight (up = false) or of the up weight (GLU).
fn word(up: bool, i: u32) -> vec4<u32> {
#if GLU
    if (up) {
        return w_up[i];
    }
#endif
    return w[i];
}

// The weights of 16-byte word `wi` of column `c` (within the chunk) as E values in 4-wide groups.
// Quantized values are exact: q * d, (q - 8) * d, q * d + m.
#if F32
fn weights(m: bool, c: u32, wi: u32) -> array<vec4<f32>, 1> {
    return array<vec4<f32>, 1>(bitcast<vec4<f32>>(word(m, (c * p.row_words) / 4u + wi)));
}
#elif HALF
fn weights(m: bool, c: u32, wi: u32) -> array<vec4<f32>, 2> {
    let q = word(m, (c * p.row_words) / 4u + wi);
    return array<vec4<f32>, 2>(vec4<f32>(unpack2x16float(q.x), unpack2x16float(q.y)), vec4<f32>(unpack2x16float(q.z), unpack2x16float(q.w)));
}
#else
// Scale word `s` (u32 index) of the chunk.
fn scale_word(m: bool, s: u32) -> u32 {
    return word(m, s / 4u)[s % 4u];
}
#if Q8_0
fn weights(m: bool, c: u32, wi: u32) -> array<vec4<f32>, 4> {
    // wi is a half block: block wi / 2, values 16 * (wi % 2) ..
    let kb = p.k / 32u;
    let b = wi / 2u;
    let d = unpack2x16float(scale_word(m, p.scales_at + c * ((kb + 1u) / 2u) + b / 2u))[b % 2u];
    let q = word(m, (c * p.row_words) / 4u + wi);
    var out: array<vec4<f32>, 4>;
    for (var j = 0u; j < 4u; j = j + 1u) {
        let v = vec4<i32>(bitcast<i32>(q[j] << 24u), bitcast<i32>(q[j] << 16u), bitcast<i32>(q[j] << 8u), bitcast<i32>(q[j])) >> vec4<u32>(24u);
        out[j] = vec4<f32>(v) * d;
    }
    return out;
}
#elif Q5_0 || Q5_1 || Q4_K || Q5_K || Q6_K
fn weights(m: bool, c: u32, wi: u32) -> array<vec4<f32>, 8> {
    // wi is unit wi: nibbles in value order (value 8j + e at bits 4e of word j), high bits and
    // scales in their regions (row_major.rs). Values are exact as in the CPU reference.
    let units = p.k / 32u;
    let u = c * units + wi;
    let q = word(m, (c * p.row_words) / 4u + wi);
#if Q5_0 || Q5_1 || Q5_K
    let hw = vec2<u32>(scale_word(m, p.high_at + u), 0u);
#elif Q6_K
    let hw = vec2<u32>(scale_word(m, p.high_at + 2u * u), scale_word(m, p.high_at + 2u * u + 1u));
#endif
#if Q5_0
    let d = vec4<f32>(unpack2x16float(scale_word(m, p.scales_at + c * ((units + 1u) / 2u) + wi / 2u))[wi % 2u]);
#elif Q5_1
    let dm = unpack2x16float(scale_word(m, p.scales_at + u));
    let d = vec4<f32>(dm.x);
    let mn = vec4<f32>(dm.y);
#else
    let f = (scale_word(m, p.scales_at + c * ((units + 1u) / 2u) + wi / 2u) >> (16u * (wi % 2u))) & 0xffffu;
    let dd = unpack2x16float(scale_word(m, p.super_at + c * (units / 8u) + wi / 8u));
#if Q6_K
    let d_lo = vec4<f32>(dd.x * f32(bitcast<i32>((f & 0xffu) << 24u) >> 24u));
    let d_hi = vec4<f32>(dd.x * f32(bitcast<i32>((f >> 8u) << 24u) >> 24u));
#else
    let d = vec4<f32>(dd.x * f32(f & 0xffu));
    let mn = vec4<f32>(dd.y * f32(f >> 8u));
#endif
#endif
    var out: array<vec4<f32>, 8>;
    for (var g = 0u; g < 8u; g = g + 1u) {
        // Values 4g..4g+3.
        let shifts = vec4<u32>(0u, 4u, 8u, 12u) + vec4<u32>(16u * (g % 2u));
        var code = (vec4<u32>(q[g / 2u]) >> shifts) & vec4<u32>(15u);
        let idx = vec4<u32>(4u * g) + vec4<u32>(0u, 1u, 2u, 3u);
#if Q5_0 || Q5_1 || Q5_K
        code = code | (((vec4<u32>(hw.x) >> idx) & vec4<u32>(1u)) << vec4<u32>(4u));
#elif Q6_K
        let hsel = select(hw.x, hw.y, g >= 4u);
        code = code | (((vec4<u32>(hsel) >> (2u * (idx % vec4<u32>(16u)))) & vec4<u32>(3u)) << vec4<u32>(4u));
#endif
        let v = vec4<f32>(code);
#if Q5_0
        out[g] = (v - 16.0) * d;
#elif Q5_1
        out[g] = fma(v, d, mn);
#elif Q6_K
        out[g] = (v - 32.0) * select(d_lo, d_hi, g >= 4u);
#else
        out[g] = fma(v, d, -mn);
#endif
    }
    return out;
}
#else
fn weights(m: bool, c: u32, wi: u32) -> array<vec4<f32>, 8> {
    // wi is block wi: byte j of the 16 holds value j (low nibble) and value j + 16 (high nibble).
    let kb = p.k / 32u;
    let q = word(m, (c * p.row_words) / 4u + wi);
#if Q4_1
    let dm = unpack2x16float(scale_word(m, p.scales_at + c * kb + wi));
    let d = dm.x;
    let mn = dm.y;
#else
    let d = unpack2x16float(scale_word(m, p.scales_at + c * ((kb + 1u) / 2u) + wi / 2u))[wi % 2u];
#endif
    var out: array<vec4<f32>, 8>;
    for (var j = 0u; j < 4u; j = j + 1u) {
        let lo = vec4<u32>(q[j], q[j] >> 8u, q[j] >> 16u, q[j] >> 24u) & vec4<u32>(15u);
        let hi = vec4<u32>(q[j] >> 4u, q[j] >> 12u, q[j] >> 20u, q[j] >> 28u) & vec4<u32>(15u);
#if Q4_1
        out[j] = fma(vec4<f32>(lo), vec4<f32>(d), vec4<f32>(mn));
        out[j + 4u] = fma(vec4<f32>(hi), vec4<f32>(d), vec4<f32>(mn));
#else
        out[j] = (vec4<f32>(lo) - 8.0) * d;
        out[j + 4u] = (vec4<f32>(hi) - 8.0) * d;
#endif
    }
    return out;
}
#endif
#endif

// Element offset (within the word's E elements) of 4-wide group g of `weights`.
fn group_offset(g: u32) -> u32 {
#if Q4_0
    return select(4u * g, 16u + 4u * (g - 4u), g >= 4u);
#elif Q4_1
    return select(4u * g, 16u + 4u * (g - 4u), g >= 4u);
#else
    return 4u * g;
#endif
}

#if GLU
fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}
#endif

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lane = li % LANES;
    let seg = li / LANES;
    let c = wid.x * COLS + seg;
    let live = c < p.cols;
    let r0 = wid.y * ROWS;
    // Rows past n_rows re-read the last row; their results are never stored.
    var rows: array<u32, ROWS>;
    for (var r = 0u; r < ROWS; r = r + 1u) {
        rows[r] = min(r0 + r, p.n_rows - 1u);
    }

#if NORM
    // inv_rms per row: lane sums squares of x words lane, lane + 64, ... in order, then the tree.
    for (var r = 0u; r < ROWS; r = r + 1u) {
        var ss = 0.0;
        for (var e = lane * 4u; e < p.k; e = e + LANES * 4u) {
            let v = x4_at(rows[r], e);
            ss = fma(v.x, v.x, ss);
            ss = fma(v.y, v.y, ss);
            ss = fma(v.z, v.z, ss);
            ss = fma(v.w, v.w, ss);
        }
        red[r * WG + li] = ss;
    }
    reduce_segments(lane, seg);
    if (li < ROWS) {
        // Segment 0's sum; every segment computed the same value.
        inv_rms[li] = 1.0 / sqrt(red[li * WG] / f32(p.k) + p.eps);
    }
    workgroupBarrier();
#endif

    var acc: array<f32, ROWS>;
#if GLU
    var acc_up: array<f32, ROWS>;
#endif
    let words = (p.k + E - 1u) / E;
    for (var wi = lane; wi < words; wi = wi + LANES) {
        if (live) {
            let wg = weights(false, c, wi);
#if GLU
            let wu = weights(true, c, wi);
#endif
            let e0 = wi * E;
            for (var g = 0u; g < E / 4u; g = g + 1u) {
                let e = e0 + group_offset(g);
                for (var r = 0u; r < ROWS; r = r + 1u) {
                    let xv = xn4(r, rows[r], e);
                    var a = acc[r];
                    a = fma(xv.x, wg[g].x, a);
                    a = fma(xv.y, wg[g].y, a);
                    a = fma(xv.z, wg[g].z, a);
                    a = fma(xv.w, wg[g].w, a);
                    acc[r] = a;
#if GLU
                    var u = acc_up[r];
                    u = fma(xv.x, wu[g].x, u);
                    u = fma(xv.y, wu[g].y, u);
                    u = fma(xv.z, wu[g].z, u);
                    u = fma(xv.w, wu[g].w, u);
                    acc_up[r] = u;
#endif
                }
            }
        }
    }
    for (var r = 0u; r < ROWS; r = r + 1u) {
        red[r * WG + li] = acc[r];
    }
    reduce_segments(lane, seg);
#if GLU
    if (lane < ROWS) {
        gate_sum[seg * ROWS + lane] = red[lane * WG + seg * LANES];
    }
    workgroupBarrier();
    for (var r = 0u; r < ROWS; r = r + 1u) {
        red[r * WG + li] = acc_up[r];
    }
    reduce_segments(lane, seg);
#endif

    if (live && lane < ROWS && r0 + lane < p.n_rows) {
        // Lane r of the segment stores row r.
        let r = lane;
        let i = r * WG + seg * LANES;
#if GLU
        let out = silu(gate_sum[seg * ROWS + r]) * red[i];
#else
        let out = red[i];
#endif
        let at = p.y_offset + (r0 + r) * p.y_stride + p.col0 + c;
        if (p.accumulate != 0u) {
            y[at] = y[at] + out;
        } else {
            y[at] = out;
        }
    }
}
