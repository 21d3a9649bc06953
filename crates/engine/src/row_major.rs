//! The GPU kernel family's weight layout (`matmul_gpu.wgsl`): each output column's weights (a row of
//! the PyTorch `[out, in]` matrix) are contiguous along k, read as 16-byte words. A workgroup's 64
//! lanes of one column read 64 neighbouring words per step, so loads coalesce on any GPU.
//!
//! Per chunk of `cols` output columns (one storage buffer):
//! - f32: row c at word c * row_words, row_words = k rounded up to 8 (zero padding);
//! - f16: halves packed in pairs, row c at word c * row_words, row_words = (k rounded up to 8) / 2;
//! - Q8_0 / Q4_0 / Q4_1: the GGML blocks' quant bytes as they are on disk, row c's blocks at word
//!   c * kb * qw (qw = 8 for Q8_0, 4 for Q4), then from word `scales_at` (a multiple of 4) the
//!   scales: Q8_0 / Q4_0 one f16 per block, packed in pairs, block b of row c in word
//!   c * ceil(kb / 2) + b / 2 (half b % 2); Q4_1 one word per block (d low half, m high half) at
//!   c * kb + b.
//!
//! Quant bytes are moved bit for bit, so dequantization is exact as in the other layouts.

use crate::context::{Gpu, Resource};
use crate::error::{EngineError, Result};
use crate::quant::{QuantType, QK};
use crate::tensor::{HostDType, HostTensor, Matrix, MatrixChunk, WeightFormat};
use half::f16;

/// k is padded to a multiple of this many elements in float rows (one 16-byte word of f16).
pub const ROW_ALIGN: usize = 8;

/// u32 words of one GGML block's quants.
pub fn quant_words(q: QuantType) -> usize {
    match q {
        QuantType::Q8_0 => QK / 4,
        QuantType::Q4_0 | QuantType::Q4_1 => QK / 8,
    }
}

/// Words of a chunk of `cols` columns with `k` inputs: (words per row of quants or floats, words of
/// the scale region, where the scale region starts).
fn chunk_words(format: WeightFormat, k: usize, cols: usize) -> (usize, usize, usize) {
    let kp = k.div_ceil(ROW_ALIGN) * ROW_ALIGN;
    match format {
        WeightFormat::F32 => (kp, 0, cols * kp),
        WeightFormat::F16 => (kp / 2, 0, cols * kp / 2),
        WeightFormat::Quant(q) => {
            let kb = k / QK;
            let row = kb * quant_words(q);
            let scales_at = (cols * row).div_ceil(4) * 4;
            let scales = match q {
                QuantType::Q4_1 => cols * kb,
                _ => cols * kb.div_ceil(2),
            };
            (row, scales, scales_at)
        }
    }
}

/// Bytes of one chunk of `cols` columns with `k` inputs in this layout (a multiple of 16).
pub fn chunk_bytes(format: WeightFormat, k: usize, cols: usize) -> u64 {
    let (_, scale_words, scales_at) = chunk_words(format, k, cols);
    ((scales_at + scale_words) * 4).div_ceil(16) as u64 * 16
}

