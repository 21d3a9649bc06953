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
//              TEXTURE variant (CPU adapters, with F32 or packed f16): w is a texture_2d<u32> of
//              rgba32uint texels read as one linear array (texel t at (t & (W-1), t >> TEX_SHIFT)).
//              Columns come in groups of 128 = 8 invocations x 16; an invocation's 16 columns are
//              PARTS texels (packed f16: 2 texels of 8 halves; F32: 4 texels of 4 floats), and texel
//              (group g, part s, input k, invocation i of the group) is ((g * PARTS + s) * K + k) * 8 + i
//              (tensor.rs upload_texture). Eight neighbouring invocations then walk one contiguous run
//              per part as k advances: llvmpipe fetches a texel with one vector load, where it reads a
//              storage buffer one bounds-checked word per lane, and streams need contiguous runs.
//   3 storage  w_up (GLU variant only): the up projection, same layout as w (the gate)
//   3/4 storage y: array<f32>, row r column (col0 + c) at y_offset + r * y_stride + col0 + c
//   5 storage  norm_w (NORM only): array<f32>, the k RMSNorm weights of x's rows
//   X_UNIFORM variant (CPU adapters): x is a uniform window of X_WINDOW vec4s (x_offset counts from
//              the window's start) and norm_w a uniform array of NORM_WINDOW = k / 4 vec4s: llvmpipe
//              gathers uniform words branch-free where it loads storage words in a per-lane loop.
// Defines: ROWS (rows per invocation: 1 for decode, else up to MATMUL_ROWS = 3, balanced over the
// passes: kernels.rs rows_per_invocation), F32 | F16, GLU,
// NORM (x is RMSNorm-ed on the fly: binding 5 holds the k norm weights, eps in Params; see inv_rms),
// TEXTURE with TEX_SHIFT (log2 of the texture width), X4 (x read as vec4: k, x_offset, x_stride
// multiples of 4), X_UNIFORM with X_WINDOW (and NORM_WINDOW).
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
    // NORM: the RMSNorm epsilon.
    eps: f32,
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
#else
@group(0) @binding(2) var<storage, read> w: array<Block>;
#if GLU
@group(0) @binding(3) var<storage, read> w_up: array<Block>;
#endif
#endif
#if GLU
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#else
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
#endif

const ROWS: u32 = {{ROWS}}u;
const WG: u32 = {{WG}}u;

