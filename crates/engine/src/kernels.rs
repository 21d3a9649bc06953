//! Typed entry points for every kernel: parameter blocks matching the WGSL `Params` structs, the
//! variant choice from the device's capabilities, and the dispatch geometry.

use crate::context::{Access, Gpu, GpuBuffer, KernelSpec, Pipeline, Resource};
use crate::error::Result;
use crate::shader::{self, Defines};
use crate::step::{flat_groups, Step};
use crate::quant::QuantType;
use crate::tensor::{Matrix, MatrixChunk, WeightFormat};
use bytemuck::{Pod, Zeroable};
use std::sync::Arc;

use Access::{Read as R, ReadWrite as W, Texture as T, Uniform as U};

/// The CPU family's matmul entries (matmul.wgsl for f32/f16, matmul_quant.wgsl for blocks), indexed by
/// `cpu_matmul_spec`: x (and the norm weights) from storage or through uniform windows, weights in
/// buffers or textures, GLU or not, RMSNorm folded in or not. Bindings: x, w, (w_up), y, then (NORM)
/// the norm weights at 5.
macro_rules! cpu_matmul {
    ($name:literal, $src:expr, $($b:expr),*) => {
        KernelSpec { name: $name, source: $src, entry: "main", bindings: &[$($b),*] }
    };
}
static CPU_MATMUL: [KernelSpec; 32] = [
    cpu_matmul!("matmul", shader::MATMUL, (1, R), (2, R), (3, W)),
    cpu_matmul!("matmul", shader::MATMUL, (1, R), (2, R), (3, W), (5, R)),
    cpu_matmul!("matmul_glu", shader::MATMUL, (1, R), (2, R), (3, R), (4, W)),
    cpu_matmul!("matmul_glu", shader::MATMUL, (1, R), (2, R), (3, R), (4, W), (5, R)),
    cpu_matmul!("matmul", shader::MATMUL, (1, R), (2, T), (3, W)),
    cpu_matmul!("matmul", shader::MATMUL, (1, R), (2, T), (3, W), (5, R)),
    cpu_matmul!("matmul_glu", shader::MATMUL, (1, R), (2, T), (3, T), (4, W)),
    cpu_matmul!("matmul_glu", shader::MATMUL, (1, R), (2, T), (3, T), (4, W), (5, R)),
    cpu_matmul!("matmul_quant", shader::MATMUL_QUANT, (1, R), (2, R), (3, W)),
    cpu_matmul!("matmul_quant", shader::MATMUL_QUANT, (1, R), (2, R), (3, W), (5, R)),
    cpu_matmul!("matmul_quant_glu", shader::MATMUL_QUANT, (1, R), (2, R), (3, R), (4, W)),
    cpu_matmul!("matmul_quant_glu", shader::MATMUL_QUANT, (1, R), (2, R), (3, R), (4, W), (5, R)),
    cpu_matmul!("matmul_quant", shader::MATMUL_QUANT, (1, R), (2, T), (3, W)),
    cpu_matmul!("matmul_quant", shader::MATMUL_QUANT, (1, R), (2, T), (3, W), (5, R)),
    cpu_matmul!("matmul_quant_glu", shader::MATMUL_QUANT, (1, R), (2, T), (3, T), (4, W)),
    cpu_matmul!("matmul_quant_glu", shader::MATMUL_QUANT, (1, R), (2, T), (3, T), (4, W), (5, R)),
    cpu_matmul!("matmul", shader::MATMUL, (1, U), (2, R), (3, W)),
    cpu_matmul!("matmul", shader::MATMUL, (1, U), (2, R), (3, W), (5, U)),
    cpu_matmul!("matmul_glu", shader::MATMUL, (1, U), (2, R), (3, R), (4, W)),
    cpu_matmul!("matmul_glu", shader::MATMUL, (1, U), (2, R), (3, R), (4, W), (5, U)),
    cpu_matmul!("matmul", shader::MATMUL, (1, U), (2, T), (3, W)),
    cpu_matmul!("matmul", shader::MATMUL, (1, U), (2, T), (3, W), (5, U)),
    cpu_matmul!("matmul_glu", shader::MATMUL, (1, U), (2, T), (3, T), (4, W)),
    cpu_matmul!("matmul_glu", shader::MATMUL, (1, U), (2, T), (3, T), (4, W), (5, U)),
    cpu_matmul!("matmul_quant", shader::MATMUL_QUANT, (1, U), (2, R), (3, W)),
    cpu_matmul!("matmul_quant", shader::MATMUL_QUANT, (1, U), (2, R), (3, W), (5, U)),
    cpu_matmul!("matmul_quant_glu", shader::MATMUL_QUANT, (1, U), (2, R), (3, R), (4, W)),
    cpu_matmul!("matmul_quant_glu", shader::MATMUL_QUANT, (1, U), (2, R), (3, R), (4, W), (5, U)),
    cpu_matmul!("matmul_quant", shader::MATMUL_QUANT, (1, U), (2, T), (3, W)),
    cpu_matmul!("matmul_quant", shader::MATMUL_QUANT, (1, U), (2, T), (3, W), (5, U)),
    cpu_matmul!("matmul_quant_glu", shader::MATMUL_QUANT, (1, U), (2, T), (3, T), (4, W)),
    cpu_matmul!("matmul_quant_glu", shader::MATMUL_QUANT, (1, U), (2, T), (3, T), (4, W), (5, U)),
];

fn cpu_matmul_spec(uniform: bool, quant: bool, texture: bool, glu: bool, norm: bool) -> &'static KernelSpec {
    &CPU_MATMUL[(uniform as usize) << 4 | (quant as usize) << 3 | (texture as usize) << 2 | (glu as usize) << 1 | norm as usize]
}
const MATMUL_GPU: KernelSpec = KernelSpec { name: "matmul_gpu", source: shader::MATMUL_GPU, entry: "main", bindings: &[(1, R), (2, R), (5, W)] };
const MATMUL_GPU_NORM: KernelSpec =
    KernelSpec { name: "matmul_gpu", source: shader::MATMUL_GPU, entry: "main", bindings: &[(1, R), (2, R), (4, R), (5, W)] };
const MATMUL_GPU_GLU: KernelSpec =
    KernelSpec { name: "matmul_gpu_glu", source: shader::MATMUL_GPU, entry: "main", bindings: &[(1, R), (2, R), (3, R), (5, W)] };
const MATMUL_GPU_GLU_NORM: KernelSpec =
    KernelSpec { name: "matmul_gpu_glu", source: shader::MATMUL_GPU, entry: "main", bindings: &[(1, R), (2, R), (3, R), (4, R), (5, W)] };
const RMSNORM: KernelSpec = KernelSpec { name: "rmsnorm", source: shader::RMSNORM, entry: "main", bindings: &[(1, R), (2, R), (3, W)] };
const RMSNORM_SERIAL: KernelSpec = KernelSpec { name: "rmsnorm", source: shader::RMSNORM, entry: "serial", bindings: &[(1, R), (2, R), (3, W)] };
const ROPE: KernelSpec = KernelSpec { name: "rope", source: shader::ROPE, entry: "main", bindings: &[(1, R), (2, R), (3, R), (4, W)] };
const ROPE_QKV: KernelSpec =
    KernelSpec { name: "rope", source: shader::ROPE, entry: "qkv", bindings: &[(1, R), (2, R), (3, R), (4, W), (5, R), (6, W), (7, W)] };
