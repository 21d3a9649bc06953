//! Weights on the GPU. Matrices are stored transposed, `[in][out]` with out padded to a multiple of 16,
//! so matmul invocations read neighbouring columns; a matrix too large for one storage binding is split
//! into column chunks, each its own buffer. Source data comes from the host as f32 / f16 / bf16 bytes.

use crate::context::{Gpu, GpuBuffer};
use crate::error::{EngineError, Result};
use half::{bf16, f16};
use std::sync::Arc;

/// Element type of weights on the host (as stored in a checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostDType {
    F32,
    F16,
    BF16,
}

impl HostDType {
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
        }
    }
}

/// How weight matrices are kept on the GPU (math is always f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    F32,
    F16,
}

impl WeightFormat {
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
        }
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
        let want = rows * cols * dtype.size();
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
        }
    }

    pub fn to_f32(&self) -> Vec<f32> {
        (0..self.rows * self.cols).map(|i| self.get(i)).collect()
    }
}

/// Matrix widths are padded to this many columns (matmul.wgsl's 16-column blocks).
pub const COLUMN_ALIGN: usize = 16;

/// One column range of a matrix in its own buffer, laid out `[k][wcols]`.
#[derive(Debug, Clone)]
pub struct MatrixChunk {
    pub buffer: Arc<GpuBuffer>,
    pub col0: u32,
    pub cols: u32,
    pub wcols: u32,
}

/// A weight matrix y = x·Wᵀ with `k` inputs and `n` outputs, on the GPU.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub name: String,
    pub k: usize,
    pub n: usize,
    pub format: WeightFormat,
    pub chunks: Vec<MatrixChunk>,
}

impl Matrix {
    /// Bytes on the GPU (what one full matmul reads).
    pub fn bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.buffer.size).sum()
    }

    /// Upload a `[n, k]` host matrix (PyTorch Linear layout), transposing and converting on the way,
    /// a few MiB at a time so no second full copy is held in memory. `progress` gets bytes uploaded.
    pub fn upload(gpu: &Gpu, host: &HostTensor, format: WeightFormat, progress: &mut dyn FnMut(u64)) -> Result<Matrix> {
        Self::upload_chunked(gpu, host, format, gpu.caps.max_storage_binding.min(gpu.caps.max_buffer), progress)
    }

    /// As `upload`, with chunks of at most `limit` bytes (tests force splitting with a small limit).
    pub fn upload_chunked(gpu: &Gpu, host: &HostTensor, format: WeightFormat, limit: u64, progress: &mut dyn FnMut(u64)) -> Result<Matrix> {
        let (n, k) = (host.rows, host.cols);
        let esize = format.size() as u64;
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
            while k0 < k {
                let kr = piece_rows.min(k - k0);
                let mut f32s = vec![0f32; kr * wcols];
                for c in 0..cols {
                    let src = (col0 + c) * k + k0;
                    for r in 0..kr {
                        f32s[r * wcols + c] = host.get(src + r);
                    }
                }
                let offset = (k0 * wcols) as u64;
                match format {
                    WeightFormat::F32 => gpu.write(&buffer, offset, &f32s),
                    WeightFormat::F16 => {
                        let h: Vec<u16> = f32s.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
                        gpu.write(&buffer, offset, &h)
                    }
                }
                progress(kr as u64 * cols as u64 * host.dtype.size() as u64);
                k0 += kr;
            }
            chunks.push(MatrixChunk { buffer, col0: col0 as u32, cols: cols as u32, wcols: wcols as u32 });
            col0 += cols;
        }
        Ok(Matrix { name: host.name.to_string(), k, n, format, chunks })
    }

    /// Upload from f32 values in `[n, k]` layout (tests, constructed models).
    pub fn from_f32(gpu: &Gpu, name: &str, n: usize, k: usize, data: &[f32], format: WeightFormat) -> Result<Matrix> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let host = HostTensor::new(name, HostDType::F32, n, k, bytes)?;
        Matrix::upload(gpu, &host, format, &mut |_| {})
    }
}

/// Upload a 1-D tensor (norm weights) as f32.
pub fn upload_vector(gpu: &Gpu, host: &HostTensor) -> Result<Arc<GpuBuffer>> {
    let v = host.to_f32();
    let buf = gpu.binding_buffer(host.name, (v.len() * 4) as u64)?;
    gpu.write(&buf, 0, &v);
    Ok(buf)
}
