// rope.wgsl: optional per-head RMSNorm (Qwen3's q_norm / k_norm) then rotate-half (NeoX) RoPE.
// One invocation per (row, head).
// QKV variant (entry `qkv`): the fused q/k/v projection's output in, one invocation per (row, slot)
// over n_heads q slots, n_kv_heads k slots and n_kv_heads v slots: q heads are normed and rotated
// into q, k heads into the K cache, v heads copied into the V cache. Bindings then: 1 src (qkv rows,
// [q | k | v] of width (n_heads + 2 n_kv_heads) * head_dim), 2 q_norm, 3 rope, 4 q, 5 k_norm,
// 6 k_cache, 7 v_cache. The per-head arithmetic is the same as `main`'s, so both give the same bits.
// Its rows may belong to up to MAX_SEGS sequences whose caches share one buffer: segment i =
// segs[i] = (first row, KV base in floats, position of its first row, 0); a row at position pos of
// a segment writes its K and V at KV base + pos * kv_stride and rotates by pos. One sequence alone
// is the segment (0, 0, pos0).
//
// Bindings (group 0):
//   0 uniform  Params (dynamic offset)
//   1 storage  src: array<f32>, row r head h at src_offset + r * src_stride + h * head_dim
//   2 storage  norm_w: array<f32>, [head_dim] (ignored when use_norm = 0)
//   3 storage  rope: array<vec2<f32>>, [position][head_dim / 2] = (cos, sin), computed on the CPU
//              in f64 from f32 angles so every backend rotates by the same numbers
//   4 storage  dst: array<f32>, row r head h at dst_offset + r * dst_stride + h * head_dim
//              (for K this is the cache: dst_offset = first position * n_kv_heads * head_dim)
// Row r sits at position pos0 + r. Pairs are (i, i + head_dim/2). Per-row work only: batch-invariant.

#if QKV
struct Params {
    n_rows: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    src_offset: u32,
    src_stride: u32,
    q_offset: u32,
    q_stride: u32,
    kv_stride: u32,
    use_norm: u32,
    eps: f32,
    n_segs: u32,
    segs: array<vec4<u32>, MAX_SEGS>,
}

// Segments per dispatch: Params fills its 256-byte uniform slot (kernels.rs ATTENTION_SEGMENTS).
const MAX_SEGS: u32 = 12u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> q_norm: array<f32>;
@group(0) @binding(3) var<storage, read> rope: array<vec2<f32>>;
@group(0) @binding(4) var<storage, read_write> q_out: array<f32>;
@group(0) @binding(5) var<storage, read> k_norm: array<f32>;
@group(0) @binding(6) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(7) var<storage, read_write> v_cache: array<f32>;

@compute @workgroup_size(64)
fn qkv(@builtin(global_invocation_id) gid: vec3<u32>) {
    let slots = p.n_heads + 2u * p.n_kv_heads;
    let t = gid.x;
    if (t >= p.n_rows * slots) {
        return;
    }
    let slot = t % slots;
    let row = t / slots;
    var seg = p.segs[0];
    for (var i = 1u; i < p.n_segs; i = i + 1u) {
        if (row >= p.segs[i].x) {
            seg = p.segs[i];
        }
    }
    let pos = seg.z + (row - seg.x);
    let kv_row = seg.y + pos * p.kv_stride;
    let d = p.head_dim;
    let half_d = d / 2u;
    let sb = p.src_offset + row * p.src_stride + slot * d;
    if (slot >= p.n_heads + p.n_kv_heads) {
        let db = kv_row + (slot - p.n_heads - p.n_kv_heads) * d;
        for (var i = 0u; i < d; i = i + 1u) {
            v_cache[db + i] = src[sb + i];
        }
        return;
    }
    let is_q = slot < p.n_heads;
    var db = kv_row + (slot - p.n_heads) * d;
    if (is_q) {
        db = p.q_offset + row * p.q_stride + slot * d;
    }
    var inv = 1.0;
    if (p.use_norm != 0u) {
        var ss = 0.0;
        for (var i = 0u; i < d; i = i + 1u) {
            let v = src[sb + i];
            ss = fma(v, v, ss);
        }
        inv = 1.0 / sqrt(ss / f32(d) + p.eps);
    }
    let rb = pos * half_d;
    for (var i = 0u; i < half_d; i = i + 1u) {
        var a = src[sb + i];
        var b = src[sb + i + half_d];
        if (p.use_norm != 0u) {
            if (is_q) {
                a = a * inv * q_norm[i];
                b = b * inv * q_norm[i + half_d];
            } else {
                a = a * inv * k_norm[i];
                b = b * inv * k_norm[i + half_d];
            }
        }
        let cs = rope[rb + i];
        let ra = a * cs.x - b * cs.y;
        let rb2 = b * cs.x + a * cs.y;
        if (is_q) {
            q_out[db + i] = ra;
            q_out[db + i + half_d] = rb2;
        } else {
            k_cache[db + i] = ra;
            k_cache[db + i + half_d] = rb2;
        }
    }
}
#else
struct Params {
    n_rows: u32,
    n_heads: u32,
    head_dim: u32,
    src_offset: u32,
    src_stride: u32,
    dst_offset: u32,
    dst_stride: u32,
    pos0: u32,
    use_norm: u32,
    eps: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> norm_w: array<f32>;
@group(0) @binding(3) var<storage, read> rope: array<vec2<f32>>;
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x;
    if (t >= p.n_rows * p.n_heads) {
        return;
    }
    let head = t % p.n_heads;
    let row = t / p.n_heads;
    let d = p.head_dim;
    let half_d = d / 2u;
    let sb = p.src_offset + row * p.src_stride + head * d;
    let db = p.dst_offset + row * p.dst_stride + head * d;
    var inv = 1.0;
    if (p.use_norm != 0u) {
        var ss = 0.0;
        for (var i = 0u; i < d; i = i + 1u) {
            let v = src[sb + i];
            ss = fma(v, v, ss);
        }
        inv = 1.0 / sqrt(ss / f32(d) + p.eps);
    }
    let rb = (p.pos0 + row) * half_d;
    for (var i = 0u; i < half_d; i = i + 1u) {
        var a = src[sb + i];
        var b = src[sb + i + half_d];
        if (p.use_norm != 0u) {
            a = a * inv * norm_w[i];
            b = b * inv * norm_w[i + half_d];
        }
        let cs = rope[rb + i];
        dst[db + i] = a * cs.x - b * cs.y;
        dst[db + i + half_d] = b * cs.x + a * cs.y;
    }
}
#endif
