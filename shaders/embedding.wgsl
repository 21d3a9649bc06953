// embedding.wgsl: gather token embeddings, y[r, j] = E[ids[r], j].
// The embedding shares the transposed matrix layout of matmul.wgsl ([hidden][wcols], vocabulary along
// columns), so a tied lm_head and the embedding are ONE tensor on the GPU. A vocabulary too large for one
// binding is split into column chunks: one dispatch per chunk, and each invocation writes only when its
// token falls in [col0, col0 + cols).
//
// Bindings (group 0):
//   0 uniform  Params (dynamic offset)
//   1 storage  ids: array<u32>, token of row r at ids[ids_offset + r]
//   2 storage  w: the chunk; F32 -> array<f32>; F16 -> array<f16>; block types (Q8_0, Q4_0, Q4_1, Q5_0,
//              Q5_1, Q4_K, Q5_K, Q6_K) -> array<u32> in matmul_quant.wgsl's group layout; else
//              array<u32> of packed f16 pairs
//              TEXTURE: a texture_2d<u32> read as a linear array of texels (4 words each): F32 and
//              f16 in matmul.wgsl's TEXTURE layout, quantized blocks in matmul_quant.wgsl's TEXTURE
//              layout (groups interleaved in runs of 8, see group_word)
//              ROW_MAJOR (GPU kernel family): array<u32> in matmul_gpu.wgsl's layout (row_major.rs):
//              token t's values contiguous, wcols words per token, quantized scales from scales_at,
//              high code bits from high_at, K-quant super-block words from super_at
//   3 storage  y: array<f32>, row r at y_offset + r * y_stride
// One invocation per (row, channel). Pure gather: batch-invariant. Quantized values are dequantized
// exactly as matmul_quant.wgsl does (q·d, (q-8)·d, (q-16)·d, q·d+m, q·(d·sc) - dmin·m, (q-32)·(d·sc)).

struct Params {
    n_rows: u32,
    hidden: u32,
    col0: u32,
    cols: u32,
    wcols: u32,
    ids_offset: u32,
    y_offset: u32,
    y_stride: u32,
    scales_at: u32,
    high_at: u32,
    super_at: u32,
    _pad0: u32,
}

// Units per block (SB) and high-bit words per unit (HW) of the block types kept as 32-value units.
#if Q4_K || Q5_K || Q6_K
const SB: u32 = 8u;
#else
const SB: u32 = 1u;
#endif
#if Q6_K
const HW: u32 = 2u;
#elif Q5_0 || Q5_1 || Q5_K
const HW: u32 = 1u;
#else
const HW: u32 = 0u;
#endif
// u32 words of one CPU-family group of the unit types (quant.rs gpu_group_words).
#if Q4_K || Q5_K || Q6_K
const WORDS: u32 = 16u * SB * (4u + HW) + 80u;
#elif Q5_1
const WORDS: u32 = 16u * (4u + HW) + 16u;
#else
const WORDS: u32 = 16u * (4u + HW) + 8u;
#endif

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
#if TEXTURE
@group(0) @binding(2) var w: texture_2d<u32>;
const TEX_SHIFT: u32 = {{TEX_SHIFT}}u;

fn texel(t: u32) -> vec4<u32> {
    return textureLoad(w, vec2<u32>(t & ((1u << TEX_SHIFT) - 1u), t >> TEX_SHIFT), 0);
}

// Word i of the linear word sequence (4 per texel).
fn word(i: u32) -> u32 {
    return texel(i >> 2u)[i & 3u];
}
#elif ROW_MAJOR
@group(0) @binding(2) var<storage, read> w: array<u32>;

fn word(i: u32) -> u32 {
    return w[i];
}
#elif F32
@group(0) @binding(2) var<storage, read> w: array<f32>;
#elif F16
@group(0) @binding(2) var<storage, read> w: array<f16>;
#else
@group(0) @binding(2) var<storage, read> w: array<u32>;

fn word(i: u32) -> u32 {
    return w[i];
}
#endif
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

