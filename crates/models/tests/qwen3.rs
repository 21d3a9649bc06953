//! The GPU Qwen3 forward against the CPU reference on tiny random models covering every shape edge
//! case, on every test adapter configuration (Vulkan native variants, Vulkan fallback, GL).

use domino_engine::step::read_f32;
use domino_engine::testing::test_gpus;
use domino_engine::{Gpu, HostDType, Step, WeightFormat};
use domino_models::qwen3::{Capture, Forward};
use domino_models::reference::ReferenceModel;
use domino_models::testing::{write_tiny_model, TinySpec};
use domino_models::{Checkpoint, Qwen3Config, Qwen3Model};
use pollster::block_on;
use std::sync::Arc;

fn specs() -> Vec<(&'static str, TinySpec)> {
    let base = TinySpec::default();
    vec![
        ("d32 gqa2 untied bf16 (q width != hidden)", base.clone()),
        ("d16 gqa4 tied f32 sharded", TinySpec { head_dim: 16, heads: 8, kv_heads: 2, tied: true, dtype: HostDType::F32, shards: 3, seed: 11, ..base.clone() }),
        ("d128 gqa2 untied f16", TinySpec { head_dim: 128, heads: 2, kv_heads: 1, hidden: 96, dtype: HostDType::F16, seed: 12, ..base.clone() }),
        ("llama (no qk norm) gqa4 tied", TinySpec { qk_norm: false, heads: 4, kv_heads: 1, tied: true, seed: 13, ..base }),
    ]
}

fn relative_error(got: &[f32], want: &[f32]) -> f32 {
    let range = want.iter().cloned().fold(f32::NEG_INFINITY, f32::max) - want.iter().cloned().fold(f32::INFINITY, f32::min);
    got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max) / range
}

/// Logits of all prompt positions (prefill in sub-batches of 4 rows), then of 3 single-row decode steps.
fn gpu_logits(gpu: &Arc<Gpu>, model: &Qwen3Model, ids: &[u32], prompt_len: usize, capture_layers: &[usize]) -> (Vec<Vec<f32>>, Vec<f32>) {
    let v = model.config.vocab_size;
    let h = model.config.hidden_size;
    let state = model.new_state(64, 4, 16).unwrap();
    gpu.write(&state.ids, 0, ids);
    let feats = gpu.buffer("features", (ids.len() * h * capture_layers.len().max(1) * 4) as u64).unwrap();
    let mut out = Vec::new();
    let mut step = Step::new(gpu);
    let capture = Capture { layers: capture_layers, dst: &feats, dst_row: 0 };
    model.record_forward(&mut step, &state, &Forward { pos0: 0, n_rows: prompt_len as u32, logits_from: 0, capture: Some(capture) }).unwrap();
    step.submit().unwrap();
    let all = block_on(read_f32(gpu, &state.logits, 0, prompt_len * v)).unwrap();
    out.extend(all.chunks(v).map(|c| c.to_vec()));
    for pos in prompt_len..ids.len() {
        let mut step = Step::new(gpu);
        let capture = Capture { layers: capture_layers, dst: &feats, dst_row: pos as u32 };
        model.record_forward(&mut step, &state, &Forward { pos0: pos as u32, n_rows: 1, logits_from: 0, capture: Some(capture) }).unwrap();
        step.submit().unwrap();
        out.push(block_on(read_f32(gpu, &state.logits, 0, v)).unwrap());
    }
    let f = block_on(read_f32(gpu, &feats, 0, ids.len() * h * capture_layers.len())).unwrap();
    (out, f)
}

