//! The adapter's copy bandwidth, measured with a WGSL copy kernel: the yardstick the benchmark holds
//! the decode step's weight bandwidth against.

use crate::context::Gpu;
use crate::error::Result;
use crate::kernels::copy_bandwidth_kernel;
use crate::step::Step;

/// Bytes moved per second (read + write) by copying `bytes` once, best of `runs`.
pub async fn copy_bandwidth(gpu: &Gpu, bytes: u64, runs: usize, now: &dyn Fn() -> f64) -> Result<f64> {
    let bytes = bytes.min(gpu.caps.max_storage_binding) / 16 * 16;
    let src = gpu.binding_buffer("bandwidth src", bytes)?;
    let dst = gpu.binding_buffer("bandwidth dst", bytes)?;
    let mut best = f64::INFINITY;
    for i in 0..runs + 1 {
        let mut step = Step::new(gpu);
        copy_bandwidth_kernel(&mut step, &src, &dst, bytes)?;
        let t0 = now();
        step.submit_and_read(&dst, 0, 4).await?;
        let dt = now() - t0;
        if i > 0 {
            best = best.min(dt);
        }
    }
    Ok(2.0 * bytes as f64 / best)
}
