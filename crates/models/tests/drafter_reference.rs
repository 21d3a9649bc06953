//! Drafter configs (z-lab DFlash and Domino formats), tensor plans, pairing validation, the GRU cell,
//! the CPU drafter's internals, and the CPU speculative loop: lossless against target-only greedy
//! decoding for both drafter kinds and every block size, with acceptance lengths that add up.

use domino_engine::reference::argmax;
use domino_engine::HostDType;
use domino_models::drafter::{default_target_layer_ids, detect_head_prefix, drafter_tensor_plan, DrafterConfig, DrafterKind};
use domino_models::drafter_reference::{gru_cell, speculative_greedy, target_features, ReferenceDrafter};
use domino_models::reference::ReferenceModel;
use domino_models::testing::{
    config_json, safetensors_bytes, tiny_drafter_tensors, tiny_tensors, write_tiny_drafter, write_tiny_model, TinyDrafterSpec, TinySpec,
};
use domino_models::{Checkpoint, ModelError, Qwen3Config, WeightSource};
use std::path::Path;

// ---------------------------------------------------------------------------------------------
// Configs modelled on the published checkpoints.

const QWEN3_8B: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
  "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
  "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936
}"#;

/// Shaped like z-lab/Qwen3-8B-DFlash-b16's config.json.
const DFLASH_8B: &str = r#"{
  "architectures": ["DFlashDraftModel"],
  "attention_bias": false, "attention_dropout": 0.0,
  "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
  "block_size": 16, "bos_token_id": 151643,
  "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
  "dtype": "bfloat16", "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
  "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention", "full_attention"],
  "max_position_embeddings": 40960, "max_window_layers": 5, "model_type": "qwen3",
  "num_attention_heads": 32, "num_hidden_layers": 5, "num_key_value_heads": 8, "num_target_layers": 36,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": false, "transformers_version": "4.57.1", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936
}"#;

/// Shaped like Huang2020/Qwen3-8B-Domino-b16's config.json: the DFlash fields plus the Domino head,
/// and training-only extras the parser must ignore.
const DOMINO_8B: &str = r#"{
  "architectures": ["DFlashDraftModel"],
  "attention_bias": false, "attention_dropout": 0.0,
  "block_size": 16, "bos_token_id": 151643,
  "dflash_config": {
    "mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33],
    "projector_type": "domino", "emb_dim": 256, "gru_hidden_dim": 1024,
    "pure_draft_prefix_len": 1, "shift_label": true,
    "loss_decay_gamma": 7.0, "base_loss_lambda_decay_ratio": 1.0, "num_anchors": 256
  },
  "emb_dim": 256,
  "dtype": "bfloat16", "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
  "max_position_embeddings": 40960, "model_type": "qwen3",
  "num_attention_heads": 32, "num_hidden_layers": 5, "num_key_value_heads": 8, "num_target_layers": 36,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000, "tie_word_embeddings": false,
  "transformers_version": "4.57.1", "use_cache": true, "vocab_size": 151936
}"#;

fn qwen3_8b() -> Qwen3Config {
    Qwen3Config::from_json(QWEN3_8B.as_bytes(), Path::new("Qwen3-8B/config.json")).unwrap()
}

fn parse(json: &str) -> Result<DrafterConfig, ModelError> {
    DrafterConfig::from_json(json.as_bytes(), Path::new("drafter/config.json"))
}

/// `json` with `edit` applied to its parsed value.
fn edited(json: &str, edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut v: serde_json::Value = serde_json::from_str(json).unwrap();
    edit(&mut v);
    v.to_string()
}