const ATTN_PARTIAL: KernelSpec = KernelSpec {
    name: "attention",
    source: shader::ATTENTION,
    entry: "partial",
    bindings: &[(1, R), (2, R), (3, R), (4, W), (5, W)],
};
const ATTN_FUSED: KernelSpec = KernelSpec {
    name: "attention",
    source: shader::ATTENTION,
    entry: "fused",
    bindings: &[(1, R), (2, R), (3, R), (4, W), (5, W), (6, W)],
};
const ATTN_COMBINE: KernelSpec =
    KernelSpec { name: "attention", source: shader::ATTENTION, entry: "combine", bindings: &[(4, R), (5, R), (6, W)] };
const EMBEDDING: KernelSpec = KernelSpec { name: "embedding", source: shader::EMBEDDING, entry: "main", bindings: &[(1, R), (2, R), (3, W)] };
const EMBEDDING_TEX: KernelSpec = KernelSpec { name: "embedding", source: shader::EMBEDDING, entry: "main", bindings: &[(1, R), (2, T), (3, W)] };
const ARGMAX: KernelSpec = KernelSpec { name: "sampling", source: shader::SAMPLING, entry: "argmax", bindings: &[(1, R), (2, W)] };
const SAMPLE: KernelSpec = KernelSpec { name: "sampling", source: shader::SAMPLING, entry: "sample", bindings: &[(1, R), (2, W)] };
const ACCEPT_SAMPLED: KernelSpec =
    KernelSpec { name: "sampling", source: shader::SAMPLING, entry: "speculative", bindings: &[(1, R), (2, W), (3, W)] };
const COPY_ROWS: KernelSpec = KernelSpec { name: "copy", source: shader::COPY, entry: "rows", bindings: &[(1, R), (2, W)] };
const COPY_WITHIN: KernelSpec = KernelSpec { name: "copy", source: shader::COPY, entry: "rows", bindings: &[(1, W)] };
const BANDWIDTH: KernelSpec = KernelSpec { name: "copy", source: shader::COPY, entry: "bandwidth", bindings: &[(1, R), (2, W)] };

const GRU: KernelSpec = KernelSpec { name: "domino_head", source: shader::DOMINO_HEAD, entry: "gru", bindings: &[(1, R), (2, R), (3, W)] };
const SILU_ADD: KernelSpec = KernelSpec { name: "domino_head", source: shader::DOMINO_HEAD, entry: "silu_add", bindings: &[(1, R), (2, R), (3, W)] };
const ACCEPT_GREEDY: KernelSpec =
    KernelSpec { name: "speculative", source: shader::SPECULATIVE, entry: "accept_greedy", bindings: &[(1, R), (2, W), (3, W)] };

/// Keys per attention chunk (CHUNK in attention.wgsl).
pub const ATTENTION_CHUNK: u32 = 32;
/// Largest head_dim the attention kernel supports.
pub const MAX_HEAD_DIM: usize = 256;
/// Rows per invocation of the multi-row matmul variant (prefill, verify, drafter). 3 keeps the 12
/// vec4 accumulators of a 16-column invocation in registers on llvmpipe, whose compiler spills 16 of
/// them (4 rows: prefill and verify ran at half the speed, measured on SmolLM2 f16 and Q4_1).
pub const MATMUL_ROWS: u32 = 3;
/// Rows per invocation of the quantized multi-row matmul. matmul_quant.wgsl keeps each row's sums in
/// a variable of its own, indexed only by constants, so more rows no longer fall off llvmpipe's loop
/// unroller into dynamically indexed memory (8 rows ran 5x slower before that). Since x is read four
/// inputs per load, 8 rows sharing one dequantization measure no slower than 4 at batch 8 and
/// faster at 16 (process CPU time, `batch_profile`).
pub const MATMUL_QUANT_ROWS: u32 = 8;
/// Output columns per matmul invocation and workgroup size (matmul.wgsl's block and WG).
const MATMUL_COLS: u32 = 16;
const MATMUL_WG: u32 = 16;

/// Rows per workgroup of the GPU family's multi-row matmul (matmul_gpu.wgsl ROWS): a verify pass of
/// up to 8 rows reads each weight once; 17 rows read it 3 times (mostly from L2).
pub const GPU_ROWS: u32 = 8;
/// Output columns per workgroup of the GPU family's matmul (64 lanes each).
pub const GPU_COLS: u32 = 4;
/// Outputs narrower than this get one column per workgroup (64 invocations), so a narrow matrix
/// still spreads over as many workgroups as it has columns.
pub const GPU_NARROW: usize = 1024;

/// Shader defines for reading `w`: its format, and TEXTURE when it lives in weight textures (f16
/// then always through the packed path).
fn matrix_defines(gpu: &Gpu, w: &Matrix) -> Defines {
    if w.on_texture() {
        let shift = gpu.weight_texture_width().trailing_zeros();
        let base = match w.format {
            WeightFormat::F16 => Defines::default(),
            other => weight_defines(gpu, other),
        };
        return base.flag("TEXTURE").value("TEX_SHIFT", shift);
    }
    weight_defines(gpu, w.format)
}

fn weight_defines(gpu: &Gpu, format: WeightFormat) -> Defines {
    match format {
        WeightFormat::F32 => Defines::default().flag("F32"),
        WeightFormat::F16 if gpu.caps.f16 && !gpu.caps.prefer_packed_f16 => Defines::default().flag("F16"),
        WeightFormat::F16 => Defines::default(),
        WeightFormat::Quant(q) => Defines::default().flag(quant_flag(q)),
    }
}

/// The shader define naming a block type (matmul_quant.wgsl, matmul_gpu.wgsl, embedding.wgsl).
fn quant_flag(q: QuantType) -> &'static str {
    match q {
        QuantType::Q8_0 => "Q8_0",
        QuantType::Q4_0 => "Q4_0",
        QuantType::Q4_1 => "Q4_1",
        QuantType::Q5_0 => "Q5_0",
        QuantType::Q5_1 => "Q5_1",
        QuantType::Q4_K => "Q4_K",
        QuantType::Q5_K => "Q5_K",
        QuantType::Q6_K => "Q6_K",
    }
}

/// A strided view of rows in an f32 buffer: row r starts at `offset + r * stride` (in elements).
#[derive(Debug, Clone)]
pub struct Rows<'a> {
    pub buf: &'a Arc<GpuBuffer>,
    pub offset: u32,
    pub stride: u32,
}

