//! Quantized weights (every block type: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) on the GPU against the CPU reference on the exactly
//! dequantized weights, on every test adapter configuration: matmul (decode and multi-row, batch
//! invariance bit for bit), the fused GLU, the embedding gather, and splitting across buffers.

use domino_engine::quant::{self, QuantType};
use domino_engine::reference;
use domino_engine::testing::{test_gpus, Rng};
use domino_engine::{kernels, Epilogue, Gpu, HostDType, HostTensor, Matrix, Rows, Step, WeightFormat};

const TYPES: [QuantType; 8] = QuantType::ALL;

/// Inputs per row for a type's tests: whole blocks, and for the 32-value types an odd block count.
fn k_for(t: QuantType, blocks32: usize) -> usize {
    if t.is_k() {
        256 * blocks32.div_ceil(8).max(1)
    } else {
        32 * blocks32
    }
}

use domino_engine::testing::{max_abs_diff as max_err, read_f32_blocking as read, upload_f32 as upload};

fn run_matmul(gpu: &Gpu, w: &Matrix, x: &[f32], rows: usize) -> Vec<f32> {
    let xb = upload(gpu, x);
    let yb = upload(gpu, &vec![0.0; rows * w.n]);
    let mut step = Step::new(gpu);
    kernels::matmul(&mut step, w, &Rows::new(&xb, 0, w.k as u32), &Rows::new(&yb, 0, w.n as u32), rows as u32, Epilogue::Store).unwrap();
    step.submit().unwrap();
    read(gpu, &yb, rows * w.n)
}

/// As run_matmul with x's rows one float apart from any vec4 boundary (offset 1, stride k + 1): the
/// kernel reads x one input at a time there instead of four.
fn run_matmul_unaligned(gpu: &Gpu, w: &Matrix, x: &[f32], rows: usize) -> Vec<f32> {
    let k = w.k;
    let mut padded = vec![0.0; 1 + rows * (k + 1)];
    for r in 0..rows {
        padded[1 + r * (k + 1)..1 + r * (k + 1) + k].copy_from_slice(&x[r * k..(r + 1) * k]);
    }
    let xb = upload(gpu, &padded);
    let yb = upload(gpu, &vec![0.0; rows * w.n]);
    let mut step = Step::new(gpu);
    kernels::matmul(&mut step, w, &Rows { buf: &xb, offset: 1, stride: k as u32 + 1 }, &Rows::new(&yb, 0, w.n as u32), rows as u32, Epilogue::Store).unwrap();
    step.submit().unwrap();
    read(gpu, &yb, rows * w.n)
}

/// A quantized `[n, k]` matrix as a file would hold it, and its exact dequantization.
fn blocks(t: QuantType, rng: &mut Rng, n: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
    let bytes = quant::quantize(t, &rng.vec(n * k, 0.5));
    let deq = quant::dequantize(t, &bytes);
    (bytes, deq)
}

#[test]
fn quantized_matmul_matches_reference_and_is_batch_invariant() {
    for (name, gpu) in test_gpus() {
        let mut rng = Rng::new(31);
        for t in TYPES {
            for (k, n) in [(k_for(t, 2), 48usize), (k_for(t, 3), 50), (k_for(t, 1), 7), (k_for(t, 16), 20)] {
                let (bytes, deq) = blocks(t, &mut rng, n, k);
                let host = HostTensor::new("w", HostDType::Quant(t), n, k, &bytes).unwrap();
                let w = Matrix::upload(&gpu, &host, WeightFormat::Quant(t), &mut |_| {}).unwrap();
                if gpu.caps.gpu_kernels {
                    // Row-major: the file's bytes, plus at most 16 bytes of padding per region.
                    assert_eq!(w.bytes(), domino_engine::row_major::chunk_bytes(WeightFormat::Quant(t), k, n), "{t:?}");
                    // K-quants add at most 4 bytes per super-block (the 6-bit scales as bytes).
                    let slack = 64 + n * 2 + if t.is_k() { n * k / 256 * 4 } else { 0 };
                    assert!(w.bytes() as usize <= bytes.len() + slack, "{t:?}: stays quantized on the GPU ({} vs {})", w.bytes(), bytes.len());
                } else {
                    // Weight textures hold whole runs of 8 groups (128 columns).
                    let run = if gpu.caps.weight_textures { domino_engine::tensor::TEXTURE_GROUP_RUN } else { 1 };
                    assert_eq!(w.bytes() as usize, k / t.block_values() * n.div_ceil(16).div_ceil(run) * run * t.gpu_group_words() * 4, "{t:?}: stays quantized on the GPU");
                }
                // 1 to 64 rows: every multi-row pass, split into passes of the multi-row variants.
                let x_all = rng.vec(64 * k, 1.0);
                let alone: Vec<Vec<f32>> = (0..64).map(|r| run_matmul(&gpu, &w, &x_all[r * k..(r + 1) * k], 1)).collect();
                for rows in [1usize, 2, 7, 9, 17, 40, 64] {
                    let x = &x_all[..rows * k];
                    let y = run_matmul(&gpu, &w, x, rows);
                    let err = max_err(&y, &reference::matmul(x, &deq, rows, k, n));
                    assert!(err < 1e-4, "{name} {t:?} k={k} n={n} rows={rows}: max err {err}");
                    for r in 0..rows {
                        assert_eq!(
                            y[r * n..(r + 1) * n].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            alone[r].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            "{name} {t:?}: row {r} of {rows} differs from the row computed alone"
                        );
                    }
                    if rows == 1 || rows == 9 {
                        let unaligned = run_matmul_unaligned(&gpu, &w, x, rows);
                        assert!(y.iter().zip(&unaligned).all(|(a, b)| a.to_bits() == b.to_bits()), "{name} {t:?} rows={rows}: x read one input at a time differs");
                    }
                }
            }
        }
    }
}

