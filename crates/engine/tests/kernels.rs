//! Every kernel against the CPU reference, on every test adapter configuration, plus batch
//! invariance: a row computed among N rows is bit-identical to the same row computed alone.

use domino_engine::kernels::{self, AttentionScratch, AttentionShape, KvSegment, QkvRope, SamplingConfig};
use domino_engine::reference;
use domino_engine::testing::{test_gpus, Rng};
use domino_engine::{Epilogue, Gpu, HostDType, HostTensor, Matrix, QuantType, Rows, Step, WeightFormat};
use pollster::block_on;
use std::sync::Arc;

use domino_engine::testing::{max_abs_diff as max_err, read_f32_blocking as read, upload_f32 as upload};

const ROW_COUNTS: [usize; 5] = [1, 2, 7, 17, 64];

fn run_matmul(gpu: &Gpu, w: &Matrix, x: &[f32], rows: usize, init: &[f32], epi: Epilogue) -> Vec<f32> {
    let xb = upload(gpu, x);
    let yb = upload(gpu, init);
    let mut step = Step::new(gpu);
    kernels::matmul(&mut step, w, &Rows::new(&xb, 0, w.k as u32), &Rows::new(&yb, 0, w.n as u32), rows as u32, epi).unwrap();
    step.submit().unwrap();
    read(gpu, &yb, rows * w.n)
}

#[test]
fn matmul_matches_reference_and_is_batch_invariant() {
    for (name, gpu) in test_gpus() {
        let mut rng = Rng::new(1);
        for (k, n) in [(64usize, 48usize), (96, 50), (130, 7)] {
            let wv = rng.vec(n * k, 0.5);
            for format in [WeightFormat::F32, WeightFormat::F16] {
                let w = Matrix::from_f32(&gpu, "w", n, k, &wv, format).unwrap();
                // The reference sees the weights as the GPU stores them.
                let wq: Vec<f32> = match format {
                    WeightFormat::F32 => wv.clone(),
                    _ => wv.iter().map(|v| half::f16::from_f32(*v).to_f32()).collect(),
                };
                let x_all = rng.vec(64 * k, 1.0);
                let alone: Vec<Vec<f32>> =
                    (0..64).map(|r| run_matmul(&gpu, &w, &x_all[r * k..(r + 1) * k], 1, &vec![0.0; n], Epilogue::Store)).collect();
                for rows in ROW_COUNTS {
                    let x = &x_all[..rows * k];
                    let y = run_matmul(&gpu, &w, x, rows, &vec![0.0; rows * n], Epilogue::Store);
                    let want = reference::matmul(x, &wq, rows, k, n);
                    let err = max_err(&y, &want);
                    assert!(err < 1e-4, "{name} {format:?} k={k} n={n} rows={rows}: max err {err}");
                    for r in 0..rows {
                        assert_eq!(
                            y[r * n..(r + 1) * n].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            alone[r].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            "{name} {format:?}: row {r} of {rows} differs from the row computed alone"
                        );
                    }
                }
                // Residual epilogue: y = init + x·W.
                let init = rng.vec(2 * n, 1.0);
                let y = run_matmul(&gpu, &w, &x_all[..2 * k], 2, &init, Epilogue::Accumulate);
                let want: Vec<f32> = reference::matmul(&x_all[..2 * k], &wq, 2, k, n).iter().zip(&init).map(|(a, b)| a + b).collect();
                assert!(max_err(&y, &want) < 1e-4, "{name}: accumulate");
            }
        }
    }
}

#[test]
fn matmul_split_across_buffers_matches_single_buffer() {
    for (name, gpu) in test_gpus() {
        let mut rng = Rng::new(2);
        let (k, n) = (40, 300);
        let wv = rng.vec(n * k, 0.5);
        let host = HostTensor::new("w", HostDType::F32, n, k, bytemuck::cast_slice(&wv)).unwrap();
        let whole = Matrix::upload(&gpu, &host, WeightFormat::F16, &mut |_| {}).unwrap();
        // The smallest chunk: 16 columns in buffers (19 chunks), a 128-column group in textures (3).
        // The GPU family's row-major chunks hold whole columns (80 bytes each): 16 again.
        let (cols, chunks) = if gpu.caps.weight_textures { (128, 3) } else { (16, 19) };
        let split = Matrix::upload_chunked(&gpu, &host, WeightFormat::F16, 40 * 2 * cols, &mut |_| {}).unwrap();
        assert_eq!((whole.chunks.len(), split.chunks.len()), (1, chunks), "{name}");
        let x = rng.vec(3 * k, 1.0);
        let a = run_matmul(&gpu, &whole, &x, 3, &vec![0.0; 3 * n], Epilogue::Store);
        let b = run_matmul(&gpu, &split, &x, 3, &vec![0.0; 3 * n], Epilogue::Store);
        assert_eq!(a, b, "{name}");
        // The embedding gather over the split table equals the reference rows.
        let ids: Vec<u32> = vec![0, 15, 16, 299, 50, 127, 128, 255, 256];
        let idb = gpu.buffer("ids", 4 * ids.len() as u64).unwrap();
        gpu.write(&idb, 0, &ids);
        let yb = gpu.buffer("y", (ids.len() * k * 4) as u64).unwrap();
        let mut step = Step::new(&gpu);
        kernels::embedding(&mut step, &split, &idb, 0, &Rows::new(&yb, 0, k as u32), ids.len() as u32).unwrap();
        step.submit().unwrap();
        let got = read(&gpu, &yb, ids.len() * k);
        let wq: Vec<f32> = wv.iter().map(|v| half::f16::from_f32(*v).to_f32()).collect();
        assert_eq!(got, reference::embedding(&wq, k, &ids), "{name} embedding");
    }
}

