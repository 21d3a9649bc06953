//! The GPU context: adapter choice, device with the features and limits we need, and the caches of
//! pipelines and bind groups. One `Gpu` is shared (Arc) by every model and session on a device.

use crate::error::{EngineError, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Which graphics API to look for adapters on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    Auto,
    Vulkan,
    Metal,
    Dx12,
    Gl,
    /// Every backend compiled in (for listing and cross-vendor benchmarks).
    All,
}

impl BackendChoice {
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "auto" => Self::Auto,
            "vulkan" | "vk" => Self::Vulkan,
            "metal" => Self::Metal,
            "dx12" | "d3d12" => Self::Dx12,
            "gl" | "opengl" | "gles" => Self::Gl,
            "all" => Self::All,
            other => return Err(EngineError::UnknownBackend(other.to_string())),
        })
    }

    pub fn backends(self) -> wgpu::Backends {
        match self {
            // Auto prefers the modern APIs; GL only when nothing else exists (see `Gpu::new`).
            Self::Auto | Self::All => wgpu::Backends::all(),
            Self::Vulkan => wgpu::Backends::VULKAN,
            Self::Metal => wgpu::Backends::METAL,
            Self::Dx12 => wgpu::Backends::DX12,
            Self::Gl => wgpu::Backends::GL,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Vulkan => "vulkan",
            Self::Metal => "metal",
            Self::Dx12 => "dx12",
            Self::Gl => "gl",
            Self::All => "all",
        }
    }
}

/// Which kernel family runs: the CPU-adapter kernels (few wide invocations, weight textures) or the
/// GPU kernels (cooperative workgroups, coalesced row-major weights). `Auto` picks by adapter type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KernelChoice {
    #[default]
    Auto,
    Cpu,
    Gpu,
}

impl KernelChoice {
    /// Parse `--kernels`: auto, cpu or gpu.
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "auto" => Self::Auto,
            "cpu" => Self::Cpu,
            "gpu" => Self::Gpu,
            other => return Err(EngineError::Gpu(format!("unknown kernel family '{other}' (expected auto, cpu or gpu)"))),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Cpu => "cpu",
            Self::Gpu => "gpu",
        }
    }
}

/// What the kernels may use on this device. Variants are picked from these at pipeline creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// The GPU kernel family runs (row-major weights, cooperative GEMV/GEMM, one workgroup per
    /// attention chunk); otherwise the CPU-adapter family. Fixed when the device is opened, because
    /// the weight layout depends on it.
    pub gpu_kernels: bool,
    /// A CPU adapter (llvmpipe / lavapipe, SwiftShader): 8-lane SIMD per core, so kernels with few
    /// invocations use small workgroups to reach every core.
    pub cpu: bool,
    /// shader-f16 granted: f16 weights are read natively instead of unpacked from u32 pairs.
    pub f16: bool,
    /// subgroup operations granted: reductions use subgroupAdd instead of workgroup memory only.
    pub subgroup: bool,
    /// Read f16 weights through the packed-u32 path even with shader-f16: measured faster on
    /// llvmpipe (CPU adapters), where native f16 vector loads are slower than unpack2x16float.
    pub prefer_packed_f16: bool,
    /// Store f16/f32 weight matrices in rgba32uint textures read with textureLoad instead of storage
    /// buffers: llvmpipe (CPU adapters) fetches a texel with one vector load where it reads storage
    /// buffers one bounds-checked word per lane (decode matmul measured ~2x faster).
    pub weight_textures: bool,
    /// max_texture_dimension_2d: a weight texture is at most WEIGHT_TEXTURE_WIDTH x this many texels.
    pub max_texture_dim: u32,
    pub max_storage_binding: u64,
    pub max_buffer: u64,
    pub uniform_align: u32,
    /// Bytes of a uniform window the CPU family reads matmul inputs through (0: it reads them from
    /// storage). llvmpipe loads a storage word in a per-lane loop of branches but gathers uniform
    /// words branch-free, so uniform inputs made decode and multi-row passes faster there.
    pub uniform_window: u32,
    /// Bytes the device can give a model, where known: `GpuOptions::memory_budget`, else on CPU
    /// adapters (whose device memory is host memory) the host's available memory. wgpu reports no
    /// budget for real GPUs, so there only the per-buffer limits are checked.
    pub memory_budget: Option<u64>,
}

