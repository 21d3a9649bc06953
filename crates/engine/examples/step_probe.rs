//! Process CPU time per call of each kernel of a batched decode step at SmolLM2-135M's shapes
//! (Q4_1 layers, Q8_0 lm_head), at 1 and 8 rows (or the listed row counts) with 100-key contexts: where a batch-8 step's time
//! goes. `cargo run --release -p domino-engine --example step_probe -- [vulkan|gl] [reps] [rows,rows,...]`
use domino_engine::kernels::{self, AttentionScratch, AttentionShape, KvSegment, NormInput, QkvRope};
use domino_engine::quant::{quantize, QuantType};
use domino_engine::testing::{process_cpu_seconds, Rng};
use domino_engine::{BackendChoice, Epilogue, Gpu, GpuOptions, HostDType, HostTensor, Matrix, Rows, Step, WeightFormat};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let backend = BackendChoice::parse(args.get(1).map(String::as_str).unwrap_or("vulkan"))?;
    let reps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(50);
    let gpu = pollster::block_on(Gpu::new(&GpuOptions { backend, ..Default::default() }))?;
    let (h, heads, kv_heads, hd, inter, vocab) = (576u32, 9u32, 3u32, 64u32, 1536u32, 49152u32);
    let (qw, kvw) = (heads * hd, kv_heads * hd);
    let mut rng = Rng::new(1);
    let rows_max = 8u32;
    let act = |n: u32| -> domino_engine::Result<_> {
        let b = gpu.activation_buffer("b", (n * rows_max) as u64 * 4)?;
        gpu.write(&b, 0, &Rng::new(n as u64).vec((n * rows_max) as usize, 1.0));
        Ok(b)
    };
    let (x, a, qkv, q, att, mlp, logits) = (act(h)?, act(h)?, act(qw + 2 * kvw)?, act(qw)?, act(qw)?, act(inter)?, act(vocab)?);
    let norm_w = act(h)?;
    let cap = 128u32;
    let pool = |_: ()| -> domino_engine::Result<_> {
        let b = gpu.buffer("kv", (cap * kvw * rows_max) as u64 * 4)?;
        gpu.write(&b, 0, &Rng::new(7).vec((cap * kvw * rows_max) as usize, 1.0));
        Ok(b)
    };
    let (kp, vp) = (pool(())?, pool(())?);
    let rope = kernels::rope_table(&gpu, cap as usize, hd as usize, 1e6)?;
    let shape = AttentionShape { n_heads: heads, n_kv_heads: kv_heads, head_dim: hd };
    let scratch = AttentionScratch::new(&gpu, shape, rows_max, cap)?;
    let mut quant = |n: u32, k: u32, t: QuantType| -> domino_engine::Result<Matrix> {
        let bytes = quantize(t, &rng.vec((n * k) as usize, 0.1));
        Matrix::upload(&gpu, &HostTensor::new("w", HostDType::Quant(t), n as usize, k as usize, &bytes)?, WeightFormat::Quant(t), &mut |_| {})
    };
    let (wqkv, wo, wg, wu, wd) = (quant(qw + 2 * kvw, h, QuantType::Q4_1)?, quant(h, qw, QuantType::Q4_1)?, quant(inter, h, QuantType::Q4_1)?, quant(inter, h, QuantType::Q4_1)?, quant(h, inter, QuantType::Q4_1)?);
    let head = quant(vocab, h, QuantType::Q8_0)?;
    let time = |name: &str, rows: u32, f: &dyn Fn(&mut Step) -> domino_engine::Result<()>| -> domino_engine::Result<()> {
        let run = || -> domino_engine::Result<()> {
            let mut step = Step::new(&gpu);
            for _ in 0..reps {
                f(&mut step)?;
            }
            pollster::block_on(step.submit_and_read(&x, 0, 4))?;
            Ok(())
        };
        run()?;
        let c0 = process_cpu_seconds().unwrap_or(0.0);
        run()?;
        let cpu = process_cpu_seconds().unwrap_or(0.0) - c0;
        println!("{name:<28} rows {rows}: {:8.0} us CPU per call", cpu * 1e6 / reps as f64);
        Ok(())
    };
    let row_counts: Vec<u32> = match args.get(3) {
        Some(list) => list.split(',').map(|r| r.parse::<u32>().map(|r| r.clamp(1, rows_max))).collect::<Result<_, _>>()?,
        None => vec![1, rows_max],
    };
    for rows in row_counts {
        let norm = NormInput { weight: &norm_w, eps: 1e-6, scratch: Rows::new(&a, 0, h) };
        let segs: Vec<KvSegment> = (0..rows).map(|r| KvSegment { first_row: r, n_rows: 1, pos0: 100, kv_base: r * cap * kvw }).collect();
        time("rmsnorm", rows, &|s| kernels::rmsnorm(s, &norm_w, h, 1e-6, &Rows::new(&x, 0, h), &Rows::new(&a, 0, h), rows))?;
        time("qkv (normed)", rows, &|s| kernels::matmul_normed(s, &wqkv, &norm, &Rows::new(&x, 0, h), &Rows::new(&qkv, 0, qw + 2 * kvw), rows, Epilogue::Store))?;
        time("qkv_rope (segments)", rows, &|s| {
            let (src, qr) = (Rows::new(&qkv, 0, qw + 2 * kvw), Rows::new(&q, 0, qw));
            let io = QkvRope { qkv: &src, q: &qr, k_cache: &kp, v_cache: &vp, norms: Some((&norm_w, &norm_w)), rope_table: &rope };
            kernels::qkv_rope_segments(s, &io, shape, &segs, 1e-6)
        })?;
        time("attention (segments, 100)", rows, &|s| kernels::attention_segments(s, shape, &Rows::new(&q, 0, qw), &kp, &vp, &Rows::new(&att, 0, qw), &scratch, &segs))?;
        time("o", rows, &|s| kernels::matmul(s, &wo, &Rows::new(&att, 0, qw), &Rows::new(&x, 0, h), rows, Epilogue::Accumulate))?;
        time("gate/up (normed)", rows, &|s| kernels::matmul_glu_normed(s, &wg, &wu, &norm, &Rows::new(&x, 0, h), &Rows::new(&mlp, 0, inter), rows))?;
        time("down", rows, &|s| kernels::matmul(s, &wd, &Rows::new(&mlp, 0, inter), &Rows::new(&x, 0, h), rows, Epilogue::Accumulate))?;
        time("lm_head (Q8_0)", rows, &|s| {
            kernels::rmsnorm(s, &norm_w, h, 1e-6, &Rows::new(&x, 0, h), &Rows::new(&a, 0, h), rows)?;
            kernels::matmul(s, &head, &Rows::new(&a, 0, h), &Rows::new(&logits, 0, vocab), rows, Epilogue::Store)
        })?;
    }
    Ok(())
}
