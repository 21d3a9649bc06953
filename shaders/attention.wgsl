// attention.wgsl: scaled dot-product attention with GQA over a KV cache, for N query rows.
// Two entry points run back to back (split-KV, "flash decoding"):
//   partial: one invocation per (row, head, chunk of CHUNK keys) writes the chunk's unnormalised
//            output sum_j e^(s_j - m) v_j and its (m, l) softmax statistics;
//   combine: one invocation per (row, head, channel) merges the chunks in chunk order.
//
// Bindings (group 0):
//   0 uniform  Params (dynamic offset)
//   1 storage  q: array<f32>, row r head h at q_offset + r * q_stride + h * head_dim      (partial)
//   2 storage  k_cache: array<f32>, [position][n_kv_heads][head_dim]                     (partial)
//   3 storage  v_cache: array<f32>, same layout                                           (partial)
//   4 storage  part: array<f32>, [row][head][n_chunks][head_dim] partial outputs   (rw / read)
//   5 storage  stats: array<vec2<f32>>, [row][head][n_chunks] = (max score m, sum e^(s-m))  (rw / read)
//   6 storage  out: array<f32>, row r head h at out_offset + r * out_stride + h * head_dim  (combine)
// Params carries row0 (the first row of this pass within the dispatch's rows), n_segs and segs (below).
//
// Segments: the rows of one dispatch may belong to up to MAX_SEGS sequences whose caches live in one
// buffer (a batched step's KV pool). Segment i = segs[i] = (first row, KV base, position of its first
// row, 0): its rows are consecutive positions of one sequence whose position 0 starts KV base floats
// into k_cache / v_cache. Pass row r is row row0 + r of the dispatch; its segment is the last whose
// first row <= row0 + r. One sequence alone is one segment (0, 0, kv_len).
// Masking: causal=1 -> a row at position pos sees its sequence's keys [0, pos]; causal=0 -> every
// row sees keys [0, kv_len) (the drafter's unmasked pass over [context cache ++ block]). Query head
// h reads kv head h / (n_heads / n_kv_heads).
// Defines: PARTIAL (the first entry point), COOP (GPU kernel family: the partial pass with one
// workgroup of CHUNK invocations per (row, head, chunk), below), WG (workgroup size: 8 on CPU adapters, where the few
// (row, head, chunk) invocations of a decode step must still spread over every core; 64 otherwise),
// D4 (head_dim / 4 rounded up: the CPU family's partial work keeps its query in D4 vec4 registers),
// V4 (head_dim, q_offset, q_stride and every KV base multiples of 4: q, K, V and the partials are
// read as vec4, with the same order of fma per channel as the scalar reads), FUSED (the CPU family's
// one-pass entry `fused`: partial and combine in one invocation per (row, KV head) with V4, serving
// the G = n_heads / n_kv_heads query heads of that KV head; per (row, head) without V4).
// Invariants: chunk boundaries are absolute key indices and every sum runs in a fixed order, so a row's
// output does not depend on how many rows are in the batch (batch invariance). head_dim <= 256.

struct Params {
    n_rows: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    q_offset: u32,
    q_stride: u32,
    kv_len: u32,
    causal: u32,
    n_chunks: u32,
    scale: f32,
    out_offset: u32,
    out_stride: u32,
    row0: u32,
    n_segs: u32,
    _pad0: u32,
    _pad1: u32,
    segs: array<vec4<u32>, MAX_SEGS>,
}

const CHUNK: u32 = 32u;
// Segments per dispatch: Params fills its 256-byte uniform slot (kernels.rs ATTENTION_SEGMENTS).
const MAX_SEGS: u32 = 12u;
const WG: u32 = {{WG}}u;
const NEG_BIG: f32 = -3.0e38;

@group(0) @binding(0) var<uniform> p: Params;
#if PARTIAL || FUSED
#if V4
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> part: array<vec4<f32>>;
#else
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_cache: array<f32>;
@group(0) @binding(3) var<storage, read> v_cache: array<f32>;
@group(0) @binding(4) var<storage, read_write> part: array<f32>;
#endif
@group(0) @binding(5) var<storage, read_write> stats: array<vec2<f32>>;
#if FUSED
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
#endif
#else
@group(0) @binding(4) var<storage, read> part: array<f32>;
@group(0) @binding(5) var<storage, read> stats: array<vec2<f32>>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
#endif

