// embedding.wgsl: gather token embeddings, y[r, j] = E[ids[r], j].
// The embedding shares the transposed matrix layout of matmul.wgsl ([hidden][wcols], vocabulary along
// columns), so a tied lm_head and the embedding are ONE tensor on the GPU. A vocabulary too large for one
// binding is split into column chunks: one dispatch per chunk, and each invocation writes only when its
// token falls in [col0, col0 + cols).
//
// Bindings (group 0):
//   0 uniform  Params (dynamic offset)
//   1 storage  ids: array<u32>, token of row r at ids[ids_offset + r]
//   2 storage  w: the chunk; F32 -> array<f32>; F16 -> array<f16>; else array<u32> of packed f16 pairs
//   3 storage  y: array<f32>, row r at y_offset + r * y_stride
// One invocation per (row, channel). Pure gather: batch-invariant.

struct Params {
    n_rows: u32,
    hidden: u32,
    col0: u32,
    cols: u32,
    wcols: u32,
    ids_offset: u32,
    y_offset: u32,
    y_stride: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
#if F32
@group(0) @binding(2) var<storage, read> w: array<f32>;
#elif F16
@group(0) @binding(2) var<storage, read> w: array<f16>;
#else
@group(0) @binding(2) var<storage, read> w: array<u32>;
#endif
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

fn load(i: u32) -> f32 {
#if F32
    return w[i];
#elif F16
    return f32(w[i]);
#else
    let pair = unpack2x16float(w[i / 2u]);
    return select(pair.x, pair.y, (i & 1u) == 1u);
#endif
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x + gid.y * 65535u * 64u;
    if (t >= p.n_rows * p.hidden) {
        return;
    }
    let j = t % p.hidden;
    let row = t / p.hidden;
    let token = ids[p.ids_offset + row];
    if (token < p.col0 || token >= p.col0 + p.cols) {
        return;
    }
    y[p.y_offset + row * p.y_stride + j] = load(j * p.wcols + (token - p.col0));
}
