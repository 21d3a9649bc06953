//! Malformed files through the CLI: corrupted copies of real files (the SmolLM2 GGUF, the shipped
//! drafter, tiny models written in the real formats) each make `domino generate` exit with status 1
//! and print exactly one `error:` line: never status 101 (a panic), never a signal.

use domino_engine::HostDType;
use domino_models::gguf::{GgufFile, GgufValue};
use domino_models::gguf_writer::{gguf_bytes, write_tiny_gguf, GgufTensor};
use domino_models::testing::{write_tiny_model, TinySpec};
use std::path::{Path, PathBuf};
use std::process::Command;

fn smollm2_path() -> PathBuf {
    let cache = std::env::var("DOMINO_CACHE").map(PathBuf::from).unwrap_or_else(|_| match std::env::var("XDG_CACHE_HOME") {
        Ok(x) => PathBuf::from(x).join("domino"),
        Err(_) => PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/domino"),
    });
    let p = cache.join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} is missing: run `bash scripts/fetch-smollm2.sh`", p.display());
    p
}

fn shipped_drafter() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../drafters/smollm2-135m-instruct-domino")
}

/// `domino generate` on `model` (and `extra`): exit status 1 and exactly one stderr line, `error: ...`.
fn one_error(case: &str, model: &Path, extra: &[&str]) -> String {
    one_error_env(case, model, extra, &[])
}

fn one_error_env(case: &str, model: &Path, extra: &[&str], env: &[(&str, &str)]) -> String {
    let mut args = vec!["generate", "--model", model.to_str().unwrap(), "--prompt-ids", "1,2,3", "--max-tokens", "2"];
    args.extend_from_slice(extra);
    let out = Command::new(env!("CARGO_BIN_EXE_domino"))
        .args(&args)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .envs(env.iter().copied())
        .output()
        .expect("run domino");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{case}: exit status {:?} (101 = panic, None = signal); stderr: {stderr}", out.status);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{case}: expected exactly one stderr line, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{case}: {stderr}");
    lines[0].to_string()
}

/// A GGUF file rewritten from `g` with `edit` applied to its metadata and tensor index.
fn rewrite_gguf(g: &GgufFile, edit: impl FnOnce(&mut Vec<(String, GgufValue)>, &mut Vec<GgufTensor>)) -> Vec<u8> {
    let mut meta: Vec<(String, GgufValue)> = g.metadata().map(|(k, v)| (k.to_string(), v.clone())).collect();
    let mut tensors: Vec<GgufTensor> = g
        .tensors
        .iter()
        .map(|t| GgufTensor { name: t.name.clone(), shape: t.shape(), ggml_type: t.ggml_type, data: g.tensor_data(&t.name).unwrap().unwrap().1.to_vec() })
        .collect();
    edit(&mut meta, &mut tensors);
    gguf_bytes(&meta, &tensors)
}

#[test]
fn smollm2_truncated_at_20_points_and_with_flipped_header_bytes() {
    let real = smollm2_path();
    let len = std::fs::metadata(&real).unwrap().len();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.gguf");
    // Flipped bytes in a full copy, patched in place and restored: magic, version, the tensor and
    // metadata counts, the first key's length (bytes 7 / 15 / 23 / 31 are high bytes of LE fields).
    std::fs::copy(&real, &path).unwrap();
    let patch = |at: u64, xor: u8| {
        use std::io::{Read, Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let mut b = [0u8];
        f.seek(SeekFrom::Start(at)).unwrap();
        f.read_exact(&mut b).unwrap();
        f.seek(SeekFrom::Start(at)).unwrap();
        f.write_all(&[b[0] ^ xor]).unwrap();
    };
    for (at, xor) in [(0, 0x20), (4, 0x07), (7, 0x80), (15, 0x40), (23, 0x40), (31, 0x10)] {
        patch(at, xor);
        one_error(&format!("byte {at} ^ {xor:#x}"), &path, &[]);
        patch(at, xor);
    }
    // Truncated at 20 points, from the end to the start (each cut shortens the same copy).
    let mut points = vec![0, 1, 4, 6, 8, 12, 20, 24, 28, 40, 1_000, 100_000, 1_000_000, len / 40, len / 10, len / 4, len / 2, 3 * len / 4, len - 100, len - 1];
    points.sort_unstable_by(|a, b| b.cmp(a));
    for at in points {
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(at).unwrap();
        let e = one_error(&format!("truncated at {at}"), &path, &[]);
        assert!(e.contains("broken.gguf"), "truncated at {at}: {e}");
    }
}

#[test]
fn absurd_dims_wrong_dtypes_and_bad_metadata_in_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinySpec::default();
    let src = dir.path().join("tiny.gguf");
    write_tiny_gguf(&src, &spec, HostDType::Quant(domino_engine::QuantType::Q8_0)).unwrap();
    let g = GgufFile::open(&src).unwrap();
    let path = dir.path().join("broken.gguf");
    type Edit = Box<dyn FnOnce(&mut Vec<(String, GgufValue)>, &mut Vec<GgufTensor>)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        ("absurd embedding dims", Box::new(|_, t| t[0].shape = vec![1 << 40, 1 << 30]), "token_embd.weight"),
        ("dims whose product overflows", Box::new(|_, t| t[0].shape = vec![1 << 33, 1 << 33, 1 << 33]), "token_embd.weight"),
        ("absurd embedding_length", Box::new(|m, _| set(m, "qwen3.embedding_length", GgufValue::U64(1 << 40))), ""),
        ("absurd block_count", Box::new(|m, _| set(m, "qwen3.block_count", GgufValue::U64(u64::MAX))), "layers"),
        ("zero heads", Box::new(|m, _| set(m, "qwen3.attention.head_count", GgufValue::U32(0))), "head"),
        ("Q3_K matrix", Box::new(|_, t| t[1].ggml_type = 11), "Q3_K"),
        ("unknown tensor type", Box::new(|_, t| t[1].ggml_type = 9999), "unknown type 9999"),
        ("architecture as a number", Box::new(|m, _| set(m, "general.architecture", GgufValue::U32(7))), "general.architecture"),
        ("eos id outside the vocabulary", Box::new(|m, _| set(m, "tokenizer.ggml.eos_token_id", GgufValue::U32(1 << 30))), "eos_token_id"),
        ("tokens of the wrong type", Box::new(|m, _| set(m, "tokenizer.ggml.tokens", GgufValue::Array(vec![GgufValue::U32(1)]))), "tokenizer.ggml.tokens"),
    ];
    for (case, edit, needle) in cases {
        std::fs::write(&path, rewrite_gguf(&g, edit)).unwrap();
        let e = one_error(case, &path, &[]);
        assert!(e.contains(needle), "{case}: {e}");
    }
}