impl<'a> Rows<'a> {
    pub fn new(buf: &'a Arc<GpuBuffer>, offset: u32, stride: u32) -> Self {
        Self { buf, offset, stride }
    }
    /// The same rows starting `r` rows further.
    pub fn skip(&self, r: u32) -> Self {
        Self { buf: self.buf, offset: self.offset + r * self.stride, stride: self.stride }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct MatmulParams {
    k: u32,
    n_rows: u32,
    x_offset: u32,
    x_stride: u32,
    y_offset: u32,
    y_stride: u32,
    col0: u32,
    cols: u32,
    wcols: u32,
    accumulate: u32,
    eps: f32,
    _pad: u32,
}

/// How a matmul writes its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Epilogue {
    Store,
    /// y += x·W (residual connection).
    Accumulate,
}

/// The CPU family's matmul pipeline for `w`, with the RMSNorm folded in when `norm`, reading x
/// (and the norm weights) through uniform windows of `window` bytes when given.
fn matmul_pipeline(gpu: &Gpu, w: &Matrix, x: &Rows, n_rows: u32, glu: bool, norm: bool, window: Option<u32>) -> Result<Arc<Pipeline>> {
    let rows = rows_per_invocation(w, n_rows);
    let quant = matches!(w.format, WeightFormat::Quant(_));
    let spec = cpu_matmul_spec(window.is_some(), quant, w.on_texture(), glu, norm);
    // Kernels read x four inputs at a time where its layout allows (the same sums either way); in a
    // uniform window the row's start moves by the window's offset, a multiple of 16 bytes.
    let aligned_windows = window.is_none() || gpu.caps.uniform_align.is_multiple_of(16);
    let x4 = aligned_windows && w.k.is_multiple_of(4) && x.offset.is_multiple_of(4) && (n_rows == 1 || x.stride.is_multiple_of(4));
    let mut defines = matrix_defines(gpu, w).flag_if("GLU", glu).flag_if("NORM", norm).flag_if("X4", x4).value("ROWS", rows).value("WG", MATMUL_WG);
    if let Some(bytes) = window {
        defines = defines.flag("X_UNIFORM").value("X_WINDOW", bytes / 16);
        if norm {
            defines = defines.value("NORM_WINDOW", w.k as u32 / 4);
        }
    }
    gpu.pipeline(spec, &defines)
}

/// Rows `first..first + rows` of a matmul input, seen through a uniform window: `offset` bytes into
/// the buffer, the first row `x_offset` floats into the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct InputWindow {
    first: u32,
    rows: u32,
    offset: u64,
    x_offset: u32,
}

/// How the CPU family reads `n_rows` rows of k inputs through uniform windows of the device's size
/// (`Caps::uniform_window`): as many rows per window as fit, each window at an aligned offset. None
/// where windows are off or do not fit (a row too long, a buffer without the tail
/// `Gpu::activation_buffer` gives, norm weights not a whole number of vec4s): x is then read from
/// storage. Every row is computed the same way in any window, so the split keeps batch invariance.
fn input_windows(gpu: &Gpu, k: usize, x: &Rows, n_rows: u32, norm: bool) -> Option<Vec<InputWindow>> {
    let window = gpu.caps.uniform_window as u64;
    let align = (gpu.caps.uniform_align as u64).max(4);
    let k = k as u64;
    if window == 0 || (align - 4) + 4 * k > window || (norm && (!k.is_multiple_of(4) || 4 * k > window)) {
        return None;
    }
    let mut windows = Vec::new();
    let mut first = 0u32;
    while first < n_rows {
        let start = 4 * (x.offset as u64 + first as u64 * x.stride as u64);
        let offset = start / align * align;
        if offset + window > x.buf.size {
            return None;
        }
        let x_offset = (start - offset) / 4;
        // Rows whose k inputs end inside the window: x_offset + (rows - 1) * stride + k <= window / 4.
        let room = window / 4 - x_offset - k;
        let fit = if x.stride == 0 { u64::MAX } else { 1 + room / x.stride as u64 };
        let rows = fit.min((n_rows - first) as u64) as u32;
        windows.push(InputWindow { first, rows, offset, x_offset: x_offset as u32 });
        first += rows;
    }
    Some(windows)
}

fn matmul_params(k: usize, c: &MatrixChunk, x: &Rows, y: &Rows, n_rows: u32, epilogue: Epilogue, eps: f32) -> MatmulParams {
    MatmulParams {
        k: k as u32,
        n_rows,
        x_offset: x.offset,
        x_stride: x.stride,
        y_offset: y.offset,
        y_stride: y.stride,
        col0: c.col0,
        cols: c.cols,
        wcols: c.wcols,
        accumulate: (epilogue == Epilogue::Accumulate) as u32,
        eps,
        _pad: 0,
    }
}

/// Rows per invocation of the CPU family's matmul over `w`: 1 for decode, else at most the
/// multi-row variant's (`MATMUL_QUANT_ROWS` for blocks, `MATMUL_ROWS` for floats), with the passes
/// over the rows balanced: as few as that allows, each as short as it can be (5 quantized rows run
/// as 3 + 3, not 4 + 4; 2 rows as 2, not 4). An invocation's rows past n_rows are computed and
/// dropped, so every spare row costs its multiply-adds. 2-row steps (a speculative verify of one
/// draft, two clients) took 74-89 ms instead of 96-103 ms on llvmpipe (three alternations).
fn rows_per_invocation(w: &Matrix, n_rows: u32) -> u32 {
    let most = match (n_rows, w.format) {
        (1, _) => return 1,
        (_, WeightFormat::Quant(_)) => MATMUL_QUANT_ROWS,
        _ => MATMUL_ROWS,
    };
    n_rows.div_ceil(n_rows.div_ceil(most))
}

fn matmul_groups(c: &MatrixChunk, rows_per: u32, n_rows: u32) -> [u32; 3] {
    [c.cols.div_ceil(MATMUL_COLS).div_ceil(MATMUL_WG), n_rows.div_ceil(rows_per), 1]
}

/// The RMSNorm applied to a matmul's input, folded into the matmul where that is cheaper than a
/// dispatch of its own: each workgroup (GPU family) or decode invocation (CPU family) recomputes the
/// row's scale in a fixed order. The CPU family's multi-row passes run a separate rmsnorm into
/// `scratch` instead: there every invocation would recompute ROWS scales from per-lane gathers of x,
/// which cost llvmpipe more than the pass (prefill measured about 20% slower folded).
#[derive(Debug, Clone)]
pub struct NormInput<'a> {
    pub weight: &'a Arc<GpuBuffer>,
    pub eps: f32,
    pub scratch: Rows<'a>,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct GpuMatmulParams {
    k: u32,
    n_rows: u32,
    x_offset: u32,
    x_stride: u32,
    y_offset: u32,
    y_stride: u32,
    col0: u32,
    cols: u32,
    row_words: u32,
    scales_at: u32,
    accumulate: u32,
    eps: f32,
    high_at: u32,
    super_at: u32,
    _pad: [u32; 2],
}

/// The row-major layout's format flag. f16 is `HALF` (packed pairs, unpack2x16float): the `F16` flag
/// would enable shader-f16, which the GPU family does not need.
fn gpu_format_flag(format: WeightFormat) -> &'static str {
    match format {
        WeightFormat::F32 => "F32",
        WeightFormat::F16 => "HALF",
        WeightFormat::Quant(q) => quant_flag(q),
    }
}