impl Matrix {
    /// Upload a `[n, k]` host matrix in the GPU family's row-major layout, in chunks of at most
    /// `limit` bytes, a few MiB at a time.
    pub(crate) fn upload_row_major(gpu: &Gpu, host: &HostTensor, format: WeightFormat, limit: u64, progress: &mut dyn FnMut(u64)) -> Result<Matrix> {
        let (n, k) = (host.rows, host.cols);
        if let WeightFormat::Quant(q) = format {
            if k % QK != 0 {
                return Err(EngineError::Tensor {
                    name: host.name.to_string(),
                    message: format!("cannot store as {}: {k} inputs are not a multiple of the block size {QK}", q.name()),
                });
            }
        }
        let chunk_bytes = |cols: usize| chunk_bytes(format, k, cols);
        // A dispatch covers at most 65535 workgroups of GPU_COLS columns along x.
        let mut max_cols = ((limit / chunk_bytes(1).max(1)) as usize).max(1).min(65535 * crate::kernels::GPU_COLS as usize);
        while max_cols > 1 && chunk_bytes(max_cols + 1) <= limit && max_cols < 65535 * crate::kernels::GPU_COLS as usize {
            max_cols += 1;
        }
        if chunk_bytes(1) > limit {
            let per_col = chunk_bytes(1);
            return Err(EngineError::LimitTooSmall {
                what: format!("one column of tensor '{}' ({k} inputs, {})", host.name, format.name()),
                needed: per_col,
                limit,
                limit_name: "max_storage_buffer_binding_size",
                adapter: gpu.info.name.clone(),
            });
        }
        let mut chunks = Vec::new();
        let mut col0 = 0usize;
        let mut row = vec![0f32; k];
        while col0 < n {
            let cols = (n - col0).min(max_cols);
            let (row_words, scale_words, scales_at) = chunk_words(format, k, cols);
            let total = scales_at + scale_words;
            let buffer = gpu.buffer(&format!("{}[{col0}..]", host.name), total as u64 * 4)?;
            // Pieces of whole columns, ~4 MiB each.
            let piece = ((4usize << 20) / (row_words * 4).max(1)).max(1);
            let mut c0 = 0;
            while c0 < cols {
                let nc = piece.min(cols - c0);
                match format {
                    WeightFormat::Quant(q) => {
                        let (quants, scales) = pack_quant_rows(host, q, col0 + c0, nc, &mut row);
                        gpu.write(&buffer, (c0 * row_words) as u64, &quants);
                        write_scales(gpu, &buffer, q, k / QK, scales_at, c0, &scales);
                    }
                    _ => {
                        let mut words = vec![0u32; nc * row_words];
                        for c in 0..nc {
                            host.read_row(col0 + c0 + c, 0, &mut row);
                            let dst = &mut words[c * row_words..(c + 1) * row_words];
                            if format == WeightFormat::F32 {
                                for (d, v) in dst.iter_mut().zip(&row) {
                                    *d = v.to_bits();
                                }
                            } else {
                                for (i, v) in row.iter().enumerate() {
                                    dst[i / 2] |= (f16::from_f32(*v).to_bits() as u32) << (16 * (i % 2));
                                }
                            }
                        }
                        gpu.write(&buffer, (c0 * row_words) as u64, &words);
                    }
                }
                progress(host.dtype.bytes_for(nc * k) as u64);
                c0 += nc;
            }
            chunks.push(MatrixChunk { storage: Resource::Buffer(buffer), col0: col0 as u32, cols: cols as u32, wcols: row_words as u32, scales_at: scales_at as u32 });
            col0 += cols;
        }
        Ok(Matrix { name: host.name.to_string(), k, n, format, chunks, row_major: true })
    }
}

/// The quant words of `nc` rows from `first`, and each block's scale as (d, m) f16 bits.
fn pack_quant_rows(host: &HostTensor, q: QuantType, first: usize, nc: usize, scratch: &mut [f32]) -> (Vec<u32>, Vec<(u16, u16)>) {
    let k = host.cols;
    let kb = k / QK;
    let bb = q.block_bytes();
    let same = host.dtype == HostDType::Quant(q);
    let mut block = vec![0u8; bb];
    let mut quants = Vec::with_capacity(nc * kb * quant_words(q));
    let mut scales = Vec::with_capacity(nc * kb);
    for c in 0..nc {
        if !same {
            host.read_row(first + c, 0, scratch);
        }
        for b in 0..kb {
            let src: &[u8] = if same {
                let at = ((first + c) * kb + b) * bb;
                &host.data[at..at + bb]
            } else {
                q.quantize_block(&scratch[b * QK..(b + 1) * QK], &mut block);
                &block
            };
            let d = u16::from_le_bytes([src[0], src[1]]);
            let (m, qs) = match q {
                QuantType::Q4_1 => (u16::from_le_bytes([src[2], src[3]]), &src[4..]),
                _ => (0, &src[2..]),
            };
            scales.push((d, m));
            quants.extend(qs.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])));
        }
    }
    (quants, scales)
}

/// Write the scales of columns [c0, c0 + scales.len() / kb) of a chunk.
fn write_scales(gpu: &Gpu, buffer: &crate::context::GpuBuffer, q: QuantType, kb: usize, scales_at: usize, c0: usize, scales: &[(u16, u16)]) {
    match q {
        QuantType::Q4_1 => {
            let words: Vec<u32> = scales.iter().map(|&(d, m)| d as u32 | ((m as u32) << 16)).collect();
            gpu.write(buffer, (scales_at + c0 * kb) as u64, &words);
        }
        _ => {
            let kb2 = kb.div_ceil(2);
            let mut words = vec![0u32; scales.len() / kb.max(1) * kb2];
            for (i, &(d, _)) in scales.iter().enumerate() {
                let (c, b) = (i / kb, i % kb);
                words[c * kb2 + b / 2] |= (d as u32) << (16 * (b % 2));
            }
            gpu.write(buffer, (scales_at + c0 * kb2) as u64, &words);
        }
    }
}
