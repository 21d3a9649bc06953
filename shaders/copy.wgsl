// copy.wgsl: plain data movement.
//   rows:      dst[dst_offset + r * dst_stride + i] = src[src_offset + r * src_stride + i] for i < width
//              (captures the residual stream of chosen rows as drafter features).
//   rows with WITHIN: the same copy inside one buffer (binding 1, read_write; ranges disjoint).
//   bandwidth: dst[i] = src[i] over vec4<u32>; the probe the benchmark compares the decode's weight
//              bandwidth against (it reads n and writes n 16-byte words).
//
// Bindings (group 0):
//   0 uniform  Params (dynamic offset)
//   1 storage  src (read)
//   2 storage  dst (read_write)
// Invariant: pure copies, no arithmetic.

struct Params {
    n_rows: u32,
    width: u32,
    src_offset: u32,
    src_stride: u32,
    dst_offset: u32,
    dst_stride: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
#if BANDWIDTH
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>;

// width = number of vec4<u32> words. Each invocation copies a block of 4 consecutive words per
// iteration of a grid-stride loop (wide per-invocation accesses are what llvmpipe moves fastest,
// the same shape as the matmul's weight loads).
@compute @workgroup_size(64)
fn bandwidth(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let stride = nwg.x * 64u * 4u;
    for (var i = gid.x * 4u; i + 3u < p.width; i = i + stride) {
        let a = src[i];
        let b = src[i + 1u];
        let c = src[i + 2u];
        let d = src[i + 3u];
        dst[i] = a;
        dst[i + 1u] = b;
        dst[i + 2u] = c;
        dst[i + 3u] = d;
    }
}
#elif WITHIN
@group(0) @binding(1) var<storage, read_write> data: array<f32>;

fn load(i: u32) -> f32 {
    return data[i];
}

fn store(i: u32, v: f32) {
    data[i] = v;
}
#else
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

fn load(i: u32) -> f32 {
    return src[i];
}

fn store(i: u32, v: f32) {
    dst[i] = v;
}
#endif

#if !BANDWIDTH
@compute @workgroup_size(64)
fn rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x + gid.y * 65535u * 64u;
    if (t >= p.n_rows * p.width) {
        return;
    }
    let i = t % p.width;
    let r = t / p.width;
    store(p.dst_offset + r * p.dst_stride + i, load(p.src_offset + r * p.src_stride + i));
}
#endif