#[test]
fn quantized_glu_embedding_and_split_match_reference() {
    for (name, gpu) in test_gpus() {
        let mut rng = Rng::new(32);
        for t in TYPES {
            let (k, n) = (k_for(t, 2), 40);
            let (gb, g) = blocks(t, &mut rng, n, k);
            let (ub, u) = blocks(t, &mut rng, n, k);
            let gm = Matrix::upload(&gpu, &HostTensor::new("g", HostDType::Quant(t), n, k, &gb).unwrap(), WeightFormat::Quant(t), &mut |_| {}).unwrap();
            let um = Matrix::upload(&gpu, &HostTensor::new("u", HostDType::Quant(t), n, k, &ub).unwrap(), WeightFormat::Quant(t), &mut |_| {}).unwrap();
            for rows in [1usize, 5, 12, 20] {
                let x = rng.vec(rows * k, 1.0);
                let xb = upload(&gpu, &x);
                let yb = gpu.buffer("y", (rows * n * 4) as u64).unwrap();
                let mut step = Step::new(&gpu);
                kernels::matmul_glu(&mut step, &gm, &um, &Rows::new(&xb, 0, k as u32), &Rows::new(&yb, 0, n as u32), rows as u32).unwrap();
                step.submit().unwrap();
                let err = max_err(&read(&gpu, &yb, rows * n), &reference::glu(&x, &g, &u, rows, k, n));
                assert!(err < 1e-4, "{name} {t:?} glu rows={rows}: {err}");
            }

            // A vocabulary split into chunks of one group (16 columns; 64 inputs = 2 blocks per column),
            // or of one run of 8 groups (128 columns) in weight textures.
            let run = if gpu.caps.weight_textures { domino_engine::tensor::TEXTURE_GROUP_RUN } else { 1 };
            let (vocab, hidden) = (103 * run, k_for(t, 2));
            let (eb, e) = blocks(t, &mut rng, vocab, hidden);
            let host = HostTensor::new("embed", HostDType::Quant(t), vocab, hidden, &eb).unwrap();
            let limit = (run * hidden / t.block_values() * t.gpu_group_words() * 4) as u64;
            let split = Matrix::upload_chunked(&gpu, &host, WeightFormat::Quant(t), limit, &mut |_| {}).unwrap();
            assert_eq!(split.chunks.len(), 7, "{t:?}");
            let whole = Matrix::upload(&gpu, &host, WeightFormat::Quant(t), &mut |_| {}).unwrap();
            let x = rng.vec(3 * hidden, 1.0);
            assert_eq!(run_matmul(&gpu, &split, &x, 3), run_matmul(&gpu, &whole, &x, 3), "{name} {t:?} split");
            let ids: Vec<u32> = vec![0, 15, 16, vocab as u32 - 1, 50, 16 * run as u32];
            let idb = gpu.buffer("ids", 24).unwrap();
            gpu.write(&idb, 0, &ids);
            let yb = gpu.buffer("y", (ids.len() * hidden * 4) as u64).unwrap();
            let mut step = Step::new(&gpu);
            kernels::embedding(&mut step, &split, &idb, 0, &Rows::new(&yb, 0, hidden as u32), ids.len() as u32).unwrap();
            step.submit().unwrap();
            assert_eq!(read(&gpu, &yb, ids.len() * hidden), reference::embedding(&e, hidden, &ids), "{name} {t:?} embedding");
        }
    }
}