fn set(meta: &mut [(String, GgufValue)], key: &str, v: GgufValue) {
    meta.iter_mut().find(|(k, _)| k == key).unwrap_or_else(|| panic!("no {key}")).1 = v;
}

#[test]
fn corrupted_safetensors_configs_and_drafters() {
    let spec = TinySpec { max_position: 256, ..TinySpec::default() };
    let fresh = || {
        let d = tempfile::tempdir().unwrap();
        write_tiny_model(d.path(), &spec).unwrap();
        d
    };
    // Truncated safetensors at several points, and a header length pointing past the end.
    let d = fresh();
    let p = d.path().join("model.safetensors");
    let real = std::fs::read(&p).unwrap();
    for at in [0, 7, 8, 9, 100, real.len() / 2, real.len() - 1] {
        std::fs::write(&p, &real[..at]).unwrap();
        assert!(one_error(&format!("safetensors truncated at {at}"), d.path(), &[]).contains("model.safetensors"));
    }
    let mut flipped = real.clone();
    flipped[7] ^= 0x40;
    std::fs::write(&p, &flipped).unwrap();
    one_error("safetensors header length", d.path(), &[]);

    // Absurd config sizes.
    for (field, value) in [("hidden_size", 1u64 << 40), ("vocab_size", 1 << 62), ("num_hidden_layers", 1 << 40), ("intermediate_size", u64::MAX)] {
        let d = fresh();
        let cp = d.path().join("config.json");
        let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&cp).unwrap()).unwrap();
        v[field] = value.into();
        std::fs::write(&cp, serde_json::to_vec(&v).unwrap()).unwrap();
        one_error(&format!("config {field} = {value}"), d.path(), &[]);
    }

    // A shard index naming a file outside the folder.
    let d = fresh();
    std::fs::write(d.path().join("model.safetensors.index.json"), br#"{"weight_map": {"model.norm.weight": "../../etc/passwd"}}"#).unwrap();
    assert!(one_error("shard path", d.path(), &[]).contains("not a plain file name"));

    // The shipped SmolLM2 drafter against a tiny target, and a tiny target's drafter against SmolLM2.
    let d = fresh();
    let drafter = shipped_drafter();
    let e = one_error("drafter for another target", d.path(), &["--draft", drafter.to_str().unwrap()]);
    assert!(e.contains("drafter"), "{e}");
    let tiny_drafter = tempfile::tempdir().unwrap();
    domino_models::testing::write_tiny_drafter(tiny_drafter.path(), &spec, &domino_models::testing::TinyDrafterSpec::default()).unwrap();
    let e = one_error("tiny drafter on SmolLM2", &smollm2_path(), &["--draft", tiny_drafter.path().to_str().unwrap()]);
    assert!(e.contains("drafter"), "{e}");
}

#[test]
fn memory_budget_binding_limit_and_context_through_the_cli() {
    let spec = TinySpec { max_position: 4096, ..TinySpec::default() };
    let d = tempfile::tempdir().unwrap();
    write_tiny_model(d.path(), &spec).unwrap();
    let e = one_error_env("100 KiB budget", d.path(), &[], &[("DOMINO_MEMORY_BUDGET", "100K")]);
    assert!(e.contains("memory budget of 100.0 KiB") && e.contains("--context") && e.contains("--dtype"), "{e}");
    // One layer's KV cache for 1000 positions is 1000 x 64 x 4 = 250 KiB: over a forced 64 KiB binding limit.
    let e = one_error_env("64 KiB bindings", d.path(), &["--context", "1000"], &[("DOMINO_MAX_BINDING", "64K")]);
    assert!(e.contains("KV cache of one layer for 1000 positions") && e.contains("binds at most 64.0 KiB"), "{e}");
    let e = one_error("context beyond the model", d.path(), &["--context", "5000"]);
    assert!(e.contains("max_position_embeddings 4096"), "{e}");
    let e = one_error("context below prompt + max tokens", d.path(), &["--context", "4"]);
    assert!(e.contains("exceeds the context of 4 positions"), "{e}");
    assert!(one_error_env("bad budget", d.path(), &[], &[("DOMINO_MEMORY_BUDGET", "lots")]).contains("DOMINO_MEMORY_BUDGET=lots"));
    // --context sizes the KV cache of a run that fits.
    let out = Command::new(env!("CARGO_BIN_EXE_domino"))
        .args(["generate", "--model", d.path().to_str().unwrap(), "--prompt-ids", "1,2,3", "--max-tokens", "4", "--ignore-eos", "--context", "200", "--json"])
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .env("DOMINO_MAX_BINDING", "64K")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["output_ids"].as_array().unwrap().len(), 4);
}