fn parse_error(json: &str) -> String {
    match parse(json) {
        Ok(c) => panic!("expected a config error, parsed {c:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn parses_the_dflash_format() {
    let c = parse(DFLASH_8B).unwrap();
    assert_eq!(c.kind, DrafterKind::DFlash);
    assert_eq!((c.block_size, c.num_target_layers, c.mask_token_id), (16, 36, 151669));
    assert_eq!(c.target_layer_ids, vec![1, 9, 17, 25, 33]);
    assert_eq!((c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim), (4096, 5, 32, 8, 128));
    assert_eq!((c.intermediate_size, c.max_position_embeddings), (12288, 40960));
    assert_eq!((c.rms_norm_eps, c.rope_theta), (1e-6, 1e6));
    assert_eq!((c.emb_dim, c.gru_hidden_dim, c.shift_label, c.head_prefix.as_str()), (None, None, false, ""));
    assert_eq!(c.drafts_per_block(), 15);
    c.validate_against(&qwen3_8b()).unwrap();
}

#[test]
fn parses_the_domino_format() {
    let c = parse(DOMINO_8B).unwrap();
    assert_eq!(c.kind, DrafterKind::Domino);
    assert_eq!((c.emb_dim, c.gru_hidden_dim, c.pure_draft_prefix_len, c.shift_label), (Some(256), Some(1024), 1, true));
    assert_eq!(c.target_layer_ids, vec![1, 9, 17, 25, 33]);
    assert_eq!(c.drafts_per_block(), 16);
    c.validate_against(&qwen3_8b()).unwrap();
    // transformers 5 moves rope_theta under rope_parameters.
    let v5 = edited(DOMINO_8B, |v| {
        let o = v.as_object_mut().unwrap();
        o.remove("rope_theta");
        o.insert("rope_parameters".into(), serde_json::json!({"rope_theta": 1000000.0, "rope_type": "default"}));
    });
    assert_eq!(parse(&v5).unwrap().rope_theta, 1e6);
}

#[test]
fn default_target_layer_ids_follow_z_lab() {
    let without = edited(DFLASH_8B, |v| {
        v["dflash_config"].as_object_mut().unwrap().remove("target_layer_ids");
    });
    assert_eq!(parse(&without).unwrap().target_layer_ids, vec![1, 9, 17, 25, 33]);
    // One draft layer reads the middle of the target.
    let one = edited(&without, |v| v["num_hidden_layers"] = 1.into());
    assert_eq!(parse(&one).unwrap().target_layer_ids, vec![18]);
    assert_eq!(default_target_layer_ids(28, 5), Some(vec![1, 7, 13, 19, 25]));
    // Python rounds halves to even: 1 + 1·3/2 = 2.5 → 2, and 1 + 1·5/2 = 3.5 → 4.
    assert_eq!(default_target_layer_ids(7, 3), Some(vec![1, 2, 4]));
    assert_eq!(default_target_layer_ids(9, 3), Some(vec![1, 4, 6]));
    // A 2-layer target has no spread for 2 draft layers: explicit ids are required.
    assert_eq!(default_target_layer_ids(2, 2), None);
    let tiny = edited(&without, |v| v["num_target_layers"] = 2.into());
    assert!(parse_error(&tiny).contains("target_layer_ids"));
}

#[test]
fn config_errors_name_the_field() {
    let missing = edited(DFLASH_8B, |v| {
        v.as_object_mut().unwrap().remove("hidden_size");
    });
    assert!(parse_error(&missing).contains("field 'hidden_size': missing"));
    let wrong_type = edited(DFLASH_8B, |v| v["num_hidden_layers"] = "five".into());
    let e = parse_error(&wrong_type);
    assert!(e.contains("num_hidden_layers") && e.contains("non-negative integer") && e.contains("five"), "{e}");
    let no_mask = edited(DFLASH_8B, |v| {
        v["dflash_config"].as_object_mut().unwrap().remove("mask_token_id");
    });
    assert!(parse_error(&no_mask).contains("dflash_config.mask_token_id"));
    let not_drafter = edited(DFLASH_8B, |v| {
        v.as_object_mut().unwrap().remove("dflash_config");
    });
    assert!(parse_error(&not_drafter).contains("dflash_config"));
    let projector = edited(DOMINO_8B, |v| v["dflash_config"]["projector_type"] = "mlp".into());
    assert!(parse_error(&projector).contains("projector_type"));
    let no_gru = edited(DOMINO_8B, |v| {
        v["dflash_config"].as_object_mut().unwrap().remove("gru_hidden_dim");
    });
    assert!(parse_error(&no_gru).contains("gru_hidden_dim"));
    let block0 = edited(DFLASH_8B, |v| v["block_size"] = 0.into());
    assert!(parse_error(&block0).contains("block_size must be between 1 and 4096 (found 0)"));
    let conflict = edited(DFLASH_8B, |v| v["dflash_config"]["block_size"] = 8.into());
    assert!(parse_error(&conflict).contains("block_size"));
    let sliding = edited(DFLASH_8B, |v| v["layer_types"][2] = "sliding_attention".into());
    assert!(parse_error(&sliding).contains("layer_types"));
    let bias = edited(DFLASH_8B, |v| v["attention_bias"] = true.into());
    assert!(parse_error(&bias).contains("attention_bias"));
}

#[test]
fn validation_against_the_target_names_both_values() {
    let target = qwen3_8b();
    let base = parse(DOMINO_8B).unwrap();
    let check = |edit: &dyn Fn(&mut DrafterConfig), needles: &[&str]| {
        let mut c = base.clone();
        edit(&mut c);
        let e = c.validate_against(&target).unwrap_err().to_string();
        for n in needles {
            assert!(e.contains(n), "'{e}' should mention '{n}'");
        }
    };
    check(&|c| c.hidden_size = 2560, &["hidden_size 2560", "hidden_size 4096"]);
    check(&|c| c.mask_token_id = 151936, &["mask_token_id 151936", "vocab_size 151936"]);
    check(&|c| c.target_layer_ids = vec![1, 9, 36], &["target_layer_ids entry 36", "36 layers"]);
    check(&|c| c.block_size = 0, &["block_size", "0"]);
    check(&|c| c.num_target_layers = 28, &["num_target_layers 28", "36 layers"]);
    check(&|c| c.gru_hidden_dim = None, &["Domino", "gru_hidden_dim"]);
    check(&|c| c.emb_dim = None, &["Domino", "emb_dim"]);
}

// ---------------------------------------------------------------------------------------------
// Tensor plans.

fn params(plan: &[(String, Vec<usize>)]) -> usize {
    plan.iter().map(|(_, s)| s.iter().product::<usize>()).sum()
}

#[test]
fn tensor_plans_match_the_published_checkpoints() {
    let target = qwen3_8b();
    let dflash = drafter_tensor_plan(&parse(DFLASH_8B).unwrap(), &target);
    assert_eq!(dflash.len(), 3 + 5 * 11);
    assert_eq!(dflash[0], ("fc.weight".to_string(), vec![4096, 5 * 4096]));
    let find = |plan: &[(String, Vec<usize>)], name: &str| plan.iter().find(|(n, _)| n == name).map(|(_, s)| s.clone());
    assert_eq!(find(&dflash, "hidden_norm.weight"), Some(vec![4096]));
    assert_eq!(find(&dflash, "norm.weight"), Some(vec![4096]));
    assert_eq!(find(&dflash, "layers.4.self_attn.k_proj.weight"), Some(vec![1024, 4096]));
    assert_eq!(find(&dflash, "layers.0.self_attn.o_proj.weight"), Some(vec![4096, 4096]));
    assert_eq!(find(&dflash, "layers.2.self_attn.q_norm.weight"), Some(vec![128]));
    assert_eq!(find(&dflash, "layers.3.mlp.down_proj.weight"), Some(vec![4096, 12288]));
    assert!(dflash.iter().all(|(n, _)| !n.starts_with("model.") && !n.contains("embed_tokens") && !n.contains("lm_head")));
    // Spec §5: backbone 1.049B parameters, Domino head 55.9M.
    assert_eq!(params(&dflash), 1_048_626_432);

    let mut domino_cfg = parse(DOMINO_8B).unwrap();
    let domino = drafter_tensor_plan(&domino_cfg, &target);
    let head: Vec<_> = domino[dflash.len()..].to_vec();
    assert_eq!(
        head,
        vec![
            ("prefix_gru.weight_ih_l0".to_string(), vec![3 * 1024, 4096]),
            ("prefix_gru.weight_hh_l0".to_string(), vec![3 * 1024, 1024]),
            ("embed_proj.0.weight".to_string(), vec![256, 4096 + 1024]),
            ("embed_proj.2.weight".to_string(), vec![151936, 256]),
        ]
    );
    assert_eq!(params(&head), 55_934_976);
    domino_cfg.head_prefix = "logit_head.".into();
    let old = drafter_tensor_plan(&domino_cfg, &target);
    assert_eq!(old[dflash.len()].0, "logit_head.prefix_gru.weight_ih_l0");
    assert_eq!(old[dflash.len() + 3].0, "logit_head.embed_proj.2.weight");
    assert_eq!(old[..dflash.len()], domino[..dflash.len()]);
}

// ---------------------------------------------------------------------------------------------
// GRU cell.

#[test]
fn gru_cell_matches_a_hand_computation() {
    // g = 1, input width 2. Rows of w_ih: r = [0.5, -1], z = [0.25, 0.75], n = [-0.5, 1.5].
    let w_ih = [0.5, -1.0, 0.25, 0.75, -0.5, 1.5];
    let w_hh = [0.3, -0.6, 0.9];
    let (x, s) = ([1.0, 2.0], [0.4]);
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    let r = sig(-1.5 + 0.12); // gi_r = 0.5 - 2, gh_r = 0.3 * 0.4
    let z = sig(1.75 - 0.24); // gi_z = 0.25 + 1.5, gh_z = -0.6 * 0.4
    let n = (2.5 + r * 0.36).tanh(); // gi_n = -0.5 + 3, gh_n = 0.9 * 0.4, gated by r
    let want = (1.0 - z) * n + z * 0.4;
    let got = gru_cell(&w_ih, &w_hh, &x, &s, 1);
    assert!((got[0] as f64 - want).abs() < 1e-6, "{} vs {want}", got[0]);

    // g = 2: a saturated update gate keeps the state; a closed one takes n = tanh(gi_n) when r = 0.
    let s2 = [0.3, -0.7];
    let mut w_ih2 = vec![0.0f32; 6];
    w_ih2[2] = 50.0; // z row 0
    w_ih2[3] = 50.0; // z row 1
    assert_eq!(gru_cell(&w_ih2, &[0.0; 12], &[1.0], &s2, 2), vec![0.3, -0.7]);
    let w_ih3 = [-50.0, -50.0, -50.0, -50.0, 0.5, -0.25]; // r = z = 0, n = tanh(gi_n)
    let w_hh3 = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 9.0, 9.0, 9.0, 9.0]; // gh_n is gated off by r = 0
    let got = gru_cell(&w_ih3, &w_hh3, &[1.0], &s2, 2);
    assert!((got[0] - 0.5f32.tanh()).abs() < 1e-6 && (got[1] - (-0.25f32).tanh()).abs() < 1e-6, "{got:?}");
}

// ---------------------------------------------------------------------------------------------
// Helpers: tiny targets and drafters.

fn target_spec() -> TinySpec {
    // A larger embedding scale widens logit margins (fewer near-ties), as in runtime/tests/generate.rs.
    TinySpec { embed_scale: 4.0, dtype: HostDType::F32, ..TinySpec::default() }
}

fn load_target(spec: &TinySpec) -> ReferenceModel {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), spec).unwrap();
    let config = Qwen3Config::from_file(&dir.path().join("config.json")).unwrap();
    ReferenceModel::load(config, &Checkpoint::open(dir.path()).unwrap(), false).unwrap()
}

