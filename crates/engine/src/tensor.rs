//! Weights on the GPU. Matrices are stored transposed, `[in][out]` with out padded to a multiple of 16,
//! so matmul invocations read neighbouring columns; a matrix too large for one storage binding is split
//! into column chunks, each its own buffer. On CPU adapters f16 / f32 matrices live in weight textures
//! instead (`upload_texture`: llvmpipe reads texels much faster than storage-buffer words). Source data comes from the host as f32 / f16 / bf16 bytes
//! or GGML quantized blocks; quantized formats keep their blocks on the GPU (see quant.rs for the layout).

use crate::context::{Gpu, GpuBuffer, GpuTexture, Resource};
use crate::error::{EngineError, Result};
use crate::quant::{QuantType, GROUP_COLS};
use half::{bf16, f16};
use std::sync::Arc;

/// Element type of weights on the host (as stored in a checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostDType {
    F32,
    F16,
    BF16,
    /// GGML blocks (32 or 256 values) along each row.
    Quant(QuantType),
}

impl HostDType {
    /// Bytes of `n` values (for quantized types n must be a whole number of blocks).
    pub fn bytes_for(self, n: usize) -> usize {
        match self {
            Self::F32 => 4 * n,
            Self::F16 | Self::BF16 => 2 * n,
            Self::Quant(q) => n / q.block_values() * q.block_bytes(),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::Quant(q) => q.name(),
        }
    }
}

/// How weight matrices are kept on the GPU (math is always f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    F32,
    F16,
    /// GGML blocks kept quantized; matmul_quant.wgsl dequantizes while it multiplies.
    Quant(QuantType),
}

impl WeightFormat {
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Quant(q) => q.name(),
        }
    }

    /// Parse a `--dtype` value: f16, f32 or a block type (q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k,
    /// q6_k).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "f16" => Some(Self::F16),
            "f32" => Some(Self::F32),
            other => QuantType::parse(other).map(Self::Quant),
        }
    }
}

/// What `--dtype` asked for: one format for every matrix, or each tensor as stored (quantized blocks
/// stay quantized, float tensors become f16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DTypeChoice {
    AsStored,
    Format(WeightFormat),
}

impl DTypeChoice {
    pub fn format_for(self, stored: HostDType) -> WeightFormat {
        match (self, stored) {
            (Self::Format(f), _) => f,
            (Self::AsStored, HostDType::Quant(q)) => WeightFormat::Quant(q),
            (Self::AsStored, _) => WeightFormat::F16,
        }
    }

    /// Parse `--dtype`: auto (as stored), f16, f32 or a block type.
    pub fn parse(s: &str) -> Option<Self> {
        if s == "auto" {
            return Some(Self::AsStored);
        }
        WeightFormat::parse(s).map(Self::Format)
    }
}

