// speculative.wgsl: GPU-side verification of a speculative round (spec §4), so that a round needs one
// small readback and the next round's anchor is already in place.
//   accept_greedy: drafts d_1..d_K sit in ids[start + 1 ..]; the target's argmax of verify row j is
//   post[j] (row j = position start + j). a = number of leading i with d_i == post[i - 1]. Writes the
//   bonus post[a] over ids[start + 1 + a] (the new anchor) and result = [a, d_1..d_a, post[a]].
//
// Bindings (group 0):
//   0 uniform  Params (dynamic offset)
//   1 storage  post: array<u32>, K + 1 target choices (read)
//   2 storage  ids: array<u32>, token of every position (read_write)
//   3 storage  result: array<u32>, K + 2 entries (read_write)
// A single invocation: K <= 32, nothing to parallelise.

struct Params {
    start: u32,
    k: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> post: array<u32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> result: array<u32>;

@compute @workgroup_size(1)
fn accept_greedy() {
    var a = 0u;
    loop {
        if (a >= p.k) {
            break;
        }
        let d = ids[p.start + 1u + a];
        if (d != post[a]) {
            break;
        }
        result[1u + a] = d;
        a = a + 1u;
    }
    ids[p.start + 1u + a] = post[a];
    result[1u + a] = post[a];
    result[0] = a;
}
