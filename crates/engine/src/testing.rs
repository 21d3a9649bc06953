//! Helpers for GPU tests (used by this crate's tests and by the crates above it).
//!
//! `test_gpus()` opens every adapter configuration the test suite covers: software Vulkan with its
//! native variants (shader-f16, subgroups), the same adapter forced onto the fallback variants, and the
//! GL adapter (no f16, no subgroups), and on each backend the GPU kernel family forced on. A missing adapter is a test FAILURE, never a skip: set
//! DOMINO_TEST_BACKENDS=vulkan (or gl) to narrow the set deliberately on a machine without one.

use crate::context::{BackendChoice, Gpu, GpuBuffer, GpuOptions, KernelChoice};
use std::sync::Arc;

/// Deterministic pseudo-random numbers for tests (xorshift), uniform in [-scale, scale).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| (self.uniform() * 2.0 - 1.0) * scale).collect()
    }
}

/// The backends the GPU tests run on: DOMINO_TEST_BACKENDS, else Vulkan and GL.
pub fn test_backends() -> Vec<(String, BackendChoice)> {
    let wanted = std::env::var("DOMINO_TEST_BACKENDS").unwrap_or_else(|_| "vulkan,gl".into());
    wanted
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|name| (name.to_string(), BackendChoice::parse(name).unwrap_or_else(|e| panic!("DOMINO_TEST_BACKENDS: {e}"))))
        .collect()
}

/// A device on `backend` with weight textures forced on or off (everything else the adapter's default).
pub fn test_gpu_with_storage(name: &str, backend: BackendChoice, textures: bool) -> Arc<Gpu> {
    let opts = GpuOptions { backend, weight_textures: Some(textures), ..Default::default() };
    pollster::block_on(Gpu::new(&opts)).unwrap_or_else(|e| panic!("GPU test adapter '{name}' is required but unavailable: {e}"))
}

pub fn test_gpus() -> Vec<(String, Arc<Gpu>)> {
    let mut out = Vec::new();
    for (name, backend) in test_backends() {
        let name = name.as_str();
        // Native variants really native: f16 weights read as f16 from storage buffers even where
        // packed f16 or weight textures would be picked, and matmul inputs read from storage
        // (the fallback configuration reads them through uniform windows).
        let opts = GpuOptions { backend, packed_f16: Some(false), weight_textures: Some(false), uniform_inputs: Some(false), ..Default::default() };
        let native = pollster::block_on(Gpu::new(&opts))
            .unwrap_or_else(|e| panic!("GPU test adapter '{name}' is required but unavailable: {e}"));
        let has_native_variants = native.caps.f16 || native.caps.subgroup;
        if has_native_variants {
            let label = format!("{name}[f16={},subgroup={},buffers]", native.caps.f16, native.caps.subgroup);
            out.push((label, native));
        }
        // The adapter's own choices without f16 and subgroups (weight textures on CPU adapters).
        let opts = GpuOptions { backend, disable_f16: true, disable_subgroup: true, ..Default::default() };
        let fallback = pollster::block_on(Gpu::new(&opts)).unwrap_or_else(|e| panic!("GPU adapter '{name}': {e}"));
        let storage = if fallback.caps.weight_textures { "textures" } else { "buffers" };
        out.push((format!("{name}[fallback,{storage}]"), fallback));
        // The GPU kernel family (row-major weights, cooperative workgroups), forced on the
        // software adapter: correctness and batch invariance here, speed on real GPUs.
        out.push((format!("{name}[gpu kernels]"), test_gpu_kernels(name, backend)));
    }
    out
}

/// A device on `backend` running the GPU kernel family (`--kernels gpu`).
pub fn test_gpu_kernels(name: &str, backend: BackendChoice) -> Arc<Gpu> {
    let opts = GpuOptions { backend, kernels: KernelChoice::Gpu, ..Default::default() };
    pollster::block_on(Gpu::new(&opts)).unwrap_or_else(|e| panic!("GPU test adapter '{name}' is required but unavailable: {e}"))
}

/// An activation buffer holding `data` (test inputs: the CPU family reads them through uniform
/// windows where the device uses them, as it reads a model's activations).
pub fn upload_f32(gpu: &Gpu, data: &[f32]) -> Arc<GpuBuffer> {
    let b = gpu.activation_buffer("test", (data.len() * 4) as u64).unwrap_or_else(|e| panic!("test buffer: {e}"));
    gpu.write(&b, 0, data);
    b
}

/// The first `n` f32 values of `b`, waiting for the GPU.
pub fn read_f32_blocking(gpu: &Gpu, b: &GpuBuffer, n: usize) -> Vec<f32> {
    pollster::block_on(crate::step::read_f32(gpu, b, 0, n)).unwrap_or_else(|e| panic!("test readback: {e}"))
}

/// Largest absolute difference between two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// User + system CPU time of this process (all threads), from /proc/self/stat on Linux (None
/// elsewhere): on a shared machine it moves far less with other tenants' load than wall time does,
/// which the probe examples rely on.
pub fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15, in ticks
    // of 1/100 s (USER_HZ on Linux).
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}