/// Facts about an adapter, for `domino devices` and benchmark reports.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AdapterSummary {
    pub index: usize,
    pub name: String,
    pub vendor: u32,
    pub device: u32,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub driver_info: String,
    pub features: Vec<String>,
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_storage_buffers_per_shader_stage: u32,
}

fn summarize(index: usize, adapter: &wgpu::Adapter) -> AdapterSummary {
    let info = adapter.get_info();
    let limits = adapter.limits();
    let features = adapter.features();
    let mut names = Vec::new();
    for (flag, name) in [
        (wgpu::Features::SHADER_F16, "shader-f16"),
        (wgpu::Features::SUBGROUP, "subgroups"),
        (wgpu::Features::TIMESTAMP_QUERY, "timestamp-query"),
    ] {
        if features.contains(flag) {
            names.push(name.to_string());
        }
    }
    AdapterSummary {
        index,
        name: info.name.clone(),
        vendor: info.vendor,
        device: info.device,
        backend: format!("{:?}", info.backend).to_lowercase(),
        device_type: format!("{:?}", info.device_type),
        driver: info.driver.clone(),
        driver_info: info.driver_info.clone(),
        features: names,
        max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
        max_buffer_size: limits.max_buffer_size,
        max_compute_workgroup_storage_size: limits.max_compute_workgroup_storage_size,
        max_compute_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
        max_storage_buffers_per_shader_stage: limits.max_storage_buffers_per_shader_stage,
    }
}

fn new_instance(backends: wgpu::Backends) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    wgpu::Instance::new(desc)
}

/// Every adapter on the chosen backend(s), in a stable order (the `--adapter N` numbering).
pub async fn list_adapters(backend: BackendChoice) -> Vec<(wgpu::Adapter, AdapterSummary)> {
    let instance = new_instance(backend.backends());
    let mut adapters = instance.enumerate_adapters(backend.backends()).await;
    // Stable numbering: real GPUs before software ones, GL last.
    adapters.sort_by_key(|a| {
        let info = a.get_info();
        let type_rank = match info.device_type {
            wgpu::DeviceType::DiscreteGpu => 0,
            wgpu::DeviceType::IntegratedGpu => 1,
            wgpu::DeviceType::VirtualGpu => 2,
            wgpu::DeviceType::Cpu => 3,
            wgpu::DeviceType::Other => 4,
        };
        (info.backend == wgpu::Backend::Gl, type_rank, info.name.clone())
    });
    adapters.into_iter().enumerate().map(|(i, a)| {
        let s = summarize(i, &a);
        (a, s)
    }).collect()
}

/// How to open a device.
#[derive(Debug, Clone)]
pub struct GpuOptions {
    pub backend: BackendChoice,
    pub adapter: Option<usize>,
    /// Ignore shader-f16 even if offered (tests the packed path on any adapter).
    pub disable_f16: bool,
    /// Ignore subgroups even if offered.
    pub disable_subgroup: bool,
    /// Force (Some(true)) or forbid (Some(false)) the packed-u32 f16 path; None picks by adapter type.
    pub packed_f16: Option<bool>,
    /// Force (Some(true)) or forbid (Some(false)) weight textures; None picks by adapter type.
    /// The GPU kernel family always reads storage buffers.
    pub weight_textures: Option<bool>,
    /// The kernel family (`--kernels`): Auto = GPU kernels on GPUs, CPU kernels on CPU adapters.
    pub kernels: KernelChoice,
    /// Bytes a model may use on this device (`Caps::memory_budget`); None: what the backend reports.
    pub memory_budget: Option<u64>,
    /// Request lower max_storage_buffer_binding_size / max_buffer_size than the adapter offers
    /// (the device then enforces them): imposes a small adapter on purpose.
    pub max_binding: Option<u64>,
    /// Force (Some(true)) or forbid (Some(false)) the CPU family's uniform input windows
    /// (`Caps::uniform_window`); None uses them wherever the CPU family runs.
    pub uniform_inputs: Option<bool>,
}

