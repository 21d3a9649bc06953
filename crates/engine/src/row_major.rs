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
//! - Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K (kept as 32-value units, quant.rs `Unit`): row c's units' low
//!   nibbles at word c * units * 4 (value 8j + e of a unit at bits 4e of its word j); from `high_at`
//!   the high code bits, `high_words` per unit, unit u of row c at (c * units + u) * high_words;
//!   from `scales_at` the 16-bit unit scales (Q5_1: one word d | m << 16 per unit at c * units + u;
//!   else packed in pairs, unit u of row c in word c * ceil(units / 2) + u / 2, half u % 2); from
//!   `super_at` (K-quants) one word per super-block, block s of row c at c * units / 8 + s.
//!   Each region starts on a 16-byte boundary.
//!
//! Codes and scales are moved bit for bit, so dequantization is exact as in the other layouts.

use crate::context::{Gpu, Resource};
use crate::error::{EngineError, Result};
use crate::quant::{QuantType, QK};
use crate::tensor::{HostDType, HostTensor, Matrix, MatrixChunk, WeightFormat};
use half::f16;

/// k is padded to a multiple of this many elements in float rows (one 16-byte word of f16).
pub const ROW_ALIGN: usize = 8;

/// Whether `q` keeps the on-disk quant bytes (the first three types) rather than 32-value units.
fn disk_bytes(q: QuantType) -> bool {
    matches!(q, QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q4_1)
}

/// Where each region of a chunk starts, in u32 words.
struct ChunkLayout {
    /// Words per row of quants (or floats).
    row_words: usize,
    high_at: usize,
    scales_at: usize,
    super_at: usize,
    total: usize,
}

fn align4(w: usize) -> usize {
    w.div_ceil(4) * 4
}

/// The regions of a chunk of `cols` columns with `k` inputs.
fn chunk_layout(format: WeightFormat, k: usize, cols: usize) -> ChunkLayout {
    let kp = k.div_ceil(ROW_ALIGN) * ROW_ALIGN;
    let floats = |row_words: usize| ChunkLayout { row_words, high_at: 0, scales_at: 0, super_at: 0, total: cols * row_words };
    match format {
        WeightFormat::F32 => floats(kp),
        WeightFormat::F16 => floats(kp / 2),
        WeightFormat::Quant(q) => {
            let units = k / QK;
            let row_words = units * q.quant_words();
            let high_at = align4(cols * row_words);
            let scales_at = align4(high_at + cols * units * q.high_words());
            let scales = match q {
                QuantType::Q4_1 | QuantType::Q5_1 => cols * units,
                _ => cols * units.div_ceil(2),
            };
            let super_at = align4(scales_at + scales);
            let supers = if q.is_k() { cols * (units / 8) } else { 0 };
            ChunkLayout { row_words, high_at, scales_at, super_at, total: super_at + supers }
        }
    }
}

/// Bytes of one chunk of `cols` columns with `k` inputs in this layout (a multiple of 16).
pub fn chunk_bytes(format: WeightFormat, k: usize, cols: usize) -> u64 {
    (chunk_layout(format, k, cols).total * 4).div_ceil(16) as u64 * 16
}