#[test]
fn float_weights_quantize_at_load_like_the_cpu_quantizer() {
    // --dtype q8_0 on an f16/bf16/f32 checkpoint: the GPU holds llama.cpp's reference quantization.
    for (name, gpu) in test_gpus().into_iter().take(1) {
        let mut rng = Rng::new(33);
        for t in TYPES {
            let (k, n) = (k_for(t, 3), 20);
            let wv = rng.vec(n * k, 0.5);
            let host = HostTensor::new("w", HostDType::F32, n, k, bytemuck::cast_slice(&wv)).unwrap();
            let w = Matrix::upload(&gpu, &host, WeightFormat::Quant(t), &mut |_| {}).unwrap();
            let deq = quant::dequantize(t, &quant::quantize(t, &wv));
            let x = rng.vec(2 * k, 1.0);
            let err = max_err(&run_matmul(&gpu, &w, &x, 2), &reference::matmul(&x, &deq, 2, k, n));
            assert!(err < 1e-4, "{name} {t:?}: {err}");
        }
        // Inputs that are not whole blocks cannot be quantized: a clear error, not a panic.
        let odd = rng.vec(4 * 40, 0.5);
        let host = HostTensor::new("odd", HostDType::F32, 4, 40, bytemuck::cast_slice(&odd)).unwrap();
        let err = Matrix::upload(&gpu, &host, WeightFormat::Quant(QuantType::Q8_0), &mut |_| {}).unwrap_err().to_string();
        assert!(err.contains("odd") && err.contains("multiple of the block size 32"), "{err}");
    }
}

/// A matrix's leading outputs (the drafter's shortlist of the lm_head, `Matrix::leading_outputs`)
/// compute exactly the full matmul's first columns, bit for bit, and leave the rest of each output
/// row untouched, whole or split across buffers and textures, quantized or not, 1 to 9 rows.
#[test]
fn leading_outputs_compute_the_first_columns_alone() {
    for (name, gpu) in test_gpus() {
        let mut rng = Rng::new(37);
        let (k, n) = (64, 700);
        for t in [Some(QuantType::Q8_0), Some(QuantType::Q4_1), None] {
            let (bytes, format) = match t {
                Some(t) => (blocks(t, &mut rng, n, k).0, WeightFormat::Quant(t)),
                None => (bytemuck::cast_slice(&rng.vec(n * k, 0.5)).to_vec(), WeightFormat::F16),
            };
            let dtype = t.map(HostDType::Quant).unwrap_or(HostDType::F32);
            let host = HostTensor::new("w", dtype, n, k, &bytes).unwrap();
            let whole = Matrix::upload(&gpu, &host, format, &mut |_| {}).unwrap();
            // Chunks of 256 columns: the cut falls inside a chunk and on a chunk boundary.
            let split = Matrix::upload_chunked(&gpu, &host, format, (whole.bytes() / 3).max(1), &mut |_| {}).unwrap();
            for w in [&whole, &split] {
                for keep in [128usize, 256, 384, 640] {
                    let view = w.leading_outputs(keep).unwrap();
                    for rows in [1usize, 2, 9] {
                        let x = rng.vec(rows * k, 1.0);
                        let full = run_matmul(&gpu, w, &x, rows);
                        let xb = upload(&gpu, &x);
                        let yb = upload(&gpu, &vec![7.0; rows * n]);
                        let mut step = Step::new(&gpu);
                        kernels::matmul(&mut step, &view, &Rows::new(&xb, 0, k as u32), &Rows::new(&yb, 0, n as u32), rows as u32, Epilogue::Store).unwrap();
                        step.submit().unwrap();
                        let got = read(&gpu, &yb, rows * n);
                        for r in 0..rows {
                            let (g, f) = (&got[r * n..(r + 1) * n], &full[r * n..(r + 1) * n]);
                            assert!(g[..keep].iter().zip(&f[..keep]).all(|(a, b)| a.to_bits() == b.to_bits()), "{name} {format:?} keep={keep} rows={rows}: row {r}");
                            assert!(g[keep..].iter().all(|&v| v == 7.0), "{name} {format:?} keep={keep}: wrote past the leading outputs");
                        }
                    }
                }
                assert!(w.leading_outputs(100).is_none() && w.leading_outputs(768).is_none() && w.leading_outputs(0).is_none());
            }
        }
    }
}