/// A row-major host tensor view: `rows` x `cols` elements of `dtype` in little-endian bytes.
/// For a PyTorch Linear weight `[out, in]`, rows = out and cols = in.
#[derive(Debug, Clone, Copy)]
pub struct HostTensor<'a> {
    pub name: &'a str,
    pub dtype: HostDType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl<'a> HostTensor<'a> {
    pub fn new(name: &'a str, dtype: HostDType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self> {
        if let HostDType::Quant(q) = dtype {
            if !cols.is_multiple_of(q.block_values()) {
                return Err(EngineError::Tensor {
                    name: name.to_string(),
                    message: format!("{} rows of {cols} values are not whole blocks of {}", dtype.name(), q.block_values()),
                });
            }
        }
        let want = dtype.bytes_for(rows * cols);
        if data.len() != want {
            return Err(EngineError::Tensor {
                name: name.to_string(),
                message: format!("expected {want} bytes for [{rows}, {cols}] {dtype:?}, found {}", data.len()),
            });
        }
        Ok(Self { name, dtype, rows, cols, data })
    }

    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self.dtype {
            HostDType::F32 => f32::from_le_bytes(self.data[4 * i..4 * i + 4].try_into().unwrap_or([0; 4])),
            HostDType::F16 => f16::from_bits(u16::from_le_bytes([self.data[2 * i], self.data[2 * i + 1]])).to_f32(),
            HostDType::BF16 => bf16::from_bits(u16::from_le_bytes([self.data[2 * i], self.data[2 * i + 1]])).to_f32(),
            HostDType::Quant(q) => {
                let bv = q.block_values();
                let mut block = vec![0f32; bv];
                let b = i / bv * q.block_bytes();
                q.dequantize_block(&self.data[b..b + q.block_bytes()], &mut block);
                block[i % bv]
            }
        }
    }

    /// Values [start, start + out.len()) of row `row`, decoding quantized data a block at a time.
    pub fn read_row(&self, row: usize, start: usize, out: &mut [f32]) {
        let base = row * self.cols + start;
        match self.dtype {
            HostDType::Quant(q) => {
                let bv = q.block_values();
                let mut block = vec![0f32; bv];
                let mut decoded = usize::MAX;
                for (j, o) in out.iter_mut().enumerate() {
                    let i = base + j;
                    if i / bv != decoded {
                        decoded = i / bv;
                        let b = decoded * q.block_bytes();
                        q.dequantize_block(&self.data[b..b + q.block_bytes()], &mut block);
                    }
                    *o = block[i % bv];
                }
            }
            _ => {
                for (j, o) in out.iter_mut().enumerate() {
                    *o = self.get(base + j);
                }
            }
        }
    }

    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, row) in out.chunks_mut(self.cols.max(1)).enumerate() {
            self.read_row(r, 0, row);
        }
        out
    }
}

/// Matrix widths are padded to this many columns (matmul.wgsl's 16-column blocks).
pub const COLUMN_ALIGN: usize = 16;

/// Columns per group of a weight texture: 8 invocations x 16 columns (matmul.wgsl, TEXTURE).
pub const TEXTURE_GROUP_COLS: usize = 128;

/// One column range of a matrix in its own buffer, laid out `[k][wcols]`, or in its own weight
/// texture in the grouped layout of matmul.wgsl's TEXTURE variant (`upload_texture`).
#[derive(Debug, Clone)]
pub struct MatrixChunk {
    pub storage: Resource,
    pub col0: u32,
    pub cols: u32,
    /// Transposed layouts: columns incl. padding. Row-major (GPU family): u32 words per column.
    pub wcols: u32,
    /// Row-major quantized chunks: the u32 word where the scales start (row_major.rs); else 0.
    pub scales_at: u32,
    /// Row-major Q5_x / Q6_K chunks: the u32 word where the high code bits start; else 0.
    pub high_at: u32,
    /// Row-major K-quant chunks: the u32 word where the super-block words start; else 0.
    pub super_at: u32,
}

/// A weight matrix y = x·Wᵀ with `k` inputs and `n` outputs, on the GPU.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub name: String,
    pub k: usize,
    pub n: usize,
    pub format: WeightFormat,
    pub chunks: Vec<MatrixChunk>,
    /// The GPU family's layout (row_major.rs, matmul_gpu.wgsl) instead of the transposed one.
    pub row_major: bool,
}