// A pass row's keys: how many it sees, and where its sequence's cache starts (floats).
struct RowKeys {
    visible: u32,
    base: u32,
}

fn row_keys(row: u32) -> RowKeys {
    let r = p.row0 + row;
    var seg = p.segs[0];
    for (var i = 1u; i < p.n_segs; i = i + 1u) {
        if (r >= p.segs[i].x) {
            seg = p.segs[i];
        }
    }
    var visible = p.kv_len;
    if (p.causal != 0u) {
        visible = seg.z + (r - seg.x) + 1u;
    }
    return RowKeys(visible, seg.y);
}

#if PARTIAL || FUSED
#if !COOP
// head_dim / 4, rounded up: a row-head's query is read once into registers, not once per key.
const D4: u32 = {{D4}}u;

// The query of (row, head), in channel order.
fn load_q(row: u32, head: u32) -> array<vec4<f32>, D4> {
    var qv: array<vec4<f32>, D4>;
    let qb = p.q_offset + row * p.q_stride + head * p.head_dim;
#if V4
    for (var i = 0u; i < D4; i = i + 1u) {
        qv[i] = q[qb / 4u + i];
    }
#else
    for (var i = 0u; i < p.head_dim; i = i + 1u) {
        qv[i / 4u][i % 4u] = q[qb + i];
    }
#endif
    return qv;
}

// One chunk of the CPU family's partial work for slot t = (row, head, chunk) with that row-head's
// query qv: scores in key order, their max m and sum l of e^(s - m), and the unnormalised output
// sum_j e^(s_j - m) v_j written to part[t * head_dim..]. The chunk must hold at least one visible
// key. Returns (m, l).
fn chunk_partial(t: u32, keys: RowKeys, head: u32, chunk: u32, qv: array<vec4<f32>, D4>) -> vec2<f32> {
    let d = p.head_dim;
    let start = chunk * CHUNK;
    let end = min(start + CHUNK, keys.visible);
    let kv_head = head / (p.n_heads / p.n_kv_heads);
    var s: array<f32, 32>;
    var m = NEG_BIG;
    for (var j = start; j < end; j = j + 1u) {
        let kb = keys.base + (j * p.n_kv_heads + kv_head) * d;
        var dot = 0.0;
#if V4
        for (var i = 0u; i < D4; i = i + 1u) {
            let kv = k_cache[kb / 4u + i];
            dot = fma(qv[i].x, kv.x, dot);
            dot = fma(qv[i].y, kv.y, dot);
            dot = fma(qv[i].z, kv.z, dot);
            dot = fma(qv[i].w, kv.w, dot);
        }
#else
        for (var i = 0u; i < d; i = i + 1u) {
            dot = fma(qv[i / 4u][i % 4u], k_cache[kb + i], dot);
        }
#endif
        let score = dot * p.scale;
        s[j - start] = score;
        m = max(m, score);
    }
    var l = 0.0;
    let pb = t * d;
#if V4
    // Key by key, every channel's sum in registers: each score is read once (llvmpipe reads a
    // private array at a varying index lane by lane), and every channel still sums in key order.
    var a: array<vec4<f32>, D4>;
    for (var i = 0u; i < D4; i = i + 1u) {
        a[i] = vec4<f32>(0.0);
    }
    for (var j = start; j < end; j = j + 1u) {
        let e = exp(s[j - start] - m);
        l = l + e;
        let vb = keys.base / 4u + (j * p.n_kv_heads + kv_head) * D4;
        for (var i = 0u; i < D4; i = i + 1u) {
            a[i] = fma(vec4<f32>(e), v_cache[vb + i], a[i]);
        }
    }
    for (var i = 0u; i < D4; i = i + 1u) {
        part[pb / 4u + i] = a[i];
    }
#else
    for (var j = start; j < end; j = j + 1u) {
        let e = exp(s[j - start] - m);
        s[j - start] = e;
        l = l + e;
    }
    for (var i = 0u; i < d; i = i + 1u) {
        var a = 0.0;
        for (var j = start; j < end; j = j + 1u) {
            a = fma(s[j - start], v_cache[keys.base + (j * p.n_kv_heads + kv_head) * d + i], a);
        }
        part[pb + i] = a;
    }
#endif
    return vec2<f32>(m, l);
}
#endif
#endif