impl Default for GpuOptions {
    fn default() -> Self {
        Self {
            backend: BackendChoice::Auto,
            adapter: None,
            disable_f16: false,
            disable_subgroup: false,
            packed_f16: None,
            weight_textures: None,
            kernels: KernelChoice::Auto,
            memory_budget: None,
            max_binding: None,
            uniform_inputs: None,
        }
    }
}

/// The CPU family's uniform input window (`Caps::uniform_window`): 64 KiB or the adapter's smaller
/// limit; none for the GPU family, where forbidden, or under 16 KiB (too few rows per window).
fn uniform_window(gpu_kernels: bool, limits: &wgpu::Limits, wanted: Option<bool>) -> u32 {
    if gpu_kernels || wanted == Some(false) {
        return 0;
    }
    let window = limits.max_uniform_buffer_binding_size.min(65536) as u32 & !15;
    if window < 16384 {
        0
    } else {
        window
    }
}

/// A GPU buffer with a process-unique id (the bind-group cache key).
#[derive(Debug)]
pub struct GpuBuffer {
    pub id: u64,
    pub buffer: wgpu::Buffer,
    pub size: u64,
    pub label: String,
}

/// Whether a binding is read-only or read-write storage, a weight texture (texture_2d<u32>), or a
/// read-only uniform window of a storage buffer (`Resource::Window`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    Read,
    ReadWrite,
    Texture,
    Uniform,
}

/// Texels per row of a weight texture (a power of two; rows hold consecutive texels, so the texture
/// is a linear array of rgba32uint texels folded into 2D). Smaller only if the adapter's limit is.
pub const WEIGHT_TEXTURE_WIDTH: u32 = 4096;

/// A weight texture: `texels` rgba32uint texels (16 bytes each) in row-major order, `width` per row
/// (the last row zero-padded).
#[derive(Debug)]
pub struct GpuTexture {
    pub id: u64,
    pub texture: wgpu::Texture,
    pub view: wgpu::TextureView,
    pub width: u32,
    pub height: u32,
    pub texels: u64,
    pub label: String,
}

impl GpuTexture {
    /// Bytes of the texels in use (without the padding of the last row).
    pub fn bytes(&self) -> u64 {
        self.texels * 16
    }
}

/// Something a kernel binds: a storage buffer or a weight texture.
#[derive(Debug, Clone)]
pub enum Resource {
    Buffer(Arc<GpuBuffer>),
    Texture(Arc<GpuTexture>),
    /// `size` bytes of a buffer from `offset` (a multiple of the uniform alignment), bound as a
    /// uniform buffer (`Access::Uniform`).
    Window { buf: Arc<GpuBuffer>, offset: u64, size: u64 },
}

impl Resource {
    pub fn id(&self) -> u64 {
        match self {
            Resource::Buffer(b) => b.id,
            Resource::Texture(t) => t.id,
            Resource::Window { buf, .. } => buf.id,
        }
    }
    /// What names this binding in the bind-group cache: the resource, and the window's offset.
    pub fn key(&self) -> [u64; 2] {
        match self {
            Resource::Window { offset, .. } => [self.id(), *offset],
            _ => [self.id(), u64::MAX],
        }
    }
    pub fn bytes(&self) -> u64 {
        match self {
            Resource::Buffer(b) => b.size,
            Resource::Texture(t) => t.bytes(),
            Resource::Window { size, .. } => *size,
        }
    }
    pub fn binding(&self) -> wgpu::BindingResource<'_> {
        match self {
            Resource::Buffer(b) => b.buffer.as_entire_binding(),
            Resource::Texture(t) => wgpu::BindingResource::TextureView(&t.view),
            Resource::Window { buf, offset, size } => {
                wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: &buf.buffer, offset: *offset, size: std::num::NonZeroU64::new(*size) })
            }
        }
    }
}

/// A kernel entry point: WGSL source, entry name and its storage bindings (binding 0 is always the
/// uniform params block with a dynamic offset).
#[derive(Debug, Clone, Copy)]
pub struct KernelSpec {
    pub name: &'static str,
    pub source: &'static str,
    pub entry: &'static str,
    pub bindings: &'static [(u32, Access)],
}