impl Matrix {
    /// Bytes of weights on the GPU (what one full matmul reads).
    pub fn bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.storage.bytes()).sum()
    }

    /// The same weights restricted to their first `n` outputs, without a copy: chunks past `n` are
    /// dropped and the last one kept is trimmed (every kernel bounds its outputs by a chunk's `cols`
    /// and strides by its `wcols`). `n` must be a multiple of `TEXTURE_GROUP_COLS`, so no 16-column
    /// block or texture group is cut, and at most `self.n`.
    pub fn leading_outputs(&self, n: usize) -> Option<Matrix> {
        if n == 0 || n > self.n || !n.is_multiple_of(TEXTURE_GROUP_COLS) {
            return None;
        }
        let chunks = self
            .chunks
            .iter()
            .filter(|c| (c.col0 as usize) < n)
            .map(|c| MatrixChunk { cols: c.cols.min(n as u32 - c.col0), ..c.clone() })
            .collect();
        Some(Matrix { name: format!("{}[:{n}]", self.name), n, chunks, ..self.clone() })
    }

    /// Whether the chunks live in weight textures (kernels pick their TEXTURE variant).
    pub fn on_texture(&self) -> bool {
        matches!(self.chunks.first().map(|c| &c.storage), Some(Resource::Texture(_)))
    }

    /// Upload a `[n, k]` host matrix (PyTorch Linear layout), transposing and converting on the way,
    /// a few MiB at a time so no second full copy is held in memory. `progress` gets bytes uploaded.
    pub fn upload(gpu: &Gpu, host: &HostTensor, format: WeightFormat, progress: &mut dyn FnMut(u64)) -> Result<Matrix> {
        Self::upload_chunked(gpu, host, format, gpu.caps.max_storage_binding.min(gpu.caps.max_buffer), progress)
    }

    /// As `upload`, with chunks of at most `limit` bytes (tests force splitting with a small limit).
    pub fn upload_chunked(gpu: &Gpu, host: &HostTensor, format: WeightFormat, limit: u64, progress: &mut dyn FnMut(u64)) -> Result<Matrix> {
        let (n, k) = (host.rows, host.cols);
        if gpu.caps.gpu_kernels {
            return Self::upload_row_major(gpu, host, format, limit, progress);
        }
        if let WeightFormat::Quant(q) = format {
            return Self::upload_quantized(gpu, host, q, limit, progress);
        }
        if gpu.caps.weight_textures {
            return Self::upload_texture(gpu, host, format, limit, progress);
        }
        let esize: u64 = if format == WeightFormat::F32 { 4 } else { 2 };
        let max_cols = (limit / (k.max(1) as u64 * esize)) / COLUMN_ALIGN as u64 * COLUMN_ALIGN as u64;
        if max_cols == 0 {
            return Err(EngineError::LimitTooSmall {
                what: format!("one column of tensor '{}' ({k} inputs)", host.name),
                needed: k as u64 * esize * COLUMN_ALIGN as u64,
                limit,
                limit_name: "max_storage_buffer_binding_size",
                adapter: gpu.info.name.clone(),
            });
        }
        let mut chunks = Vec::new();
        let mut col0 = 0usize;
        while col0 < n {
            let cols = (n - col0).min(max_cols as usize);
            let wcols = cols.div_ceil(COLUMN_ALIGN) * COLUMN_ALIGN;
            let buffer = gpu.buffer(&format!("{}[{col0}..]", host.name), k as u64 * wcols as u64 * esize)?;
            // Upload in pieces of whole k-rows (~4 MiB) with a blocked transpose.
            let piece_rows = ((4usize << 20) / (wcols * esize as usize)).max(1);
            let mut k0 = 0;
            let mut column = vec![0f32; piece_rows.min(k)];
            while k0 < k {
                let kr = piece_rows.min(k - k0);
                let mut f32s = vec![0f32; kr * wcols];
                for c in 0..cols {
                    host.read_row(col0 + c, k0, &mut column[..kr]);
                    for (r, v) in column[..kr].iter().enumerate() {
                        f32s[r * wcols + c] = *v;
                    }
                }
                let offset = (k0 * wcols) as u64;
                match format {
                    WeightFormat::F32 => gpu.write(&buffer, offset, &f32s),
                    _ => {
                        let h: Vec<u16> = f32s.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
                        gpu.write(&buffer, offset, &h)
                    }
                }
                progress(host.dtype.bytes_for(kr * cols) as u64);
                k0 += kr;
            }
            chunks.push(MatrixChunk { storage: Resource::Buffer(buffer), col0: col0 as u32, cols: cols as u32, wcols: wcols as u32, scales_at: 0, high_at: 0, super_at: 0 });
            col0 += cols;
        }
        Ok(Matrix { name: host.name.to_string(), k, n, format, chunks, row_major: false })
    }

    /// Upload f16 / f32 weights into weight textures. Columns come in groups of 128 (8 invocations
    /// of 16 columns); an invocation's 16 columns are split into `parts` texels (2 for f16: 8 packed
    /// halves each; 4 for f32) and texel (group g, part s, input k, invocation i) sits at linear
    /// index ((g * parts + s) * k_total + k) * 8 + i. Each run of 8 invocations thus streams through
    /// contiguous memory as k advances, which is what llvmpipe reads fastest.
    fn upload_texture(gpu: &Gpu, host: &HostTensor, format: WeightFormat, limit: u64, progress: &mut dyn FnMut(u64)) -> Result<Matrix> {
        let (n, k) = (host.rows, host.cols);
        let parts: usize = if format == WeightFormat::F32 { 4 } else { 2 };
        let group_texels = (parts * k.max(1) * 8) as u64;
        let max_groups = (gpu.weight_texture_capacity().min(limit / 16) / group_texels) as usize;
        if max_groups == 0 {
            return Err(EngineError::LimitTooSmall {
                what: format!("{TEXTURE_GROUP_COLS} columns of tensor '{}' ({k} inputs) in one weight texture", host.name),
                needed: group_texels * 16,
                limit: (gpu.weight_texture_capacity() * 16).min(limit),
                limit_name: "max_texture_dimension_2d",
                adapter: gpu.info.name.clone(),
            });
        }
        let mut chunks = Vec::new();
        let mut col0 = 0usize;
        let mut column = vec![0f32; k];
        while col0 < n {
            let cols = (n - col0).min(max_groups * TEXTURE_GROUP_COLS);
            let groups = cols.div_ceil(TEXTURE_GROUP_COLS);
            let tex = gpu.weight_texture(&format!("{}[{col0}..]", host.name), groups as u64 * group_texels)?;
            let mut writer = TextureRowWriter::new(gpu, &tex);
            // One group at a time: its texels are one contiguous run of the linear texel order.
            let mut group = vec![0u32; parts * k * 8 * 4];
            for g in 0..groups {
                group.iter_mut().for_each(|w| *w = 0);
                for gc in 0..TEXTURE_GROUP_COLS.min(cols - g * TEXTURE_GROUP_COLS) {
                    host.read_row(col0 + g * TEXTURE_GROUP_COLS + gc, 0, &mut column);
                    // Column c of invocation inv: part s, word `word` of the texel (and the half).
                    let (inv, c) = (gc / 16, gc % 16);
                    let (s, word, half) = match format {
                        WeightFormat::F32 => (c / 4, c % 4, None),
                        _ => (c / 8, (c % 8) / 2, Some(16 * (c % 2))),
                    };
                    for (kk, &v) in column.iter().enumerate() {
                        let at = ((s * k + kk) * 8 + inv) * 4 + word;
                        match half {
                            None => group[at] = v.to_bits(),
                            Some(shift) => group[at] |= (f16::from_f32(v).to_bits() as u32) << shift,
                        }
                    }
                }
                writer.push(&group);
                progress(host.dtype.bytes_for(k * TEXTURE_GROUP_COLS.min(cols - g * TEXTURE_GROUP_COLS)) as u64);
            }
            writer.finish();
            let wcols = groups * TEXTURE_GROUP_COLS;
            chunks.push(MatrixChunk { storage: Resource::Texture(tex), col0: col0 as u32, cols: cols as u32, wcols: wcols as u32, scales_at: 0, high_at: 0, super_at: 0 });
            col0 += cols;
        }
        Ok(Matrix { name: host.name.to_string(), k, n, format, chunks, row_major: false })
    }

    /// Upload keeping (or converting to) GGML blocks: chunk layout `[k / block][wcols / 16]` groups of
    /// `q.gpu_group_words()` u32 (quant.rs). Blocks already of type `q` are repacked bit for bit;
    /// anything else is dequantized to f32 and quantized with llama.cpp's reference rounding.
    fn upload_quantized(gpu: &Gpu, host: &HostTensor, q: QuantType, limit: u64, progress: &mut dyn FnMut(u64)) -> Result<Matrix> {
        let (n, k) = (host.rows, host.cols);
        let bv = q.block_values();
        if k % bv != 0 {
            return Err(EngineError::Tensor {
                name: host.name.to_string(),
                message: format!("cannot store as {}: {k} inputs are not a multiple of the block size {bv}", q.name()),
            });
        }
        let kb = k / bv;
        let words = q.gpu_group_words();
        let group_bytes = (words * 4) as u64;
        // In weight textures the same word sequence fills texels (4 words each) in order.
        let capacity = if gpu.caps.weight_textures { limit.min(gpu.weight_texture_capacity() * 16) } else { limit };
        let max_groups = capacity / (kb as u64 * group_bytes);
        if max_groups == 0 {
            return Err(EngineError::LimitTooSmall {
                what: format!("16 columns of tensor '{}' ({k} inputs, {})", host.name, q.name()),
                needed: kb as u64 * group_bytes,
                limit,
                limit_name: "max_storage_buffer_binding_size",
                adapter: gpu.info.name.clone(),
            });
        }
        // Weight textures interleave groups in runs of 8 (see `interleave_groups`).
        let run = if gpu.caps.weight_textures { TEXTURE_GROUP_RUN } else { 1 };
        let max_groups = max_groups / run as u64 * run as u64;
        if max_groups == 0 {
            return Err(EngineError::LimitTooSmall {
                what: format!("{} columns of tensor '{}' ({k} inputs, {}) in one weight texture", run * GROUP_COLS, host.name, q.name()),
                needed: (run * kb) as u64 * group_bytes,
                limit: capacity,
                limit_name: "max_texture_dimension_2d",
                adapter: gpu.info.name.clone(),
            });
        }
        let max_cols = max_groups as usize * GROUP_COLS;
        let same = host.dtype == HostDType::Quant(q);
        let bb = q.block_bytes();
        let mut chunks = Vec::new();
        let mut col0 = 0usize;
        let mut values = vec![0f32; bv];
        let mut block = vec![0u8; bb];
        while col0 < n {
            let cols = (n - col0).min(max_cols);
            let groups = cols.div_ceil(GROUP_COLS).div_ceil(run) * run;
            let wcols = groups * GROUP_COLS;
            let label = format!("{}[{col0}..]", host.name);
            let mut sink = if gpu.caps.weight_textures {
                QuantSink::Texture(gpu.weight_texture(&label, kb as u64 * groups as u64 * group_bytes / 16)?, Vec::new(), 0)
            } else {
                QuantSink::Buffer(gpu.buffer(&label, kb as u64 * groups as u64 * group_bytes)?)
            };
            // Pieces of whole block-rows (~4 MiB), zero-padded past `cols` (d = 0 dequantizes to 0).
            let piece = ((4usize << 20) / (groups * words * 4)).max(1);
            let mut b0 = 0;
            while b0 < kb {
                let nb = piece.min(kb - b0);
                let mut out = vec![0u32; nb * groups * words];
                for c in 0..cols {
                    let (g, cc) = (c / GROUP_COLS, c % GROUP_COLS);
                    for b in b0..b0 + nb {
                        let src: &[u8] = if same {
                            let at = ((col0 + c) * kb + b) * bb;
                            &host.data[at..at + bb]
                        } else {
                            host.read_row(col0 + c, b * bv, &mut values);
                            q.quantize_block(&values, &mut block);
                            &block
                        };
                        let at = ((b - b0) * groups + g) * words;
                        q.pack_gpu(src, cc, &mut out[at..at + words]);
                    }
                }
                if gpu.caps.weight_textures {
                    out = interleave_groups(&out, groups, words);
                }
                sink.write(gpu, (b0 * groups * words) as u64, &out);
                progress(host.dtype.bytes_for(nb * bv * cols) as u64);
                b0 += nb;
            }
            chunks.push(MatrixChunk { storage: sink.finish(gpu), col0: col0 as u32, cols: cols as u32, wcols: wcols as u32, scales_at: 0, high_at: 0, super_at: 0 });
            col0 += cols;
        }
        Ok(Matrix { name: host.name.to_string(), k, n, format: WeightFormat::Quant(q), chunks, row_major: false })
    }

    /// Upload from f32 values in `[n, k]` layout (tests, constructed models).
    pub fn from_f32(gpu: &Gpu, name: &str, n: usize, k: usize, data: &[f32], format: WeightFormat) -> Result<Matrix> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let host = HostTensor::new(name, HostDType::F32, n, k, bytes)?;
        Matrix::upload(gpu, &host, format, &mut |_| {})
    }
}