/// Weight textures (the CPU adapters' storage) and storage buffers give bit-identical matmul, GLU and
/// embedding results for every weight format: same weights, same per-column order of accumulation.
#[test]
fn weight_textures_match_storage_buffers_bit_for_bit() {
    for (name, backend) in domino_engine::testing::test_backends() {
        let on_texture = domino_engine::testing::test_gpu_with_storage(&name, backend, true);
        let on_buffer = domino_engine::testing::test_gpu_with_storage(&name, backend, false);
        let mut rng = Rng::new(9);
        // 300 columns: two full 128-column texture groups and a partial one.
        let (k, n) = (96, 300);
        let (wv, uv) = (rng.vec(n * k, 0.5), rng.vec(n * k, 0.5));
        let x = rng.vec(7 * k, 1.0);
        let ids: Vec<u32> = vec![0, 7, 15, 16, 127, 128, 200, 299];
        let quant = [QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1, QuantType::Q5_0, QuantType::Q5_1].map(WeightFormat::Quant);
        for format in [WeightFormat::F16, WeightFormat::F32].into_iter().chain(quant) {
            let results: Vec<Vec<Vec<f32>>> = [&on_texture, &on_buffer]
                .iter()
                .map(|gpu| {
                    let w = Matrix::from_f32(gpu, "w", n, k, &wv, format).unwrap();
                    let u = Matrix::from_f32(gpu, "u", n, k, &uv, format).unwrap();
                    let mut out: Vec<Vec<f32>> = [1usize, 7].iter().map(|&rows| run_matmul(gpu, &w, &x[..rows * k], rows, &vec![0.0; rows * n], Epilogue::Store)).collect();
                    let (xb, yb) = (upload(gpu, &x), gpu.buffer("y", (7 * n * 4) as u64).unwrap());
                    let mut step = Step::new(gpu);
                    kernels::matmul_glu(&mut step, &w, &u, &Rows::new(&xb, 0, k as u32), &Rows::new(&yb, 0, n as u32), 7).unwrap();
                    step.submit().unwrap();
                    out.push(read(gpu, &yb, 7 * n));
                    let idb = gpu.buffer("ids", 4 * ids.len() as u64).unwrap();
                    gpu.write(&idb, 0, &ids);
                    let eb = gpu.buffer("e", (ids.len() * k * 4) as u64).unwrap();
                    let mut step = Step::new(gpu);
                    kernels::embedding(&mut step, &w, &idb, 0, &Rows::new(&eb, 0, k as u32), ids.len() as u32).unwrap();
                    step.submit().unwrap();
                    out.push(read(gpu, &eb, ids.len() * k));
                    assert_eq!(w.on_texture(), gpu.caps.weight_textures);
                    out
                })
                .collect();
            for (i, what) in ["matmul 1 row", "matmul 7 rows", "glu 7 rows", "embedding"].iter().enumerate() {
                let bits = |v: &Vec<f32>| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&results[0][i]), bits(&results[1][i]), "{name} {format:?} {what}: textures differ from buffers");
            }
            let wq: Vec<f32> = match format {
                WeightFormat::F32 => wv.clone(),
                WeightFormat::F16 => wv.iter().map(|v| half::f16::from_f32(*v).to_f32()).collect(),
                WeightFormat::Quant(t) => domino_engine::quant::dequantize(t, &domino_engine::quant::quantize(t, &wv)),
            };
            assert_eq!(results[0][3], reference::embedding(&wq, k, &ids), "{name} {format:?} embedding vs reference");
        }
    }
}

