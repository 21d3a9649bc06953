// matmul.wgsl: y[r, n] (+)= sum_k x[r, k] * W[k, n] for 1..N rows: decode GEMV, verify and prefill.
//
// Bindings (group 0):
//   0 uniform  Params (dynamic offset)
//   1 storage  x: array<f32>, row r starts at x_offset + r * x_stride
//   2 storage  w: one chunk of the weight, stored TRANSPOSED as [k][wcols] (wcols = cols rounded up to
//              16) so neighbouring invocations read neighbouring columns. Each invocation owns 16
//              columns = one "block" per k: F32 -> 4 x vec4<f32>; F16 (native shader-f16) ->
//              2 x (vec4<f16>, vec4<f16>); otherwise f16 pairs packed in 2 x vec4<u32>, unpacked with
//              unpack2x16float. The same bytes serve the native and the packed f16 variants.
//   3 storage  w_up (GLU variant only): the up projection, same layout as w (the gate)
//   3/4 storage y: array<f32>, row r column (col0 + c) at y_offset + r * y_stride + col0 + c
// Defines: ROWS (rows per invocation: 1 for decode, 3 otherwise: MATMUL_ROWS in kernels.rs), F32 | F16, GLU.
//
// Invariants: an invocation owns 16 output columns for ROWS rows and accumulates over k strictly in
// order 0..k with explicit fma. No cross-invocation reduction exists, so a row's result is bit-identical
// whatever the number of rows in the batch and whatever ROWS variant ran it (batch invariance).
// GLU: y = silu(x·Wg) * (x·Wu). accumulate=1: y += x·W (the residual add), applied after the full sum.
// Wide per-invocation loads matter: llvmpipe moves 16 columns per invocation ~2.5x faster than 4.

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

#if F32
alias Block = array<vec4<f32>, 4>;
#elif F16
struct Block { a: vec4<f16>, b: vec4<f16>, c: vec4<f16>, d: vec4<f16> }
#else
alias Block = array<vec4<u32>, 2>;
#endif

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<Block>;
#if GLU
@group(0) @binding(3) var<storage, read> w_up: array<Block>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#else
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
#endif

const ROWS: u32 = {{ROWS}}u;
const WG: u32 = 16u;

// The 16 weights of a block as 4 vec4<f32>.
fn expand(b: Block) -> array<vec4<f32>, 4> {
#if F32
    return b;
#elif F16
    return array<vec4<f32>, 4>(vec4<f32>(b.a), vec4<f32>(b.b), vec4<f32>(b.c), vec4<f32>(b.d));
#else
    return array<vec4<f32>, 4>(
        vec4<f32>(unpack2x16float(b[0].x), unpack2x16float(b[0].y)),
        vec4<f32>(unpack2x16float(b[0].z), unpack2x16float(b[0].w)),
        vec4<f32>(unpack2x16float(b[1].x), unpack2x16float(b[1].y)),
        vec4<f32>(unpack2x16float(b[1].z), unpack2x16float(b[1].w)),
    );
#endif
}

#if GLU
fn silu(v: vec4<f32>) -> vec4<f32> {
    return v / (vec4<f32>(1.0) + exp(-v));
}
#endif

@compute @workgroup_size(16)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let blk = gid.x;
    let r0 = gid.y * ROWS;
    if (blk * 16u >= p.cols || r0 >= p.n_rows) {
        return;
    }
    let blocks_per_k = p.wcols / 16u;
    var acc: array<vec4<f32>, ROWS * 4u>;
#if GLU
    var acc_up: array<vec4<f32>, ROWS * 4u>;
#endif
    for (var k = 0u; k < p.k; k = k + 1u) {
        let wi = k * blocks_per_k + blk;
        let wg = expand(w[wi]);
#if GLU
        let wu = expand(w_up[wi]);
#endif
        for (var r = 0u; r < ROWS; r = r + 1u) {
            // Rows past n_rows re-read the last row; their results are never stored.
            let row = min(r0 + r, p.n_rows - 1u);
            let xv = vec4<f32>(x[p.x_offset + row * p.x_stride + k]);
            for (var j = 0u; j < 4u; j = j + 1u) {
                acc[r * 4u + j] = fma(xv, wg[j], acc[r * 4u + j]);
#if GLU
                acc_up[r * 4u + j] = fma(xv, wu[j], acc_up[r * 4u + j]);
#endif
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