#[test]
fn gpu_forward_matches_cpu_reference() {
    let gpus = test_gpus();
    for (label, spec) in specs() {
        let dir = tempfile::tempdir().unwrap();
        write_tiny_model(dir.path(), &spec).unwrap();
        let config = Qwen3Config::from_file(&dir.path().join("config.json")).unwrap();
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        let ids: Vec<u32> = vec![3, 17, 250, 9, 100, 42, 7, 7, 300, 12, 5, 60, 61, 62];
        let prompt_len = 11;
        let layers: Vec<usize> = (0..spec.layers).collect();
        for format in [WeightFormat::F32, WeightFormat::F16] {
            // The reference holds the weights exactly as the GPU stores them (f16-rounded for f16), so
            // the only difference left is f32 accumulation order: the same 1e-4 bound applies to both.
            let reference = ReferenceModel::load(config.clone(), &ckpt, format == WeightFormat::F16).unwrap();
            let want = reference.forward(&ids);
            let v = config.vocab_size;
            for (name, gpu) in &gpus {
                let model = Qwen3Model::load(gpu.clone(), config.clone(), &ckpt, format, &mut |_, _, _| {}).unwrap();
                let (got, feats) = gpu_logits(gpu, &model, &ids, prompt_len, &layers);
                for (pos, row) in got.iter().enumerate() {
                    let err = relative_error(row, &want.logits[pos * v..(pos + 1) * v]);
                    assert!(err < 1e-4, "{label} {format:?} on {name}: position {pos} logit error {err:.2e} of the range");
                }
                // Captured residual stream == reference hidden states after each layer.
                let h = config.hidden_size;
                for pos in 0..ids.len() {
                    for (slot, &l) in layers.iter().enumerate() {
                        let g = &feats[(pos * layers.len() + slot) * h..(pos * layers.len() + slot + 1) * h];
                        let w = &want.hidden[l][pos * h..(pos + 1) * h];
                        let err = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                        assert!(err < 1e-3, "{label} {format:?} on {name}: feature layer {l} pos {pos} error {err}");
                    }
                }
            }
        }
    }
}

#[test]
fn f16_storage_stays_close_to_full_precision() {
    // Beyond kernel exactness: how far f16 storage moves logits from the exact f32 model.
    let spec = TinySpec { dtype: HostDType::F32, ..TinySpec::default() };
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), &spec).unwrap();
    let config = Qwen3Config::from_file(&dir.path().join("config.json")).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let ids: Vec<u32> = (0..12).map(|i| (i * 37 % 380) as u32).collect();
    let exact = ReferenceModel::load(config.clone(), &ckpt, false).unwrap().forward(&ids);
    let (name, gpu) = &test_gpus()[0];
    let model = Qwen3Model::load(gpu.clone(), config.clone(), &ckpt, WeightFormat::F16, &mut |_, _, _| {}).unwrap();
    let (got, _) = gpu_logits(gpu, &model, &ids, ids.len(), &[]);
    let v = config.vocab_size;
    for (pos, row) in got.iter().enumerate() {
        // f16 keeps 11 significant bits (relative rounding 2^-11 ~ 4.9e-4 per weight); errors
        // average out over dot products, and 5e-3 of the logit range leaves a wide margin.
        let err = relative_error(row, &exact.logits[pos * v..(pos + 1) * v]);
        assert!(err < 5e-3, "{name}: f16 storage moved position {pos} logits by {err:.2e} of the range");
    }
}

#[test]
fn real_qwen3_config_formats_parse() {
    use std::path::Path;
    // Qwen/Qwen3-0.6B's config.json as published (transformers 4.51).
    let v4 = r#"{"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
      "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
      "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
      "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
      "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
      "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
      "use_sliding_window": false, "vocab_size": 151936}"#;
    let c = Qwen3Config::from_json(v4.as_bytes(), Path::new("config.json")).unwrap();
    assert_eq!((c.hidden_size, c.q_width(), c.kv_width(), c.rope_theta, c.eos_token_ids.clone()), (1024, 2048, 1024, 1e6, vec![151645]));
    assert!(c.tie_word_embeddings && c.qk_norm);
    // transformers 5 moves rope_theta into rope_parameters and writes layer_types and dtype.
    let v5 = v4.replace(r#""rope_theta": 1000000,"#, r#""rope_parameters": {"rope_type": "default", "rope_theta": 1000000}, "layer_types": ["full_attention"], "dtype": "bfloat16","#);
    let c5 = Qwen3Config::from_json(v5.as_bytes(), Path::new("config.json")).unwrap();
    assert_eq!(c5.rope_theta, 1e6);
    let sliding = v5.replace(r#"["full_attention"]"#, r#"["sliding_attention"]"#);
    assert!(Qwen3Config::from_json(sliding.as_bytes(), Path::new("config.json")).unwrap_err().to_string().contains("sliding_attention"));
    let yarn = v5.replace(r#""rope_type": "default""#, r#""rope_type": "yarn""#);
    assert!(Qwen3Config::from_json(yarn.as_bytes(), Path::new("config.json")).unwrap_err().to_string().contains("yarn"));
}