#if PARTIAL
#if COOP
// The GPU family's partial pass: one workgroup of CHUNK invocations per (row, head, chunk), so a
// decode step at 4k keys has n_heads * 128 workgroups. Invocation j scores key start + j alone (dot
// product in channel order); the chunk's max and sum run through fixed trees in workgroup memory;
// invocation i then owns channels i, i + CHUNK, ... and sums over the chunk's keys in key order.
var<workgroup> weight: array<f32, CHUNK>;
var<workgroup> tree: array<f32, CHUNK>;

fn tree_max(li: u32) -> f32 {
    for (var stride = CHUNK / 2u; stride > 0u; stride = stride / 2u) {
        workgroupBarrier();
        if (li < stride) {
            tree[li] = max(tree[li], tree[li + stride]);
        }
    }
    workgroupBarrier();
    let result = tree[0];
    // Nobody may overwrite tree[0] before everyone has read it.
    workgroupBarrier();
    return result;
}

fn tree_sum(li: u32) -> f32 {
    for (var stride = CHUNK / 2u; stride > 0u; stride = stride / 2u) {
        workgroupBarrier();
        if (li < stride) {
            tree[li] = tree[li] + tree[li + stride];
        }
    }
    workgroupBarrier();
    let result = tree[0];
    // Nobody may overwrite tree[0] before everyone has read it.
    workgroupBarrier();
    return result;
}

@compute @workgroup_size(CHUNK)
fn partial(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let t = wid.x + wid.y * 65535u;
    let valid = t < p.n_rows * p.n_heads * p.n_chunks;
    let tc = min(t, p.n_rows * p.n_heads * p.n_chunks - 1u);
    let chunk = tc % p.n_chunks;
    let head = (tc / p.n_chunks) % p.n_heads;
    let row = tc / (p.n_chunks * p.n_heads);
    let d = p.head_dim;
    let start = chunk * CHUNK;
    let keys = row_keys(row);
    let visible = keys.visible;
    let end = min(start + CHUNK, visible);
    let kv_head = head / (p.n_heads / p.n_kv_heads);
    let qb = p.q_offset + row * p.q_stride + head * d;
    let j = start + li;
    let live = valid && j < end;
    var score = NEG_BIG;
    if (live) {
        let kb = keys.base + (j * p.n_kv_heads + kv_head) * d;
        var dot = 0.0;
#if V4
        for (var i = 0u; i < d / 4u; i = i + 1u) {
            let qv = q[qb / 4u + i];
            let kv = k_cache[kb / 4u + i];
            dot = fma(qv.x, kv.x, dot);
            dot = fma(qv.y, kv.y, dot);
            dot = fma(qv.z, kv.z, dot);
            dot = fma(qv.w, kv.w, dot);
        }
#else
        for (var i = 0u; i < d; i = i + 1u) {
            dot = fma(q[qb + i], k_cache[kb + i], dot);
        }
#endif
        score = dot * p.scale;
    }
    tree[li] = score;
    let m = tree_max(li);
    var e = 0.0;
    if (live) {
        e = exp(score - m);
    }
    weight[li] = e;
    tree[li] = e;
    let l = tree_sum(li);
    if (valid && start < visible) {
        let pb = t * d;
        let n = end - start;
#if V4
        for (var i = li; i < d / 4u; i = i + CHUNK) {
            var a = vec4<f32>(0.0);
            for (var jj = 0u; jj < n; jj = jj + 1u) {
                a = fma(vec4<f32>(weight[jj]), v_cache[(keys.base + (start + jj) * p.n_kv_heads * d + kv_head * d) / 4u + i], a);
            }
            part[pb / 4u + i] = a;
        }
#else
        for (var i = li; i < d; i = i + CHUNK) {
            var a = 0.0;
            for (var jj = 0u; jj < n; jj = jj + 1u) {
                a = fma(weight[jj], v_cache[keys.base + ((start + jj) * p.n_kv_heads + kv_head) * d + i], a);
            }
            part[pb + i] = a;
        }
#endif
    }
    if (valid && li == 0u) {
        if (start < visible) {
            stats[t] = vec2<f32>(m, l);
        } else {
            stats[t] = vec2<f32>(NEG_BIG, 0.0);
        }
    }
}
#else
@compute @workgroup_size(WG)
fn partial(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x + gid.y * 65535u * WG;
    if (t >= p.n_rows * p.n_heads * p.n_chunks) {
        return;
    }
    let chunk = t % p.n_chunks;
    let head = (t / p.n_chunks) % p.n_heads;
    let row = t / (p.n_chunks * p.n_heads);
    let keys = row_keys(row);
    if (chunk * CHUNK >= keys.visible) {
        stats[t] = vec2<f32>(NEG_BIG, 0.0);
        return;
    }
    stats[t] = chunk_partial(t, keys, head, chunk, load_q(row, head));
}
#endif
#elif FUSED
#if V4
// The CPU family's one-pass attention: one invocation per (row, KV head) runs, for each chunk in
// turn, the partial pass's work for all G query heads that share the KV head (into the same
// scratch), then the combine pass's merge for each of them, so the output has the two-pass
// kernel's bits in one dispatch instead of two. Each key and value is loaded once for the G heads:
// llvmpipe loads storage words lane by lane, so the loads are what a CPU adapter pays for.
const G: u32 = {{G}}u;

