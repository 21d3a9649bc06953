//! GGML block quantization (Q8_0, Q4_0, Q4_1) as GGUF files store it: 32 consecutive input values of
//! one output row per block, with an f16 scale (and for Q4_1 an f16 minimum).
//!
//! This module holds the exact CPU dequantization (the reference the GPU kernels are tested against),
//! quantization from floats with llama.cpp's reference rounding (for `--dtype q8_0` and for test
//! files), and the repacking into the GPU layout `matmul_quant.wgsl` reads.
//!
//! Dequantized values are exact in f32 on both sides: q·d is a small integer times an f16 (fits in
//! 24 bits of mantissa), and Q4_1's q·d + m rounds once whether or not it is fused. So CPU and GPU
//! see bit-identical weights; only the accumulation order of the matmul differs.

use half::f16;

/// Values per block.
pub const QK: usize = 32;
/// Output columns per GPU group (matmul.wgsl's 16-column blocks).
pub const GROUP_COLS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    Q8_0,
    Q4_0,
    Q4_1,
}

impl QuantType {
    pub fn name(self) -> &'static str {
        match self {
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
        }
    }

    /// Bytes of one block on disk: f16 d [+ f16 m] + the quants.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q8_0 => 2 + QK,
            Self::Q4_0 => 2 + QK / 2,
            Self::Q4_1 => 4 + QK / 2,
        }
    }

    /// u32 words of quants per block in the GPU layout (same bits as on disk, reordered).
    fn gpu_quant_words(self) -> usize {
        match self {
            Self::Q8_0 => QK / 4,
            Self::Q4_0 | Self::Q4_1 => QK / 8,
        }
    }

    /// u32 words of one GPU group: the quants of 16 columns, then their f16 scales (and minimums)
    /// packed in pairs. Mirrors WORDS in matmul_quant.wgsl.
    pub fn gpu_group_words(self) -> usize {
        let scales = GROUP_COLS / 2;
        GROUP_COLS * self.gpu_quant_words() + if self == Self::Q4_1 { 2 * scales } else { scales }
    }

    /// Exact dequantization of one block.
    pub fn dequantize_block(self, b: &[u8], out: &mut [f32]) {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        match self {
            Self::Q8_0 => {
                for (o, &q) in out.iter_mut().zip(&b[2..2 + QK]) {
                    *o = (q as i8) as f32 * d;
                }
            }
            Self::Q4_0 => {
                for (i, o) in out.iter_mut().enumerate().take(QK) {
                    *o = (nibble(&b[2..], i) as f32 - 8.0) * d;
                }
            }
            Self::Q4_1 => {
                let m = f16::from_le_bytes([b[2], b[3]]).to_f32();
                for (i, o) in out.iter_mut().enumerate().take(QK) {
                    *o = nibble(&b[4..], i) as f32 * d + m;
                }
            }
        }
    }

    /// Quantize 32 values into one block with llama.cpp's reference rounding
    /// (quantize_row_q8_0_ref / q4_0_ref / q4_1_ref).
    pub fn quantize_block(self, v: &[f32], out: &mut [u8]) {
        match self {
            Self::Q8_0 => {
                let amax = v.iter().fold(0f32, |a, x| a.max(x.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                for (o, x) in out[2..2 + QK].iter_mut().zip(v) {
                    *o = ((x * id).round() as i32).clamp(-128, 127) as i8 as u8;
                }
            }
            Self::Q4_0 => {
                // The value of largest magnitude maps to -8, keeping its sign.
                let max = v.iter().fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                let q = |x: f32| ((x * id + 8.5) as i32).clamp(0, 15) as u8;
                for j in 0..QK / 2 {
                    out[2 + j] = q(v[j]) | (q(v[j + QK / 2]) << 4);
                }
            }
            Self::Q4_1 => {
                let min = v.iter().copied().fold(f32::INFINITY, f32::min);
                let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                out[2..4].copy_from_slice(&f16::from_f32(min).to_le_bytes());
                let q = |x: f32| (((x - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                for j in 0..QK / 2 {
                    out[4 + j] = q(v[j]) | (q(v[j + QK / 2]) << 4);
                }
            }
        }
    }

    /// Write one disk block, column `c` (0..16) of a GPU group, into the group's words.
    /// Q8_0: word j holds values 4j..4j+3; Q4: word j holds values 8j..8j+7 as consecutive nibbles
    /// (GGML stores value i and i+16 in one byte; the kernel wants them in order).
    pub fn pack_gpu(self, b: &[u8], c: usize, group: &mut [u32]) {
        let qw = self.gpu_quant_words();
        let scale_base = GROUP_COLS * qw;
        let set_half = |group: &mut [u32], word: usize, bits: u16| {
            let shift = 16 * (c % 2);
            group[word] = (group[word] & !(0xffff << shift)) | ((bits as u32) << shift);
        };
        set_half(group, scale_base + c / 2, u16::from_le_bytes([b[0], b[1]]));
        match self {
            Self::Q8_0 => {
                for j in 0..qw {
                    group[j * GROUP_COLS + c] = u32::from_le_bytes([b[2 + 4 * j], b[3 + 4 * j], b[4 + 4 * j], b[5 + 4 * j]]);
                }
            }
            Self::Q4_0 | Self::Q4_1 => {
                let qs = if self == Self::Q4_1 {
                    set_half(group, scale_base + GROUP_COLS / 2 + c / 2, u16::from_le_bytes([b[2], b[3]]));
                    &b[4..]
                } else {
                    &b[2..]
                };
                for j in 0..qw {
                    let mut w = 0u32;
                    for e in 0..8 {
                        w |= (nibble(qs, 8 * j + e) as u32) << (4 * e);
                    }
                    group[j * GROUP_COLS + c] = w;
                }
            }
        }
    }
}

/// Value i (0..32) of a 16-byte Q4 block: low nibbles hold 0..16, high nibbles 16..32.
fn nibble(qs: &[u8], i: usize) -> u8 {
    if i < QK / 2 {
        qs[i] & 0x0f
    } else {
        qs[i - QK / 2] >> 4
    }
}

/// Quantize a row-major `[rows][cols]` f32 matrix (cols a multiple of 32) into blocks.
pub fn quantize(t: QuantType, values: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; values.len() / QK * t.block_bytes()];
    for (v, o) in values.chunks_exact(QK).zip(out.chunks_exact_mut(t.block_bytes())) {
        t.quantize_block(v, o);
    }
    out
}

/// Dequantize blocks into f32 values.
pub fn dequantize(t: QuantType, bytes: &[u8]) -> Vec<f32> {
    let mut out = vec![0f32; bytes.len() / t.block_bytes() * QK];
    for (b, o) in bytes.chunks_exact(t.block_bytes()).zip(out.chunks_exact_mut(QK)) {
        t.dequantize_block(b, o);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..QK * 8)
            .map(|_| {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                ((s >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 3.0
            })
            .collect()
    }

    #[test]
    fn quantize_then_dequantize_is_close_and_requantizing_is_exact() {
        for t in [QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1] {
            let v = values(7);
            let q = quantize(t, &v);
            let d = dequantize(t, &q);
            // Values lie in [-1.5, 1.5). Rounding error is half a step, except for Q4_0, whose grid
            // (q - 8)·d stops one step short on the side opposite the largest magnitude.
            let bound = match t {
                QuantType::Q8_0 => 0.5 * 1.5 / 127.0,
                QuantType::Q4_0 => 1.5 / 8.0,
                QuantType::Q4_1 => 0.5 * 3.0 / 15.0,
            };
            for (a, b) in v.iter().zip(&d) {
                assert!((a - b).abs() <= bound * 1.01 + 1e-3, "{t:?}: {a} vs {b}");
            }
            // Dequantized values lie on the grid: quantizing them again reproduces the blocks.
            assert_eq!(dequantize(t, &quantize(t, &d)), d, "{t:?}");
        }
    }

    #[test]
    fn q4_nibble_order_follows_ggml() {
        // Byte j holds value j (low nibble) and value j + 16 (high nibble).
        let mut b = vec![0u8; QuantType::Q4_0.block_bytes()];
        b[..2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        b[2] = 0x3a; // value 0 = 0xa - 8 = 2, value 16 = 0x3 - 8 = -5
        let mut out = [0f32; QK];
        QuantType::Q4_0.dequantize_block(&b, &mut out);
        assert_eq!((out[0], out[16], out[1]), (2.0, -5.0, -8.0));
    }
}
