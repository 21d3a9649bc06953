//! The fuzz corpus in the normal test suite: every committed seed (`fuzz/seeds/<target>/`) and every
//! input that once broke an invariant (`fuzz/regressions/<target>/`) goes through the same checks
//! as the fuzz targets (`domino_models::fuzzing`). See docs/fuzzing.md.
//!
//! `cargo test -p domino-models --test fuzz_regressions -- --ignored write_fuzz_seeds` rewrites the
//! seed corpus from the tiny model writers, the shipped drafter, the Qwen3 tokenizer's template and
//! the real SmolLM2 GGUF's header.

use domino_engine::HostDType;
use domino_models::fuzzing::TARGETS;
use domino_models::gguf::{GgufFile, GgufValue};
use domino_models::gguf_writer::{gguf_bytes, write_tiny_gguf, GgufTensor};
use domino_models::testing::{config_json, drafter_config_json, safetensors_bytes, tiny_tensors, write_tiny_model, TinyDrafterSpec, TinySpec, CHAT_TEMPLATE};
use domino_models::drafter::DrafterKind;
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.is_file()).collect();
    v.sort();
    v
}

#[test]
fn every_seed_and_regression_input_keeps_the_invariants() {
    let mut failures = Vec::new();
    for (target, check) in TARGETS {
        let seeds = files(&fuzz_dir().join("seeds").join(target));
        assert!(!seeds.is_empty(), "fuzz/seeds/{target} has no seeds");
        for path in seeds.iter().chain(&files(&fuzz_dir().join("regressions").join(target))) {
            let bytes = std::fs::read(path).unwrap();
            if std::panic::catch_unwind(|| check(&bytes)).is_err() {
                failures.push(path.display().to_string());
            }
        }
    }
    assert!(failures.is_empty(), "invariants broken by: {failures:?}");
}

#[test]
fn hostile_chat_templates_fail_with_errors_not_hangs() {
    use domino_models::tokenizer::{render_chat_template, ChatMessage};
    let dir = fuzz_dir().join("regressions/chat_template");
    let msgs = [ChatMessage::new("user", "hi")];
    let render = |name: &str| {
        let src = std::fs::read_to_string(dir.join(name)).unwrap();
        let t = std::time::Instant::now();
        let e = render_chat_template(&src, &msgs, true, false, "", "").unwrap_err().to_string();
        assert!(t.elapsed().as_secs() < 20, "{name} took {:?}", t.elapsed());
        assert!(!e.contains('\n'), "{e}");
        e
    };
    let e = render("nested-loops-1e10.jinja");
    assert!(e.contains("fuel"), "{e}");
    let e = render("huge-output.jinja");
    assert!(e.contains("exceeds 16 MiB"), "{e}");
    let e = render("unbounded-recursion.jinja");
    assert!(e.contains("recursion"), "{e}");
    // Real templates stay far inside the fuel: Qwen3's with 200 messages renders.
    let qwen3 = std::fs::read_to_string(fuzz_dir().join("seeds/chat_template/qwen3.jinja")).unwrap();
    let many: Vec<ChatMessage> = (0..200).map(|i| ChatMessage::new(if i % 2 == 0 { "user" } else { "assistant" }, format!("turn {i}"))).collect();
    let out = render_chat_template(&qwen3, &many, true, false, "", "").unwrap();
    assert!(out.contains("turn 199"));
}

