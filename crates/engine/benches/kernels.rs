//! Criterion benchmarks of the two kernels that dominate a decode step and a verify pass: the matmul
//! (decode: 1 row; batched: 8 rows; and a Q4_1 matrix of SmolLM2's width at the 1-8 rows of a verify
//! pass) and the split-KV attention (decode: 1 row over 512 cached keys;
//! verify: 17 rows), on the default adapter (`Gpu::new` with default options: the first adapter of
//! `domino devices`, with the variants the engine itself would pick).
//!
//! Every iteration records one `Step`, submits it and waits for a 4-byte readback, so the time includes
//! one submission and its synchronisation, exactly like a decode step of the runtime.
//! Throughput is reported in bytes of weights (matmul) or of K/V cache (attention) read per iteration.
//!
//!   cargo bench -p domino-engine                                       # full run
//!   cargo bench -p domino-engine -- --warm-up-time 1 --measurement-time 3   # quick run
//!   cargo bench -p domino-engine -- matmul/f16                          # filter

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use domino_engine::kernels::{self, AttentionScratch, AttentionShape};
use domino_engine::testing::Rng;
use domino_engine::{Epilogue, Gpu, GpuBuffer, GpuOptions, Matrix, QuantType, Rows, Step, WeightFormat};
use std::sync::{Arc, OnceLock};

fn gpu() -> &'static Arc<Gpu> {
    static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| {
        let gpu = pollster::block_on(Gpu::new(&GpuOptions::default())).unwrap_or_else(|e| panic!("no GPU adapter for the benchmarks: {e}"));
        eprintln!(
            "adapter: {} ({}, {}) f16={} subgroup={} packed_f16={}",
            gpu.info.name, gpu.info.backend, gpu.info.device_type, gpu.caps.f16, gpu.caps.subgroup, gpu.caps.prefer_packed_f16
        );
        gpu
    })
}

fn upload(gpu: &Gpu, label: &str, data: &[f32]) -> Arc<domino_engine::GpuBuffer> {
    let b = gpu.buffer(label, (data.len() * 4) as u64).expect("buffer");
    gpu.write(&b, 0, data);
    b
}

/// One matmul of `rows` rows of x by `m` into y per iteration: record, submit, wait for 4 bytes.
fn bench_matmul(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, m: &Matrix, x: &Arc<GpuBuffer>, y: &Arc<GpuBuffer>, rows: u32) {
    let gpu = gpu();
    group.bench_function(name, |b| {
        b.iter(|| {
            let mut step = Step::new(gpu);
            kernels::matmul(&mut step, m, &Rows::new(x, 0, m.k as u32), &Rows::new(y, 0, m.n as u32), rows, Epilogue::Store).expect("matmul");
            pollster::block_on(step.submit_and_read(y, 0, 4)).expect("readback")
        })
    });
}

fn matmul(c: &mut Criterion) {
    let gpu = gpu();
    let (k, n) = (1024usize, 4096usize);
    let mut rng = Rng::new(1);
    let w = rng.vec(n * k, 1.0 / (k as f32).sqrt());
    let x = upload(gpu, "x", &rng.vec(8 * k, 1.0));
    let y = gpu.buffer("y", (8 * n * 4) as u64).expect("buffer");
    let mut group = c.benchmark_group("matmul");
    for format in [WeightFormat::F16, WeightFormat::F32] {
        let m = Matrix::from_f32(gpu, "w", n, k, &w, format).expect("upload");
        group.throughput(Throughput::Bytes(m.bytes()));
        for rows in [1u32, 8] {
            bench_matmul(&mut group, &format!("{}/k{k}_n{n}/rows{rows}", format.name()), &m, &x, &y, rows);
        }
    }
    group.finish();
}

/// The CPU family's verify passes: a Q4_1 matrix of SmolLM2's layer width (k 576) read by 1-8 rows
/// through an activation buffer, as the runtime's passes read it (uniform windows on CPU adapters).
fn matmul_quant(c: &mut Criterion) {
    let gpu = gpu();
    let (k, n) = (576usize, 4608usize);
    let mut rng = Rng::new(3);
    let w = rng.vec(n * k, 1.0 / (k as f32).sqrt());
    let x = gpu.activation_buffer("x", (8 * k * 4) as u64).expect("buffer");
    gpu.write(&x, 0, &rng.vec(8 * k, 1.0));
    let y = gpu.activation_buffer("y", (8 * n * 4) as u64).expect("buffer");
    let m = Matrix::from_f32(gpu, "w", n, k, &w, WeightFormat::Quant(QuantType::Q4_1)).expect("upload");
    let mut group = c.benchmark_group("matmul_quant");
    group.throughput(Throughput::Bytes(m.bytes()));
    for rows in [1u32, 2, 4, 8] {
        bench_matmul(&mut group, &format!("q4_1/k{k}_n{n}/rows{rows}"), &m, &x, &y, rows);
    }
    group.finish();
}

fn attention(c: &mut Criterion) {
    let gpu = gpu();
    // Qwen3-8B's attention geometry: 32 query heads over 8 KV heads of 128 channels.
    let shape = AttentionShape { n_heads: 32, n_kv_heads: 8, head_dim: 128 };
    let cached = 512u32;
    let max_rows = 17u32;
    let positions = (cached + max_rows) as usize;
    let kv_width = (shape.n_kv_heads * shape.head_dim) as usize;
    let q_width = (shape.n_heads * shape.head_dim) as usize;
    let mut rng = Rng::new(2);
    let k_cache = upload(gpu, "k cache", &rng.vec(positions * kv_width, 1.0));
    let v_cache = upload(gpu, "v cache", &rng.vec(positions * kv_width, 1.0));
    let q = upload(gpu, "q", &rng.vec(max_rows as usize * q_width, 1.0));
    let out = gpu.buffer("out", (max_rows as usize * q_width * 4) as u64).expect("buffer");
    let scratch = AttentionScratch::new(gpu, shape, max_rows, cached + max_rows).expect("scratch");
    let mut group = c.benchmark_group("attention");
    // decode: one new row at position 512 (sees 513 keys); verify: 17 rows at positions 512..529.
    for (name, rows) in [("decode", 1u32), ("verify", max_rows)] {
        // Keys read: row r sees cached + r + 1 keys, each K and V of all KV heads in f32.
        let keys: u64 = (0..rows as u64).map(|r| cached as u64 + r + 1).sum();
        group.throughput(Throughput::Bytes(keys * kv_width as u64 * 4 * 2));
        group.bench_function(format!("{name}/h{}_kv{}_d{}/keys{cached}/rows{rows}", shape.n_heads, shape.n_kv_heads, shape.head_dim), |b| {
            b.iter(|| {
                let mut step = Step::new(gpu);
                kernels::attention(
                    &mut step,
                    shape,
                    &Rows::new(&q, 0, q_width as u32),
                    &k_cache,
                    &v_cache,
                    &Rows::new(&out, 0, q_width as u32),
                    &scratch,
                    rows,
                    cached,
                    true,
                )
                .expect("attention");
                pollster::block_on(step.submit_and_read(&out, 0, 4)).expect("readback")
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    // GPU work on a software adapter is slow and its timings are steady: few samples suffice.
    config = Criterion::default().sample_size(10);
    targets = matmul, matmul_quant, attention
}
criterion_main!(benches);