/// Where quantized words go: a buffer (written at offsets) or a weight texture (written in order,
/// with the words not yet filling whole texture rows held back).
enum QuantSink {
    Buffer(Arc<GpuBuffer>),
    Texture(Arc<GpuTexture>, Vec<u32>, u32),
}

impl QuantSink {
    fn write(&mut self, gpu: &Gpu, offset_words: u64, words: &[u32]) {
        match self {
            QuantSink::Buffer(b) => gpu.write(b, offset_words, words),
            QuantSink::Texture(tex, pending, next_row) => {
                debug_assert_eq!(offset_words, *next_row as u64 * tex.width as u64 * 4 + pending.len() as u64, "quantized words arrive in order");
                let mut writer = TextureRowWriter { gpu, tex, pending: std::mem::take(pending), next_row: *next_row };
                writer.push(words);
                writer.flush_whole_rows();
                *pending = writer.pending;
                *next_row = writer.next_row;
            }
        }
    }

    fn finish(self, gpu: &Gpu) -> Resource {
        match self {
            QuantSink::Buffer(b) => Resource::Buffer(b),
            QuantSink::Texture(tex, pending, next_row) => {
                TextureRowWriter { gpu, tex: &tex, pending, next_row }.finish();
                Resource::Texture(tex)
            }
        }
    }
}

