//! Times the quantized matmul (Q4_1, SmolLM2's MLP shape) at 1, 2, 4, 8 and 16 rows on the default
//! adapter, in wall and process CPU time: a probe for tuning the multi-row passes.
//! `cargo run --release -p domino-engine --example quant_probe -- [vulkan|gl] [iters]`

use domino_engine::quant::{quantize, QuantType};
use domino_engine::testing::{process_cpu_seconds, Rng};
use domino_engine::{kernels, BackendChoice, Epilogue, Gpu, GpuOptions, HostDType, HostTensor, Matrix, Rows, Step, WeightFormat};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backend = BackendChoice::parse(&std::env::args().nth(1).unwrap_or_else(|| "vulkan".into()))?;
    let iters: usize = std::env::args().nth(2).map(|s| s.parse()).transpose().map_err(|_| "iters: a number")?.unwrap_or(20);
    let gpu = pollster::block_on(Gpu::new(&GpuOptions { backend, ..Default::default() }))?;
    let (k, n) = (576usize, 1536usize);
    let t = QuantType::Q4_1;
    let mut rng = Rng::new(1);
    let bytes = quantize(t, &rng.vec(n * k, 0.1));
    let w = Matrix::upload(&gpu, &HostTensor::new("w", HostDType::Quant(t), n, k, &bytes)?, WeightFormat::Quant(t), &mut |_| {})?;
    let x = gpu.buffer("x", (k * 4 * 16) as u64)?;
    gpu.write(&x, 0, &rng.vec(k * 16, 1.0));
    let y = gpu.buffer("y", (n * 4 * 16) as u64)?;
    for rows in [1u32, 2, 4, 8, 16] {
        let run = || -> domino_engine::Result<()> {
            let mut step = Step::new(&gpu);
            for _ in 0..iters {
                kernels::matmul(&mut step, &w, &Rows::new(&x, 0, k as u32), &Rows::new(&y, 0, n as u32), rows, Epilogue::Store)?;
            }
            pollster::block_on(step.submit_and_read(&y, 0, 4))?;
            Ok(())
        };
        run()?;
        let (t0, c0) = (Instant::now(), process_cpu_seconds());
        run()?;
        let wall = t0.elapsed().as_secs_f64() / iters as f64;
        let cpu = match (process_cpu_seconds(), c0) {
            (Some(b), Some(a)) => format!(", {:.3} ms CPU, {:.3} ms CPU per row", (b - a) / iters as f64 * 1e3, (b - a) / iters as f64 * 1e3 / rows as f64),
            _ => String::new(),
        };
        println!("rows {rows:>2}: {:.3} ms wall{cpu}", wall * 1e3);
    }
    Ok(())
}