fn small_spec() -> TinySpec {
    TinySpec { hidden: 32, layers: 1, heads: 2, kv_heads: 1, head_dim: 16, intermediate: 64, vocab: 261, ..TinySpec::default() }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn smollm2_path() -> PathBuf {
    let cache = std::env::var("DOMINO_CACHE").map(PathBuf::from).unwrap_or_else(|_| match std::env::var("XDG_CACHE_HOME") {
        Ok(x) => PathBuf::from(x).join("domino"),
        Err(_) => PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/domino"),
    });
    cache.join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// SmolLM2's GGUF header with its token arrays cut to `keep` entries and its tensor index kept,
/// without the tensor data (a few KB instead of 98 MB).
fn smollm2_header(keep: usize, with_tensors: bool) -> (Vec<u8>, String) {
    let g = GgufFile::open(&smollm2_path()).expect("run scripts/fetch-smollm2.sh");
    let mut template = String::new();
    let metadata: Vec<(String, GgufValue)> = g
        .metadata()
        .map(|(k, v)| {
            if k == "tokenizer.chat_template" {
                template = v.as_str().unwrap_or_default().to_string();
            }
            let v = match v {
                GgufValue::Array(a) => GgufValue::Array(a.iter().take(keep).cloned().collect()),
                other => other.clone(),
            };
            (k.to_string(), v)
        })
        .collect();
    let tensors: Vec<GgufTensor> = if with_tensors {
        g.tensors.iter().map(|t| GgufTensor { name: t.name.clone(), shape: t.shape(), ggml_type: t.ggml_type, data: Vec::new() }).collect()
    } else {
        Vec::new()
    };
    (gguf_bytes(&metadata, &tensors), template)
}

/// Rewrites fuzz/seeds (run by hand; the output is committed).
#[test]
#[ignore]
fn write_fuzz_seeds() {
    let seeds = fuzz_dir().join("seeds");
    let tmp = tempfile::tempdir().unwrap();
    let spec = small_spec();
    let llama = TinySpec { qk_norm: false, tied: true, ..small_spec() };

    // gguf: tiny models in every tensor type (Qwen3 and Llama), and SmolLM2's real header.
    for (name, s, dtype) in [("tiny-qwen3-q4_0.gguf", &spec, HostDType::Quant(domino_engine::QuantType::Q4_0)), ("tiny-llama-q8_0.gguf", &llama, HostDType::Quant(domino_engine::QuantType::Q8_0)), ("tiny-qwen3-f16.gguf", &spec, HostDType::F16), ("tiny-llama-q4_1.gguf", &llama, HostDType::Quant(domino_engine::QuantType::Q4_1))] {
        let p = tmp.path().join(name);
        write_tiny_gguf(&p, s, dtype).unwrap();
        write(&seeds.join("gguf"), name, &std::fs::read(&p).unwrap());
    }
    let (header, smol_template) = smollm2_header(64, true);
    write(&seeds.join("gguf"), "smollm2-header.gguf", &header);

    // gguf_tokenizer: the tiny tokenizer alone, and SmolLM2's (vocabulary cut to 400 tokens).
    let p = tmp.path().join("tok.gguf");
    write_tiny_gguf(&p, &spec, HostDType::F32).unwrap();
    let g = GgufFile::open(&p).unwrap();
    let meta: Vec<(String, GgufValue)> = g.metadata().filter(|(k, _)| k.starts_with("tokenizer.")).map(|(k, v)| (k.to_string(), v.clone())).collect();
    write(&seeds.join("gguf_tokenizer"), "tiny-tokenizer.gguf", &gguf_bytes(&meta, &[]));
    let (smol_tok, _) = smollm2_header(400, false);
    write(&seeds.join("gguf_tokenizer"), "smollm2-tokenizer-400.gguf", &smol_tok);

    // safetensors: tiny target and drafter files.
    for (name, dtype) in [("tiny-bf16.safetensors", HostDType::BF16), ("tiny-f32.safetensors", HostDType::F32), ("tiny-f16.safetensors", HostDType::F16)] {
        write(&seeds.join("safetensors"), name, &safetensors_bytes(dtype, &tiny_tensors(&TinySpec { layers: 1, hidden: 16, heads: 1, kv_heads: 1, head_dim: 16, intermediate: 16, vocab: 32, ..TinySpec::default() })).unwrap());
    }

    // shard_index: the tiny writer's sharded index.
    let sharded = tmp.path().join("sharded");
    write_tiny_model(&sharded, &TinySpec { shards: 3, ..small_spec() }).unwrap();
    write(&seeds.join("shard_index"), "tiny-3-shards.json", &std::fs::read(sharded.join("model.safetensors.index.json")).unwrap());

    // target_config: tiny Qwen3 and Llama configs.
    for (name, s) in [("tiny-qwen3.json", &spec), ("tiny-llama.json", &llama)] {
        write(&seeds.join("target_config"), name, serde_json::to_string_pretty(&config_json(s)).unwrap().as_bytes());
    }

    // drafter_config: the shipped SmolLM2 drafter and tiny DFlash / Domino drafters.
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../drafters/smollm2-135m-instruct-domino/config.json");
    write(&seeds.join("drafter_config"), "smollm2-domino.json", &std::fs::read(shipped).unwrap());
    for (name, kind) in [("tiny-dflash.json", DrafterKind::DFlash), ("tiny-domino.json", DrafterKind::Domino)] {
        let d = TinyDrafterSpec { kind, target_layer_ids: vec![0, 1], ..TinyDrafterSpec::default() };
        write(&seeds.join("drafter_config"), name, serde_json::to_string_pretty(&drafter_config_json(&TinySpec::default(), &d)).unwrap().as_bytes());
    }

    // lookup_table: tables of a tiny repeating text (several confidence classes) and of a random
    // text over 6 tokens (min count 2).
    use domino_models::ngram_table::NgramTable;
    let text: Vec<u32> = (0..400u32).map(|i| (i * 7 + i / 13) % 32).collect();
    write(&seeds.join("lookup_table"), "tiny-text.safetensors", &NgramTable::build([text.as_slice()], 32, 1).to_bytes());
    let mut rng = 5u64;
    let random: Vec<u32> = (0..600)
        .map(|_| {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((rng >> 33) % 6) as u32
        })
        .collect();
    write(&seeds.join("lookup_table"), "random-6-min2.safetensors", &NgramTable::build([random.as_slice()], 6, 2).to_bytes());

    // chat_template: the tiny ChatML template, SmolLM2's and Qwen3's real ones.
    let ct = seeds.join("chat_template");
    write(&ct, "chatml.jinja", CHAT_TEMPLATE.as_bytes());
    write(&ct, "smollm2.jinja", smol_template.as_bytes());
    let qwen3_dir = std::env::var("DOMINO_QWEN3_TOKENIZER_DIR").map(PathBuf::from).unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/qwen3-tokenizer"));
    let cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(qwen3_dir.join("tokenizer_config.json")).unwrap()).unwrap();
    write(&ct, "qwen3.jinja", cfg["chat_template"].as_str().unwrap().as_bytes());
}

#[test]
fn gguf_invariants_hold_for_k_quant_and_q5_files() {
    // 256-value super-blocks: the invariants' byte sizes must follow each type's block, not 32.
    let tmp = tempfile::tempdir().unwrap();
    let spec = TinySpec { hidden: 256, layers: 2, heads: 4, kv_heads: 2, head_dim: 48, intermediate: 512, vocab: 300, ..TinySpec::default() };
    for ftype in ["q4_k_m", "q5_k_m", "q6_k", "q5_0", "q5_1"] {
        let p = tmp.path().join(format!("{ftype}.gguf"));
        domino_models::gguf_writer::write_tiny_gguf_as(&p, &spec, domino_models::gguf_writer::FileType::parse(ftype).unwrap()).unwrap();
        domino_models::fuzzing::gguf(&std::fs::read(&p).unwrap());
    }
}