fn x_scalar(i: u32) -> f32 {
#if X4 || X_UNIFORM
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
#else
@group(0) @binding(5) var<storage, read> norm_w: array<f32>;

fn norm_at(k: u32) -> f32 {
    return norm_w[k];
}
#endif

#include rms_scale.wgsl
#endif

#if TEXTURE
const TEX_SHIFT: u32 = {{TEX_SHIFT}}u;
#if F32
const PARTS: u32 = 4u;
#else
const PARTS: u32 = 2u;
#endif

fn texel_coords(t: u32) -> vec2<u32> {
    return vec2<u32>(t & ((1u << TEX_SHIFT) - 1u), t >> TEX_SHIFT);
}

// Block `blk` (16 columns) at input k of a weight texture: PARTS texels, K * 8 apart.
fn load_block(tex: texture_2d<u32>, blk: u32, k: u32) -> Block {
    let t = ((blk >> 3u) * PARTS * p.k + k) * 8u + (blk & 7u);
    let part = p.k * 8u;
#if F32
    return array<vec4<f32>, 4>(bitcast<vec4<f32>>(textureLoad(tex, texel_coords(t), 0)), bitcast<vec4<f32>>(textureLoad(tex, texel_coords(t + part), 0)),
                 bitcast<vec4<f32>>(textureLoad(tex, texel_coords(t + 2u * part), 0)), bitcast<vec4<f32>>(textureLoad(tex, texel_coords(t + 3u * part), 0)));
#else
    return array<vec4<u32>, 2>(textureLoad(tex, texel_coords(t), 0), textureLoad(tex, texel_coords(t + part), 0));
#endif
}

// The gate (or only) weight's block, and the up weight's.
fn load_w(blk: u32, k: u32) -> Block {
    return load_block(w, blk, k);
}

#if GLU
fn load_up(blk: u32, k: u32) -> Block {
    return load_block(w_up, blk, k);
}
#endif
#else
fn load_w(blk: u32, k: u32) -> Block {
    return w[k * (p.wcols / 16u) + blk];
}

#if GLU
fn load_up(blk: u32, k: u32) -> Block {
    return w_up[k * (p.wcols / 16u) + blk];
}
#endif
#endif

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

alias Acc = array<vec4<f32>, ROWS * 4u>;

// One step of k: acc[r] (+ acc_up[r] for GLU) += xs[r] * W[k, this block] for each row r.
fn mac(acc: ptr<function, Acc>, acc_up: ptr<function, Acc>, blk: u32, k: u32, xs: array<f32, ROWS>) {
    let wg = expand(load_w(blk, k));
#if GLU
    let wu = expand(load_up(blk, k));
#endif
    for (var r = 0u; r < ROWS; r = r + 1u) {
        let xv = vec4<f32>(xs[r]);
        for (var j = 0u; j < 4u; j = j + 1u) {
            (*acc)[r * 4u + j] = fma(xv, wg[j], (*acc)[r * 4u + j]);
#if GLU
            (*acc_up)[r * 4u + j] = fma(xv, wu[j], (*acc_up)[r * 4u + j]);
#endif
        }
    }
}

#if X4
// Component e of each row's four inputs.
fn lane(x4: array<vec4<f32>, ROWS>, e: u32) -> array<f32, ROWS> {
    var xs: array<f32, ROWS>;
    for (var r = 0u; r < ROWS; r = r + 1u) {
        xs[r] = x4[r][e];
    }
    return xs;
}
#endif

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let blk = gid.x;
    let r0 = gid.y * ROWS;
    if (blk * 16u >= p.cols || r0 >= p.n_rows) {
        return;
    }
    var acc: Acc;
    var acc_up: Acc;
    // Rows past n_rows re-read the last row; their results are never stored.
#if NORM
    var inv: array<f32, ROWS>;
    for (var r = 0u; r < ROWS; r = r + 1u) {
        inv[r] = inv_rms(min(r0 + r, p.n_rows - 1u));
    }
#endif
#if X4
    // x read four inputs at a time (k, x_offset and x_stride are multiples of 4): one vector load
    // instead of four scalar ones, the same order of accumulation.
    for (var k = 0u; k < p.k; k = k + 4u) {
        var x4: array<vec4<f32>, ROWS>;
        for (var r = 0u; r < ROWS; r = r + 1u) {
            let row = min(r0 + r, p.n_rows - 1u);
            x4[r] = x[(p.x_offset + row * p.x_stride + k) / 4u];
#if NORM
            x4[r] = x4[r] * inv[r] * vec4<f32>(norm_at(k), norm_at(k + 1u), norm_at(k + 2u), norm_at(k + 3u));
#endif
        }
        mac(&acc, &acc_up, blk, k, lane(x4, 0u));
        mac(&acc, &acc_up, blk, k + 1u, lane(x4, 1u));
        mac(&acc, &acc_up, blk, k + 2u, lane(x4, 2u));
        mac(&acc, &acc_up, blk, k + 3u, lane(x4, 3u));
    }
#else
    for (var k = 0u; k < p.k; k = k + 1u) {
        var xs: array<f32, ROWS>;
        for (var r = 0u; r < ROWS; r = r + 1u) {
            let row = min(r0 + r, p.n_rows - 1u);
            xs[r] = x_scalar(p.x_offset + row * p.x_stride + k);
#if NORM
            xs[r] = xs[r] * inv[r] * norm_at(k);
#endif
        }
        mac(&acc, &acc_up, blk, k, xs);
    }
#endif
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