/// Streams texels (4 u32 words each, in linear order) into a weight texture a few MiB of whole rows
/// at a time; `finish` zero-pads and writes the last partial row.
struct TextureRowWriter<'a> {
    gpu: &'a Gpu,
    tex: &'a GpuTexture,
    pending: Vec<u32>,
    next_row: u32,
}

impl<'a> TextureRowWriter<'a> {
    fn new(gpu: &'a Gpu, tex: &'a GpuTexture) -> Self {
        Self { gpu, tex, pending: Vec::new(), next_row: 0 }
    }

    fn row_words(&self) -> usize {
        self.tex.width as usize * 4
    }

    fn push(&mut self, words: &[u32]) {
        self.pending.extend_from_slice(words);
        if self.pending.len() * 4 >= 4 << 20 {
            self.flush_whole_rows();
        }
    }

    fn flush_whole_rows(&mut self) {
        let whole = self.pending.len() / self.row_words() * self.row_words();
        self.gpu.write_texture_rows(self.tex, self.next_row, &self.pending[..whole]);
        self.next_row += (whole / self.row_words()) as u32;
        self.pending.drain(..whole);
    }

    fn finish(mut self) {
        let padded = self.pending.len().div_ceil(self.row_words()) * self.row_words();
        self.pending.resize(padded, 0);
        self.flush_whole_rows();
    }
}