/// The GPU family's matmul (matmul_gpu.wgsl) over the chunks of `w` (and `up` for the GLU).
#[allow(clippy::too_many_arguments)]
fn matmul_gpu(step: &mut Step, w: &Matrix, up: Option<&Matrix>, norm: Option<&NormInput>, x: &Rows, y: &Rows, n_rows: u32, epilogue: Epilogue) -> Result<()> {
    let rows = if n_rows == 1 { 1 } else { GPU_ROWS };
    let cols = if w.n < GPU_NARROW { 1 } else { GPU_COLS };
    let spec = match (up.is_some(), norm.is_some()) {
        (false, false) => &MATMUL_GPU,
        (false, true) => &MATMUL_GPU_NORM,
        (true, false) => &MATMUL_GPU_GLU,
        (true, true) => &MATMUL_GPU_GLU_NORM,
    };
    let x4 = x.offset.is_multiple_of(4) && (n_rows == 1 || x.stride.is_multiple_of(4));
    let defines = Defines::default()
        .flag(gpu_format_flag(w.format))
        .flag_if("GLU", up.is_some())
        .flag_if("NORM", norm.is_some())
        .flag_if("X4", x4)
        .value("ROWS", rows)
        .value("COLS", cols);
    let p = step.gpu().pipeline(spec, &defines)?;
    for (i, c) in w.chunks.iter().enumerate() {
        let params = GpuMatmulParams {
            k: w.k as u32,
            n_rows,
            x_offset: x.offset,
            x_stride: x.stride,
            y_offset: y.offset,
            y_stride: y.stride,
            col0: c.col0,
            cols: c.cols,
            row_words: c.wcols,
            scales_at: c.scales_at,
            accumulate: (epilogue == Epilogue::Accumulate) as u32,
            eps: norm.map(|n| n.eps).unwrap_or(0.0),
            high_at: c.high_at,
            super_at: c.super_at,
            _pad: [0; 2],
        };
        let mut resources = vec![Resource::Buffer(x.buf.clone()), c.storage.clone()];
        let mut bytes = c.storage.bytes();
        if let Some(u) = up {
            let uc = &u.chunks[i];
            resources.push(uc.storage.clone());
            bytes += uc.storage.bytes();
        }
        if let Some(n) = norm {
            resources.push(Resource::Buffer(n.weight.clone()));
        }
        resources.push(Resource::Buffer(y.buf.clone()));
        step.dispatch_weights(&p, &params, resources, [c.cols.div_ceil(cols), n_rows.div_ceil(rows), 1], bytes);
    }
    Ok(())
}

/// y[r, :] (+)= rmsnorm(x[r, :]) · Wᵀ, the norm folded into the matmul.
pub fn matmul_normed(step: &mut Step, w: &Matrix, norm: &NormInput, x: &Rows, y: &Rows, n_rows: u32, epilogue: Epilogue) -> Result<()> {
    if w.row_major {
        return matmul_gpu(step, w, None, Some(norm), x, y, n_rows, epilogue);
    }
    if n_rows > 1 {
        rmsnorm(step, norm.weight, w.k as u32, norm.eps, x, &norm.scratch, n_rows)?;
        return matmul_cpu(step, w, None, None, &norm.scratch, y, n_rows, epilogue);
    }
    matmul_cpu(step, w, None, Some(norm), x, y, n_rows, epilogue)
}

/// y = silu(rmsnorm(x)·Wgᵀ) * (rmsnorm(x)·Wuᵀ), the norm folded in as for `matmul_normed`.
pub fn matmul_glu_normed(step: &mut Step, gate: &Matrix, up: &Matrix, norm: &NormInput, x: &Rows, y: &Rows, n_rows: u32) -> Result<()> {
    if gate.row_major {
        check_glu_pair(gate, up)?;
        return matmul_gpu(step, gate, Some(up), Some(norm), x, y, n_rows, Epilogue::Store);
    }
    check_glu_pair(gate, up)?;
    if n_rows > 1 {
        rmsnorm(step, norm.weight, gate.k as u32, norm.eps, x, &norm.scratch, n_rows)?;
        return matmul_cpu(step, gate, Some(up), None, &norm.scratch, y, n_rows, Epilogue::Store);
    }
    matmul_cpu(step, gate, Some(up), Some(norm), x, y, n_rows, Epilogue::Store)
}

fn check_glu_pair(gate: &Matrix, up: &Matrix) -> Result<()> {
    if gate.format != up.format || gate.on_texture() != up.on_texture() || gate.row_major != up.row_major || gate.chunks.len() != up.chunks.len() {
        return Err(crate::EngineError::Tensor {
            name: up.name.clone(),
            message: format!("stored as {} but its gate {} is {}: a fused GLU needs one format and layout", up.format.name(), gate.name, gate.format.name()),
        });
    }
    Ok(())
}

/// y[r, :] (+)= x[r, :] · Wᵀ for `n_rows` rows.
pub fn matmul(step: &mut Step, w: &Matrix, x: &Rows, y: &Rows, n_rows: u32, epilogue: Epilogue) -> Result<()> {
    if w.row_major {
        return matmul_gpu(step, w, None, None, x, y, n_rows, epilogue);
    }
    matmul_cpu(step, w, None, None, x, y, n_rows, epilogue)
}

/// y = silu(x·Wgᵀ) * (x·Wuᵀ): the SiLU-gated MLP's first half in one pass over both weights.
pub fn matmul_glu(step: &mut Step, gate: &Matrix, up: &Matrix, x: &Rows, y: &Rows, n_rows: u32) -> Result<()> {
    check_glu_pair(gate, up)?;
    if gate.row_major {
        return matmul_gpu(step, gate, Some(up), None, x, y, n_rows, Epilogue::Store);
    }
    matmul_cpu(step, gate, Some(up), None, x, y, n_rows, Epilogue::Store)
}

