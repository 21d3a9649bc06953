//! Time one attention dispatch per kernel family at a given key count and row count:
//! `cargo run --release -p domino-engine --example attention_probe -- [vulkan|gl] [cpu|gpu] [KEYS] [ROWS] [HEADS KV_HEADS HEAD_DIM]`
//! (default SmolLM2-135M: 9 heads, 3 KV heads of 64). Prints wall and process CPU time per call,
//! 200 calls per submission, so attention variants can be compared on one adapter in one sitting.
use domino_engine::kernels::{self, AttentionScratch, AttentionShape};
use domino_engine::testing::{process_cpu_seconds, Rng};
use domino_engine::{BackendChoice, Gpu, GpuOptions, KernelChoice, Rows, Step};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let backend = BackendChoice::parse(args.get(1).map(String::as_str).unwrap_or("vulkan"))?;
    let kernels = KernelChoice::parse(args.get(2).map(String::as_str).unwrap_or("auto")).map_err(|_| "kernels: auto, cpu or gpu")?;
    let num = |i: usize, d: u32| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (keys, rows, heads, kv_heads, hd) = (num(3, 64), num(4, 1), num(5, 9), num(6, 3), num(7, 64));
    let gpu = pollster::block_on(Gpu::new(&GpuOptions { backend, kernels, ..Default::default() }))?;
    let buf = |n: u32| -> domino_engine::Result<_> {
        let b = gpu.buffer("b", n as u64 * 4)?;
        gpu.write(&b, 0, &Rng::new(n as u64).vec(n as usize, 1.0));
        Ok(b)
    };
    let (qw, kvw) = (heads * hd, kv_heads * hd);
    let total = keys + rows;
    let (q, out, kc, vc) = (buf(qw * rows)?, buf(qw * rows)?, buf(kvw * total)?, buf(kvw * total)?);
    let shape = AttentionShape { n_heads: heads, n_kv_heads: kv_heads, head_dim: hd };
    let scratch = AttentionScratch::new(&gpu, shape, rows, total)?;
    let reps = 200;
    let run = || -> domino_engine::Result<()> {
        let mut step = Step::new(&gpu);
        for _ in 0..reps {
            kernels::attention(&mut step, shape, &Rows::new(&q, 0, qw), &kc, &vc, &Rows::new(&out, 0, qw), &scratch, rows, keys, true)?;
        }
        pollster::block_on(step.submit_and_read(&out, 0, 4))?;
        Ok(())
    };
    run()?;
    for _ in 0..3 {
        let (t, c) = (Instant::now(), process_cpu_seconds());
        run()?;
        let cpu = process_cpu_seconds().zip(c).map(|(b, a)| format!(", {:.1} us CPU", (b - a) * 1e6 / reps as f64)).unwrap_or_default();
        println!("attention {keys} keys x {rows} rows: {:.1} us per call{cpu}", t.elapsed().as_secs_f64() * 1e6 / reps as f64);
    }
    Ok(())
}