fn load_drafter(target_spec: &TinySpec, target: &ReferenceModel, spec: &TinyDrafterSpec) -> ReferenceDrafter {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_drafter(dir.path(), target_spec, spec).unwrap();
    let mut config = DrafterConfig::from_file(&dir.path().join("config.json")).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    config.head_prefix = detect_head_prefix(&ckpt);
    ReferenceDrafter::load(config, &ckpt, target, false).unwrap()
}

/// A target or drafter from an edited tensor list (F32, in memory).
fn checkpoint(tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Checkpoint {
    Checkpoint::from_bytes(vec![("model.safetensors".into(), safetensors_bytes(HostDType::F32, tensors).unwrap())]).unwrap()
}

fn set(tensors: &mut [(String, Vec<usize>, Vec<f32>)], pred: impl Fn(&str) -> bool, f: impl Fn(&mut Vec<f32>, &[usize])) {
    for (name, shape, v) in tensors.iter_mut() {
        if pred(name) {
            f(v, shape);
        }
    }
}

fn is_residual_write(name: &str) -> bool {
    name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight")
}

fn target_config(spec: &TinySpec) -> Qwen3Config {
    Qwen3Config::from_json(config_json(spec).to_string().as_bytes(), Path::new("config.json")).unwrap()
}

fn drafter_config(target: &TinySpec, spec: &TinyDrafterSpec) -> DrafterConfig {
    let json = domino_models::testing::drafter_config_json(target, spec).to_string();
    DrafterConfig::from_json(json.as_bytes(), Path::new("config.json")).unwrap()
}

/// Drafter modes under test: (label, drafter kind, use_head).
const MODES: [(&str, DrafterKind, bool); 3] =
    [("dflash", DrafterKind::DFlash, false), ("domino", DrafterKind::Domino, true), ("domino --no-head", DrafterKind::Domino, false)];

fn max_round(kind: DrafterKind, block: usize) -> usize {
    match kind {
        DrafterKind::DFlash => block,      // B − 1 drafts + the anchor
        DrafterKind::Domino => block + 1, // B drafts + the anchor
    }
}

/// Run the speculative loop and check it against greedy decoding and the acceptance invariants.
fn check_lossless(label: &str, target: &ReferenceModel, drafter: &mut ReferenceDrafter, prompt: &[u32], max: usize, use_head: bool, want: &[u32]) -> Vec<usize> {
    let (out, lens) = speculative_greedy(target, drafter, prompt, max, use_head);
    assert_eq!(out, want[..max], "{label}: prompt {prompt:?}, {max} tokens: speculative output differs from greedy");
    assert_eq!(lens.iter().sum::<usize>(), out.len(), "{label}: acceptance lengths {lens:?} must sum to the output length");
    let top = max_round(drafter.config.kind, drafter.config.block_size);
    assert!(lens.iter().all(|&l| (1..=top).contains(&l)), "{label}: acceptance lengths {lens:?} outside 1..={top}");
    lens
}

// ---------------------------------------------------------------------------------------------
// The speculative loop.

#[test]
fn speculative_greedy_is_lossless_with_random_drafters() {
    let targets = [
        target_spec(),
        TinySpec { head_dim: 16, heads: 8, kv_heads: 2, tied: true, layers: 3, seed: 21, ..target_spec() },
    ];
    let prompts: [&[u32]; 3] = [&[1, 2, 3, 4, 5], &[200, 17, 300, 299, 42, 42, 42, 8, 9, 10, 11, 12, 13, 70], &[42]];
    for tspec in &targets {
        let target = load_target(tspec);
        let want: Vec<Vec<u32>> = prompts.iter().map(|p| target.greedy(p, 16)).collect();
        for (label, kind, use_head) in MODES {
            for block in [2, 4, 8, 16] {
                let dspec = TinyDrafterSpec {
                    kind,
                    block_size: block,
                    layers: 2,
                    target_layer_ids: vec![tspec.layers - 1, 0],
                    seed: 300 + block as u64,
                    ..TinyDrafterSpec::default()
                };
                let mut drafter = load_drafter(tspec, &target, &dspec);
                for (p, w) in prompts.iter().zip(&want) {
                    for max in [1, 16] {
                        let label = format!("{label} B={block} target seed {}", tspec.seed);
                        check_lossless(&label, &target, &mut drafter, p, max, use_head, w);
                    }
                }
            }
        }
    }
}

#[test]
fn always_accepted_drafts_commit_whole_blocks() {
    let tspec = TinySpec { tied: false, ..target_spec() };
    let t = 77;
    let tcfg = target_config(&tspec);
    let target = ReferenceModel::load(tcfg, &checkpoint(&domino_models::testing::constant_target_tensors(&tspec, t)), false).unwrap();
    let prompt = [5u32, 6, 7];
    let want = target.greedy(&prompt, 60);
    assert!(want.iter().all(|&x| x == t as u32));
    for (label, kind, use_head) in MODES {
        for block in [2, 4, 8, 16] {
            // The drafter predicts t in every slot the same way: no residual writes, the final norm keeps
            // component 0 of the slot's embedding, and the Domino correction is zero.
            let dspec = TinyDrafterSpec { kind, block_size: block, seed: 7 + block as u64, ..TinyDrafterSpec::default() };
            let mut tensors = tiny_drafter_tensors(&tspec, &dspec).unwrap();
            set(&mut tensors, is_residual_write, |v, _| v.fill(0.0));
            set(&mut tensors, |n| n == "norm.weight", |v, _| v.iter_mut().enumerate().for_each(|(i, x)| *x = if i == 0 { 1.0 } else { 0.0 }));
            set(&mut tensors, |n| n.ends_with("embed_proj.2.weight"), |v, _| v.fill(0.0));
            let mut drafter = ReferenceDrafter::load(drafter_config(&tspec, &dspec), &checkpoint(&tensors), &target, false).unwrap();
            let full = max_round(kind, block);
            for max in [1, 3, block + 2, 3 * block + 1, 60] {
                let label = format!("{label} B={block} max={max}");
                let lens = check_lossless(&label, &target, &mut drafter, &prompt, max, use_head, &want);
                let (last, whole) = lens.split_last().unwrap();
                assert!(whole.iter().all(|&l| l == full), "{label}: every round but the last should commit {full}: {lens:?}");
                assert_eq!(*last, max - whole.len() * full, "{label}: the last round is truncated to end at {max}: {lens:?}");
            }
        }
    }
}

/// A target whose next token depends only on the current one (no residual writes), and a Domino
/// drafter that computes that same function in slot 0: the first draft is always accepted, whatever
/// its (random) head does to the later slots, because slot 0 is in the uncorrected prefix.
#[test]
fn domino_slot_zero_predicts_the_token_after_the_anchor() {
    let tspec = target_spec();
    let mut ttensors = tiny_tensors(&tspec);
    set(&mut ttensors, is_residual_write, |v, _| v.fill(0.0));
    let target_norm = ttensors.iter().find(|(n, _, _)| n == "model.norm.weight").unwrap().2.clone();
    let target = ReferenceModel::load(target_config(&tspec), &checkpoint(&ttensors), false).unwrap();
    let prompts: [&[u32]; 2] = [&[9, 8, 7], &[300, 1]];
    for use_head in [true, false] {
        for block in [2, 4, 8] {
            let dspec = TinyDrafterSpec { kind: DrafterKind::Domino, block_size: block, seed: 50 + block as u64, ..TinyDrafterSpec::default() };
            let mut tensors = tiny_drafter_tensors(&tspec, &dspec).unwrap();
            set(&mut tensors, is_residual_write, |v, _| v.fill(0.0));
            set(&mut tensors, |n| n == "norm.weight", |v, _| v.copy_from_slice(&target_norm));
            let mut drafter = ReferenceDrafter::load(drafter_config(&tspec, &dspec), &checkpoint(&tensors), &target, false).unwrap();
            for p in prompts {
                let want = target.greedy(p, 25);
                let label = format!("bigram domino head={use_head} B={block}");
                let lens = check_lossless(&label, &target, &mut drafter, p, 25, use_head, &want);
                let (_, whole) = lens.split_last().unwrap();
                assert!(whole.iter().all(|&l| l >= 2), "{label}: the first draft must always be accepted: {lens:?}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Drafter internals.

#[test]
fn context_cache_equals_recomputing_the_context() {
    let tspec = target_spec();
    let target = load_target(&tspec);
    let seq: Vec<u32> = vec![3, 17, 250, 9, 100, 42, 7, 7, 300, 12, 5, 60, 61];
    let out = target.forward(&seq);
    for (label, kind, use_head) in MODES {
        let dspec = TinyDrafterSpec { kind, block_size: 4, layers: 2, target_layer_ids: vec![1, 0], ..TinyDrafterSpec::default() };
        let mut drafter = load_drafter(&tspec, &target, &dspec);
        let ids = drafter.config.target_layer_ids.clone();
        let feats = |r: std::ops::Range<usize>| target_features(&out, &ids, tspec.hidden, r);
        // Incrementally: context [0,5), then [5,9), then [9,12).
        for (from, to) in [(0, 5), (5, 9), (9, 12)] {
            drafter.draft_block(&feats(from..to), seq[to], to, use_head);
        }
        assert_eq!(drafter.ctx_len(), 12);
        let incremental = drafter.last_trace().clone();
        // Drafting again at the same position without new context gives the same block: the block's
        // own K/V were not kept.
        let again = drafter.draft_block(&[], seq[12], 12, use_head);
        assert_eq!(again, incremental.drafts, "{label}");
        assert_eq!(drafter.last_final_logits(), incremental.final_logits.as_slice(), "{label}");
        // All at once from a fresh cache: bit-identical (every row is computed independently).
        drafter.reset();
        drafter.draft_block(&feats(0..12), seq[12], 12, use_head);
        assert_eq!(drafter.last_base_logits(), incremental.base_logits.as_slice(), "{label}: cached vs recomputed context");
        assert_eq!(drafter.last_trace().drafts, incremental.drafts, "{label}");
    }
}

/// y·Wᵀ for one row, written independently of the engine's kernels.
fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
    w.chunks(x.len()).map(|row| row.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() as f32).collect()
}

#[test]
fn drafts_follow_the_documented_alignment_and_head() {
    let tspec = target_spec();
    let target = load_target(&tspec);
    let (h, v) = (tspec.hidden, tspec.vocab);
    let seq: Vec<u32> = vec![11, 22, 33, 44, 55, 66, 77];
    let out = target.forward(&seq);
    let block = 6;
    let anchor = 123u32;
    let mut corrected_flips = 0;
    for (label, kind, use_head) in MODES {
        for seed in [1u64, 2, 3] {
            let dspec = TinyDrafterSpec { kind, block_size: block, seed, pure_draft_prefix_len: 1, ..TinyDrafterSpec::default() };
            let mut drafter = load_drafter(&tspec, &target, &dspec);
            let f = target_features(&out, &drafter.config.target_layer_ids.clone(), h, 0..seq.len());
            let drafts = drafter.draft_block(&f, anchor, seq.len(), use_head);
            let trace = drafter.last_trace().clone();
            let base_argmax: Vec<u32> = trace.base_logits.chunks(v).map(argmax).collect();
            let final_argmax: Vec<u32> = trace.final_logits.chunks(v).map(argmax).collect();
            assert_eq!(trace.drafts, drafts);
            match (kind, use_head) {
                (DrafterKind::DFlash, _) => {
                    assert_eq!(drafts, base_argmax[1..], "{label}: DFlash drafts are slots 1..B");
                    assert_eq!(trace.final_logits, trace.base_logits);
                }
                (DrafterKind::Domino, false) => {
                    assert_eq!(drafts, base_argmax, "{label}: shifted labels use every slot");
                    assert_eq!(trace.final_logits, trace.base_logits);
                }
                (DrafterKind::Domino, true) => {
                    assert_eq!(drafts, final_argmax, "{label}: drafts are the argmax of the final logits");
                    assert_eq!(drafts[0], base_argmax[0], "{label}: slot 0 is in the uncorrected prefix");
                    corrected_flips += (1..block).filter(|&i| drafts[i] != base_argmax[i]).count();
                    // Recompute the correction from the checkpoint's tensors, with the GRU fed the
                    // anchor and then each chosen draft.
                    let tensors = tiny_drafter_tensors(&tspec, &dspec).unwrap();
                    let get = |n: &str| tensors.iter().find(|(name, _, _)| name == n).unwrap().2.clone();
                    let (w_ih, w_hh, w1, w2) = (get("prefix_gru.weight_ih_l0"), get("prefix_gru.weight_hh_l0"), get("embed_proj.0.weight"), get("embed_proj.2.weight"));
                    let g = dspec.gru_hidden;
                    let embed = |t: u32| target.embed()[t as usize * h..(t as usize + 1) * h].to_vec();
                    let mut s = gru_cell(&w_ih, &w_hh, &embed(anchor), &vec![0.0; g], g);
                    for i in 0..block {
                        let row = &trace.final_logits[i * v..(i + 1) * v];
                        let base = &trace.base_logits[i * v..(i + 1) * v];
                        if i == 0 {
                            assert_eq!(row, base);
                        } else {
                            let ys = [&trace.backbone[i * h..(i + 1) * h], s.as_slice()].concat();
                            let act: Vec<f32> = matvec(&w1, &ys).into_iter().map(|z| z / (1.0 + (-z).exp())).collect();
                            let corr = matvec(&w2, &act);
                            for (j, ((got, b), c)) in row.iter().zip(base).zip(&corr).enumerate() {
                                assert!((got - (b + c)).abs() < 1e-4, "{label} slot {i} vocab {j}: {got} vs {}", b + c);
                            }
                        }
                        s = gru_cell(&w_ih, &w_hh, &embed(drafts[i]), &s, g);
                    }
                }
            }
        }
    }
    assert!(corrected_flips > 0, "the random Domino heads never changed a draft: the head test proves nothing");
}

#[test]
fn old_head_names_load_the_same_drafter() {
    let tspec = target_spec();
    let target = load_target(&tspec);
    let new = TinyDrafterSpec { kind: DrafterKind::Domino, block_size: 4, ..TinyDrafterSpec::default() };
    let old = TinyDrafterSpec { old_head_names: true, ..new.clone() };
    let dir = tempfile::tempdir().unwrap();
    write_tiny_drafter(dir.path(), &tspec, &old).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(detect_head_prefix(&ckpt), "logit_head.");
    assert!(ckpt.names().contains(&"logit_head.embed_proj.2.weight".to_string()));
    // Without the detected prefix the head tensors are reported missing by name.
    let config = DrafterConfig::from_file(&dir.path().join("config.json")).unwrap();
    match ReferenceDrafter::load(config.clone(), &ckpt, &target, false) {
        Err(ModelError::MissingTensor { name, .. }) => assert_eq!(name, "prefix_gru.weight_ih_l0"),
        other => panic!("expected a missing tensor, got {:?}", other.err()),
    }
    let mut old_drafter = ReferenceDrafter::load(DrafterConfig { head_prefix: detect_head_prefix(&ckpt), ..config }, &ckpt, &target, false).unwrap();
    let mut new_drafter = load_drafter(&tspec, &target, &new);
    let prompt = [4u32, 5, 6, 7];
    assert_eq!(speculative_greedy(&target, &mut old_drafter, &prompt, 12, true), speculative_greedy(&target, &mut new_drafter, &prompt, 12, true));
    assert_eq!(old_drafter.last_final_logits(), new_drafter.last_final_logits());
}

#[test]
fn drafter_checkpoints_hold_exactly_the_plan() {
    let tspec = target_spec();
    for kind in [DrafterKind::DFlash, DrafterKind::Domino] {
        let dspec = TinyDrafterSpec { kind, dtype: HostDType::BF16, ..TinyDrafterSpec::default() };
        let dir = tempfile::tempdir().unwrap();
        write_tiny_drafter(dir.path(), &tspec, &dspec).unwrap();
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        let config = DrafterConfig::from_file(&dir.path().join("config.json")).unwrap();
        assert_eq!(config.mask_token_id as usize, tspec.vocab - 1);
        let mut planned: Vec<String> = drafter_tensor_plan(&config, &target_config(&tspec)).into_iter().map(|(n, _)| n).collect();
        planned.sort();
        assert_eq!(ckpt.names(), planned);
        // A drafter for a different target is refused before any tensor is read.
        let other = TinySpec { hidden: 96, ..tspec.clone() };
        let e = config.validate_against(&target_config(&other)).unwrap_err().to_string();
        assert!(e.contains("hidden_size 64") && e.contains("hidden_size 96"), "{e}");
    }
}
