//! Time per dispatch of each kernel of a decode step at one model's shapes (default: SmolLM2-135M:
//! hidden 576, 9 heads / 3 KV heads of 64, intermediate 1536), 100 dispatches per submission:
//! `cargo run --release -p domino-engine --example decode_profile -- [vulkan|gl] [HIDDEN HEADS KV_HEADS INTER]`
use domino_engine::kernels::{self, AttentionScratch, AttentionShape};
use domino_engine::testing::Rng;
use domino_engine::{BackendChoice, Epilogue, Gpu, GpuOptions, Matrix, Rows, Step, WeightFormat};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let backend = BackendChoice::parse(args.get(1).map(String::as_str).unwrap_or("vulkan"))?;
    let num = |i: usize, d: u32| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (h, heads, kv_heads, inter) = (num(2, 576), num(3, 9), num(4, 3), num(5, 1536));
    let hd = 64u32;
    let gpu = pollster::block_on(Gpu::new(&GpuOptions { backend, ..Default::default() }))?;
    let mut rng = Rng::new(1);
    let buf = |n: u32| -> domino_engine::Result<_> {
        let b = gpu.buffer("b", n as u64 * 4)?;
        gpu.write(&b, 0, &Rng::new(n as u64).vec(n as usize, 1.0));
        Ok(b)
    };
    let (qw, kvw) = (heads * hd, kv_heads * hd);
    let (x, a, q, kraw, att, mlp) = (buf(h)?, buf(h)?, buf(qw)?, buf(kvw)?, buf(qw)?, buf(inter)?);
    let norm_w = buf(h.max(hd))?;
    let keys = 64u32;
    let (kc, vc) = (buf(kvw * (keys + 1))?, buf(kvw * (keys + 1))?);
    let rope = kernels::rope_table(&gpu, 256, hd as usize, 1e6)?;
    let shape = AttentionShape { n_heads: heads, n_kv_heads: kv_heads, head_dim: hd };
    let scratch = AttentionScratch::new(&gpu, shape, 1, 256)?;
    let mut mat = |n: u32, k: u32| Matrix::from_f32(&gpu, "w", n as usize, k as usize, &rng.vec((n * k) as usize, 0.1), WeightFormat::F16);
    let (wq, wk, wo, wg, wu, wd) = (mat(qw, h)?, mat(kvw, h)?, mat(h, qw)?, mat(inter, h)?, mat(inter, h)?, mat(h, inter)?);
    // Records `f` 100 times into one submission; prints the mean time per call.
    let time = |name: &str, f: &dyn Fn(&mut Step) -> domino_engine::Result<()>| -> domino_engine::Result<()> {
        let reps = 100;
        let run = || -> domino_engine::Result<()> {
            let mut step = Step::new(&gpu);
            for _ in 0..reps {
                f(&mut step)?;
            }
            pollster::block_on(step.submit_and_read(&x, 0, 4))?;
            Ok(())
        };
        run()?;
        let t = Instant::now();
        run()?;
        println!("{name:<24} {:8.1} us per call", t.elapsed().as_secs_f64() * 1e6 / reps as f64);
        Ok(())
    };
    time("copy_rows (1 x 16)", &|s| kernels::copy_rows(s, &Rows::new(&a, 0, h), &Rows::new(&x, 0, h), 16, 1))?;
    time("rmsnorm", &|s| kernels::rmsnorm(s, &norm_w, h, 1e-6, &Rows::new(&x, 0, h), &Rows::new(&a, 0, h), 1))?;
    time("norm_rope q", &|s| kernels::norm_rope(s, &Rows::new(&q, 0, qw), &Rows::new(&att, 0, qw), Some(&norm_w), &rope, 1, heads, hd, 40, 1e-6))?;
    time("attention (64 keys)", &|s| kernels::attention(s, shape, &Rows::new(&q, 0, qw), &kc, &vc, &Rows::new(&att, 0, qw), &scratch, 1, keys, true))?;
    time("matmul q", &|s| kernels::matmul(s, &wq, &Rows::new(&a, 0, h), &Rows::new(&q, 0, qw), 1, Epilogue::Store))?;
    time("matmul k", &|s| kernels::matmul(s, &wk, &Rows::new(&a, 0, h), &Rows::new(&kraw, 0, kvw), 1, Epilogue::Store))?;
    time("matmul o", &|s| kernels::matmul(s, &wo, &Rows::new(&att, 0, qw), &Rows::new(&x, 0, h), 1, Epilogue::Accumulate))?;
    time("glu", &|s| kernels::matmul_glu(s, &wg, &wu, &Rows::new(&a, 0, h), &Rows::new(&mlp, 0, inter), 1))?;
    time("matmul down", &|s| kernels::matmul(s, &wd, &Rows::new(&mlp, 0, inter), &Rows::new(&x, 0, h), 1, Epilogue::Accumulate))?;
    Ok(())
}
