// sampling.wgsl: choose the next token of each row from its logits, on the GPU, so that only token ids
// are read back. One workgroup of 256 per row.
//   argmax: the first index of the largest logit (ties -> lowest index; NaN never wins).
//   sample: softmax(logits / temperature) restricted to the top_k largest (top_k = 0: all) and then to
//           the smallest top set with mass >= top_p (top_p >= 1: all), sampled with a counter-based PCG
//           hash of (seed, counter + row). Thresholds are found by bisection on the value (32 steps), so
//           tokens tied within ~1e-8 of a threshold are kept together.
//
// Bindings (group 0):
//   0 uniform  Params (dynamic offset)
//   1 storage  logits: array<f32>, row r at logits_offset + r * logits_stride, vocab entries
//   2 storage  out: array<u32>, token of row r written at out_offset + r
//   3 storage  result (speculative only): [a, committed tokens...] at result_offset
//   speculative: lossless speculative sampling for greedy (one-hot) drafts (Leviathan et al. 2023).
//           Rows 0..K of the verify logits, drafts d_1..d_K at out[out_offset + 1 ..]: accept d_i with
//           probability p_i(d_i); at the first rejection draw from p_i without d_i, renormalised; if all
//           are accepted draw the bonus from p_K. Writes that token at out[out_offset + 1 + a] (the next
//           anchor) and result = [a, d_1..d_a, token]. Every row is evaluated (uniform control flow for
//           the barriers), then thread 0 resolves the first rejection.
// Invariants: every reduction runs over the same per-thread strided/chunked order with a fixed tree,
// independent of the number of rows: batch-invariant and deterministic for a given seed.

struct Params {
    vocab: u32,
    n_rows: u32,
    logits_offset: u32,
    logits_stride: u32,
    out_offset: u32,
    top_k: u32,
    seed: u32,
    counter: u32,
    temperature: f32,
    top_p: f32,
    result_offset: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
#if SPECULATIVE
@group(0) @binding(3) var<storage, read_write> result: array<u32>;
#endif

const WG: u32 = 256u;
const NEG_BIG: f32 = -3.0e38;
var<workgroup> red_f: array<f32, 256>;
var<workgroup> red_u: array<u32, 256>;
var<workgroup> chosen: u32;

// Largest value, lowest index on ties. Must be called in uniform control flow.
fn reduce_max_idx(v: f32, i: u32, lid: u32) -> vec2<u32> {
    red_f[lid] = v;
    red_u[lid] = i;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            let ov = red_f[lid + stride];
            let oi = red_u[lid + stride];
            if (ov > red_f[lid] || (ov == red_f[lid] && oi < red_u[lid])) {
                red_f[lid] = ov;
                red_u[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    let r = vec2<u32>(bitcast<u32>(red_f[0]), red_u[0]);
    workgroupBarrier();
    return r;
}

fn reduce_sum(v: f32, lid: u32) -> f32 {
    red_f[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            red_f[lid] = red_f[lid] + red_f[lid + stride];
        }
        workgroupBarrier();
    }
    let r = red_f[0];
    workgroupBarrier();
    return r;
}

fn reduce_min(v: f32, lid: u32) -> f32 {
    red_f[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lid < stride) {
            red_f[lid] = min(red_f[lid], red_f[lid + stride]);
        }
        workgroupBarrier();
    }
    let r = red_f[0];
    workgroupBarrier();
    return r;
}

fn local_argmax(lb: u32, lid: u32) -> vec2<u32> {
    var best = NEG_BIG;
    var bi = 0xffffffffu;
    for (var i = lid; i < p.vocab; i = i + WG) {
        let v = logits[lb + i];
        if (v > best || (v == best && i < bi)) {
            best = v;
            bi = i;
        }
    }
    return reduce_max_idx(best, bi, lid);
}

@compute @workgroup_size(256)
fn argmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x;
    if (row >= p.n_rows) {
        return;
    }
    let r = local_argmax(p.logits_offset + row * p.logits_stride, lid);
    if (lid == 0u) {
        out[p.out_offset + row] = select(r.y, 0u, r.y >= p.vocab);
    }
}

fn pcg(v: u32) -> u32 {
    let state = v * 747796405u + 2891336453u;
    let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
}

// Mass of exp(z) over tokens with z >= thr, z = (logit - max) / temperature.
fn kept_mass(lb: u32, mx: f32, thr: f32, lid: u32) -> f32 {
    var s = 0.0;
    for (var i = lid; i < p.vocab; i = i + WG) {
        let z = (logits[lb + i] - mx) / p.temperature;
        if (z >= thr) {
            s = s + exp(z);
        }
    }
    return reduce_sum(s, lid);
}

fn kept_count(lb: u32, mx: f32, thr: f32, lid: u32) -> f32 {
    var c = 0.0;
    for (var i = lid; i < p.vocab; i = i + WG) {
        if ((logits[lb + i] - mx) / p.temperature >= thr) {
            c = c + 1.0;
        }
    }
    return reduce_sum(c, lid);
}