/// Upload a 1-D tensor (norm weights) as f32.
pub fn upload_vector(gpu: &Gpu, host: &HostTensor) -> Result<Arc<GpuBuffer>> {
    let v = host.to_f32();
    let buf = gpu.binding_buffer(host.name, (v.len() * 4) as u64)?;
    gpu.write(&buf, 0, &v);
    Ok(buf)
}

/// Quantized groups per run in weight textures: llvmpipe's SIMD width (8 invocations, one group each).
pub const TEXTURE_GROUP_RUN: usize = 8;

/// The weight-texture order of quantized groups: within each block-row (`groups` groups of `words`
/// u32, `groups` a multiple of 8), texel t of group g moves to `((g / 8) * texels + t) * 8 + g % 8`.
/// Eight neighbouring invocations (one group each) then read eight neighbouring texels at every step,
/// one contiguous 128-byte run, where the buffer order has them `words * 4` bytes apart (llvmpipe
/// fetches a run with few cache lines; matmul_quant.wgsl and embedding.wgsl read this order).
pub fn interleave_groups(rows: &[u32], groups: usize, words: usize) -> Vec<u32> {
    let texels = words / 4;
    let mut out = vec![0u32; rows.len()];
    for (r, row) in rows.chunks_exact(groups * words).enumerate() {
        let dst = &mut out[r * groups * words..(r + 1) * groups * words];
        for g in 0..groups {
            for t in 0..texels {
                let at = ((g / TEXTURE_GROUP_RUN * texels + t) * TEXTURE_GROUP_RUN + g % TEXTURE_GROUP_RUN) * 4;
                dst[at..at + 4].copy_from_slice(&row[(g * texels + t) * 4..(g * texels + t) * 4 + 4]);
            }
        }
    }
    out
}