/// A compiled pipeline with the explicit layout its bind groups use.
#[derive(Debug)]
pub struct Pipeline {
    pub id: u64,
    pub name: String,
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
    pub bindings: &'static [(u32, Access)],
    /// The entry point's entry, for `domino plan`: "matmul_gpu::main".
    pub entry: &'static str,
    /// The defines it was specialised with, as text ("F32 GLU ROWS=8"), for `domino plan`.
    pub variant: String,
    /// `@workgroup_size` of the entry point, read from the specialised source.
    pub workgroup_size: [u32; 3],
}

pub(crate) const PARAMS_SLOT: u64 = 256;

pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: AdapterSummary,
    pub caps: Caps,
    next_id: AtomicU64,
    pipelines: Mutex<HashMap<(String, crate::shader::Defines), Arc<Pipeline>>>,
    pub(crate) bind_groups: Mutex<HashMap<(u64, Vec<u64>), wgpu::BindGroup>>,
    pub(crate) params: Mutex<Option<Arc<GpuBuffer>>>,
    /// Set by wgpu's device-lost and uncaptured-error callbacks.
    health: Arc<DeviceHealth>,
}

/// What the device callbacks reported: a lost device (permanent: open a new `Gpu`) and the first
/// uncaptured error (fails the next step instead of wgpu's default panic).
#[derive(Debug, Default)]
struct DeviceHealth {
    lost: Mutex<Option<String>>,
    error: Mutex<Option<String>>,
}

impl DeviceHealth {
    fn set(slot: &Mutex<Option<String>>, message: String) {
        if let Ok(mut m) = slot.lock() {
            m.get_or_insert(message.split_whitespace().collect::<Vec<_>>().join(" "));
        }
    }
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("adapter", &self.info.name).field("caps", &self.caps).finish()
    }
}

impl Gpu {
    /// Open a device: pick the adapter, request shader-f16 / subgroups only where offered, and the
    /// adapter's own limits (the model loader then checks that what it needs fits in them).
    pub async fn new(opts: &GpuOptions) -> Result<Arc<Gpu>> {
        let mut adapters = list_adapters(opts.backend).await;
        if adapters.is_empty() {
            return Err(EngineError::NoAdapter { backend: opts.backend.name().to_string() });
        }
        let index = match opts.adapter {
            Some(i) if i >= adapters.len() => {
                return Err(EngineError::AdapterIndex { index: i, count: adapters.len(), backend: opts.backend.name().into() })
            }
            Some(i) => i,
            None => 0,
        };
        let (adapter, info) = adapters.swap_remove(index);
        Self::from_adapter(adapter, info, opts).await
    }

