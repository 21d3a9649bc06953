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
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

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

@compute @workgroup_size(256)
fn sample(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x;
    if (row >= p.n_rows) {
        return;
    }
    let lb = p.logits_offset + row * p.logits_stride;
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

    let u = f32(pcg(pcg(p.seed) ^ (p.counter + row)) >> 8u) / 16777216.0 * total;
    // Inverse CDF over contiguous per-thread chunks: chunk sums, prefix on thread 0, one thread scans.
    let chunk = (p.vocab + WG - 1u) / WG;
    let c0 = min(lid * chunk, p.vocab);
    let c1 = min(c0 + chunk, p.vocab);
    var mine = 0.0;
    for (var i = c0; i < c1; i = i + 1u) {
        let z = (logits[lb + i] - mx) / p.temperature;
        if (z >= thr) {
            mine = mine + exp(z);
        }
    }
    red_f[lid] = mine;
    if (lid == 0u) {
        chosen = top.y;
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
            let z = (logits[lb + i] - mx) / p.temperature;
            if (z >= thr) {
                acc = acc + exp(z);
                if (acc > u) {
                    chosen = i;
                    break;
                }
            }
        }
    }
    workgroupBarrier();
    if (lid == 0u) {
        out[p.out_offset + row] = select(chosen, 0u, chosen >= p.vocab);
    }
}
