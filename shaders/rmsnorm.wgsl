// rmsnorm.wgsl: y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, one workgroup of 64 per row.
//
// Bindings (group 0):
//   0 uniform  Params (dynamic offset)
//   1 storage  x: array<f32>, row r at x_offset + r * x_stride, k elements
//   2 storage  w: array<f32>, k elements (norm weights are always kept in f32)
//   3 storage  y: array<f32>, row r at y_offset + r * y_stride (may alias nothing that is read)
// Defines: SUBGROUP (reduce with subgroupAdd, then across subgroups in workgroup memory) or the
// workgroup-memory tree; SERIAL (CPU adapters, entry `serial`): one invocation per row sums in the
// workgroup tree's order without the workgroup (rms_scale.wgsl's inv_rms, the CPU family's folded
// norm), where llvmpipe paid more for the tree's barriers than for the row. Either way the
// reduction order depends only on k, never on the number of rows, so the kernel is
// batch-invariant. Math in f32.

struct Params {
    // Elements per row.
    k: u32,
    n_rows: u32,
    x_offset: u32,
    x_stride: u32,
    y_offset: u32,
    y_stride: u32,
    eps: f32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const WG: u32 = 64u;
var<workgroup> red: array<f32, 64>;

#if SUBGROUP
fn workgroup_sum(v: f32, lid: u32, sg_lane: u32, sg_size: u32) -> f32 {
    let s = subgroupAdd(v);
    if (sg_lane == 0u) {
        red[lid / sg_size] = s;
    }
    workgroupBarrier();
    var total = 0.0;
    let n_sg = (WG + sg_size - 1u) / sg_size;
    for (var i = 0u; i < n_sg; i = i + 1u) {
        total = total + red[i];
    }
    return total;
}
#else
fn workgroup_sum(v: f32, lid: u32, sg_lane: u32, sg_size: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            red[lid] = red[lid] + red[lid + stride];
        }
        workgroupBarrier();
    }
    return red[0];
}
#endif

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
#if SUBGROUP
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
#endif
) {
#if !SUBGROUP
    let sg_lane = 0u;
    let sg_size = 1u;
#endif
    let row = wid.x + wid.y * 65535u;
    if (row >= p.n_rows) {
        return;
    }
    let xb = p.x_offset + row * p.x_stride;
    var s = 0.0;
    for (var i = lid; i < p.k; i = i + WG) {
        let v = x[xb + i];
        s = fma(v, v, s);
    }
    let total = workgroup_sum(s, lid, sg_lane, sg_size);
    let inv = 1.0 / sqrt(total / f32(p.k) + p.eps);
    let yb = p.y_offset + row * p.y_stride;
    for (var i = lid; i < p.k; i = i + WG) {
        y[yb + i] = x[xb + i] * inv * w[i];
    }
}

#if SERIAL
fn x_scalar(i: u32) -> f32 {
    return x[i];
}

#include rms_scale.wgsl

@compute @workgroup_size(8)
fn serial(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.x + gid.y * 65535u * 8u;
    if (row >= p.n_rows) {
        return;
    }
    let inv = inv_rms(row);
    let xb = p.x_offset + row * p.x_stride;
    let yb = p.y_offset + row * p.y_stride;
    for (var i = 0u; i < p.k; i = i + 1u) {
        y[yb + i] = x[xb + i] * inv * w[i];
    }
}
#endif