// The filtered distribution of a row: (max logit, threshold on z, kept mass). Uniform control flow.
fn filtered(lb: u32, lid: u32) -> vec3<f32> {
    let top = local_argmax(lb, lid);
    let mx = bitcast<f32>(top.x);
    // Threshold of the top-k set, by bisection on z in [min z, 0].
    var thr = NEG_BIG;
    if (p.top_k > 0u && p.top_k < p.vocab) {
        var local_min = 0.0;
        for (var i = lid; i < p.vocab; i = i + WG) {
            local_min = min(local_min, (logits[lb + i] - mx) / p.temperature);
        }
        var lo = reduce_min(local_min, lid);
        var hi = 0.0;
        for (var it = 0u; it < 32u; it = it + 1u) {
            let mid = 0.5 * (lo + hi);
            if (kept_count(lb, mx, mid, lid) >= f32(p.top_k)) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        thr = lo;
    }
    var total = kept_mass(lb, mx, thr, lid);
    // Nucleus: the largest threshold whose kept mass is still >= top_p of the total.
    if (p.top_p < 1.0) {
        var lo = max(thr, -200.0);
        var hi = 0.0;
        let target_mass = p.top_p * total;
        for (var it = 0u; it < 32u; it = it + 1u) {
            let mid = 0.5 * (lo + hi);
            if (kept_mass(lb, mx, mid, lid) >= target_mass) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        thr = max(thr, lo);
        total = kept_mass(lb, mx, thr, lid);
    }
    return vec3<f32>(mx, thr, total);
}

fn uniform01(n: u32) -> f32 {
    return f32(pcg(pcg(p.seed) ^ n) >> 8u) / 16777216.0;
}

// Inverse CDF over the kept set without `exclude` (0xffffffff: none); `mass` is that set's mass.
// Contiguous per-thread chunks, prefix on thread 0, one thread scans. Falls back to `fallback`.
fn draw(lb: u32, f: vec3<f32>, mass: f32, exclude: u32, u01: f32, fallback: u32, lid: u32) -> u32 {
    let u = u01 * mass;
    let chunk = (p.vocab + WG - 1u) / WG;
    let c0 = min(lid * chunk, p.vocab);
    let c1 = min(c0 + chunk, p.vocab);
    var mine = 0.0;
    for (var i = c0; i < c1; i = i + 1u) {
        let z = (logits[lb + i] - f.x) / p.temperature;
        if (z >= f.y && i != exclude) {
            mine = mine + exp(z);
        }
    }
    red_f[lid] = mine;
    if (lid == 0u) {
        chosen = fallback;
    }
    workgroupBarrier();
    if (lid == 0u) {
        var acc = 0.0;
        for (var t = 0u; t < WG; t = t + 1u) {
            let v = red_f[t];
            red_f[t] = acc;
            acc = acc + v;
        }
    }
    workgroupBarrier();
    let before = red_f[lid];
    if (u >= before && u < before + mine) {
        var acc = before;
        for (var i = c0; i < c1; i = i + 1u) {
            let z = (logits[lb + i] - f.x) / p.temperature;
            if (z >= f.y && i != exclude) {
                acc = acc + exp(z);
                if (acc > u) {
                    chosen = i;
                    break;
                }
            }
        }
    }
    workgroupBarrier();
    let c = chosen;
    workgroupBarrier();
    return c;
}

#if !SPECULATIVE
@compute @workgroup_size(256)
fn sample(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x;
    if (row >= p.n_rows) {
        return;
    }
    let lb = p.logits_offset + row * p.logits_stride;
    let f = filtered(lb, lid);
    let fallback = local_argmax(lb, lid).y;
    let token = draw(lb, f, f.z, 0xffffffffu, uniform01(p.counter + row), fallback, lid);
    if (lid == 0u) {
        out[p.out_offset + row] = select(token, 0u, token >= p.vocab);
    }
}
#else
var<workgroup> row_accept: array<u32, 64>;
var<workgroup> row_token: array<u32, 64>;

@compute @workgroup_size(256)
fn speculative(@builtin(local_invocation_index) lid: u32) {
    let k = p.n_rows - 1u;
    for (var i = 0u; i <= k; i = i + 1u) {
        let lb = p.logits_offset + i * p.logits_stride;
        let f = filtered(lb, lid);
        let fallback = local_argmax(lb, lid).y;
        var d = 0xffffffffu;
        if (i < k) {
            d = out[p.out_offset + 1u + i];
        }
        var e_d = 0.0;
        if (d < p.vocab) {
            let z = (logits[lb + d] - f.x) / p.temperature;
            if (z >= f.y) {
                e_d = exp(z);
            }
        }
        // Accept with probability p(d) = e_d / mass; otherwise draw from the rest.
        let accept = uniform01(p.counter + 2u * i) * f.z < e_d;
        let token = draw(lb, f, f.z - e_d, d, uniform01(p.counter + 2u * i + 1u), fallback, lid);
        if (lid == 0u) {
            row_accept[i] = select(0u, 1u, accept && i < k);
            row_token[i] = token;
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        var a = 0u;
        loop {
            if (a >= k || row_accept[a] == 0u) {
                break;
            }
            result[p.result_offset + 1u + a] = out[p.out_offset + 1u + a];
            a = a + 1u;
        }
        let t = select(row_token[a], 0u, row_token[a] >= p.vocab);
        out[p.out_offset + 1u + a] = t;
        result[p.result_offset + 1u + a] = t;
        result[p.result_offset] = a;
    }
}
#endif
