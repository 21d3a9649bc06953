// matmul.wgsl: y[r, n] (+)= sum_k x[r, k] * W[k, n] for 1..N rows: decode GEMV, verify and prefill.
//
// Bindings (group 0):
//   0 uniform  Params (dynamic offset)
//   1 storage  x: array<f32>, row r starts at x_offset + r * x_stride
//   2 storage  w: one chunk of the weight, stored TRANSPOSED as [k][wcols] (wcols = cols rounded up to 4)
//              so that neighbouring invocations read neighbouring columns. Element type by variant:
//              F32 -> vec4<f32>; F16 (native shader-f16) -> vec4<f16>; otherwise f16 pairs packed in
//              vec2<u32> and unpacked with unpack2x16float. All three share one memory layout per dtype.
//   3 storage  w_up (GLU variant only): the up projection, same layout as w (the gate)
//   3/4 storage y: array<f32>, row r column (col0 + c) at y_offset + r * y_stride + col0 + c
// Defines: ROWS (rows per invocation: 1 for decode, 8 otherwise), F32 | F16, GLU.
//
// Invariants: each invocation owns 4 output columns for ROWS rows and accumulates over k strictly in
// order 0..k with explicit fma. No cross-invocation reduction exists, so a row's result is bit-identical
// whatever the number of rows in the batch and whatever ROWS variant ran it (batch invariance).
// GLU: y = silu(x·Wg) * (x·Wu). accumulate=1: y += x·W (the residual add), done after the full sum.

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
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
#if F32
@group(0) @binding(2) var<storage, read> w: array<vec4<f32>>;
#elif F16
@group(0) @binding(2) var<storage, read> w: array<vec4<f16>>;
#else
@group(0) @binding(2) var<storage, read> w: array<vec2<u32>>;
#endif
#if GLU
#if F32
@group(0) @binding(3) var<storage, read> w_up: array<vec4<f32>>;
#elif F16
@group(0) @binding(3) var<storage, read> w_up: array<vec4<f16>>;
#else
@group(0) @binding(3) var<storage, read> w_up: array<vec2<u32>>;
#endif
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#else
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
#endif

const ROWS: u32 = {{ROWS}}u;

fn load_gate(i: u32) -> vec4<f32> {
#if F32
    return w[i];
#elif F16
    return vec4<f32>(w[i]);
#else
    let v = w[i];
    return vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y));
#endif
}

#if GLU
fn load_up(i: u32) -> vec4<f32> {
#if F32
    return w_up[i];
#elif F16
    return vec4<f32>(w_up[i]);
#else
    let v = w_up[i];
    return vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y));
#endif
}

fn silu(v: vec4<f32>) -> vec4<f32> {
    return v / (vec4<f32>(1.0) + exp(-v));
}
#endif

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c4 = gid.x;
    let r0 = gid.y * ROWS;
    if (c4 * 4u >= p.cols || r0 >= p.n_rows) {
        return;
    }
    let w4 = p.wcols / 4u;
    var acc: array<vec4<f32>, ROWS>;
#if GLU
    var acc_up: array<vec4<f32>, ROWS>;
#endif
    for (var k = 0u; k < p.k; k = k + 1u) {
        let wi = k * w4 + c4;
        let wg = load_gate(wi);
#if GLU
        let wu = load_up(wi);
#endif
        for (var r = 0u; r < ROWS; r = r + 1u) {
            // Rows past n_rows re-read the last row; their results are never stored.
            let row = min(r0 + r, p.n_rows - 1u);
            let xv = vec4<f32>(x[p.x_offset + row * p.x_stride + k]);
            acc[r] = fma(xv, wg, acc[r]);
#if GLU
            acc_up[r] = fma(xv, wu, acc_up[r]);
#endif
        }
    }
    for (var r = 0u; r < ROWS; r = r + 1u) {
        let row = r0 + r;
        if (row >= p.n_rows) {
            break;
        }
#if GLU
        let out = silu(acc[r]) * acc_up[r];
#else
        let out = acc[r];
#endif
        let base = p.y_offset + row * p.y_stride + p.col0 + c4 * 4u;
        for (var j = 0u; j < 4u; j = j + 1u) {
            if (c4 * 4u + j < p.cols) {
                if (p.accumulate != 0u) {
                    y[base + j] = y[base + j] + out[j];
                } else {
                    y[base + j] = out[j];
                }
            }
        }
    }
}
