//! The `domino` binary end to end: the --json contract against the CPU reference, and one clear error
//! line with a non-zero exit (never a panic) for every kind of bad input.

use domino_models::reference::ReferenceModel;
use domino_models::testing::{write_tiny_model, TinySpec};
use domino_models::{Checkpoint, Qwen3Config};
use std::path::Path;
use std::process::{Command, Output};

fn domino(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_domino")).args(args).env("XDG_RUNTIME_DIR", std::env::temp_dir()).output().expect("run domino")
}

fn tiny(spec: &TinySpec) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), spec).unwrap();
    dir
}

/// Runs a command expected to fail; returns its single stderr line.
fn expect_error(args: &[&str]) -> String {
    let out = domino(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{args:?} succeeded; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty() && !l.contains("XDG_RUNTIME_DIR")).collect();
    assert_eq!(lines.len(), 1, "{args:?}: expected one error line, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    lines[0].to_string()
}

fn json_generate(model: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["generate", "--model", model.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    let out = domino(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.trim().lines().count(), 1, "stdout must hold exactly one JSON object: {stdout}");
    serde_json::from_str(stdout.trim()).unwrap()
}

#[test]
fn json_output_matches_the_cpu_reference() {
    let spec = TinySpec { embed_scale: 4.0, ..TinySpec::default() };
    let dir = tiny(&spec);
    let config = Qwen3Config::from_file(&dir.path().join("config.json")).unwrap();
    let reference = ReferenceModel::load(config, &Checkpoint::open(dir.path()).unwrap(), false).unwrap();
    let want = reference.greedy(&[10, 20, 30, 40], 24);
    for (backend, kernels) in [("vulkan", "auto"), ("gl", "auto"), ("vulkan", "gpu"), ("gl", "gpu")] {
        let backend_kernels = format!("{backend} --kernels {kernels}");
        let backend = backend_kernels.as_str();
        let args = ["--prompt-ids", "10,20,30,40", "--max-tokens", "24", "--ignore-eos", "--dtype", "f32", "--backend"];
        let mut args: Vec<&str> = args.to_vec();
        args.extend(backend.split(' '));
        let v = json_generate(dir.path(), &args);
        assert_eq!(v["prompt_ids"], serde_json::json!([10, 20, 30, 40]));
        let got: Vec<u32> = serde_json::from_value(v["output_ids"].clone()).unwrap();
        assert_eq!(got, want, "{backend}");
        assert!(v["text"].is_string());
        for key in ["prefill_tokens_per_s", "decode_tokens_per_s"] {
            assert!(v["stats"][key].as_f64().unwrap() > 0.0, "{key}");
        }
    }
}

#[test]
fn text_prompts_chat_and_seeded_sampling() {
    let dir = tiny(&TinySpec::default());
    let m = dir.path().to_str().unwrap();
    let v = json_generate(dir.path(), &["--prompt", "Hi there", "--chat", "--max-tokens", "4", "--ignore-eos"]);
    // The tiny tokenizer is byte-level: the chat template's special tokens and the bytes of the text.
    let ids: Vec<u32> = serde_json::from_value(v["prompt_ids"].clone()).unwrap();
    assert_eq!(ids[0], domino_models::testing::IM_START);
    assert!(ids.ends_with(&[b'\n' as u32, 259, b'\n' as u32, b'\n' as u32, 260, b'\n' as u32, b'\n' as u32]), "{ids:?}");
    let args = ["--prompt", "abc", "--max-tokens", "12", "--ignore-eos", "--temperature", "0.9", "--top-p", "0.9", "--top-k", "50", "--seed", "42"];
    let a = json_generate(dir.path(), &args);
    let b = json_generate(dir.path(), &args);
    assert_eq!(a["output_ids"], b["output_ids"], "same seed, same tokens");
    assert_eq!(a["output_ids"].as_array().unwrap().len(), 12);
    // Streaming mode prints text to stdout and statistics to stderr.
    let out = domino(&["generate", "--model", m, "--prompt", "abc", "--max-tokens", "3", "--ignore-eos"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("tok/s"));
}

#[test]
fn devices_lists_vulkan_and_gl() {
    let out = domino(&["devices", "--json"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let backends: Vec<&str> = v.as_array().unwrap().iter().map(|a| a["backend"].as_str().unwrap()).collect();
    assert!(backends.contains(&"vulkan") && backends.contains(&"gl"), "{backends:?}");
}

/// On llvmpipe the CLI asks for two threads per core (`LP_NUM_THREADS`, read by the driver when it
/// enumerates the adapter) unless the user set the variable, and `devices` says which count is in effect.
#[test]
fn devices_reports_llvmpipe_threads_two_per_core_unless_set() {
    use domino_engine::cpu_threads::{llvmpipe_threads_for, LLVMPIPE_THREADS_VAR};
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let run = |set: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_domino"));
        cmd.args(["devices", "--backend", "vulkan"]);
        match set {
            Some(v) => cmd.env(LLVMPIPE_THREADS_VAR, v),
            None => cmd.env_remove(LLVMPIPE_THREADS_VAR),
        };
        let out = cmd.output().expect("run domino");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let default = run(None);
    assert!(default.contains("llvmpipe"), "the test machine's adapter is llvmpipe: {default}");
    assert!(default.contains(&format!("threads: {} (LP_NUM_THREADS", llvmpipe_threads_for(cores))), "{default}");
    let set = run(Some("3"));
    assert!(set.contains("threads: 3 (LP_NUM_THREADS"), "{set}");
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(p, serde_json::to_vec(&v).unwrap()).unwrap();
}

/// Rewrite model.safetensors with `f` applied to its tensors.
fn edit_weights(dir: &Path, f: impl FnOnce(&mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>)) {
    let p = dir.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<_> = st.tensors().into_iter().map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec())).collect();
    f(&mut tensors);
    let views: Vec<_> = tensors.iter().map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap())).collect();
    std::fs::write(p, safetensors::serialize(views, None).unwrap()).unwrap();
}

#[test]
fn bad_input_gives_one_clear_error_line() {
    let base = TinySpec { max_position: 64, ..TinySpec::default() };
    let gen = |dir: &Path, extra: &[&str]| {
        let mut a = vec!["generate".to_string(), "--model".into(), dir.to_str().unwrap().into()];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let run = |dir: &Path, extra: &[&str]| {
        let a = gen(dir, extra);
        expect_error(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let ids = ["--prompt-ids", "1,2,3", "--max-tokens", "4"];

    let d = tiny(&base);
    std::fs::remove_file(d.path().join("config.json")).unwrap();
    assert!(run(d.path(), &ids).contains("config.json: file not found"));

    let d = tiny(&base);
    std::fs::write(d.path().join("config.json"), b"{\"hidden_size\": 64,").unwrap();
    assert!(run(d.path(), &ids).contains("config.json: malformed JSON"));

    let d = tiny(&base);
    edit_config(d.path(), |v| v["rope_magic"] = 1.into());
    assert!(run(d.path(), &ids).contains("unknown config field 'rope_magic'"));

    let d = tiny(&base);
    edit_config(d.path(), |v| {
        v["architectures"] = serde_json::json!(["MistralForCausalLM"]);
        v["model_type"] = "mistral".into();
    });
    assert!(run(d.path(), &ids).contains("unsupported architecture MistralForCausalLM"));

    let d = tiny(&base);
    std::fs::remove_file(d.path().join("tokenizer.json")).unwrap();
    assert!(run(d.path(), &["--prompt", "hi"]).contains("no tokenizer.json, use --prompt-ids"));

    let d = tiny(&base);
    std::fs::write(d.path().join("tokenizer.json"), b"{not json").unwrap();
    assert!(run(d.path(), &ids).contains("tokenizer.json"));

    let d = tiny(&base);
    std::fs::remove_file(d.path().join("model.safetensors")).unwrap();
    assert!(run(d.path(), &ids).contains("model.safetensors: file not found"));

    let d = tiny(&base);
    let p = d.path().join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 100]).unwrap();
    assert!(run(d.path(), &ids).contains("corrupt or truncated safetensors"));

    let d = tiny(&base);
    std::fs::write(d.path().join("model.safetensors"), b"garbage").unwrap();
    assert!(run(d.path(), &ids).contains("corrupt or truncated safetensors"));

    let d = tiny(&base);
    edit_weights(d.path(), |t| t.retain(|(n, ..)| n != "model.layers.1.mlp.up_proj.weight"));
    assert!(run(d.path(), &ids).contains("tensor model.layers.1.mlp.up_proj.weight: missing from the checkpoint"));

    let d = tiny(&base);
    edit_weights(d.path(), |t| {
        let e = t.iter_mut().find(|(n, ..)| n == "model.layers.0.self_attn.q_proj.weight").unwrap();
        e.2 = vec![e.2[1], e.2[0]];
    });
    let e = run(d.path(), &ids);
    assert!(e.contains("tensor model.layers.0.self_attn.q_proj.weight: expected shape [128, 64], found [64, 128]"), "{e}");

    let d = tiny(&base);
    edit_weights(d.path(), |t| {
        let e = t.iter_mut().find(|(n, ..)| n == "model.norm.weight").unwrap();
        e.1 = safetensors::Dtype::I16;
    });
    assert!(run(d.path(), &ids).contains("tensor model.norm.weight: unsupported dtype I16"));

    let d = tiny(&base);
    let long: Vec<String> = (0..60).map(|i| i.to_string()).collect();
    let long = long.join(",");
    assert!(run(d.path(), &["--prompt-ids", &long, "--max-tokens", "10"]).contains("exceeds the context of 64 positions (max_position_embeddings)"));
    assert!(run(d.path(), &["--prompt-ids", "1,999,2"]).contains("token id 999 at index 1 is outside the vocabulary (vocab_size 384)"));
    assert!(run(d.path(), &["--prompt-ids", "1,2", "--backend", "metal"]).contains("no GPU adapter found for backend metal"));
    assert!(run(d.path(), &["--prompt-ids", "1,2", "--adapter", "9"]).contains("adapter index 9 is out of range"));
    assert!(run(d.path(), &["--prompt-ids", "1,2", "--dtype", "int3"]).contains("--dtype int3"));

    // A context whose KV cache cannot fit one storage binding of the adapter: named limit, no allocation.
    let d = tiny(&TinySpec { max_position: 10_000_000, ..TinySpec::default() });
    let e = run(d.path(), &["--prompt-ids", "1,2", "--max-tokens", "2000000"]);
    assert!(e.contains("KV cache") && e.contains("max_storage_buffer_binding_size"), "{e}");
}

#[test]
fn speculative_json_matches_plain_decoding_and_reports_acceptance() {
    use domino_models::drafter::DrafterKind;
    use domino_models::testing::{write_tiny_drafter, TinyDrafterSpec};
    let spec = TinySpec { embed_scale: 4.0, ..TinySpec::default() };
    let dir = tiny(&spec);
    let drafts = tempfile::tempdir().unwrap();
    let d = drafts.path().join("domino");
    write_tiny_drafter(&d, &spec, &TinyDrafterSpec { kind: DrafterKind::Domino, block_size: 4, ..TinyDrafterSpec::default() }).unwrap();
    let common = ["--prompt-ids", "5,6,7,8", "--max-tokens", "19", "--ignore-eos"];
    let plain = json_generate(dir.path(), &common);
    for extra in [vec![], vec!["--no-head"], vec!["--block-size", "3"], vec!["--draft-len", "0"], vec!["--draft-len", "2"], vec!["--draft-len", "auto", "--no-head"], vec!["--timing", "--draft-len", "2"], vec!["--lookup"], vec!["--lookup", "--draft-len", "2"]] {
        let mut args = common.to_vec();
        args.extend(["--draft", d.to_str().unwrap()]);
        args.extend(extra.iter().copied());
        let v = json_generate(dir.path(), &args);
        assert_eq!(v["output_ids"], plain["output_ids"], "{extra:?}: speculative output differs from plain decoding");
        let lengths: Vec<usize> = serde_json::from_value(v["stats"]["acceptance_lengths"].clone()).unwrap();
        assert_eq!(v["stats"]["rounds"].as_u64().unwrap() as usize, lengths.len());
        assert!(v["stats"]["mean_acceptance"].as_f64().unwrap() >= 1.0);
        let ks: Vec<usize> = serde_json::from_value(v["stats"]["draft_lengths"].clone()).unwrap();
        assert_eq!(ks.len(), lengths.len(), "{extra:?}: one draft length per round");
        if let Some(i) = extra.iter().position(|a| *a == "--draft-len").filter(|&i| extra[i + 1] != "auto") {
            let k: usize = extra[i + 1].parse().unwrap();
            // A copy may hold fewer tokens than k (it is verified whole).
            let lookup = extra.contains(&"--lookup");
            assert!(ks.iter().all(|&d| d == k || (lookup && d < k)), "{extra:?}: {ks:?}");
        }
        let lookup_rounds = v["stats"]["lookup_rounds"].as_u64().unwrap() as usize;
        assert!(lookup_rounds <= lengths.len() && (lookup_rounds == 0 || extra.contains(&"--lookup")), "{extra:?}: {lookup_rounds}");
        for key in ["draft_seconds", "verify_seconds", "head_share", "mean_draft_length"] {
            assert!(v["stats"][key].as_f64().unwrap().is_finite(), "{key}");
        }
        // The draft / verify split only with --timing (its GPU syncs slow the rounds down).
        let drafted = ks.iter().any(|&k| k > 0);
        let draft_seconds = v["stats"]["draft_seconds"].as_f64().unwrap();
        if extra.contains(&"--timing") {
            assert!(drafted && draft_seconds > 0.0, "--timing: {ks:?}, draft {draft_seconds}");
        } else {
            assert_eq!(draft_seconds, 0.0, "{extra:?}: no split without --timing");
        }
        assert!(v["stats"]["verify_seconds"].as_f64().unwrap() > 0.0, "{extra:?}");
    }
    // A drafter for another target: one clear error line.
    let other = TinySpec { hidden: 96, ..TinySpec::default() };
    let bad = drafts.path().join("other");
    write_tiny_drafter(&bad, &other, &TinyDrafterSpec::default()).unwrap();
    let m = dir.path().to_str().unwrap();
    let e = expect_error(&["generate", "--model", m, "--draft", bad.to_str().unwrap(), "--prompt-ids", "1,2"]);
    assert!(e.contains("96") && e.contains("64"), "{e}");
    let e = expect_error(&["generate", "--model", m, "--draft", d.to_str().unwrap(), "--block-size", "0", "--prompt-ids", "1,2"]);
    assert!(e.contains("block_size"), "{e}");
    let out = domino(&["generate", "--model", m, "--draft", d.to_str().unwrap(), "--draft-len", "many", "--prompt-ids", "1,2"]);
    assert_eq!(out.status.code(), Some(2), "clap rejects a bad --draft-len");
    assert!(String::from_utf8_lossy(&out.stderr).contains("draft-len"));
}

/// `train soft-labels` labels `train data` output with the target's top-k distribution and
/// `train drafter --soft-weight` trains on it; missing data or missing labels are one clear line.
#[test]
fn soft_labels_then_a_distilled_drafter() {
    let dir = tiny(&TinySpec::default());
    let m = dir.path().to_str().unwrap();
    let work = tempfile::tempdir().unwrap();
    let prompts = work.path().join("prompts.jsonl");
    std::fs::write(&prompts, "{\"prompt_ids\": [9, 8, 7]}\n{\"prompt_ids\": [5, 6]}\n{\"prompt_ids\": [30, 31, 32]}\n").unwrap();
    let data = work.path().join("data");
    let data_s = data.to_str().unwrap();
    let out = domino(&["train", "data", "--model", m, "--prompts", prompts.to_str().unwrap(), "--out", data_s, "--max-new-tokens", "24", "--ignore-eos", "--device", "cpu"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let drafter = work.path().join("drafter");
    let train = ["train", "drafter", "--model", m, "--data", data_s, "--out", drafter.to_str().unwrap(), "--block-size", "4", "--steps", "3", "--anchors", "4", "--soft-weight", "0.5"];
    let e = expect_error(&train);
    assert!(e.contains("train soft-labels"), "{e}");
    let out = domino(&["train", "soft-labels", "--model", m, "--data", data_s, "--top-k", "4"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // 3 prompts x 24 continuation tokens, the greedy token on top (up to f16 near-ties).
    assert!(stderr.contains("top 4 of 72 positions"), "{stderr}");
    let out = domino(&train);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(drafter.join("model.safetensors").exists());
    let e = expect_error(&["train", "soft-labels", "--model", m, "--data", work.path().join("nothing").to_str().unwrap()]);
    assert!(e.contains("meta.json"), "{e}");
}

/// `train ngrams` builds the table from `train data` output; a drafter folder holding it as
/// lookup-ngrams.safetensors gives `--lookup` table rounds with the plain output; a corrupt table or
/// one of another vocabulary is one clear error line.
#[test]
fn lookup_table_from_train_ngrams_keeps_the_output() {
    use domino_models::drafter::DrafterKind;
    use domino_models::ngram_table::FILE_NAME;
    use domino_models::testing::{write_tiny_drafter, TinyDrafterSpec};
    let spec = TinySpec { embed_scale: 4.0, ..TinySpec::default() };
    let dir = tiny(&spec);
    let m = dir.path().to_str().unwrap();
    let work = tempfile::tempdir().unwrap();
    let d = work.path().join("domino");
    write_tiny_drafter(&d, &spec, &TinyDrafterSpec { kind: DrafterKind::Domino, block_size: 4, ..TinyDrafterSpec::default() }).unwrap();
    let prompts = work.path().join("prompts.jsonl");
    std::fs::write(&prompts, "{\"prompt_ids\": [9, 8, 7]}\n{\"prompt_ids\": [5, 6]}\n{\"prompt_ids\": [30, 31, 32]}\n").unwrap();
    let data = work.path().join("data");
    let out = domino(&["train", "data", "--model", m, "--prompts", prompts.to_str().unwrap(), "--out", data.to_str().unwrap(), "--max-new-tokens", "40", "--ignore-eos", "--device", "cpu"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = d.join(FILE_NAME);
    let out = domino(&["train", "ngrams", "--data", data.to_str().unwrap(), "--out", table.to_str().unwrap(), "--min-count", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("contexts from"));
    let common = ["--prompt-ids", "5,6,7", "--max-tokens", "40", "--ignore-eos"];
    let plain = json_generate(dir.path(), &common);
    let mut args = common.to_vec();
    args.extend(["--draft", d.to_str().unwrap(), "--lookup"]);
    let v = json_generate(dir.path(), &args);
    assert_eq!(v["output_ids"], plain["output_ids"], "lookup with a table changed the output");
    let table_rounds = v["stats"]["table_rounds"].as_u64().unwrap();
    assert!(table_rounds > 0 && table_rounds <= v["stats"]["lookup_rounds"].as_u64().unwrap(), "{}", v["stats"]);
    // Hostile tables: named, never a panic.
    let good = std::fs::read(&table).unwrap();
    std::fs::write(&table, &good[..good.len() / 2]).unwrap();
    let with_table = ["generate", "--model", m, "--draft", d.to_str().unwrap(), "--lookup", "--prompt-ids", "1,2"];
    let e = expect_error(&with_table);
    assert!(e.contains(FILE_NAME), "{e}");
    let other = TinySpec { vocab: 200, ..spec.clone() };
    let other_dir = tiny(&other);
    let other_data = work.path().join("other-data");
    let out = domino(&["train", "data", "--model", other_dir.path().to_str().unwrap(), "--prompts", prompts.to_str().unwrap(), "--out", other_data.to_str().unwrap(), "--max-new-tokens", "8", "--device", "cpu"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = domino(&["train", "ngrams", "--data", other_data.to_str().unwrap(), "--out", table.to_str().unwrap(), "--min-count", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let e = expect_error(&with_table);
    assert!(e.contains(FILE_NAME) && e.contains("vocabulary of 200"), "{e}");
    let e = expect_error(&["train", "ngrams", "--data", data.to_str().unwrap(), "--data", other_data.to_str().unwrap(), "--out", table.to_str().unwrap()]);
    assert!(e.contains("vocabulary"), "{e}");
}

fn plan_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["plan", "--json"];
    all.extend_from_slice(args);
    let out = domino(&all);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(String::from_utf8(out.stdout).unwrap().trim()).unwrap()
}

#[test]
fn plan_lists_every_dispatch_of_the_recorded_step() {
    let spec = TinySpec::default();
    let dir = tiny(&spec);
    let model = dir.path().to_str().unwrap();
    for kernels in ["cpu", "gpu"] {
        for rows in [1u64, 17] {
            let rows_arg = rows.to_string();
            let v = plan_json(&["--model", model, "--kernels", kernels, "--rows", &rows_arg, "--context", "40", "--backend", "vulkan"]);
            assert_eq!(v["kernels"], kernels);
            assert_eq!((v["rows"].as_u64(), v["context"].as_u64(), v["submissions"].as_u64()), (Some(rows), Some(40), Some(1)));
            let dispatches = v["dispatches"].as_array().unwrap();
            for d in dispatches {
                for key in ["kernel", "variant", "label", "workgroup_size", "workgroups", "invocations", "weight_bytes"] {
                    assert!(!d[key].is_null(), "{kernels}: {key} missing in {d}");
                }
                let product = |k: &str| d[k].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).product::<u64>();
                assert_eq!(d["invocations"].as_u64().unwrap(), product("workgroup_size") * product("workgroups"), "{d}");
            }
            // Per layer: q/k/v (RMSNorm folded in), rope, attention (two passes in the GPU family, one
            // in the CPU family), o_proj + residual, gate/up (norm folded), down + residual. The CPU
            // family's multi-row passes run their two RMSNorms as passes of their own.
            let per_layer = dispatches.iter().filter(|d| d["label"].as_str().unwrap().starts_with("layer 0 ")).count();
            let want = match (kernels, rows) {
                ("gpu", _) => 7,
                (_, 1) => 6,
                _ => 8,
            };
            assert_eq!(per_layer, want, "{kernels} rows={rows}");
            // Every weight matrix is read exactly once per pass of up to 8 rows.
            let weights: u64 = dispatches.iter().map(|d| d["weight_bytes"].as_u64().unwrap()).sum();
            assert!(weights > 0);
        }
    }
}

/// Issue 13's shape check: with Qwen3-8B's layer shapes, every decode matmul of the GPU family offers a
/// GPU at least 256 workgroups and 16384 invocations, and decode attention at 4096 keys 256 workgroups.
/// One layer (the check is per layer; the README's script writes two).
#[test]
fn gpu_kernels_offer_the_parallelism_of_a_gpu_at_qwen3_8b_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    let m = model.to_str().unwrap();
    let out = domino(&[
        "random-model", "--out", m, "--hidden", "4096", "--layers", "1", "--heads", "32", "--kv-heads", "8", "--head-dim", "128",
        "--intermediate", "12288", "--vocab", "16384",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = plan_json(&["--model", m, "--kernels", "gpu", "--context", "4096", "--backend", "vulkan"]);
    let dispatches = v["dispatches"].as_array().unwrap();
    let groups = |d: &serde_json::Value| d["workgroups"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).product::<u64>();
    let mut matmuls = 0;
    for d in dispatches {
        let (kernel, label) = (d["kernel"].as_str().unwrap(), d["label"].as_str().unwrap());
        if kernel.starts_with("matmul") {
            matmuls += 1;
            assert!(groups(d) >= 256, "{label}: {} workgroups", groups(d));
            assert!(d["invocations"].as_u64().unwrap() >= 16384, "{label}: {} invocations", d["invocations"]);
        }
        if kernel == "attention" && d["variant"].as_str().unwrap().starts_with("partial") {
            assert!(groups(d) >= 256, "attention: {} workgroups", groups(d));
        }
    }
    // q/k/v, o_proj, gate/up, down and the lm_head.
    assert_eq!(matmuls, 5);
}

/// A successful run prints no line starting with "error", even without XDG_RUNTIME_DIR (EGL's
/// warning from the GL backend's probing is avoided by the CLI giving it a private runtime folder).
#[test]
fn successful_runs_print_no_error_lines_without_xdg_runtime_dir() {
    let spec = TinySpec::default();
    let dir = tiny(&spec);
    let m = dir.path().to_str().unwrap();
    for args in [vec!["devices"], vec!["generate", "--model", m, "--prompt-ids", "1,2,3", "--max-tokens", "4"], vec!["generate", "--model", m, "--prompt-ids", "1,2,3", "--max-tokens", "4", "--backend", "gl"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_domino")).args(&args).env_remove("XDG_RUNTIME_DIR").output().expect("run domino");
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.lines().any(|l| l.trim_start().to_lowercase().starts_with("error")), "{args:?}: {stderr}");
    }
}

/// The quick start's path on the real default model: streamed text stops before the stop token that
/// ended the reply (`<|im_end|>` is not printed), while `--json` keeps it in `output_ids` and `text`.
#[test]
fn streamed_chat_reply_omits_the_stop_token() {
    let cache = std::env::var("DOMINO_CACHE").map(std::path::PathBuf::from).unwrap_or_else(|_| match std::env::var("XDG_CACHE_HOME") {
        Ok(x) => std::path::PathBuf::from(x).join("domino"),
        Err(_) => std::path::PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/domino"),
    });
    let model = cache.join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(model.exists(), "{} is missing: run `bash scripts/fetch-smollm2.sh`", model.display());
    let args = ["--chat", "--prompt", "Hello", "--max-tokens", "32"];
    let v = json_generate(&model, &args);
    assert_eq!(v["stop_reason"], "eos", "{v}");
    let text = v["text"].as_str().unwrap();
    let reply = text.strip_suffix("<|im_end|>").unwrap_or_else(|| panic!("{text:?}"));
    let mut streamed = vec!["generate", "--model", model.to_str().unwrap()];
    streamed.extend_from_slice(&args);
    let out = domino(&streamed);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), reply.trim_end());
}