/// The CPU family's matmul (matmul.wgsl / matmul_quant.wgsl) over the chunks of `w` (and `up` for
/// the GLU), with the RMSNorm folded in when `norm` is given.
#[allow(clippy::too_many_arguments)]
fn matmul_cpu(step: &mut Step, w: &Matrix, up: Option<&Matrix>, norm: Option<&NormInput>, x: &Rows, y: &Rows, n_rows: u32, epilogue: Epilogue) -> Result<()> {
    let windows = input_windows(step.gpu(), w.k, x, n_rows, norm.is_some());
    let window_bytes = windows.as_ref().map(|_| step.gpu().caps.uniform_window);
    let p = matmul_pipeline(step.gpu(), w, x, n_rows, up.is_some(), norm.is_some(), window_bytes)?;
    let eps = norm.map(|n| n.eps).unwrap_or(0.0);
    for (i, c) in w.chunks.iter().enumerate() {
        let mut bytes = c.storage.bytes();
        if let Some(u) = up {
            bytes += u.chunks[i].storage.bytes();
        }
        // Bindings in the kernel's order: input, weight(s), output, then the norm weights.
        let bindings = |input: Resource, norm_weights: Option<Resource>| {
            let mut resources = vec![input, c.storage.clone()];
            if let Some(u) = up {
                resources.push(u.chunks[i].storage.clone());
            }
            resources.push(Resource::Buffer(y.buf.clone()));
            resources.extend(norm_weights);
            resources
        };
        let Some(windows) = &windows else {
            let params = matmul_params(w.k, c, x, y, n_rows, epilogue, eps);
            let resources = bindings(Resource::Buffer(x.buf.clone()), norm.map(|n| Resource::Buffer(n.weight.clone())));
            step.dispatch_weights(&p, &params, resources, matmul_groups(c, rows_per_invocation(w, n_rows), n_rows), bytes);
            continue;
        };
        let size = window_bytes.unwrap_or(0) as u64;
        for win in windows {
            let mut params = matmul_params(w.k, c, x, y, win.rows, epilogue, eps);
            params.x_offset = win.x_offset;
            params.y_offset = y.offset + win.first * y.stride;
            let input = Resource::Window { buf: x.buf.clone(), offset: win.offset, size };
            let norm_weights = norm.map(|n| Resource::Window { buf: n.weight.clone(), offset: 0, size: 4 * w.k as u64 });
            // Each window's pass reads the weights again (multi-row passes past a window's rows).
            step.dispatch_weights(&p, &params, bindings(input, norm_weights), matmul_groups(c, rows_per_invocation(w, n_rows), win.rows), bytes);
        }
    }
    Ok(())
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct RmsNormParams {
    n: u32,
    n_rows: u32,
    x_offset: u32,
    x_stride: u32,
    y_offset: u32,
    y_stride: u32,
    eps: f32,
    _pad: u32,
}

/// y[r] = rmsnorm(x[r]) * w over `n` channels.
pub fn rmsnorm(step: &mut Step, w: &Arc<GpuBuffer>, n: u32, eps: f32, x: &Rows, y: &Rows, n_rows: u32) -> Result<()> {
    let gpu = step.gpu();
    // The CPU family folds the norm into its decode matmuls with the workgroup tree's order, so its
    // separate pass (multi-row) must use that tree too: a decode row and a verify row then agree.
    let subgroup = gpu.caps.subgroup && gpu.caps.gpu_kernels;
    let params = RmsNormParams { n, n_rows, x_offset: x.offset, x_stride: x.stride, y_offset: y.offset, y_stride: y.stride, eps, _pad: 0 };
    // CPU family: one invocation per row in the same order (a batch-8 norm took llvmpipe ~200 µs
    // of CPU time through the 64-lane tree's barriers).
    if gpu.caps.cpu && !gpu.caps.gpu_kernels {
        let p = gpu.pipeline(&RMSNORM_SERIAL, &Defines::default().flag("SERIAL"))?;
        step.dispatch(&p, &params, &[x.buf, w, y.buf], flat_groups(n_rows, 8));
        return Ok(());
    }
    let p = gpu.pipeline(&RMSNORM, &Defines::default().flag_if("SUBGROUP", subgroup))?;
    let groups = if n_rows <= 65535 { [n_rows, 1, 1] } else { [65535, n_rows.div_ceil(65535), 1] };
    step.dispatch(&p, &params, &[x.buf, w, y.buf], groups);
    Ok(())
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct RopeParams {
    n_rows: u32,
    n_heads: u32,
    head_dim: u32,
    src_offset: u32,
    src_stride: u32,
    dst_offset: u32,
    dst_stride: u32,
    pos0: u32,
    use_norm: u32,
    eps: f32,
    _pad: [u32; 2],
}

/// Per-head RMSNorm (when `norm` is given) then NeoX RoPE; row r is at position pos0 + r.
#[allow(clippy::too_many_arguments)]
pub fn norm_rope(
    step: &mut Step,
    src: &Rows,
    dst: &Rows,
    norm: Option<&Arc<GpuBuffer>>,
    rope_table: &Arc<GpuBuffer>,
    n_rows: u32,
    n_heads: u32,
    head_dim: u32,
    pos0: u32,
    eps: f32,
) -> Result<()> {
    let gpu = step.gpu();
    let p = gpu.pipeline(&ROPE, &Defines::default())?;
    let params = RopeParams {
        n_rows,
        n_heads,
        head_dim,
        src_offset: src.offset,
        src_stride: src.stride,
        dst_offset: dst.offset,
        dst_stride: dst.stride,
        pos0,
        use_norm: norm.is_some() as u32,
        eps,
        _pad: [0; 2],
    };
    // Without a norm the weight binding is unused; bind the rope table in its place.
    let norm_buf = norm.unwrap_or(rope_table);
    step.dispatch(&p, &params, &[src.buf, norm_buf, rope_table, dst.buf], flat_groups(n_rows * n_heads, 64));
    Ok(())
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct RopeQkvParams {
    n_rows: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    src_offset: u32,
    src_stride: u32,
    q_offset: u32,
    q_stride: u32,
    kv_stride: u32,
    use_norm: u32,
    eps: f32,
    n_segs: u32,
    /// (first row, KV base in floats, position of the first row, 0) per segment.
    segs: [[u32; 4]; ATTENTION_SEGMENTS],
}

/// Where `qkv_rope` reads and writes: the fused projection's rows `[q | k | v]`, the rotated q rows,
/// and the K / V caches (row r at position pos0 + r).
pub struct QkvRope<'a> {
    pub qkv: &'a Rows<'a>,
    pub q: &'a Rows<'a>,
    pub k_cache: &'a Arc<GpuBuffer>,
    pub v_cache: &'a Arc<GpuBuffer>,
    /// Qwen3's q_norm and k_norm (both or neither).
    pub norms: Option<(&'a Arc<GpuBuffer>, &'a Arc<GpuBuffer>)>,
    pub rope_table: &'a Arc<GpuBuffer>,
}

/// One pass over a fused q/k/v projection: per-head RMSNorm + RoPE of q (into `q`) and k (into the
/// K cache at pos0..), v copied into the V cache. The same arithmetic per head as `norm_rope`.
pub fn qkv_rope(step: &mut Step, io: &QkvRope, shape: AttentionShape, n_rows: u32, pos0: u32, eps: f32) -> Result<()> {
    qkv_rope_dispatch(step, io, shape, &[KvSegment { first_row: 0, n_rows, pos0, kv_base: 0 }], eps)
}

/// `qkv_rope` for the rows of several sequences whose caches share `io`'s K and V buffers (a
/// batched step's KV pool): segment by segment the same bits, in one dispatch per
/// ATTENTION_SEGMENTS segments. Segments are in row order, back to back from row 0 of `io`'s rows.
pub fn qkv_rope_segments(step: &mut Step, io: &QkvRope, shape: AttentionShape, segments: &[KvSegment], eps: f32) -> Result<()> {
    for (first, local) in segment_groups(segments)? {
        let (qkv, q) = (io.qkv.skip(first), io.q.skip(first));
        let rows = QkvRope { qkv: &qkv, q: &q, ..*io };
        qkv_rope_dispatch(step, &rows, shape, &local, eps)?;
    }
    Ok(())
}

fn qkv_rope_dispatch(step: &mut Step, io: &QkvRope, shape: AttentionShape, segments: &[KvSegment], eps: f32) -> Result<()> {
    debug_assert!(!segments.is_empty() && segments.len() <= ATTENTION_SEGMENTS);
    let gpu = step.gpu();
    let p = gpu.pipeline(&ROPE_QKV, &Defines::default().flag("QKV"))?;
    let kvw = shape.n_kv_heads * shape.head_dim;
    let n_rows: u32 = segments.iter().map(|s| s.n_rows).sum();
    let params = RopeQkvParams {
        n_rows,
        n_heads: shape.n_heads,
        n_kv_heads: shape.n_kv_heads,
        head_dim: shape.head_dim,
        src_offset: io.qkv.offset,
        src_stride: io.qkv.stride,
        q_offset: io.q.offset,
        q_stride: io.q.stride,
        kv_stride: kvw,
        use_norm: io.norms.is_some() as u32,
        eps,
        n_segs: segments.len() as u32,
        segs: segment_table(segments),
    };
    // Without norms the weight bindings are unused; bind the rope table in their place.
    let (qn, kn) = io.norms.unwrap_or((io.rope_table, io.rope_table));
    let slots = shape.n_heads + 2 * shape.n_kv_heads;
    step.dispatch(&p, &params, &[io.qkv.buf, qn, io.rope_table, io.q.buf, kn, io.k_cache, io.v_cache], flat_groups(n_rows * slots, 64));
    Ok(())
}

/// The (cos, sin) table rope.wgsl reads: `[positions][head_dim/2]`, angles pos·θ^(−2i/d) as the Hugging
/// Face reference computes them (f32 inverse frequencies and products), cos/sin evaluated in f64.
pub fn rope_table_values(positions: usize, head_dim: usize, theta: f64) -> Vec<[f32; 2]> {
    let half = head_dim / 2;
    let inv: Vec<f32> = (0..half).map(|i| (1.0 / theta.powf((2 * i) as f64 / head_dim as f64)) as f32).collect();
    let mut out = Vec::with_capacity(positions * half);
    for pos in 0..positions {
        for f in &inv {
            let a = (pos as f32 * f) as f64;
            out.push([a.cos() as f32, a.sin() as f32]);
        }
    }
    out
}

pub fn rope_table(gpu: &Gpu, positions: usize, head_dim: usize, theta: f64) -> Result<Arc<GpuBuffer>> {
    let v = rope_table_values(positions, head_dim, theta);
    let buf = gpu.binding_buffer("rope table", (v.len() * 8) as u64)?;
    gpu.write(&buf, 0, &v);
    Ok(buf)
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct AttentionParams {
    n_rows: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    q_offset: u32,
    q_stride: u32,
    kv_len: u32,
    causal: u32,
    n_chunks: u32,
    scale: f32,
    out_offset: u32,
    out_stride: u32,
    row0: u32,
    n_segs: u32,
    _pad: [u32; 2],
    /// (first row, KV base in floats, position of the first row, 0) per segment.
    segs: [[u32; 4]; ATTENTION_SEGMENTS],
}

/// Segments one attention or qkv_rope dispatch takes (MAX_SEGS in attention.wgsl and rope.wgsl):
/// what fits their parameters' 256-byte uniform slot.
pub const ATTENTION_SEGMENTS: usize = 12;

/// Consecutive rows of one sequence in a multi-sequence pass: rows [first_row, first_row + n_rows)
/// sit at positions pos0.. of a sequence whose cache starts `kv_base` floats into the (shared) K
/// and V buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvSegment {
    pub first_row: u32,
    pub n_rows: u32,
    pub pos0: u32,
    pub kv_base: u32,
}

/// Attention geometry shared by the target (causal) and the drafter (unmasked).
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
}

/// Scratch for the split-KV attention: sized for `max_rows` query rows over `max_keys` keys.
#[derive(Debug, Clone)]
pub struct AttentionScratch {
    pub part: Arc<GpuBuffer>,
    pub stats: Arc<GpuBuffer>,
    pub max_rows: u32,
    pub max_chunks: u32,
}

impl AttentionScratch {
    pub fn new(gpu: &Gpu, shape: AttentionShape, max_rows: u32, max_keys: u32) -> Result<Self> {
        let max_chunks = max_keys.div_ceil(ATTENTION_CHUNK).max(1);
        let slots = max_rows as u64 * shape.n_heads as u64 * max_chunks as u64;
        let part = gpu.binding_buffer("attention partials", slots * shape.head_dim as u64 * 4)?;
        let stats = gpu.binding_buffer("attention stats", slots * 8)?;
        Ok(Self { part, stats, max_rows, max_chunks })
    }
}

/// out[r] = softmax(q[r]·Kᵀ·scale) · V. causal: row r sees keys [0, kv_len + r]; otherwise [0, kv_len).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    step: &mut Step,
    shape: AttentionShape,
    q: &Rows,
    k_cache: &Arc<GpuBuffer>,
    v_cache: &Arc<GpuBuffer>,
    out: &Rows,
    scratch: &AttentionScratch,
    n_rows: u32,
    kv_len: u32,
    causal: bool,
) -> Result<()> {
    let one = [KvSegment { first_row: 0, n_rows, pos0: kv_len, kv_base: 0 }];
    attention_dispatches(step, shape, q, k_cache, v_cache, out, scratch, &one, kv_len, causal)
}

