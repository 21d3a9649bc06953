//! Times one decode-shaped matmul (1 row) and the copy kernel on the default adapter: a quick probe
//! for kernel tuning. `cargo run --release -p domino-engine --example matvec_probe -- [vulkan|gl]`

use domino_engine::testing::Rng;
use domino_engine::{kernels, BackendChoice, Epilogue, Gpu, GpuOptions, Matrix, Rows, Step, WeightFormat};
use std::time::Instant;

fn main() {
    let backend = std::env::args().nth(1).unwrap_or_else(|| "vulkan".into());
    let gpu = pollster::block_on(Gpu::new(&GpuOptions { backend: BackendChoice::parse(&backend).unwrap(), ..Default::default() })).unwrap();
    let (k, n) = (1024usize, 8192usize);
    let mut rng = Rng::new(1);
    let w = rng.vec(n * k, 0.1);
    for format in [WeightFormat::F16, WeightFormat::F32] {
        let m = Matrix::from_f32(&gpu, "w", n, k, &w, format).unwrap();
        let x = gpu.buffer("x", (k * 4 * 8) as u64).unwrap();
        let y = gpu.buffer("y", (n * 4 * 8) as u64).unwrap();
        for rows in [1u32, 8] {
            let iters = 20;
            let run = || {
                let mut step = Step::new(&gpu);
                for _ in 0..iters {
                    kernels::matmul(&mut step, &m, &Rows::new(&x, 0, k as u32), &Rows::new(&y, 0, n as u32), rows, Epilogue::Store).unwrap();
                }
                pollster::block_on(step.submit_and_read(&y, 0, 4)).unwrap();
            };
            run();
            let t = Instant::now();
            run();
            let dt = t.elapsed().as_secs_f64() / iters as f64;
            println!("{format:?} rows={rows}: {:.3} ms, {:.2} GB/s of weights", dt * 1e3, m.bytes() as f64 / dt / 1e9);
        }
    }
    let bw = pollster::block_on(domino_engine::bandwidth::copy_bandwidth(&gpu, 64 << 20, 5, &|| {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_secs_f64()
    }))
    .unwrap();
    println!("copy: {:.2} GB/s", bw / 1e9);
}
