// rms_scale.wgsl: the RMSNorm scale of one input row, for kernels that fold the norm into a matmul
// (`#include rms_scale.wgsl` in matmul.wgsl and matmul_quant.wgsl, NORM variants).
//
// The including shader provides: `p.k` (row length), `p.x_offset`, `p.x_stride` (row r starts at
// x_offset + r * x_stride), `p.eps`, and `fn x_scalar(i: u32) -> f32` (element i of x).
// Invariant: the sum runs in exactly the order of rmsnorm.wgsl's workgroup tree (64 lanes), so a
// folded decode row and a separate rmsnorm pass of a multi-row batch give identical bits.

// The RMSNorm scale of x's row `row`, summed exactly as rmsnorm.wgsl's workgroup tree sums it (64
// lanes, lane l over elements l, l + 64, ..., then halving strides), so x * inv_rms * norm_w has the
// bits of the separate rmsnorm pass it replaces (its workgroup variant), in one dispatch fewer.
// Visiting the lanes in bit-reversed order visits the tree's leaves left to right; l0..l5 hold each
// level's pending left operand (a binary counter), so no dynamically indexed array is needed.
fn inv_rms(row: u32) -> f32 {
    let xb = p.x_offset + row * p.x_stride;
    var l0 = 0.0;
    var l1 = 0.0;
    var l2 = 0.0;
    var l3 = 0.0;
    var l4 = 0.0;
    var l5 = 0.0;
    var total = 0.0;
    for (var i = 0u; i < 64u; i = i + 1u) {
        let lane = reverseBits(i) >> 26u;
        var c = 0.0;
        for (var e = lane; e < p.k; e = e + 64u) {
            let v = x_scalar(xb + e);
            c = fma(v, v, c);
        }
        if ((i & 1u) == 0u) { l0 = c; continue; }
        c = l0 + c;
        if ((i & 2u) == 0u) { l1 = c; continue; }
        c = l1 + c;
        if ((i & 4u) == 0u) { l2 = c; continue; }
        c = l2 + c;
        if ((i & 8u) == 0u) { l3 = c; continue; }
        c = l3 + c;
        if ((i & 16u) == 0u) { l4 = c; continue; }
        c = l4 + c;
        if ((i & 32u) == 0u) { l5 = c; continue; }
        total = l5 + c;
    }
    return 1.0 / sqrt(total / f32(p.k) + p.eps);
}