/// Causal attention for the rows of several sequences at once, each segment over its own keys in
/// the shared `k_cache` / `v_cache` (a batched step's KV pool): the same bits per row as
/// `attention` on each segment alone, in one dispatch per ATTENTION_SEGMENTS segments instead of one
/// per segment. Segments are in row order, back to back from row 0 of `q` and `out`.
#[allow(clippy::too_many_arguments)]
pub fn attention_segments(
    step: &mut Step,
    shape: AttentionShape,
    q: &Rows,
    k_cache: &Arc<GpuBuffer>,
    v_cache: &Arc<GpuBuffer>,
    out: &Rows,
    scratch: &AttentionScratch,
    segments: &[KvSegment],
) -> Result<()> {
    for (first, local) in segment_groups(segments)? {
        attention_dispatches(step, shape, &q.skip(first), k_cache, v_cache, &out.skip(first), scratch, &local, 0, true)?;
    }
    Ok(())
}

/// The dispatches' share of `segments`: groups of at most ATTENTION_SEGMENTS, each as its first
/// row and its segments renumbered from there. Segments must tile their rows from the first one on,
/// in order, without gaps.
fn segment_groups(segments: &[KvSegment]) -> Result<Vec<(u32, Vec<KvSegment>)>> {
    let mut next = segments.first().map_or(0, |s| s.first_row);
    for s in segments {
        if s.first_row != next || s.n_rows == 0 {
            return Err(crate::EngineError::Gpu(format!("segment {s:?} does not follow row {next} (segments must be consecutive, non-empty)")));
        }
        next += s.n_rows;
    }
    let renumber = |group: &[KvSegment]| {
        let first = group[0].first_row;
        (first, group.iter().map(|s| KvSegment { first_row: s.first_row - first, ..*s }).collect())
    };
    Ok(segments.chunks(ATTENTION_SEGMENTS).map(renumber).collect())
}

