//! Times the quantized matmul (Q4_1, SmolLM2's MLP shape) at 1, 2, 4, 8 and 16 rows on the default
//! adapter, in wall and process CPU time: a probe for tuning the multi-row passes.
//! `cargo run --release -p domino-engine --example quant_probe -- [vulkan|gl] [iters]`

use domino_engine::quant::{quantize, QuantType};
use domino_engine::testing::Rng;
use domino_engine::{kernels, BackendChoice, Epilogue, Gpu, GpuOptions, HostDType, HostTensor, Matrix, Rows, Step, WeightFormat};
use std::time::Instant;

fn main() {
    let backend = std::env::args().nth(1).unwrap_or_else(|| "vulkan".into());
    let iters: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(20);
    let gpu = pollster::block_on(Gpu::new(&GpuOptions { backend: BackendChoice::parse(&backend).unwrap(), ..Default::default() })).unwrap();
    let (k, n) = (576usize, 1536usize);
    let t = QuantType::Q4_1;
    let mut rng = Rng::new(1);
    let bytes = quantize(t, &rng.vec(n * k, 0.1));
    let w = Matrix::upload(&gpu, &HostTensor::new("w", HostDType::Quant(t), n, k, &bytes).unwrap(), WeightFormat::Quant(t), &mut |_| {}).unwrap();
    let x = gpu.buffer("x", (k * 4 * 16) as u64).unwrap();
    gpu.write(&x, 0, &rng.vec(k * 16, 1.0));
    let y = gpu.buffer("y", (n * 4 * 16) as u64).unwrap();
    for rows in [1u32, 2, 4, 8, 16] {
        let run = || {
            let mut step = Step::new(&gpu);
            for _ in 0..iters {
                kernels::matmul(&mut step, &w, &Rows::new(&x, 0, k as u32), &Rows::new(&y, 0, n as u32), rows, Epilogue::Store).unwrap();
            }
            pollster::block_on(step.submit_and_read(&y, 0, 4)).unwrap();
        };
        run();
        let (t0, c0) = (Instant::now(), cpu_seconds());
        run();
        let dt = t0.elapsed().as_secs_f64() / iters as f64;
        let dc = (cpu_seconds() - c0) / iters as f64;
        println!("rows {rows:>2}: {:.3} ms wall, {:.3} ms CPU, {:.3} ms CPU per row", dt * 1e3, dc * 1e3, dc * 1e3 / rows as f64);
    }
}

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let f: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}
