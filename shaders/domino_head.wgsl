// domino_head.wgsl: the element-wise parts of the Domino head's sequential loop (spec §5). The GEMVs
// around them (W_ih·x, W_hh·s, W1_s·s, W2·act) run through matmul.wgsl.
//   gru:      s' = (1 - z) * n + z * s with r = σ(gi_r + gh_r), z = σ(gi_z + gh_z),
//             n = tanh(gi_n + r * gh_n); PyTorch gate order (r, z, n) in gi / gh, no biases.
//   silu_add: act = silu(a + b) (the correction's hidden layer: zW[i] + W1_s·s).
//
// Bindings (group 0):
//   0 uniform  Params (dynamic offset)
//   gru:      1 gi [3g] (read), 2 gh [3g] (read), 3 s [g] (read_write: updated in place)
//   silu_add: 1 a (read, at a_offset), 2 b (read, at b_offset), 3 out [n] (read_write)
// One invocation per element, no reductions: batch-invariant trivially.

struct Params {
    n: u32,
    a_offset: u32,
    b_offset: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn sigmoid(v: f32) -> f32 {
    return 1.0 / (1.0 + exp(-v));
}

// a = gi, b = gh, out = s (hidden size p.n).
@compute @workgroup_size(64)
fn gru(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= p.n) {
        return;
    }
    let g = p.n;
    let r = sigmoid(a[i] + b[i]);
    let z = sigmoid(a[g + i] + b[g + i]);
    let n = tanh(a[2u * g + i] + r * b[2u * g + i]);
    out[i] = (1.0 - z) * n + z * out[i];
}

@compute @workgroup_size(64)
fn silu_add(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= p.n) {
        return;
    }
    let v = a[p.a_offset + i] + b[p.b_offset + i];
    out[i] = v / (1.0 + exp(-v));
}