    pub async fn from_adapter(adapter: wgpu::Adapter, info: AdapterSummary, opts: &GpuOptions) -> Result<Arc<Gpu>> {
        let offered = adapter.features();
        let mut wanted = wgpu::Features::empty();
        if offered.contains(wgpu::Features::SHADER_F16) && !opts.disable_f16 {
            wanted |= wgpu::Features::SHADER_F16;
        }
        if offered.contains(wgpu::Features::SUBGROUP) && !opts.disable_subgroup {
            wanted |= wgpu::Features::SUBGROUP;
        }
        let mut limits = adapter.limits();
        if let Some(cap) = opts.max_binding {
            limits.max_storage_buffer_binding_size = limits.max_storage_buffer_binding_size.min(cap);
            limits.max_buffer_size = limits.max_buffer_size.min(cap.max(limits.max_storage_buffer_binding_size));
        }
        let desc = wgpu::DeviceDescriptor {
            label: Some("domino"),
            required_features: wanted,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) = adapter
            .request_device(&desc)
            .await
            .map_err(|e| EngineError::RequestDevice { adapter: info.name.clone(), message: e.to_string() })?;
        let health = Arc::new(DeviceHealth::default());
        let h = health.clone();
        device.set_device_lost_callback(move |reason, message| {
            let why = if message.is_empty() { format!("{reason:?}") } else { format!("{reason:?}: {message}") };
            DeviceHealth::set(&h.lost, why);
        });
        let h = health.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| DeviceHealth::set(&h.error, e.to_string())));
        let granted = device.features();
        let cpu = adapter.get_info().device_type == wgpu::DeviceType::Cpu;
        let gpu_kernels = match opts.kernels {
            KernelChoice::Auto => !cpu,
            KernelChoice::Cpu => false,
            KernelChoice::Gpu => true,
        };
        let caps = Caps {
            gpu_kernels,
            cpu,
            f16: granted.contains(wgpu::Features::SHADER_F16),
            subgroup: granted.contains(wgpu::Features::SUBGROUP),
            prefer_packed_f16: opts.packed_f16.unwrap_or(cpu),
            weight_textures: !gpu_kernels && opts.weight_textures.unwrap_or(cpu),
            max_texture_dim: limits.max_texture_dimension_2d,
            max_storage_binding: limits.max_storage_buffer_binding_size,
            max_buffer: limits.max_buffer_size,
            uniform_align: limits.min_uniform_buffer_offset_alignment,
            uniform_window: uniform_window(gpu_kernels, &limits, opts.uniform_inputs),
            memory_budget: opts.memory_budget.or_else(|| if cpu { host_available_memory() } else { None }),
        };
        Ok(Arc::new(Gpu {
            device,
            queue,
            info,
            caps,
            next_id: AtomicU64::new(1),
            pipelines: Mutex::new(HashMap::new()),
            bind_groups: Mutex::new(HashMap::new()),
            params: Mutex::new(None),
            health,
        }))
    }

    /// Why the device was lost, if it was (wgpu's device-lost callback). A lost device stays lost:
    /// open a new `Gpu` (and load the model again) to continue.
    pub fn lost(&self) -> Option<String> {
        self.health.lost.lock().ok().and_then(|m| m.clone())
    }

    /// Fails if the device was lost, or with the first GPU error nothing captured since the last
    /// check (which it clears). Steps call this before submitting and after a failed readback.
    pub fn check(&self) -> Result<()> {
        if let Some(reason) = self.lost() {
            return Err(EngineError::DeviceLost { adapter: self.info.name.clone(), reason });
        }
        match self.health.error.lock().ok().and_then(|mut m| m.take()) {
            Some(message) => Err(EngineError::Gpu(message)),
            None => Ok(()),
        }
    }

    /// Destroy the device now (what a driver reset does to it): every later step fails with
    /// `EngineError::DeviceLost`. For tests of the recovery path.
    pub fn destroy(&self) {
        self.device.destroy();
        // Native wgpu runs the lost callback when the device is next maintained; make it certain.
        DeviceHealth::set(&self.health.lost, "Destroyed: the device was destroyed".into());
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A storage buffer of `size` bytes (at least 16), zero-initialised.
    pub fn buffer(&self, label: &str, size: u64) -> Result<Arc<GpuBuffer>> {
        self.check()?;
        let size = size.max(16).div_ceil(16) * 16;
        if size > self.caps.max_buffer {
            return Err(EngineError::LimitTooSmall {
                what: format!("buffer '{label}'"),
                needed: size,
                limit: self.caps.max_buffer,
                limit_name: "max_buffer_size",
                adapter: self.info.name.clone(),
            });
        }
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            // UNIFORM: the CPU family reads matmul inputs and norm weights through uniform windows.
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Ok(Arc::new(GpuBuffer { id: self.next_id(), buffer, size, label: label.to_string() }))
    }

    /// A buffer of activations (rows a matmul reads as its input): as `binding_buffer`, with a
    /// uniform window's worth of zeroed tail, so a window starting at any of its `size` bytes fits.
    pub fn activation_buffer(&self, label: &str, size: u64) -> Result<Arc<GpuBuffer>> {
        let padded = size + self.caps.uniform_window as u64;
        if padded > self.caps.max_storage_binding {
            return self.binding_buffer(label, size);
        }
        self.buffer(label, padded)
    }

    /// A storage buffer that must be bindable whole: checked against max_storage_buffer_binding_size.
    pub fn binding_buffer(&self, label: &str, size: u64) -> Result<Arc<GpuBuffer>> {
        if size > self.caps.max_storage_binding {
            return Err(EngineError::LimitTooSmall {
                what: format!("buffer '{label}'"),
                needed: size,
                limit: self.caps.max_storage_binding,
                limit_name: "max_storage_buffer_binding_size",
                adapter: self.info.name.clone(),
            });
        }
        self.buffer(label, size)
    }

    /// Texels per row of this device's weight textures.
    pub fn weight_texture_width(&self) -> u32 {
        // The largest power of two within both: shaders split a texel index with a shift and a mask.
        let most = WEIGHT_TEXTURE_WIDTH.min(self.caps.max_texture_dim.max(1));
        1 << (31 - most.leading_zeros())
    }

    /// Most texels one weight texture can hold on this device.
    pub fn weight_texture_capacity(&self) -> u64 {
        self.weight_texture_width() as u64 * self.caps.max_texture_dim as u64
    }

    /// A weight texture of `texels` texels (rounded up to whole rows), zero-initialised.
    pub fn weight_texture(&self, label: &str, texels: u64) -> Result<Arc<GpuTexture>> {
        let width = self.weight_texture_width();
        let height = texels.div_ceil(width as u64).max(1);
        if height > self.caps.max_texture_dim as u64 {
            return Err(EngineError::LimitTooSmall {
                what: format!("weight texture '{label}' ({width} x {height} texels)"),
                needed: height * width as u64 * 16,
                limit: self.caps.max_texture_dim as u64 * width as u64 * 16,
                limit_name: "max_texture_dimension_2d",
                adapter: self.info.name.clone(),
            });
        }
        let texture = self.device.create_texture(&wgpu::TextureDescriptor {
            label: Some(label),
            size: wgpu::Extent3d { width, height: height as u32, depth_or_array_layers: 1 },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: wgpu::TextureFormat::Rgba32Uint,
            usage: wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_DST,
            view_formats: &[],
        });
        let view = texture.create_view(&wgpu::TextureViewDescriptor::default());
        Ok(Arc::new(GpuTexture { id: self.next_id(), texture, view, width, height: height as u32, texels, label: label.to_string() }))
    }

    /// Write whole texture rows starting at row `row`: `words` holds 4 u32 per texel, a multiple of
    /// the row width.
    pub fn write_texture_rows(&self, tex: &GpuTexture, row: u32, words: &[u32]) {
        let row_words = tex.width as usize * 4;
        debug_assert_eq!(words.len() % row_words, 0);
        let rows = (words.len() / row_words) as u32;
        if rows == 0 {
            return;
        }
        self.queue.write_texture(
            wgpu::TexelCopyTextureInfo { texture: &tex.texture, mip_level: 0, origin: wgpu::Origin3d { x: 0, y: row, z: 0 }, aspect: wgpu::TextureAspect::All },
            bytemuck::cast_slice(words),
            wgpu::TexelCopyBufferLayout { offset: 0, bytes_per_row: Some(tex.width * 16), rows_per_image: Some(rows) },
            wgpu::Extent3d { width: tex.width, height: rows, depth_or_array_layers: 1 },
        );
    }

    pub fn write<T: bytemuck::Pod>(&self, buf: &GpuBuffer, offset_elems: u64, data: &[T]) {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        if bytes.is_empty() {
            return;
        }
        let offset = offset_elems * std::mem::size_of::<T>() as u64;
        if bytes.len().is_multiple_of(4) && offset.is_multiple_of(4) {
            self.queue.write_buffer(&buf.buffer, offset, bytes);
        } else {
            // write_buffer needs 4-byte multiples: pad the tail (callers only do this for u8/u16 data).
            let mut padded = bytes.to_vec();
            padded.resize(bytes.len().div_ceil(4) * 4, 0);
            self.queue.write_buffer(&buf.buffer, offset, &padded);
        }
    }

    /// The pipeline for `spec` specialised with `defines`, compiled once and cached.
    pub fn pipeline(&self, spec: &KernelSpec, defines: &crate::shader::Defines) -> Result<Arc<Pipeline>> {
        let key = (format!("{}::{}", spec.name, spec.entry), defines.clone());
        if let Some(p) = self.pipelines.lock().map_err(|_| EngineError::Gpu("pipeline cache poisoned".into()))?.get(&key) {
            return Ok(p.clone());
        }
        let source = crate::shader::preprocess(spec.name, spec.source, defines)?;
        let workgroup_size = crate::shader::workgroup_size(&source, spec.entry)
            .ok_or_else(|| EngineError::Shader { name: spec.name.to_string(), message: format!("no @workgroup_size for entry '{}'", spec.entry) })?;
        let module = self.compile(spec.name, &source)?;
        let mut entries = vec![wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: true,
                min_binding_size: None,
            },
            count: None,
        }];
        for &(binding, access) in spec.bindings {
            let ty = match access {
                Access::Texture => wgpu::BindingType::Texture {
                    sample_type: wgpu::TextureSampleType::Uint,
                    view_dimension: wgpu::TextureViewDimension::D2,
                    multisampled: false,
                },
                Access::Uniform => wgpu::BindingType::Buffer { ty: wgpu::BufferBindingType::Uniform, has_dynamic_offset: false, min_binding_size: None },
                _ => wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only: access == Access::Read },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
            };
            entries.push(wgpu::BindGroupLayoutEntry { binding, visibility: wgpu::ShaderStages::COMPUTE, ty, count: None });
        }
        let layout = self.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(spec.name), entries: &entries });
        let pl = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(spec.name),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(spec.name),
            layout: Some(&pl),
            module: &module,
            entry_point: Some(spec.entry),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = block_on_ready(scope.pop()) {
            return Err(EngineError::Shader { name: spec.name.to_string(), message: e.to_string() });
        }
        let p = Arc::new(Pipeline {
            id: self.next_id(),
            name: spec.name.to_string(),
            pipeline,
            layout,
            bindings: spec.bindings,
            entry: spec.entry,
            variant: defines.describe(),
            workgroup_size,
        });
        self.pipelines.lock().map_err(|_| EngineError::Gpu("pipeline cache poisoned".into()))?.insert(key, p.clone());
        Ok(p)
    }

    fn compile(&self, name: &str, source: &str) -> Result<wgpu::ShaderModule> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let desc = wgpu::ShaderModuleDescriptor { label: Some(name), source: wgpu::ShaderSource::Wgsl(source.into()) };
        // SAFETY: our kernels index only inside the ranges their params describe (the CPU side checks
        // sizes before dispatch) and every loop is bounded by uniform params, so naga's injected bounds
        // checks and loop counters are pure overhead; they cost llvmpipe ~2x on the matmul.
        let checks = wgpu::ShaderRuntimeChecks { bounds_checks: false, force_loop_bounding: false, ..Default::default() };
        let module = unsafe { self.device.create_shader_module_trusted(desc, checks) };
        if let Some(e) = block_on_ready(scope.pop()) {
            return Err(EngineError::Shader { name: name.to_string(), message: e.to_string() });
        }
        Ok(module)
    }

    /// Start watching allocations for out-of-memory errors (wgpu reports them asynchronously).
    pub fn begin_allocation_check(&self) -> wgpu::ErrorScopeGuard {
        self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory)
    }

    /// Turn an out-of-memory error raised since `begin_allocation_check` into a clear error.
    pub fn end_allocation_check(&self, scope: wgpu::ErrorScopeGuard, what: &str) -> Result<()> {
        match block_on_ready(scope.pop()) {
            Some(e) => Err(EngineError::OutOfMemory { what: what.to_string(), message: e.to_string(), adapter: self.info.name.clone() }),
            None => Ok(()),
        }
    }

    /// Forget cached bind groups (call when buffers they reference are dropped, e.g. a session ends).
    pub fn clear_bind_groups(&self) {
        if let Ok(mut m) = self.bind_groups.lock() {
            m.clear();
        }
    }
}

/// MemAvailable from /proc/meminfo (Linux), the memory a CPU adapter's device can still take.
pub fn host_available_memory() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib.saturating_mul(1024))
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// Error scopes resolve immediately on wgpu-core (native) and after a JS microtask in the browser.
/// Polling once is enough natively; in the browser an unresolved scope is treated as "no error" and
/// real errors surface through the uncaptured-error handler instead.
fn block_on_ready<F: std::future::Future>(f: F) -> F::Output
where
    F::Output: Default,
{
    use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};
    fn noop_raw() -> RawWaker {
        fn clone(_: *const ()) -> RawWaker {
            noop_raw()
        }
        fn noop(_: *const ()) {}
        static VT: RawWakerVTable = RawWakerVTable::new(clone, noop, noop, noop);
        RawWaker::new(std::ptr::null(), &VT)
    }
    let waker = unsafe { Waker::from_raw(noop_raw()) };
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => Default::default(),
    }
}