@compute @workgroup_size(WG)
fn fused(@builtin(global_invocation_id) gid: vec3<u32>) {
    let rk = gid.x + gid.y * 65535u * WG;
    if (rk >= p.n_rows * p.n_kv_heads) {
        return;
    }
    let kv_head = rk % p.n_kv_heads;
    let row = rk / p.n_kv_heads;
    let keys = row_keys(row);
    let n_used = (keys.visible + CHUNK - 1u) / CHUNK;
    var q_group: array<array<vec4<f32>, D4>, G>;
    for (var g = 0u; g < G; g = g + 1u) {
        q_group[g] = load_q(row, kv_head * G + g);
    }
    // Per chunk, chunk_partial's sums for each head kv_head * G + g of the group, in the same
    // order per head: scores in key order, their max m and sum l of e^(s - m), the output sums key
    // by key; written to part / stats at that head's slot (row, head, chunk).
    var scores: array<array<f32, CHUNK>, G>;
    var sums: array<array<vec4<f32>, D4>, G>;
    var m: array<f32, G>;
    var l: array<f32, G>;
    var dot: array<f32, G>;
    var e: array<f32, G>;
    for (var chunk = 0u; chunk < n_used; chunk = chunk + 1u) {
        let start = chunk * CHUNK;
        let end = min(start + CHUNK, keys.visible);
        for (var g = 0u; g < G; g = g + 1u) {
            m[g] = NEG_BIG;
            l[g] = 0.0;
            for (var i = 0u; i < D4; i = i + 1u) {
                sums[g][i] = vec4<f32>(0.0);
            }
        }
        for (var j = start; j < end; j = j + 1u) {
            let kb = keys.base / 4u + (j * p.n_kv_heads + kv_head) * D4;
            for (var g = 0u; g < G; g = g + 1u) {
                dot[g] = 0.0;
            }
            for (var i = 0u; i < D4; i = i + 1u) {
                let kv = k_cache[kb + i];
                for (var g = 0u; g < G; g = g + 1u) {
                    var d = dot[g];
                    d = fma(q_group[g][i].x, kv.x, d);
                    d = fma(q_group[g][i].y, kv.y, d);
                    d = fma(q_group[g][i].z, kv.z, d);
                    d = fma(q_group[g][i].w, kv.w, d);
                    dot[g] = d;
                }
            }
            for (var g = 0u; g < G; g = g + 1u) {
                let score = dot[g] * p.scale;
                scores[g][j - start] = score;
                m[g] = max(m[g], score);
            }
        }
        for (var j = start; j < end; j = j + 1u) {
            let vb = keys.base / 4u + (j * p.n_kv_heads + kv_head) * D4;
            for (var g = 0u; g < G; g = g + 1u) {
                e[g] = exp(scores[g][j - start] - m[g]);
                l[g] = l[g] + e[g];
            }
            for (var i = 0u; i < D4; i = i + 1u) {
                let v = v_cache[vb + i];
                for (var g = 0u; g < G; g = g + 1u) {
                    sums[g][i] = fma(vec4<f32>(e[g]), v, sums[g][i]);
                }
            }
        }
        for (var g = 0u; g < G; g = g + 1u) {
            let t = (row * p.n_heads + kv_head * G + g) * p.n_chunks + chunk;
            for (var i = 0u; i < D4; i = i + 1u) {
                part[t * D4 + i] = sums[g][i];
            }
            stats[t] = vec2<f32>(m[g], l[g]);
        }
    }
    // The combine pass's merge for each head, four channels at a time, in chunk order.
    for (var g = 0u; g < G; g = g + 1u) {
        let head = kv_head * G + g;
        let sb = (row * p.n_heads + head) * p.n_chunks;
        var m_all = NEG_BIG;
        for (var c = 0u; c < n_used; c = c + 1u) {
            m_all = max(m_all, stats[sb + c].x);
        }
        let ob = p.out_offset + row * p.out_stride + head * p.head_dim;
        for (var i = 0u; i < D4; i = i + 1u) {
            var lsum = 0.0;
            var o = vec4<f32>(0.0);
            for (var c = 0u; c < n_used; c = c + 1u) {
                let st = stats[sb + c];
                let f = exp(st.x - m_all);
                lsum = fma(st.y, f, lsum);
                o = fma(part[(sb + c) * D4 + i], vec4<f32>(f), o);
            }
            let r = o / lsum;
            out[ob + 4u * i] = r.x;
            out[ob + 4u * i + 1u] = r.y;
            out[ob + 4u * i + 2u] = r.z;
            out[ob + 4u * i + 3u] = r.w;
        }
    }
}
#else
// The CPU family's one-pass attention with scalar reads: one invocation per (row, head) runs the
// partial pass's work for each chunk in turn (chunk_partial, into the same scratch), then the
// combine pass's merge for each channel: the two-pass kernel's bits in one dispatch.
@compute @workgroup_size(WG)
fn fused(@builtin(global_invocation_id) gid: vec3<u32>) {
    let rh = gid.x + gid.y * 65535u * WG;
    if (rh >= p.n_rows * p.n_heads) {
        return;
    }
    let head = rh % p.n_heads;
    let row = rh / p.n_heads;
    let d = p.head_dim;
    let keys = row_keys(row);
    let n_used = (keys.visible + CHUNK - 1u) / CHUNK;
    let sb = rh * p.n_chunks;
    let qv = load_q(row, head);
    var m_all = NEG_BIG;
    for (var chunk = 0u; chunk < n_used; chunk = chunk + 1u) {
        let st = chunk_partial(sb + chunk, keys, head, chunk, qv);
        stats[sb + chunk] = st;
        m_all = max(m_all, st.x);
    }
    // The combine pass's merge, channel by channel, in chunk order.
    let ob = p.out_offset + row * p.out_stride + head * d;
    for (var i = 0u; i < d; i = i + 1u) {
        var l = 0.0;
        var o = 0.0;
        for (var c = 0u; c < n_used; c = c + 1u) {
            let st = stats[sb + c];
            let f = exp(st.x - m_all);
            l = fma(st.y, f, l);
            o = fma(part[(sb + c) * d + i], f, o);
        }
        out[ob + i] = o / l;
    }
}
#endif
#else
@compute @workgroup_size(WG)
fn combine(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x + gid.y * 65535u * WG;
    let d = p.head_dim;
    if (t >= p.n_rows * p.n_heads * d) {
        return;
    }
    let i = t % d;
    let head = (t / d) % p.n_heads;
    let row = t / (d * p.n_heads);
    let n_used = (row_keys(row).visible + CHUNK - 1u) / CHUNK;
    let sb = (row * p.n_heads + head) * p.n_chunks;
    var m = NEG_BIG;
    for (var c = 0u; c < n_used; c = c + 1u) {
        m = max(m, stats[sb + c].x);
    }
    var l = 0.0;
    var o = 0.0;
    for (var c = 0u; c < n_used; c = c + 1u) {
        let st = stats[sb + c];
        let f = exp(st.x - m);
        l = fma(st.y, f, l);
        o = fma(part[(sb + c) * d + i], f, o);
    }
    out[p.out_offset + row * p.out_stride + head * d + i] = o / l;
}
#endif