/// The vec4 read of x (X4: offset and stride multiples of 4) and the scalar read (any offset) sum in
/// the same order: identical bits.
#[test]
fn matmul_x4_and_scalar_input_reads_agree() {
    for (name, gpu) in test_gpus() {
        let mut rng = Rng::new(12);
        let (k, n, rows) = (64usize, 40usize, 3usize);
        let w = Matrix::from_f32(&gpu, "w", n, k, &rng.vec(n * k, 0.5), WeightFormat::F16).unwrap();
        let x = rng.vec(rows * k, 1.0);
        let mut shifted = vec![0.0f32];
        shifted.extend_from_slice(&x);
        let (xa, xb) = (upload(&gpu, &x), upload(&gpu, &shifted));
        for r in [1usize, rows] {
            let run = |xbuf: &Arc<domino_engine::GpuBuffer>, offset: u32| {
                let yb = gpu.buffer("y", (r * n * 4) as u64).unwrap();
                let mut step = Step::new(&gpu);
                kernels::matmul(&mut step, &w, &Rows::new(xbuf, offset, k as u32), &Rows::new(&yb, 0, n as u32), r as u32, Epilogue::Store).unwrap();
                step.submit().unwrap();
                read(&gpu, &yb, r * n).iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            assert_eq!(run(&xa, 0), run(&xb, 1), "{name} rows={r}");
        }
    }
}

/// A matrix whose smallest chunk cannot fit the limit is a clear error naming the tensor and the
/// limit, in either weight storage.
#[test]
fn chunk_limit_too_small_is_a_clear_error() {
    for (name, backend) in domino_engine::testing::test_backends() {
        for textures in [true, false] {
            let gpu = domino_engine::testing::test_gpu_with_storage(&name, backend, textures);
            let wv = vec![0.5f32; 64 * 40];
            let host = HostTensor::new("blk.0.ffn_up", HostDType::F32, 64, 40, bytemuck::cast_slice(&wv)).unwrap();
            let err = Matrix::upload_chunked(&gpu, &host, WeightFormat::F16, 100, &mut |_| {}).unwrap_err().to_string();
            assert!(err.contains("blk.0.ffn_up") && err.contains("100"), "{name} textures={textures}: {err}");
        }
    }
}

#[test]
fn glu_matches_reference() {
    for (name, gpu) in test_gpus() {
        let mut rng = Rng::new(3);
        let (k, n) = (48, 36);
        let g = rng.vec(n * k, 0.4);
        let u = rng.vec(n * k, 0.4);
        for rows in ROW_COUNTS {
            let x = rng.vec(rows * k, 1.0);
            let gm = Matrix::from_f32(&gpu, "g", n, k, &g, WeightFormat::F32).unwrap();
            let um = Matrix::from_f32(&gpu, "u", n, k, &u, WeightFormat::F32).unwrap();
            let xb = upload(&gpu, &x);
            let yb = gpu.buffer("y", (rows * n * 4) as u64).unwrap();
            let mut step = Step::new(&gpu);
            kernels::matmul_glu(&mut step, &gm, &um, &Rows::new(&xb, 0, k as u32), &Rows::new(&yb, 0, n as u32), rows as u32).unwrap();
            step.submit().unwrap();
            let err = max_err(&read(&gpu, &yb, rows * n), &reference::glu(&x, &g, &u, rows, k, n));
            assert!(err < 1e-4, "{name} rows={rows}: {err}");
        }
    }
}

#[test]
fn rmsnorm_and_norm_rope_match_reference() {
    for (name, gpu) in test_gpus() {
        let mut rng = Rng::new(4);
        for n in [16usize, 100, 576] {
            let rows = 5;
            let x = rng.vec(rows * n, 2.0);
            let w = rng.vec(n, 1.0);
            let (xb, wb) = (upload(&gpu, &x), upload(&gpu, &w));
            let yb = gpu.buffer("y", (rows * n * 4) as u64).unwrap();
            let mut step = Step::new(&gpu);
            kernels::rmsnorm(&mut step, &wb, n as u32, 1e-6, &Rows::new(&xb, 0, n as u32), &Rows::new(&yb, 0, n as u32), rows as u32).unwrap();
            step.submit().unwrap();
            let err = max_err(&read(&gpu, &yb, rows * n), &reference::rmsnorm(&x, &w, 1e-6));
            assert!(err < 1e-5, "{name} rmsnorm n={n}: {err}");
        }
        for d in [16usize, 32, 128] {
            let (rows, heads, pos0, theta) = (3, 4, 37, 1e6);
            let x = rng.vec(rows * heads * d, 1.5);
            let w = rng.vec(d, 1.0);
            let table = kernels::rope_table(&gpu, pos0 + rows, d, theta).unwrap();
            for norm in [true, false] {
                let (xb, wb) = (upload(&gpu, &x), upload(&gpu, &w));
                let yb = gpu.buffer("y", (x.len() * 4) as u64).unwrap();
                let mut step = Step::new(&gpu);
                let stride = (heads * d) as u32;
                let nw = if norm { Some(&wb) } else { None };
                kernels::norm_rope(&mut step, &Rows::new(&xb, 0, stride), &Rows::new(&yb, 0, stride), nw, &table, rows as u32, heads as u32, d as u32, pos0 as u32, 1e-6)
                    .unwrap();
                step.submit().unwrap();
                let want = reference::norm_rope(&x, if norm { Some(&w) } else { None }, rows, heads, d, pos0, theta, 1e-6);
                let err = max_err(&read(&gpu, &yb, x.len()), &want);
                assert!(err < 2e-5, "{name} norm_rope d={d} norm={norm}: {err}");
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run_attention(gpu: &Gpu, shape: AttentionShape, q: &[f32], k: &Arc<domino_engine::GpuBuffer>, v: &Arc<domino_engine::GpuBuffer>, rows: usize, kv_len: usize, causal: bool) -> Vec<f32> {
    run_attention_at(gpu, shape, q, 0, k, v, rows, kv_len, causal)
}

/// As `run_attention`, with the queries `q_offset` floats into their buffer (an odd offset forces the
/// scalar reads; 0 allows the vec4 reads).
#[allow(clippy::too_many_arguments)]
fn run_attention_at(gpu: &Gpu, shape: AttentionShape, q: &[f32], q_offset: usize, k: &Arc<domino_engine::GpuBuffer>, v: &Arc<domino_engine::GpuBuffer>, rows: usize, kv_len: usize, causal: bool) -> Vec<f32> {
    let width = (shape.n_heads * shape.head_dim) as usize;
    let mut padded = vec![0.0f32; q_offset];
    padded.extend_from_slice(q);
    let qb = upload(gpu, &padded);
    let ob = gpu.buffer("o", (rows * width * 4) as u64).unwrap();
    let scratch = AttentionScratch::new(gpu, shape, 17, 256).unwrap();
    let mut step = Step::new(gpu);
    let r = Rows::new(&qb, q_offset as u32, width as u32);
    kernels::attention(&mut step, shape, &r, k, v, &Rows::new(&ob, 0, width as u32), &scratch, rows as u32, kv_len as u32, causal).unwrap();
    step.submit().unwrap();
    read(gpu, &ob, rows * width)
}

#[test]
fn attention_matches_reference_and_is_batch_invariant() {
    for (name, gpu) in test_gpus() {
        let mut rng = Rng::new(5);
        for (hq, hkv, d) in [(4usize, 2usize, 16usize), (8, 2, 32), (2, 1, 128)] {
            let shape = AttentionShape { n_heads: hq as u32, n_kv_heads: hkv as u32, head_dim: d as u32 };
            let keys_total = 140;
            let kc = rng.vec(keys_total * hkv * d, 1.0);
            let vc = rng.vec(keys_total * hkv * d, 1.0);
            let (kb, vb) = (upload(&gpu, &kc), upload(&gpu, &vc));
            let q_all = rng.vec(64 * hq * d, 1.0);
            let width = hq * d;
            let past = 60;
            for causal in [true, false] {
                let kv_len = if causal { past } else { 77 };
                // Each row alone: row r is at position past + r, so it runs with kv_len past + r.
                let alone: Vec<Vec<f32>> = (0..64)
                    .map(|r| {
                        let q = &q_all[r * width..(r + 1) * width];
                        if causal {
                            run_attention(&gpu, shape, q, &kb, &vb, 1, past + r, true)
                        } else {
                            run_attention(&gpu, shape, q, &kb, &vb, 1, kv_len, false)
                        }
                    })
                    .collect();
                for rows in ROW_COUNTS {
                    let q = &q_all[..rows * width];
                    let got = run_attention(&gpu, shape, q, &kb, &vb, rows, kv_len, causal);
                    // Scalar reads (odd query offset) and vec4 reads sum in the same order.
                    let scalar = run_attention_at(&gpu, shape, q, 1, &kb, &vb, rows, kv_len, causal);
                    assert_eq!(
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        scalar.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{name} d={d} causal={causal} rows={rows}: vec4 and scalar reads differ"
                    );
                    let want = reference::attention(q, &kc, &vc, rows, hq, hkv, d, kv_len, past, causal);
                    let err = max_err(&got, &want);
                    assert!(err < 1e-5, "{name} hq={hq} hkv={hkv} d={d} causal={causal} rows={rows}: {err}");
                    for r in 0..rows {
                        let a: Vec<u32> = got[r * width..(r + 1) * width].iter().map(|v| v.to_bits()).collect();
                        let b: Vec<u32> = alone[r].iter().map(|v| v.to_bits()).collect();
                        assert_eq!(a, b, "{name} d={d} causal={causal}: row {r} of {rows} differs from alone");
                    }
                }
            }
        }
    }
}

/// Many sequences sharing one KV pool (a batched step): `qkv_rope_segments` and
/// `attention_segments` over all their rows give, bit for bit, what `qkv_rope` and `attention` give
/// each sequence alone in a cache of its own. 14 segments: more than one dispatch takes.
#[test]
fn segmented_qkv_rope_and_attention_equal_each_sequence_alone() {
    for (name, gpu) in test_gpus() {
        let mut rng = Rng::new(11);
        for (hq, hkv, d) in [(4usize, 2usize, 16usize), (8, 2, 32), (3, 1, 6)] {
            let shape = AttentionShape { n_heads: hq as u32, n_kv_heads: hkv as u32, head_dim: d as u32 };
            let (kvw, qw, cap) = (hkv * d, hq * d, 80usize);
            let src_w = qw + 2 * kvw;
            // (rows, first position) per sequence; sequence i's cache is region i of the pool.
            let seqs: Vec<(usize, usize)> = (0..14).map(|i| (1 + (i % 3) * 2, (i * 13 + 5) % 70)).collect();
            let total: usize = seqs.iter().map(|s| s.0).sum();
            let qkv = rng.vec(total * src_w, 1.0);
            let pool_init = rng.vec(seqs.len() * cap * kvw, 1.0);
            let (qn, kn) = (upload(&gpu, &rng.vec(d, 1.0)), upload(&gpu, &rng.vec(d, 1.0)));
            let table = kernels::rope_table(&gpu, cap, d, 1e4).unwrap();
            let scratch = AttentionScratch::new(&gpu, shape, 8, cap as u32).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();

            // All sequences at once, in the pool.
            let (kp, vp) = (upload(&gpu, &pool_init), upload(&gpu, &pool_init));
            let src = upload(&gpu, &qkv);
            let (qb, ob) = (gpu.buffer("q", (total * qw * 4) as u64).unwrap(), gpu.buffer("o", (total * qw * 4) as u64).unwrap());
            let mut segments = Vec::new();
            let mut row = 0;
            for (i, &(n, pos0)) in seqs.iter().enumerate() {
                segments.push(KvSegment { first_row: row, n_rows: n as u32, pos0: pos0 as u32, kv_base: (i * cap * kvw) as u32 });
                row += n as u32;
            }
            let (src_rows, q_rows) = (Rows::new(&src, 0, src_w as u32), Rows::new(&qb, 0, qw as u32));
            let mut step = Step::new(&gpu);
            let io = QkvRope { qkv: &src_rows, q: &q_rows, k_cache: &kp, v_cache: &vp, norms: Some((&qn, &kn)), rope_table: &table };
            kernels::qkv_rope_segments(&mut step, &io, shape, &segments, 1e-6).unwrap();
            kernels::attention_segments(&mut step, shape, &q_rows, &kp, &vp, &Rows::new(&ob, 0, qw as u32), &scratch, &segments).unwrap();
            step.submit().unwrap();
            let (pool_k, pool_v) = (read(&gpu, &kp, pool_init.len()), read(&gpu, &vp, pool_init.len()));
            let (all_q, all_out) = (read(&gpu, &qb, total * qw), read(&gpu, &ob, total * qw));

            // Each sequence alone, in a cache of its own.
            for (i, s) in segments.iter().enumerate() {
                let (r0, n) = (s.first_row as usize, s.n_rows as usize);
                let region = &pool_init[i * cap * kvw..(i + 1) * cap * kvw];
                let (kc, vc) = (upload(&gpu, region), upload(&gpu, region));
                let src1 = upload(&gpu, &qkv[r0 * src_w..(r0 + n) * src_w]);
                let (q1, o1) = (gpu.buffer("q1", (n * qw * 4) as u64).unwrap(), gpu.buffer("o1", (n * qw * 4) as u64).unwrap());
                let (src_rows, q_rows) = (Rows::new(&src1, 0, src_w as u32), Rows::new(&q1, 0, qw as u32));
                let mut step = Step::new(&gpu);
                let io = QkvRope { qkv: &src_rows, q: &q_rows, k_cache: &kc, v_cache: &vc, norms: Some((&qn, &kn)), rope_table: &table };
                kernels::qkv_rope(&mut step, &io, shape, s.n_rows, s.pos0, 1e-6).unwrap();
                kernels::attention(&mut step, shape, &q_rows, &kc, &vc, &Rows::new(&o1, 0, qw as u32), &scratch, s.n_rows, s.pos0, true).unwrap();
                step.submit().unwrap();
                let what = format!("{name} hq={hq} hkv={hkv} d={d} sequence {i}");
                assert_eq!(bits(&read(&gpu, &q1, n * qw)), bits(&all_q[r0 * qw..(r0 + n) * qw]), "{what}: rotated q");
                assert_eq!(bits(&read(&gpu, &o1, n * qw)), bits(&all_out[r0 * qw..(r0 + n) * qw]), "{what}: attention");
                let at = i * cap * kvw..(i + 1) * cap * kvw;
                assert_eq!(bits(&read(&gpu, &kc, region.len())), bits(&pool_k[at.clone()]), "{what}: K cache");
                assert_eq!(bits(&read(&gpu, &vc, region.len())), bits(&pool_v[at]), "{what}: V cache");
            }
        }
    }
}

/// A copy between two slots of one pool buffer moves the bits and touches nothing else; ranges
/// that overlap are refused.
#[test]
fn copy_within_one_buffer_moves_rows_and_refuses_overlap() {
    for (name, gpu) in test_gpus() {
        let mut rng = Rng::new(12);
        let data = rng.vec(1000, 1.0);
        let buf = upload(&gpu, &data);
        let mut step = Step::new(&gpu);
        kernels::copy_rows_within(&mut step, &buf, 10, 600, 7, 5, 40).unwrap();
        step.submit().unwrap();
        let mut want = data.clone();
        for r in 0..40 {
            for i in 0..5 {
                want[600 + r * 7 + i] = data[10 + r * 7 + i];
            }
        }
        assert_eq!(read(&gpu, &buf, 1000).iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{name}");
        let mut step = Step::new(&gpu);
        let err = kernels::copy_rows_within(&mut step, &buf, 0, 100, 7, 7, 40).unwrap_err();
        assert!(err.to_string().contains("overlaps"), "{name}: {err}");
    }
}

fn run_sampling(gpu: &Gpu, logits: &[f32], rows: usize, vocab: usize, cfg: &SamplingConfig, counter: u32) -> Vec<u32> {
    let lb = upload(gpu, logits);
    let out = gpu.buffer("ids", (rows * 4) as u64).unwrap();
    let mut step = Step::new(gpu);
    kernels::sample(&mut step, &Rows::new(&lb, 0, vocab as u32), vocab as u32, rows as u32, &out, 0, cfg, counter).unwrap();
    let b = block_on(step.submit_and_read(&out, 0, (rows * 4) as u64)).unwrap();
    bytemuck::pod_collect_to_vec(&b)
}

#[test]
fn argmax_matches_reference_with_ties() {
    for (name, gpu) in test_gpus() {
        let mut rng = Rng::new(6);
        let vocab = 1003;
        let mut logits = rng.vec(4 * vocab, 3.0);
        logits[vocab + 500] = 10.0;
        logits[vocab + 700] = 10.0; // tie: the lower index wins
        logits[2 * vocab + 1002] = 9.0;
        let got = run_sampling(&gpu, &logits, 4, vocab, &SamplingConfig::greedy(), 0);
        let want: Vec<u32> = logits.chunks(vocab).map(reference::argmax).collect();
        assert_eq!(got, want, "{name}");
        assert_eq!(got[1], 500);
    }
}

#[test]
fn sampling_follows_the_filtered_distribution() {
    for (name, gpu) in test_gpus() {
        let vocab = 40;
        let mut rng = Rng::new(7);
        let logits = rng.vec(vocab, 2.0);
        for (t, top_k, top_p) in [(1.0f32, 0u32, 1.0f32), (0.7, 5, 1.0), (1.3, 0, 0.6)] {
            let cfg = SamplingConfig { temperature: t, top_k, top_p, seed: 1234 };
            // Many rows in one dispatch: row r draws with counter r, so this is n independent draws.
            let n = 4000;
            let all: Vec<f32> = (0..n).flat_map(|_| logits.iter().copied()).collect();
            let draws = run_sampling(&gpu, &all, n, vocab, &cfg, 0);
            let p = reference::sampling_distribution(&logits, t, top_k as usize, top_p);
            let mut counts = vec![0usize; vocab];
            for d in &draws {
                counts[*d as usize] += 1;
            }
            for (i, c) in counts.iter().enumerate() {
                assert!(p[i] > 0.0 || *c == 0, "{name}: token {i} drawn {c} times outside the kept set (t={t} k={top_k} p={top_p})");
            }
            // Chi-square over kept tokens with expected count >= 5; fixed seed, 0.1% significance.
            let (mut chi, mut dof) = (0.0, 0usize);
            for i in 0..vocab {
                let e = p[i] * n as f64;
                if e >= 5.0 {
                    chi += (counts[i] as f64 - e).powi(2) / e;
                    dof += 1;
                }
            }
            let dof = dof.saturating_sub(1).max(1) as f64;
            // Wilson-Hilferty approximation of the 99.9% chi-square quantile.
            let crit = dof * (1.0 - 2.0 / (9.0 * dof) + 3.09 * (2.0 / (9.0 * dof)).sqrt()).powi(3);
            assert!(chi < crit, "{name} t={t} k={top_k} p={top_p}: chi2 {chi:.1} >= {crit:.1} (dof {dof})");
            // Same seed and counter: the same draws.
            assert_eq!(draws[..50], run_sampling(&gpu, &all[..50 * vocab], 50, vocab, &cfg, 0)[..], "{name}: not reproducible");
        }
    }
}

#[test]
fn test_adapters_cover_native_and_fallback_variants() {
    let gpus = test_gpus();
    for (name, g) in &gpus {
        eprintln!("test adapter {name}: {} ({})", g.info.name, g.info.backend);
    }
    let wanted = std::env::var("DOMINO_TEST_BACKENDS").unwrap_or_else(|_| "vulkan,gl".into());
    if wanted.contains("gl") {
        assert!(gpus.iter().any(|(_, g)| g.info.backend == "gl" && !g.caps.f16 && !g.caps.subgroup), "GL adapter with fallback kernels missing");
    }
    if wanted.contains("vulkan") {
        assert!(gpus.iter().any(|(_, g)| g.info.backend == "vulkan"), "Vulkan adapter missing");
    }
}

/// The RMSNorm folded into the matmul (`matmul_normed`, `matmul_glu_normed`) for every weight
/// format, against the reference rmsnorm then matmul, bit-identical across row counts (the CPU
/// family folds only decode rows, so this also checks that its fold and its separate rmsnorm pass
/// agree bit for bit, as they must for speculative decoding to be lossless).
#[test]
fn normed_matmul_matches_reference_and_is_batch_invariant() {
    use domino_engine::kernels::NormInput;
    use domino_engine::quant;
    for (name, gpu) in test_gpus() {
        let mut rng = Rng::new(21);
        let (k, n) = (576usize, 72usize);
        let norm_w = rng.vec(k, 1.0);
        let nb = upload(&gpu, &norm_w);
        let x_all = rng.vec(64 * k, 2.0);
        let formats = [WeightFormat::F32, WeightFormat::F16, WeightFormat::Quant(QuantType::Q8_0), WeightFormat::Quant(QuantType::Q4_1)];
        for format in formats {
            let (g, u) = (rng.vec(n * k, 0.4), rng.vec(n * k, 0.4));
            let exact = |v: &[f32]| -> Vec<f32> {
                match format {
                    WeightFormat::F32 => v.to_vec(),
                    WeightFormat::F16 => v.iter().map(|x| half::f16::from_f32(*x).to_f32()).collect(),
                    WeightFormat::Quant(t) => quant::dequantize(t, &quant::quantize(t, v)),
                }
            };
            let (gm, um) = (Matrix::from_f32(&gpu, "g", n, k, &g, format).unwrap(), Matrix::from_f32(&gpu, "u", n, k, &u, format).unwrap());
            let run = |rows: usize, glu: bool| -> Vec<f32> {
                let xb = upload(&gpu, &x_all[..rows * k]);
                let scratch = gpu.buffer("scratch", (rows * k * 4) as u64).unwrap();
                let yb = upload(&gpu, &vec![0.0; rows * n]);
                let norm = NormInput { weight: &nb, eps: 1e-6, scratch: Rows::new(&scratch, 0, k as u32) };
                let (x, y) = (Rows::new(&xb, 0, k as u32), Rows::new(&yb, 0, n as u32));
                let mut step = Step::new(&gpu);
                if glu {
                    kernels::matmul_glu_normed(&mut step, &gm, &um, &norm, &x, &y, rows as u32).unwrap();
                } else {
                    kernels::matmul_normed(&mut step, &gm, &norm, &x, &y, rows as u32, Epilogue::Store).unwrap();
                }
                step.submit().unwrap();
                read(&gpu, &yb, rows * n)
            };
            for glu in [false, true] {
                let alone: Vec<Vec<f32>> = (0..17).map(|r| {
                    let xb = upload(&gpu, &x_all[r * k..(r + 1) * k]);
                    let scratch = gpu.buffer("scratch", (k * 4) as u64).unwrap();
                    let yb = upload(&gpu, &vec![0.0; n]);
                    let norm = NormInput { weight: &nb, eps: 1e-6, scratch: Rows::new(&scratch, 0, k as u32) };
                    let mut step = Step::new(&gpu);
                    if glu {
                        kernels::matmul_glu_normed(&mut step, &gm, &um, &norm, &Rows::new(&xb, 0, k as u32), &Rows::new(&yb, 0, n as u32), 1).unwrap();
                    } else {
                        kernels::matmul_normed(&mut step, &gm, &norm, &Rows::new(&xb, 0, k as u32), &Rows::new(&yb, 0, n as u32), 1, Epilogue::Store).unwrap();
                    }
                    step.submit().unwrap();
                    read(&gpu, &yb, n)
                }).collect();
                for rows in ROW_COUNTS {
                    let y = run(rows, glu);
                    let xn = reference::rmsnorm(&x_all[..rows * k], &norm_w, 1e-6);
                    let want = if glu { reference::glu(&xn, &exact(&g), &exact(&u), rows, k, n) } else { reference::matmul(&xn, &exact(&g), rows, k, n) };
                    let range = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let err = max_err(&y, &want);
                    assert!(err < 1e-4 * range.max(1.0), "{name} {format:?} glu={glu} rows={rows}: max err {err}");
                    for r in 0..rows.min(17) {
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&y[r * n..(r + 1) * n]), bits(&alone[r]), "{name} {format:?} glu={glu}: row {r} of {rows} differs from the row alone");
                    }
                }
                if !gpu.caps.gpu_kernels && !glu {
                    // The fold's scale has the bits of the separate rmsnorm pass (same reduction order).
                    let xb = upload(&gpu, &x_all[..k]);
                    let (ab, yb) = (upload(&gpu, &vec![0.0; k]), upload(&gpu, &vec![0.0; n]));
                    let mut step = Step::new(&gpu);
                    kernels::rmsnorm(&mut step, &nb, k as u32, 1e-6, &Rows::new(&xb, 0, k as u32), &Rows::new(&ab, 0, k as u32), 1).unwrap();
                    kernels::matmul(&mut step, &gm, &Rows::new(&ab, 0, k as u32), &Rows::new(&yb, 0, n as u32), 1, Epilogue::Store).unwrap();
                    step.submit().unwrap();
                    assert_eq!(read(&gpu, &yb, n).iter().map(|v| v.to_bits()).collect::<Vec<_>>(), alone[0].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{name} {format:?}: folded vs separate rmsnorm");
                }
            }
        }
    }
}

/// The CPU family's uniform input windows (`Caps::uniform_window`) against its storage reads, bit
/// for bit: rows at an unaligned offset, spread over several windows (k = 1536: ten rows per 64 KiB
/// window), plain, GLU and with the RMSNorm folded in, for float and block weights.
#[test]
fn uniform_input_windows_match_storage_reads_bit_for_bit() {
    use domino_engine::kernels::NormInput;
    use domino_engine::testing::test_backends;
    use domino_engine::GpuOptions;
    for (name, backend) in test_backends() {
        let open = |uniform: bool| {
            let opts = GpuOptions { backend, kernels: domino_engine::KernelChoice::Cpu, uniform_inputs: Some(uniform), ..Default::default() };
            block_on(Gpu::new(&opts)).unwrap_or_else(|e| panic!("GPU test adapter '{name}' is required but unavailable: {e}"))
        };
        let (windowed, storage) = (open(true), open(false));
        assert!(windowed.caps.uniform_window >= 16384, "{name}: no uniform window on a CPU-family device");
        assert_eq!(storage.caps.uniform_window, 0);
        let mut rng = Rng::new(41);
        let (k, n, offset) = (1536usize, 40usize, 100usize);
        let (g, u, norm_w) = (rng.vec(n * k, 0.4), rng.vec(n * k, 0.4), rng.vec(k, 1.0));
        let x = rng.vec(offset + 64 * k, 1.5);
        for format in [WeightFormat::F16, WeightFormat::Quant(QuantType::Q4_1), WeightFormat::Quant(QuantType::Q6_K)] {
            for rows in [1usize, 17, 64] {
                for (glu, normed) in [(false, false), (true, false), (false, true), (true, true)] {
                    if normed && rows > 1 {
                        continue; // multi-row passes normalise in a pass of their own
                    }
                    let run = |gpu: &Arc<Gpu>| -> Vec<f32> {
                        let gm = Matrix::from_f32(gpu, "g", n, k, &g, format).unwrap();
                        let um = Matrix::from_f32(gpu, "u", n, k, &u, format).unwrap();
                        let (xb, yb, nb) = (upload(gpu, &x), upload(gpu, &vec![0.0; rows * n]), upload(gpu, &norm_w));
                        let scratch = gpu.buffer("scratch", (k * 4) as u64).unwrap();
                        let norm = NormInput { weight: &nb, eps: 1e-6, scratch: Rows::new(&scratch, 0, k as u32) };
                        let (xr, yr) = (Rows::new(&xb, offset as u32, k as u32), Rows::new(&yb, 0, n as u32));
                        let mut step = Step::new(gpu);
                        match (glu, normed) {
                            (false, false) => kernels::matmul(&mut step, &gm, &xr, &yr, rows as u32, Epilogue::Store).unwrap(),
                            (true, false) => kernels::matmul_glu(&mut step, &gm, &um, &xr, &yr, rows as u32).unwrap(),
                            (false, true) => kernels::matmul_normed(&mut step, &gm, &norm, &xr, &yr, rows as u32, Epilogue::Store).unwrap(),
                            (true, true) => kernels::matmul_glu_normed(&mut step, &gm, &um, &norm, &xr, &yr, rows as u32).unwrap(),
                        }
                        let plan = step.plan();
                        let windows = plan.iter().filter(|d| d.variant.contains("X_UNIFORM")).count();
                        if gpu.caps.uniform_window > 0 {
                            // 64 rows of 1536 inputs span 7 windows of 10 rows (16384 floats each).
                            assert_eq!(windows, if rows == 64 { 7 } else if rows == 17 { 2 } else { 1 }, "{name}: windows of {rows} rows");
                            assert_eq!(windows, plan.len(), "{name}: every pass reads uniform windows");
                        } else {
                            assert_eq!(windows, 0);
                        }
                        step.submit().unwrap();
                        read(gpu, &yb, rows * n)
                    };
                    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(run(&windowed)), bits(run(&storage)), "{name} {format:?} rows={rows} glu={glu} normed={normed}");
                }
            }
        }
    }
}