// The f16 at half h of word i (packed f16 pairs and quantized scales; unused by the native paths).
fn half_at(i: u32, h: u32) -> f32 {
#if TEXTURE
    let pair = unpack2x16float(word(i));
#elif ROW_MAJOR
    let pair = unpack2x16float(word(i));
#elif F32
    let pair = vec2<f32>(0.0);
#elif F16
    let pair = vec2<f32>(0.0);
#else
    let pair = unpack2x16float(word(i));
#endif
    return select(pair.x, pair.y, h == 1u);
}

#if Q8_0 || Q4_0 || Q4_1 || Q5_0 || Q5_1 || Q4_K || Q5_K || Q6_K
// Word `off` of the quantized group (block-row kb, 16-column block blk) of `words` words, in
// matmul_quant.wgsl's order: groups in sequence in buffers, interleaved in runs of 8 in textures.
fn group_word(kb: u32, blk: u32, off: u32, words: u32) -> u32 {
#if TEXTURE
    let t = ((kb * (p.wcols / 128u) + blk / 8u) * (words / 4u) + off / 4u) * 8u + blk % 8u;
    return texel(t)[off % 4u];
#else
    return word((kb * (p.wcols / 16u) + blk) * words + off);
#endif
}

// The f16 at half h of a group's word `off`.
fn group_half(kb: u32, blk: u32, off: u32, words: u32, h: u32) -> f32 {
    let pair = unpack2x16float(group_word(kb, blk, off, words));
    return select(pair.x, pair.y, h == 1u);
}
#endif

// A K-quant value from its code q (value i of its unit), the unit's 16-bit field f and its
// super-block word sw (f16 d | f16 dmin << 16).
fn kvalue(q: f32, i: u32, f: u32, sw: u32) -> f32 {
    let dd = unpack2x16float(sw);
#if Q6_K
    let sc = bitcast<i32>(((f >> (8u * (i / 16u))) & 0xffu) << 24u) >> 24u;
    return (q - 32.0) * (dd.x * f32(sc));
#else
    return fma(q, dd.x * f32(f & 0xffu), -(dd.y * f32(f >> 8u)));
#endif
}