/// The segments' params slots: (first row, KV base, first position, 0), then zeros.
fn segment_table(segments: &[KvSegment]) -> [[u32; 4]; ATTENTION_SEGMENTS] {
    let mut table = [[0u32; 4]; ATTENTION_SEGMENTS];
    for (slot, s) in table.iter_mut().zip(segments) {
        *slot = [s.first_row, s.kv_base, s.pos0, 0];
    }
    table
}

/// The dispatches of one attention call over at most ATTENTION_SEGMENTS segments starting at row 0
/// (`kv_len` only matters when not causal: every row then sees keys [0, kv_len)).
#[allow(clippy::too_many_arguments)]
fn attention_dispatches(
    step: &mut Step,
    shape: AttentionShape,
    q: &Rows,
    k_cache: &Arc<GpuBuffer>,
    v_cache: &Arc<GpuBuffer>,
    out: &Rows,
    scratch: &AttentionScratch,
    segments: &[KvSegment],
    kv_len: u32,
    causal: bool,
) -> Result<()> {
    debug_assert!(!segments.is_empty() && segments.len() <= ATTENTION_SEGMENTS);
    let gpu = step.gpu();
    // CPU adapters: small workgroups, so a decode step's few (head, chunk) invocations reach every core.
    // GPU family: one workgroup per (row, head, chunk) (COOP), enough parallelism at any context.
    let wg = if gpu.caps.cpu && !gpu.caps.gpu_kernels { 8 } else { 64 };
    let coop = gpu.caps.gpu_kernels;
    let kv_aligned = segments.iter().all(|s| s.kv_base % 4 == 0);
    let v4 = shape.head_dim.is_multiple_of(4) && q.offset.is_multiple_of(4) && q.stride.is_multiple_of(4) && kv_aligned;
    // The CPU family's partial work holds a query in this many vec4 registers.
    let d4 = shape.head_dim.div_ceil(4);
    // CPU family: partial and combine in one dispatch (one invocation per (row, head), same bits);
    // with vec4 reads one invocation per (row, KV head) serves the G query heads sharing its keys.
    let fused = gpu.caps.cpu && !gpu.caps.gpu_kernels;
    let group = shape.n_heads / shape.n_kv_heads.max(1);
    let fused_threads = |rows: u32| if v4 { rows * shape.n_kv_heads } else { rows * shape.n_heads };
    let (partial, combine) = if fused {
        (gpu.pipeline(&ATTN_FUSED, &Defines::default().flag("FUSED").flag_if("V4", v4).value("WG", wg).value("D4", d4).value("G", group))?, None)
    } else {
        let partial = gpu.pipeline(&ATTN_PARTIAL, &Defines::default().flag("PARTIAL").flag_if("COOP", coop).flag_if("V4", v4).value("WG", wg).value("D4", d4))?;
        (partial, Some(gpu.pipeline(&ATTN_COMBINE, &Defines::default().value("WG", wg))?))
    };
    let n_rows: u32 = segments.iter().map(|s| s.n_rows).sum();
    let max_visible = if causal { segments.iter().map(|s| s.pos0 + s.n_rows).max().unwrap_or(0) } else { kv_len };
    let n_chunks = max_visible.div_ceil(ATTENTION_CHUNK).max(1);
    if n_chunks > scratch.max_chunks {
        return Err(crate::EngineError::Gpu(format!(
            "attention over {max_visible} keys exceeds the scratch sized for {} keys",
            scratch.max_chunks * ATTENTION_CHUNK
        )));
    }
    let segs = segment_table(segments);
    // Process at most scratch.max_rows rows per pass; the chunking never depends on this split.
    let mut r0 = 0;
    while r0 < n_rows {
        let rows = (n_rows - r0).min(scratch.max_rows);
        let params = AttentionParams {
            n_rows: rows,
            n_heads: shape.n_heads,
            n_kv_heads: shape.n_kv_heads,
            head_dim: shape.head_dim,
            q_offset: q.offset + r0 * q.stride,
            q_stride: q.stride,
            kv_len,
            causal: causal as u32,
            n_chunks,
            scale: 1.0 / (shape.head_dim as f32).sqrt(),
            out_offset: out.offset + r0 * out.stride,
            out_stride: out.stride,
            row0: r0,
            n_segs: segments.len() as u32,
            _pad: [0; 2],
            segs,
        };
        match &combine {
            None => step.dispatch(&partial, &params, &[q.buf, k_cache, v_cache, &scratch.part, &scratch.stats, out.buf], flat_groups(fused_threads(rows), wg)),
            Some(combine) => {
                step.dispatch(
                    &partial,
                    &params,
                    &[q.buf, k_cache, v_cache, &scratch.part, &scratch.stats],
                    if coop { flat_groups(rows * shape.n_heads * n_chunks, 1) } else { flat_groups(rows * shape.n_heads * n_chunks, wg) },
                );
                step.dispatch(combine, &params, &[&scratch.part, &scratch.stats, out.buf], flat_groups(rows * shape.n_heads * shape.head_dim, wg));
            }
        }
        r0 += rows;
    }
    Ok(())
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct EmbeddingParams {
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
    _pad: u32,
}

/// y[r] = E[ids[ids_offset + r]] where E is stored as the (transposed) matrix `[hidden -> vocab]`.
pub fn embedding(step: &mut Step, table: &Matrix, ids: &Arc<GpuBuffer>, ids_offset: u32, y: &Rows, n_rows: u32) -> Result<()> {
    let gpu = step.gpu();
    let spec = if table.on_texture() { &EMBEDDING_TEX } else { &EMBEDDING };
    let defines = if table.row_major { Defines::default().flag("ROW_MAJOR").flag(gpu_format_flag(table.format)) } else { matrix_defines(gpu, table) };
    let p = gpu.pipeline(spec, &defines)?;
    for c in &table.chunks {
        let params = EmbeddingParams {
            n_rows,
            hidden: table.k as u32,
            col0: c.col0,
            cols: c.cols,
            wcols: c.wcols,
            ids_offset,
            y_offset: y.offset,
            y_stride: y.stride,
            scales_at: c.scales_at,
            high_at: c.high_at,
            super_at: c.super_at,
            _pad: 0,
        };
        let resources = vec![Resource::Buffer(ids.clone()), c.storage.clone(), Resource::Buffer(y.buf.clone())];
        step.dispatch_resources(&p, &params, resources, flat_groups(n_rows * table.k as u32, 64));
    }
    Ok(())
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct SamplingParams {
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
    result_offset: u32,
    _pad: u32,
}

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingConfig {
    /// 0 = greedy (argmax).
    pub temperature: f32,
    /// 0 = no top-k filtering.
    pub top_k: u32,
    /// 1 = no nucleus filtering.
    pub top_p: f32,
    pub seed: u64,
}

impl SamplingConfig {
    pub fn greedy() -> Self {
        Self { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

/// out[out_offset + r] = chosen token of logits row r. `counter` numbers the draws (row r uses
/// counter + r) so a seed gives one reproducible stream.
#[allow(clippy::too_many_arguments)]
pub fn sample(
    step: &mut Step,
    logits: &Rows,
    vocab: u32,
    n_rows: u32,
    out: &Arc<GpuBuffer>,
    out_offset: u32,
    cfg: &SamplingConfig,
    counter: u32,
) -> Result<()> {
    let gpu = step.gpu();
    let spec = if cfg.is_greedy() { &ARGMAX } else { &SAMPLE };
    let p = gpu.pipeline(spec, &Defines::default())?;
    let seed = (cfg.seed ^ (cfg.seed >> 32)) as u32;
    let params = SamplingParams {
        vocab,
        n_rows,
        logits_offset: logits.offset,
        logits_stride: logits.stride,
        out_offset,
        top_k: cfg.top_k,
        seed,
        counter,
        temperature: cfg.temperature.max(1e-6),
        top_p: cfg.top_p,
        result_offset: 0,
        _pad: 0,
    };
    step.dispatch(&p, &params, &[logits.buf, out], [n_rows, 1, 1]);
    Ok(())
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct CopyParams {
    n_rows: u32,
    width: u32,
    src_offset: u32,
    src_stride: u32,
    dst_offset: u32,
    dst_stride: u32,
    _pad: [u32; 2],
}

/// dst[r][0..width] = src[r][0..width] for n_rows rows.
pub fn copy_rows(step: &mut Step, src: &Rows, dst: &Rows, width: u32, n_rows: u32) -> Result<()> {
    let p = step.gpu().pipeline(&COPY_ROWS, &Defines::default())?;
    let params = CopyParams {
        n_rows,
        width,
        src_offset: src.offset,
        src_stride: src.stride,
        dst_offset: dst.offset,
        dst_stride: dst.stride,
        _pad: [0; 2],
    };
    step.dispatch(&p, &params, &[src.buf, dst.buf], flat_groups(n_rows * width, 64));
    Ok(())
}

/// Copy `n_rows` rows of `width` floats from `src_offset` to `dst_offset` (row stride `stride`)
/// within one buffer (a batched step's KV pool: one sequence's cached prefix into another's). The
/// two ranges must not overlap.
pub fn copy_rows_within(step: &mut Step, buf: &Arc<GpuBuffer>, src_offset: u32, dst_offset: u32, stride: u32, width: u32, n_rows: u32) -> Result<()> {
    let (lo, hi) = (src_offset.min(dst_offset), src_offset.max(dst_offset));
    let span = (n_rows.saturating_sub(1)) as u64 * stride as u64 + width as u64;
    if n_rows > 0 && (lo as u64 + span) > hi as u64 {
        return Err(crate::EngineError::Gpu(format!("copy of {n_rows} rows from {src_offset} to {dst_offset} overlaps itself")));
    }
    let p = step.gpu().pipeline(&COPY_WITHIN, &Defines::default().flag("WITHIN"))?;
    let params = CopyParams { n_rows, width, src_offset, src_stride: stride, dst_offset, dst_stride: stride, _pad: [0; 2] };
    step.dispatch(&p, &params, &[buf], flat_groups(n_rows * width, 64));
    Ok(())
}

/// dst = src over `bytes` (a multiple of 16), with a WGSL copy kernel: the bandwidth probe.
pub fn copy_bandwidth_kernel(step: &mut Step, src: &Arc<GpuBuffer>, dst: &Arc<GpuBuffer>, bytes: u64) -> Result<()> {
    let p = step.gpu().pipeline(&BANDWIDTH, &Defines::default().flag("BANDWIDTH"))?;
    let words = (bytes / 16) as u32;
    let params = CopyParams { n_rows: 1, width: words, src_offset: 0, src_stride: 0, dst_offset: 0, dst_stride: 0, _pad: [0; 2] };
    step.dispatch(&p, &params, &[src, dst], [words.div_ceil(64 * 4 * 8).clamp(1, 65535), 1, 1]);
    Ok(())
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct HeadParams {
    n: u32,
    a_offset: u32,
    b_offset: u32,
    _pad: u32,
}

/// s = GRU(gi, gh, s) in place: gi = W_ih·x and gh = W_hh·s, each `[3g]` in (r, z, n) order.
pub fn gru_cell(step: &mut Step, gi: &Arc<GpuBuffer>, gh: &Arc<GpuBuffer>, s: &Arc<GpuBuffer>, g: u32) -> Result<()> {
    let p = step.gpu().pipeline(&GRU, &Defines::default())?;
    step.dispatch(&p, &HeadParams { n: g, a_offset: 0, b_offset: 0, _pad: 0 }, &[gi, gh, s], flat_groups(g, 64));
    Ok(())
}

/// out[0..n] = silu(a[a_offset..] + b[b_offset..]).
pub fn silu_add(step: &mut Step, a: &Rows, b: &Rows, out: &Arc<GpuBuffer>, n: u32) -> Result<()> {
    let p = step.gpu().pipeline(&SILU_ADD, &Defines::default())?;
    step.dispatch(&p, &HeadParams { n, a_offset: a.offset, b_offset: b.offset, _pad: 0 }, &[a.buf, b.buf, out], flat_groups(n, 64));
    Ok(())
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct AcceptParams {
    start: u32,
    k: u32,
    _pad: [u32; 2],
}

/// Greedy verification: compare drafts ids[start+1..start+1+k] with the target's choices `post`,
/// write the bonus token as the new anchor and `result` = [a, d_1..d_a, bonus].
pub fn accept_greedy(step: &mut Step, post: &Arc<GpuBuffer>, ids: &Arc<GpuBuffer>, result: &Arc<GpuBuffer>, start: u32, k: u32) -> Result<()> {
    let p = step.gpu().pipeline(&ACCEPT_GREEDY, &Defines::default())?;
    step.dispatch(&p, &AcceptParams { start, k, _pad: [0; 2] }, &[post, ids, result], [1, 1, 1]);
    Ok(())
}

/// Lossless speculative sampling for one round (sampling.wgsl `speculative`): logits rows 0..=k of
/// the verify pass, drafts at ids[start+1..=start+k]. Writes the next anchor at ids[start+1+a] and
/// result[result_offset..] = [a, d_1..d_a, token]. `counter` seeds the round's draws.
#[allow(clippy::too_many_arguments)]
pub fn accept_sampled(
    step: &mut Step,
    logits: &Rows,
    vocab: u32,
    k: u32,
    ids: &Arc<GpuBuffer>,
    start: u32,
    result: &Arc<GpuBuffer>,
    result_offset: u32,
    cfg: &SamplingConfig,
    counter: u32,
) -> Result<()> {
    let p = step.gpu().pipeline(&ACCEPT_SAMPLED, &Defines::default().flag("SPECULATIVE"))?;
    let params = SamplingParams {
        vocab,
        n_rows: k + 1,
        logits_offset: logits.offset,
        logits_stride: logits.stride,
        out_offset: start,
        top_k: cfg.top_k,
        seed: (cfg.seed ^ (cfg.seed >> 32)) as u32,
        counter,
        temperature: cfg.temperature.max(1e-6),
        top_p: cfg.top_p,
        result_offset,
        _pad: 0,
    };
    step.dispatch(&p, &params, &[logits.buf, ids, result], [1, 1, 1]);
    Ok(())
}