impl Matrix {
    /// Upload a `[n, k]` host matrix in the GPU family's row-major layout, in chunks of at most
    /// `limit` bytes, a few MiB at a time.
    pub(crate) fn upload_row_major(gpu: &Gpu, host: &HostTensor, format: WeightFormat, limit: u64, progress: &mut dyn FnMut(u64)) -> Result<Matrix> {
        let (n, k) = (host.rows, host.cols);
        if let WeightFormat::Quant(q) = format {
            if k % q.block_values() != 0 {
                return Err(EngineError::Tensor {
                    name: host.name.to_string(),
                    message: format!("cannot store as {}: {k} inputs are not a multiple of the block size {}", q.name(), q.block_values()),
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
            let layout = chunk_layout(format, k, cols);
            let row_words = layout.row_words;
            let buffer = gpu.buffer(&format!("{}[{col0}..]", host.name), layout.total as u64 * 4)?;
            // Pieces of whole columns, ~4 MiB each.
            let piece = ((4usize << 20) / (row_words * 4).max(1)).max(1);
            let mut c0 = 0;
            while c0 < cols {
                let nc = piece.min(cols - c0);
                match format {
                    WeightFormat::Quant(q) => {
                        let units = k / QK;
                        let packed = pack_quant_rows(host, q, col0 + c0, nc, &mut row);
                        gpu.write(&buffer, (c0 * row_words) as u64, &packed.quants);
                        if !packed.high.is_empty() {
                            gpu.write(&buffer, (layout.high_at + c0 * units * q.high_words()) as u64, &packed.high);
                        }
                        let scale_units = if disk_bytes(q) { k / q.block_values() } else { units };
                        write_scales(gpu, &buffer, q, scale_units, layout.scales_at, c0, &packed.scales);
                        if !packed.supers.is_empty() {
                            gpu.write(&buffer, (layout.super_at + c0 * (units / 8)) as u64, &packed.supers);
                        }
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
            chunks.push(MatrixChunk {
                storage: Resource::Buffer(buffer),
                col0: col0 as u32,
                cols: cols as u32,
                wcols: row_words as u32,
                scales_at: layout.scales_at as u32,
                high_at: layout.high_at as u32,
                super_at: layout.super_at as u32,
            });
            col0 += cols;
        }
        Ok(Matrix { name: host.name.to_string(), k, n, format, chunks, row_major: true })
    }
}

/// The regions' words of `nc` rows.
struct PackedRows {
    quants: Vec<u32>,
    high: Vec<u32>,
    /// Per block (first three types) or unit: (scale, min) f16 bits or the unit's 16-bit scale.
    scales: Vec<(u16, u16)>,
    supers: Vec<u32>,
}

/// The words of `nc` rows from `first` in this layout, converting blocks of another type on the way.
fn pack_quant_rows(host: &HostTensor, q: QuantType, first: usize, nc: usize, scratch: &mut [f32]) -> PackedRows {
    let k = host.cols;
    let (bv, bb) = (q.block_values(), q.block_bytes());
    let kb = k / bv;
    let same = host.dtype == HostDType::Quant(q);
    let mut block = vec![0u8; bb];
    let mut out = PackedRows { quants: Vec::with_capacity(nc * (k / QK) * q.quant_words()), high: Vec::new(), scales: Vec::new(), supers: Vec::new() };
    for c in 0..nc {
        if !same {
            host.read_row(first + c, 0, scratch);
        }
        for b in 0..kb {
            let src: &[u8] = if same {
                let at = ((first + c) * kb + b) * bb;
                &host.data[at..at + bb]
            } else {
                q.quantize_block(&scratch[b * bv..(b + 1) * bv], &mut block);
                &block
            };
            if disk_bytes(q) {
                let d = u16::from_le_bytes([src[0], src[1]]);
                let (m, qs) = match q {
                    QuantType::Q4_1 => (u16::from_le_bytes([src[2], src[3]]), &src[4..]),
                    _ => (0, &src[2..]),
                };
                out.scales.push((d, m));
                out.quants.extend(qs.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])));
                continue;
            }
            for u in 0..q.units() {
                let unit = q.unit(src, u);
                out.quants.extend((0..q.quant_words()).map(|j| q.low_word(&unit, j)));
                out.high.extend((0..q.high_words()).map(|h| q.high_word(&unit, h)));
                out.scales.push((unit.scale, unit.min));
                if q.is_k() && u == 0 {
                    out.supers.push(unit.super_word);
                }
            }
        }
    }
    out
}

/// Write the scales of columns [c0, c0 + scales.len() / kb) of a chunk.
fn write_scales(gpu: &Gpu, buffer: &crate::context::GpuBuffer, q: QuantType, kb: usize, scales_at: usize, c0: usize, scales: &[(u16, u16)]) {
    match q {
        QuantType::Q4_1 | QuantType::Q5_1 => {
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