// Channel j of vocabulary column `col` (relative to the chunk).
fn load(j: u32, col: u32) -> f32 {
#if ROW_MAJOR
    // matmul_gpu.wgsl's layout (row_major.rs): column col's values contiguous, wcols words each.
    let base = col * p.wcols;
    let kb = p.hidden / 32u;
    let b = j / 32u;
    let i = j % 32u;
#if F32
    return bitcast<f32>(word(base + j));
#elif HALF
    return half_at(base + j / 2u, j % 2u);
#elif Q8_0
    let q = bitcast<i32>(word(base + b * 8u + i / 4u) << (24u - 8u * (i % 4u))) >> 24u;
    return f32(q) * half_at(p.scales_at + col * ((kb + 1u) / 2u) + b / 2u, b % 2u);
#elif Q5_0 || Q5_1 || Q4_K || Q5_K || Q6_K
    // 32-value units: nibbles in value order, then high bits, unit scales, super words (row_major.rs).
    let units = p.hidden / 32u;
    let u = j / 32u;
    let lo = (word(base + u * 4u + i / 8u) >> (4u * (i % 8u))) & 15u;
#if Q6_K
    let hi = (word(p.high_at + (col * units + u) * 2u + i / 16u) >> (2u * (i % 16u))) & 3u;
#elif Q4_K
    let hi = 0u;
#else
    let hi = (word(p.high_at + col * units + u) >> i) & 1u;
#endif
    let q = f32(lo | (hi << 4u));
#if Q5_0
    return (q - 16.0) * half_at(p.scales_at + col * ((units + 1u) / 2u) + u / 2u, u % 2u);
#elif Q5_1
    let dm = unpack2x16float(word(p.scales_at + col * units + u));
    return fma(q, dm.x, dm.y);
#else
    let f = (word(p.scales_at + col * ((units + 1u) / 2u) + u / 2u) >> (16u * (u % 2u))) & 0xffffu;
    return kvalue(q, i, f, word(p.super_at + col * (units / 8u) + u / 8u));
#endif
#else
    // Byte i % 16 of the block: value i in its low nibble (i < 16), else in its high nibble.
    let bi = i % 16u;
    let q = (word(base + b * 4u + bi / 4u) >> (8u * (bi % 4u) + select(0u, 4u, i >= 16u))) & 15u;
#if Q4_1
    let dm = unpack2x16float(word(p.scales_at + col * kb + b));
    return fma(f32(q), dm.x, dm.y);
#else
    return (f32(q) - 8.0) * half_at(p.scales_at + col * ((kb + 1u) / 2u) + b / 2u, b % 2u);
#endif
#endif
#elif Q8_0
    let kb = j / 32u;
    let blk = col / 16u;
    let i = j % 32u;
    let c = col % 16u;
    let q = bitcast<i32>(group_word(kb, blk, (i / 4u) * 16u + c, 136u) << (24u - 8u * (i % 4u))) >> 24u;
    return f32(q) * group_half(kb, blk, 128u + c / 2u, 136u, c % 2u);
#elif Q4_0
    let kb = j / 32u;
    let blk = col / 16u;
    let i = j % 32u;
    let c = col % 16u;
    let q = (group_word(kb, blk, (i / 8u) * 16u + c, 72u) >> (4u * (i % 8u))) & 15u;
    return (f32(q) - 8.0) * group_half(kb, blk, 64u + c / 2u, 72u, c % 2u);
#elif Q4_1
    let kb = j / 32u;
    let blk = col / 16u;
    let i = j % 32u;
    let c = col % 16u;
    let q = (group_word(kb, blk, (i / 8u) * 16u + c, 80u) >> (4u * (i % 8u))) & 15u;
    return fma(f32(q), group_half(kb, blk, 64u + c / 2u, 80u, c % 2u), group_half(kb, blk, 72u + c / 2u, 80u, c % 2u));
#elif Q5_0 || Q5_1 || Q4_K || Q5_K || Q6_K
    // Group g of the block-row holds SB units of 16 columns (quant.rs pack_gpu).
    let g = j / (32u * SB);
    let s = (j / 32u) % SB;
    let i = j % 32u;
    let blk = col / 16u;
    let c = col % 16u;
    let lo = (group_word(g, blk, (s * 4u + i / 8u) * 16u + c, WORDS) >> (4u * (i % 8u))) & 15u;
#if Q6_K
    let hi = (group_word(g, blk, 64u * SB + (s * 2u + i / 16u) * 16u + c, WORDS) >> (2u * (i % 16u))) & 3u;
#elif Q4_K
    let hi = 0u;
#else
    let hi = (group_word(g, blk, 64u * SB + s * 16u + c, WORDS) >> i) & 1u;
#endif
    let q = f32(lo | (hi << 4u));
    let sc = 16u * SB * (4u + HW);
#if Q5_0
    return (q - 16.0) * group_half(g, blk, sc + c / 2u, WORDS, c % 2u);
#elif Q5_1
    return fma(q, group_half(g, blk, sc + c / 2u, WORDS, c % 2u), group_half(g, blk, sc + 8u + c / 2u, WORDS, c % 2u));
#else
    let f = (group_word(g, blk, sc + s * 8u + c / 2u, WORDS) >> (16u * (c % 2u))) & 0xffffu;
    return kvalue(q, i, f, group_word(g, blk, sc + 8u * SB + c, WORDS));
#endif
#elif TEXTURE
    // Column col is column c of invocation blk: part c / (columns per texel) of its texels.
    let blk = col / 16u;
    let c = col % 16u;
#if F32
    let t = ((blk >> 3u) * 4u * p.hidden + (c / 4u) * p.hidden + j) * 8u + (blk & 7u);
    return bitcast<f32>(texel(t)[c % 4u]);
#else
    let t = ((blk >> 3u) * 2u * p.hidden + (c / 8u) * p.hidden + j) * 8u + (blk & 7u);
    return half_at(t * 4u + (c % 8u) / 2u, c % 2u);
#endif
#elif F32
    return w[j * p.wcols + col];
#elif F16
    return f32(w[j * p.wcols + col]);
#else
    let i = j * p.wcols + col;
    return half_at(i / 2u, i & 1u);
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
    y[p.y_offset + row * p.y_stride + j] = load(j, token - p.col0);
}
